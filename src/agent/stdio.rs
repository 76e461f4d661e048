//! `pieval world stdio`: an attempt's served world over MCP's stdio transport, for
//! agents that spawn their tools as a process (an MCP client's `command`). The process
//! speaks MCP on its stdin and stdout (the official Rust SDK, `rmcp`) and forwards each
//! listing and call to the world's plain HTTP tools ([`super::serve`]): the same world,
//! recorded the same way — the bridge holds no state of its own.

use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
    PaginatedRequestParams, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::Value;

use crate::error::{Error, Result};

/// The most bytes of an answer from the world read (its outputs are bounded well below).
const MAX_ANSWER: usize = 4 << 20;

/// The environment variable that holds the world's token (never an argument: a
/// process's arguments are visible to every user of the machine).
pub const TOKEN_ENV: &str = "PIEVAL_WORLD_TOKEN";

#[derive(Clone)]
struct Bridge {
    client: reqwest::Client,
    /// The world's `http_url` (`…/w/<id>/tools`).
    tools: reqwest::Url,
    token: String,
}

/// The world's tools URL from its `mcp_url` or `http_url`: a loopback `http` URL only.
pub fn tools_url(url: &str) -> std::result::Result<reqwest::Url, String> {
    let mut u = reqwest::Url::parse(url).map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    let loopback = match u.host() {
        Some(url::Host::Ipv4(a)) => a.is_loopback(),
        Some(url::Host::Ipv6(a)) => a.is_loopback(),
        Some(url::Host::Domain(d)) => d == "localhost",
        None => false,
    };
    if u.scheme() != "http" || !loopback {
        return Err(format!(
            "{url:?}: a world is served on this machine (http://127.0.0.1:<port>/w/<id>/mcp)"
        ));
    }
    let path = u.path().trim_end_matches('/').to_owned();
    let base = path
        .strip_suffix("/mcp")
        .or_else(|| path.strip_suffix("/tools"))
        .filter(|b| b.starts_with("/w/") && b.matches('/').count() == 2)
        .ok_or_else(|| format!("{url:?} is not a world's mcp_url or http_url (…/w/<id>/mcp)"))?;
    u.set_path(&format!("{base}/tools"));
    u.set_query(None);
    u.set_fragment(None);
    Ok(u)
}

impl Bridge {
    async fn get(&self, req: reqwest::RequestBuilder) -> std::result::Result<Value, ErrorData> {
        let fail = |m: String| ErrorData::internal_error(format!("world: {m}"), None);
        let resp = req
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|e| fail(e.to_string()))?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|e| fail(e.to_string()))?;
        if bytes.len() > MAX_ANSWER {
            return Err(fail(format!("an answer of {} bytes", bytes.len())));
        }
        let text = String::from_utf8_lossy(&bytes);
        if !status.is_success() {
            return Err(fail(format!(
                "{status}: {}",
                crate::text::excerpt(text.trim(), 200)
            )));
        }
        serde_json::from_str(&text).map_err(|e| fail(format!("not JSON: {e}")))
    }
}

impl ServerHandler for Bridge {
    fn get_info(&self) -> ServerConfig {
        super::serve::server_info()
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> std::result::Result<ListToolsResult, ErrorData> {
        let v = self.get(self.client.get(self.tools.clone())).await?;
        let tools = v["tools"]
            .as_array()
            .map(|a| a.iter().map(super::serve::mcp_tool).collect())
            .unwrap_or_default();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _ctx: RequestContext<RoleServer>,
    ) -> std::result::Result<CallToolResponse, ErrorData> {
        let mut url = self.tools.clone();
        url.path_segments_mut()
            .map_err(|_| ErrorData::internal_error("world: not a base URL", None))?
            .push(&request.name);
        let body = request
            .arguments
            .map_or_else(|| "{}".to_owned(), |m| Value::Object(m).to_string());
        let v = self
            .get(
                self.client
                    .post(url)
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(body),
            )
            .await?;
        let output = v["output"].as_str().unwrap_or_default().to_owned();
        let content = vec![ContentBlock::text(output)];
        Ok(if v["error"].as_bool() == Some(true) {
            CallToolResult::error(content)
        } else {
            CallToolResult::success(content)
        }
        .into())
    }
}

/// Serve the world at `url` (its `mcp_url` or `http_url`) on stdin and stdout until the
/// client closes them.
pub fn serve(url: &str, token: String) -> Result<()> {
    let tools = tools_url(url).map_err(Error::State)?;
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(600))
        .build()
        .map_err(|e| Error::State(format!("world stdio: {e}")))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Internal(format!("cannot start the async runtime: {e}")))?;
    rt.block_on(async move {
        let bridge = Bridge {
            client,
            tools,
            token,
        };
        let running = bridge
            .serve(rmcp::transport::stdio())
            .await
            .map_err(|e| Error::State(format!("world stdio: {e}")))?;
        running
            .waiting()
            .await
            .map_err(|e| Error::State(format!("world stdio: {e}")))?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_worlds_loopback_url_is_taken() {
        let ok = tools_url("http://127.0.0.1:4000/w/abc/mcp").unwrap();
        assert_eq!(ok.as_str(), "http://127.0.0.1:4000/w/abc/tools");
        let ok = tools_url("http://localhost:4000/w/abc/tools/").unwrap();
        assert_eq!(ok.as_str(), "http://localhost:4000/w/abc/tools");
        for bad in [
            "https://127.0.0.1:4000/w/abc/mcp",
            "http://example.com/w/abc/mcp",
            "http://10.0.0.1:4000/w/abc/mcp",
            "http://127.0.0.1:4000/w/abc/other",
            "http://127.0.0.1:4000/w/a/b/mcp",
            "http://127.0.0.1:4000/mcp",
            "not a url",
        ] {
            assert!(tools_url(bad).is_err(), "{bad}");
        }
    }
}
