//! OpenAI-compatible chat completions over HTTP (tokio + reqwest).
//!
//! Retries (`super::transport`): timeouts, connection failures, HTTP 408 / 409 / 429 / 5xx and unparseable
//! bodies are retried up to `max_retries` times. The wait before retry `n` (from 0) is a
//! random duration in `[0, min(30 s, 0.5 s · 2ⁿ)]` ("full jitter"), or the server's
//! `Retry-After` (seconds or an HTTP date, at most 5 minutes) when it sends one. Other
//! 4xx answers (a bad key, an unknown model) and redirects (never followed) fail at
//! once. The API key is read from the
//! environment variable the config names, sent only in the `Authorization` header, and
//! redacted from every message this module returns.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use serde_json::{Value, json};

use super::Message;
use super::config::ModelSection;
use super::transport::{self, Pacing, TryError};
use super::{AgentTurn, CallError, Completion, Provider};
use crate::error::Result;

const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

pub struct OpenAiProvider {
    client: reqwest::Client,
    url: String,
    model: String,
    api_key: Option<String>,
    max_tokens: u32,
    temperature: f64,
    top_p: Option<f64>,
    seed: u64,
    max_retries: u32,
    pacing: Pacing,
}

impl OpenAiProvider {
    pub fn new(model: &ModelSection, seed: u64) -> Result<Self> {
        let api_key = model
            .api_key_env
            .as_deref()
            .map(|var| crate::secrets::from_env("api_key_env", var))
            .transpose()?;
        let base = model.base_url.as_deref().unwrap_or_default();
        let client = transport::client(model.timeout_s, model.concurrency)?;
        Ok(Self {
            client,
            url: format!("{}/chat/completions", base.trim_end_matches('/')),
            model: model.name.clone(),
            api_key,
            max_tokens: model.max_tokens,
            temperature: model.temperature,
            top_p: model.top_p,
            seed,
            max_retries: model.max_retries,
            pacing: Pacing::new(model.requests_per_minute),
        })
    }

    /// One attempt: the answer's body (every key redacted, in any spelling) and whether
    /// anything was, or Err(message, retryable, retry_after).
    async fn attempt(&self, body: &Value) -> Result<(String, bool), TryError> {
        let mut req = transport::with_attempt(self.client.post(&self.url).json(body));
        if let Some(k) = &self.api_key {
            req = req.bearer_auth(k);
        }
        let resp = transport::send(req).await?;
        let head = transport::head(&resp);
        let body = transport::read_body(resp, head.retry_after).await?;
        // Redacted before anything is cut or parsed: an excerpt never holds part of the
        // key.
        let (text, redacted) = {
            let raw = String::from_utf8_lossy(&body);
            let (t, r) = crate::secrets::redact(&raw);
            (t.into_owned(), r)
        };
        let status = head.status;
        if status.is_redirection() {
            return Err(transport::redirect_error(&head, "base_url"));
        }
        if !status.is_success() {
            let retryable = status.as_u16() == 408
                || status.as_u16() == 409
                || status.as_u16() == 429
                || status.is_server_error();
            return Err((
                format!(
                    "HTTP {}: {}",
                    status.as_u16(),
                    crate::text::excerpt(text.trim(), 200)
                ),
                retryable,
                head.retry_after,
            ));
        }
        Ok((text, redacted))
    }

    /// Send `body` with retries; each answer is parsed by `parse` (given the body, and
    /// whether a key was redacted from it; an answer it rejects is retried like a server
    /// error). The answer, its latency and attempts.
    async fn send<T>(
        &self,
        body: &Value,
        parse: impl Fn(&str, bool) -> Result<T, String>,
    ) -> Result<(T, f64, u32), CallError> {
        transport::with_retries(self.max_retries, &self.pacing, || async {
            let (text, redacted) = self.attempt(body).await?;
            parse(&text, redacted).map_err(|m| (m, true, None))
        })
        .await
    }

    fn body(&self, messages: &impl serde::Serialize) -> Value {
        let mut body = json!({
            "model": self.model,
            "messages": messages,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "seed": self.seed,
        });
        if let Some(p) = self.top_p {
            body["top_p"] = json!(p);
        }
        body
    }
}

/// A response body as JSON, or why it is not.
fn json_body(body: &str) -> Result<Value, String> {
    serde_json::from_str(body).map_err(|e| {
        format!(
            "malformed response (not JSON: {e}): {}",
            crate::text::excerpt(body.trim(), 120)
        )
    })
}

/// An assistant turn of a chat-completions body: its text (none when it only calls
/// tools) and its tool calls (`message.tool_calls`, parallel calls in order). A call
/// whose `arguments` is not text (some servers send the object) keeps the object's JSON
/// text; one without an id gets `call_<n>`.
pub fn parse_agent_turn(body: &str) -> Result<AgentTurn, String> {
    let v = json_body(body)?;
    let message = v
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .and_then(|c| c.get("message"))
        .ok_or_else(|| {
            format!(
                "malformed response (no choices[0].message): {}",
                crate::text::excerpt(body.trim(), 120)
            )
        })?;
    let content = message
        .get("content")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let tool_calls = match message.get("tool_calls").filter(|c| !c.is_null()) {
        Some(calls) => {
            super::tool_calls_of(calls).map_err(|m| format!("malformed response ({m})"))?
        }
        None => Vec::new(),
    };
    if content.is_none() && tool_calls.is_empty() {
        let reason = v
            .pointer("/choices/0/finish_reason")
            .and_then(Value::as_str)
            .unwrap_or("none");
        return Err(format!(
            "malformed response (neither content nor tool calls; finish_reason {reason})"
        ));
    }
    let usage = |k: &str| v.pointer(&format!("/usage/{k}")).and_then(Value::as_u64);
    Ok(AgentTurn {
        content,
        tool_calls,
        completion: Completion {
            prompt_tokens: usage("prompt_tokens"),
            completion_tokens: usage("completion_tokens"),
            ..Completion::default()
        },
    })
}

/// The `Retry-After` header: delta-seconds or an HTTP date.
pub fn parse_retry_after(v: &str) -> Option<Duration> {
    let v = v.trim();
    let d = if let Ok(secs) = v.parse::<f64>() {
        (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs))?
    } else {
        let when = httpdate::parse_http_date(v).ok()?;
        when.duration_since(SystemTime::now()).unwrap_or_default()
    };
    Some(d.min(MAX_RETRY_AFTER))
}

/// The text and token counts of a chat-completions body.
pub fn parse_completion(body: &str) -> Result<Completion, String> {
    let v = json_body(body)?;
    let choice = v
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .ok_or_else(|| {
            format!(
                "malformed response (no choices): {}",
                crate::text::excerpt(body.trim(), 120)
            )
        })?;
    let text = choice
        .pointer("/message/content")
        .or_else(|| choice.get("text"))
        .and_then(Value::as_str)
        .ok_or_else(|| {
            let reason = choice
                .get("finish_reason")
                .and_then(Value::as_str)
                .unwrap_or("none");
            format!("malformed response (no message content; finish_reason {reason})")
        })?;
    let usage = |k: &str| v.pointer(&format!("/usage/{k}")).and_then(Value::as_u64);
    Ok(Completion {
        text: text.to_owned(),
        prompt_tokens: usage("prompt_tokens"),
        completion_tokens: usage("completion_tokens"),
        ..Completion::default()
    })
}

#[async_trait]
impl Provider for OpenAiProvider {
    fn name(&self) -> &str {
        "openai"
    }

    async fn complete(
        &self,
        _case_id: &str,
        messages: &[Message],
    ) -> Result<Completion, CallError> {
        let (mut c, latency_ms, attempts) = self
            .send(&self.body(&messages), |text, redacted| {
                parse_completion(text).map(|c| (c, redacted))
            })
            .await
            .map(|((mut c, redacted), l, a)| {
                // The answer as parsed, redacted again: the body's redaction covers it,
                // this covers a key its parts only make when joined.
                let (text, again) = crate::secrets::redact(&c.text);
                if again {
                    c.text = text.into_owned();
                }
                c.redacted = (redacted || again) && c.text.contains(crate::secrets::REDACTED);
                (c, l, a)
            })?;
        c.truncated = super::cap_response(&mut c.text);
        c.latency_ms = latency_ms;
        c.attempts = attempts;
        Ok(c)
    }

    async fn chat(
        &self,
        _key: &str,
        messages: &[Value],
        tools: &[Value],
    ) -> Result<AgentTurn, CallError> {
        let mut body = self.body(&messages);
        if !tools.is_empty() {
            body["tools"] = Value::Array(tools.to_vec());
        }
        let ((mut turn, redacted), latency_ms, attempts) = self
            .send(&body, |text, redacted| {
                parse_agent_turn(text).map(|t| (t, redacted))
            })
            .await?;
        // what was parsed, redacted again (a key its parts only make when joined)
        turn.completion.redacted = redacted;
        Ok(turn.finished(latency_ms, attempts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_forms() {
        assert_eq!(parse_retry_after("2"), Some(Duration::from_secs(2)));
        assert_eq!(parse_retry_after("0.5"), Some(Duration::from_millis(500)));
        assert_eq!(parse_retry_after("100000"), Some(MAX_RETRY_AFTER));
        assert_eq!(parse_retry_after("soon"), None);
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"),
            Some(Duration::ZERO),
            "a date in the past means now"
        );
    }

    #[test]
    fn completion_bodies() {
        let ok = parse_completion(
            r#"{"choices":[{"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":5,"completion_tokens":1}}"#,
        )
        .unwrap();
        assert_eq!(
            (ok.text.as_str(), ok.prompt_tokens, ok.completion_tokens),
            ("hi", Some(5), Some(1))
        );
        assert!(parse_completion("<html>").unwrap_err().contains("not JSON"));
        assert!(
            parse_completion(r#"{"choices":[]}"#)
                .unwrap_err()
                .contains("no choices")
        );
        assert!(
            parse_completion(
                r#"{"choices":[{"message":{"content":null},"finish_reason":"content_filter"}]}"#
            )
            .unwrap_err()
            .contains("content_filter")
        );
    }
}
