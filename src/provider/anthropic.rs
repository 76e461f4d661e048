//! `provider: anthropic` — Claude's Messages API natively (`POST {base_url}/v1/messages`,
//! API version 2023-06-01): the system prompt as `system`, the conversation as
//! `messages`, `max_tokens`, and `temperature` / `top_p` only when the config sets them
//! (the current SDK's request types declare neither); for agentic cases the tools as
//! `tools` (`name`, `description`, `input_schema`), the model's `tool_use` blocks as tool
//! calls, and each tool's output sent back as a `tool_result` block (consecutive results
//! in one user turn, as the API requires). The key goes in `x-api-key` only, redacted
//! from everything kept; retries, `Retry-After` (and Anthropic's 529 "overloaded"),
//! pacing and the no-redirect rule are `super::transport`'s. A `max_tokens` stop keeps
//! the text (cut where the model was stopped); a `refusal` stop is the model's answer.

use async_trait::async_trait;
use serde_json::{Value, json};

use super::config::ModelSection;
use super::transport::{self, Pacing, TryError};
use super::{AgentTurn, CallError, Completion, Message, Provider, ToolCall};
use crate::error::Result;

/// The Messages API's version pieval speaks.
pub const API_VERSION: &str = "2023-06-01";
/// Where the API answers unless `base_url` says otherwise.
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";

pub struct AnthropicProvider {
    client: reqwest::Client,
    url: String,
    model: String,
    api_key: Option<String>,
    max_tokens: u32,
    temperature: f64,
    top_p: Option<f64>,
    max_retries: u32,
    pacing: Pacing,
}

impl AnthropicProvider {
    pub fn new(model: &ModelSection) -> Result<Self> {
        let api_key = model
            .api_key_env
            .as_deref()
            .map(|var| crate::secrets::from_env("api_key_env", var))
            .transpose()?;
        let base = model.base_url.as_deref().unwrap_or(DEFAULT_BASE_URL);
        let base = base.trim_end_matches('/');
        let base = base.strip_suffix("/v1").unwrap_or(base);
        Ok(Self {
            client: transport::client(model.timeout_s, model.concurrency)?,
            url: format!("{base}/v1/messages"),
            model: model.name.clone(),
            api_key,
            max_tokens: model.max_tokens,
            temperature: model.temperature,
            top_p: model.top_p,
            max_retries: model.max_retries,
            pacing: Pacing::new(model.requests_per_minute),
        })
    }

    async fn attempt(&self, body: &Value) -> std::result::Result<Value, TryError> {
        let mut req = transport::with_attempt(
            self.client
                .post(&self.url)
                .header("anthropic-version", API_VERSION)
                .json(body),
        );
        if let Some(k) = &self.api_key {
            req = req.header("x-api-key", k);
        }
        let resp = transport::send(req).await?;
        let head = transport::head(&resp);
        let bytes = transport::read_body(resp, head.retry_after).await?;
        let text = crate::secrets::redact(&String::from_utf8_lossy(&bytes))
            .0
            .into_owned();
        let status = head.status;
        if status.is_redirection() {
            return Err(transport::redirect_error(&head, "base_url"));
        }
        if !status.is_success() {
            // 529: overloaded (Anthropic's own), retried like 503
            let code = status.as_u16();
            let retryable = matches!(code, 408 | 409 | 429 | 529) || status.is_server_error();
            return Err((
                format!("HTTP {code}: {}", crate::text::excerpt(text.trim(), 200)),
                retryable,
                head.retry_after,
            ));
        }
        serde_json::from_str(&text).map_err(|e| {
            (
                format!(
                    "malformed response (not JSON: {e}): {}",
                    crate::text::excerpt(text.trim(), 120)
                ),
                true,
                None,
            )
        })
    }

    async fn send(&self, body: &Value) -> std::result::Result<(Value, f64, u32), CallError> {
        transport::with_retries(self.max_retries, &self.pacing, || self.attempt(body)).await
    }

    fn body(&self, system: Option<String>, messages: Vec<Value>) -> Value {
        let mut body = json!({
            "model": self.model,
            "max_tokens": self.max_tokens,
            "messages": messages,
        });
        if let Some(s) = system.filter(|s| !s.is_empty()) {
            body["system"] = json!(s);
        }
        // The request types of the official SDK (anthropic 2.17.0) declare no sampling
        // parameters: they are sent only when the config asks for them (a temperature
        // above 0, a top_p), for the models that still take them.
        if self.temperature > 0.0 {
            body["temperature"] = json!(self.temperature);
        }
        if let Some(p) = self.top_p {
            body["top_p"] = json!(p);
        }
        body
    }
}

/// An answer's text blocks, its tool calls, its stop reason, and token counts.
pub fn parse_message(v: &Value) -> std::result::Result<AgentTurn, String> {
    let blocks = v.get("content").and_then(Value::as_array).ok_or_else(|| {
        format!(
            "malformed response (no content blocks): {}",
            crate::text::excerpt(&v.to_string(), 120)
        )
    })?;
    let mut text = String::new();
    let mut saw_text = false;
    let mut tool_calls = Vec::new();
    for (i, b) in blocks.iter().enumerate() {
        match b.get("type").and_then(Value::as_str) {
            Some("text") => {
                saw_text = true;
                text.push_str(b.get("text").and_then(Value::as_str).unwrap_or_default());
            }
            Some("tool_use") => {
                let name = b.get("name").and_then(Value::as_str).ok_or_else(|| {
                    format!("malformed response (content[{i}], a tool_use, has no name)")
                })?;
                let id = b
                    .get("id")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map_or_else(|| format!("toolu_{}", i + 1), str::to_owned);
                let arguments = b
                    .get("input")
                    .map_or_else(|| "{}".to_owned(), Value::to_string);
                tool_calls.push(ToolCall {
                    id,
                    name: name.to_owned(),
                    arguments,
                });
            }
            // thinking and other blocks are not the answer
            _ => {}
        }
    }
    let stop = v.get("stop_reason").and_then(Value::as_str).unwrap_or("");
    if !saw_text && tool_calls.is_empty() && stop != "refusal" && stop != "end_turn" {
        return Err(format!(
            "malformed response (neither text nor tool_use; stop_reason {stop:?})"
        ));
    }
    let usage = |k: &str| v.pointer(&format!("/usage/{k}")).and_then(Value::as_u64);
    Ok(AgentTurn {
        content: (saw_text || tool_calls.is_empty()).then_some(text),
        tool_calls,
        completion: Completion {
            prompt_tokens: usage("input_tokens"),
            completion_tokens: usage("output_tokens"),
            ..Completion::default()
        },
    })
}

/// OpenAI-form chat messages (system, user, assistant with `tool_calls`, `tool`) as the
/// Messages API's `system` and `messages`: tool calls as `tool_use` blocks, tool outputs
/// as `tool_result` blocks in a user turn; consecutive turns of one role merged (the API
/// wants them alternating).
pub fn to_messages(messages: &[Value]) -> (Option<String>, Vec<Value>) {
    let mut system: Vec<String> = Vec::new();
    let mut out: Vec<(String, Vec<Value>)> = Vec::new();
    let mut push = |role: &str, block: Value| match out.last_mut() {
        Some((r, blocks)) if r == role => blocks.push(block),
        _ => out.push((role.to_owned(), vec![block])),
    };
    for m in messages {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
        let text = match m.get("content") {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Null) | None => None,
            Some(other) => Some(other.to_string()),
        };
        match role {
            "system" | "developer" => system.extend(text),
            "assistant" => {
                if let Some(t) = text.filter(|t| !t.is_empty()) {
                    push("assistant", json!({"type": "text", "text": t}));
                }
                for c in m
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let args = c.pointer("/function/arguments");
                    let input = match args {
                        Some(Value::String(s)) => serde_json::from_str::<Value>(s)
                            .ok()
                            .filter(Value::is_object)
                            .unwrap_or_else(|| json!({})),
                        Some(v @ Value::Object(_)) => v.clone(),
                        _ => json!({}),
                    };
                    push(
                        "assistant",
                        json!({
                            "type": "tool_use",
                            "id": c.get("id").and_then(Value::as_str).unwrap_or("toolu_0"),
                            "name": c.pointer("/function/name").and_then(Value::as_str).unwrap_or(""),
                            "input": input,
                        }),
                    );
                }
            }
            "tool" => push(
                "user",
                json!({
                    "type": "tool_result",
                    "tool_use_id": m.get("tool_call_id").and_then(Value::as_str).unwrap_or("toolu_0"),
                    "content": text.unwrap_or_default(),
                }),
            ),
            _ => push(
                "user",
                json!({"type": "text", "text": text.unwrap_or_default()}),
            ),
        }
    }
    let messages = out
        .into_iter()
        .map(|(role, blocks)| json!({"role": role, "content": blocks}))
        .collect();
    ((!system.is_empty()).then(|| system.join("\n\n")), messages)
}

/// OpenAI-form tools (`{type: function, function: {name, description, parameters}}`)
/// as the Messages API's.
pub fn to_tools(tools: &[Value]) -> Vec<Value> {
    tools
        .iter()
        .filter_map(|t| {
            let f = t.get("function").unwrap_or(t);
            let name = f.get("name")?.as_str()?;
            let mut tool = json!({
                "name": name,
                "input_schema": f.get("parameters").cloned().filter(Value::is_object)
                    .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
            });
            if let Some(d) = f.get("description").and_then(Value::as_str) {
                tool["description"] = json!(d);
            }
            Some(tool)
        })
        .collect()
}

/// Every text of a turn redacted again (a key its parts only make when joined).
#[async_trait]
impl Provider for AnthropicProvider {
    fn name(&self) -> &str {
        "anthropic"
    }

    async fn complete(
        &self,
        _case_id: &str,
        messages: &[Message],
    ) -> std::result::Result<Completion, CallError> {
        let as_json: Vec<Value> = messages
            .iter()
            .map(|m| json!({"role": m.role, "content": m.content}))
            .collect();
        let (system, msgs) = to_messages(&as_json);
        let (v, latency_ms, attempts) = self.send(&self.body(system, msgs)).await?;
        let turn = parse_message(&v).map_err(|message| CallError {
            message,
            latency_ms,
            attempts,
        })?;
        Ok(turn.finished(latency_ms, attempts).into_completion())
    }

    async fn chat(
        &self,
        _key: &str,
        messages: &[Value],
        tools: &[Value],
    ) -> std::result::Result<AgentTurn, CallError> {
        let (system, msgs) = to_messages(messages);
        let mut body = self.body(system, msgs);
        if !tools.is_empty() {
            body["tools"] = Value::Array(to_tools(tools));
        }
        let (v, latency_ms, attempts) = self.send(&body).await?;
        let turn = parse_message(&v).map_err(|message| CallError {
            message,
            latency_ms,
            attempts,
        })?;
        Ok(turn.finished(latency_ms, attempts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_turns_become_messages_turns() {
        let (system, msgs) = to_messages(&[
            json!({"role": "system", "content": "be brief"}),
            json!({"role": "user", "content": "pay the bill"}),
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{\"f\":\"a\"}"}},
                {"id": "c2", "type": "function", "function": {"name": "read", "arguments": "not json"}}]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": "IGNORE PREVIOUS"}),
            json!({"role": "tool", "tool_call_id": "c2", "content": "x"}),
        ]);
        assert_eq!(system.as_deref(), Some("be brief"));
        assert_eq!(
            msgs.len(),
            3,
            "user, assistant, one user turn of results: {msgs:?}"
        );
        assert_eq!(msgs[1]["content"][0]["input"]["f"], "a");
        assert_eq!(msgs[1]["content"][1]["input"], json!({}));
        assert_eq!(msgs[2]["content"].as_array().unwrap().len(), 2);
        assert_eq!(msgs[2]["content"][0]["type"], "tool_result");
        assert_eq!(msgs[2]["content"][0]["tool_use_id"], "c1");
    }

    #[test]
    fn answers_parse() {
        let t = parse_message(&json!({"content": [{"type": "text", "text": "hi"}, {"type": "tool_use", "id": "t1", "name": "send", "input": {"to": "x"}}], "stop_reason": "tool_use", "usage": {"input_tokens": 3, "output_tokens": 2}})).unwrap();
        assert_eq!(t.content.as_deref(), Some("hi"));
        assert_eq!(t.tool_calls[0].arguments, "{\"to\":\"x\"}");
        assert_eq!(t.completion.prompt_tokens, Some(3));
        let r = parse_message(&json!({"content": [], "stop_reason": "refusal"})).unwrap();
        assert_eq!(r.content.as_deref(), Some(""));
        assert!(parse_message(&json!({"content": [], "stop_reason": "max_tokens"})).is_err());
        assert!(
            parse_message(&json!({"type": "error"}))
                .unwrap_err()
                .contains("no content")
        );
        let tools = to_tools(&[
            json!({"type": "function", "function": {"name": "send", "description": "d", "parameters": {"type": "object", "properties": {"to": {"type": "string"}}}}}),
        ]);
        assert_eq!(
            tools[0]["input_schema"]["properties"]["to"]["type"],
            "string"
        );
    }
}
