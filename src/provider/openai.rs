//! OpenAI-compatible chat completions over HTTP (tokio + reqwest).
//!
//! Retries: timeouts, connection failures, HTTP 408 / 409 / 429 / 5xx and unparseable
//! bodies are retried up to `max_retries` times. The wait before retry `n` (from 0) is a
//! random duration in `[0, min(30 s, 0.5 s · 2ⁿ)]` ("full jitter"), or the server's
//! `Retry-After` (seconds or an HTTP date, at most 5 minutes) when it sends one. Other
//! 4xx answers (a bad key, an unknown model) and redirects (never followed) fail at
//! once. The API key is read from the
//! environment variable the config names, sent only in the `Authorization` header, and
//! redacted from every message this module returns.

use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use serde_json::{Value, json};
use tokio::sync::Mutex;

use super::Message;
use super::config::ModelSection;
use super::{AgentTurn, CallError, Completion, Provider, ToolCall};
use crate::error::{Error, Result};

const MAX_BACKOFF: Duration = Duration::from_secs(30);
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
    /// Requests-per-minute limit: the earliest instant the next request may start.
    pacing: Option<(Duration, Mutex<Instant>)>,
}

impl OpenAiProvider {
    pub fn new(model: &ModelSection, seed: u64) -> Result<Self> {
        let api_key = match &model.api_key_env {
            None => None,
            Some(var) => match std::env::var(var) {
                Ok(k) if !k.trim().is_empty() => Some(k.trim().to_owned()),
                _ => {
                    return Err(Error::State(format!(
                        "api_key_env names {var}, but that environment variable is not set: export {var}=<your key> (the key is never written to any artifact)"
                    )));
                }
            },
        };
        // Redacted from every text of every client from now on, in any spelling.
        if let Some(k) = &api_key {
            crate::secrets::register(k);
        }
        let base = model.base_url.as_deref().unwrap_or_default();
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs_f64(model.timeout_s))
            .connect_timeout(Duration::from_secs_f64(model.timeout_s.min(10.0)))
            .pool_max_idle_per_host(model.concurrency)
            .user_agent(concat!("pieval/", env!("CARGO_PKG_VERSION")))
            // Never follow a redirect: the key goes only to the configured origin, on
            // every hop (reqwest strips it on a cross-host hop, but a chain that comes
            // back to one host would carry it again). A 3xx is the case's error.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| Error::Internal(format!("cannot build the HTTP client: {e}")))?;
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
            pacing: model.requests_per_minute.map(|rpm| {
                (
                    Duration::from_secs_f64(60.0 / f64::from(rpm)),
                    Mutex::new(Instant::now()),
                )
            }),
        })
    }

    /// Text with every registered key, in any spelling, redacted (`crate::secrets`).
    fn redact(&self, s: &str) -> String {
        crate::secrets::redact(s).0.into_owned()
    }

    /// Wait for this request's slot under the requests-per-minute limit.
    async fn pace(&self) {
        if let Some((interval, next)) = &self.pacing {
            let slot = {
                let mut next = next.lock().await;
                let now = Instant::now();
                let slot = (*next).max(now);
                *next = slot + *interval;
                slot
            };
            tokio::time::sleep_until(slot.into()).await;
        }
    }

    /// One attempt: the answer's body (every key redacted, in any spelling) and whether
    /// anything was, or Err(message, retryable, retry_after).
    async fn attempt(
        &self,
        body: &Value,
    ) -> Result<(String, bool), (String, bool, Option<Duration>)> {
        let mut req = self.client.post(&self.url).json(body);
        if let Some(k) = &self.api_key {
            req = req.bearer_auth(k);
        }
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) => {
                let what = if e.is_timeout() {
                    "timed out".to_owned()
                } else if e.is_connect() {
                    format!("connection failed: {}", crate::text::error_chain(&e))
                } else {
                    format!("request failed: {}", crate::text::error_chain(&e))
                };
                return Err((what, true, None));
            }
        };
        let status = resp.status();
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_retry_after);
        let location = resp
            .headers()
            .get(reqwest::header::LOCATION)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        // Read at most MAX_BODY_BYTES: an endpoint cannot make the run hold more.
        let mut resp = resp;
        let mut body: Vec<u8> = Vec::new();
        loop {
            match resp.chunk().await {
                Ok(Some(chunk)) => {
                    if body.len() + chunk.len() > super::MAX_BODY_BYTES {
                        return Err((
                            format!(
                                "the response body exceeds {} MiB; it was not read",
                                super::MAX_BODY_BYTES >> 20
                            ),
                            false,
                            None,
                        ));
                    }
                    body.extend_from_slice(&chunk);
                }
                Ok(None) => break,
                Err(e) => {
                    let what = if e.is_timeout() {
                        "timed out reading the response".to_owned()
                    } else {
                        format!(
                            "the response body could not be read: {}",
                            crate::text::error_chain(&e)
                        )
                    };
                    return Err((what, true, retry_after));
                }
            }
        }
        // Redacted before anything is cut or parsed: an excerpt never holds part of the
        // key.
        let (text, redacted) = {
            let raw = String::from_utf8_lossy(&body);
            let (t, r) = crate::secrets::redact(&raw);
            (t.into_owned(), r)
        };
        if status.is_redirection() {
            let to = location.as_deref().map_or_else(
                || "no Location".to_owned(),
                |l| format!("to {}", crate::text::excerpt(&self.redact(l), 200)),
            );
            return Err((
                format!(
                    "HTTP {} redirect {to}: pieval does not follow redirects (the key is sent only to the configured base_url); set base_url to the address that answers",
                    status.as_u16()
                ),
                false,
                None,
            ));
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
                retry_after,
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
        let start = Instant::now();
        let mut attempts = 0;
        loop {
            self.pace().await;
            attempts += 1;
            match self
                .attempt(body)
                .await
                .and_then(|(text, redacted)| parse(&text, redacted).map_err(|m| (m, true, None)))
            {
                Ok(answer) => return Ok((answer, start.elapsed().as_secs_f64() * 1e3, attempts)),
                Err((message, retryable, retry_after)) => {
                    if !retryable || attempts > self.max_retries {
                        let tried = if attempts > 1 {
                            format!(" (after {attempts} attempts)")
                        } else {
                            String::new()
                        };
                        return Err(CallError {
                            message: self.redact(&format!("{message}{tried}")),
                            latency_ms: start.elapsed().as_secs_f64() * 1e3,
                            attempts,
                        });
                    }
                    let wait = retry_after.unwrap_or_else(|| backoff(attempts - 1));
                    tokio::time::sleep(wait).await;
                }
            }
        }
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
    let mut tool_calls = Vec::new();
    if let Some(calls) = message.get("tool_calls").filter(|c| !c.is_null()) {
        let calls = calls
            .as_array()
            .ok_or("malformed response (tool_calls is not a list)")?;
        for (i, c) in calls.iter().enumerate() {
            let name = c
                .pointer("/function/name")
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    format!("malformed response (tool_calls[{i}] has no function.name)")
                })?;
            let arguments = match c.pointer("/function/arguments") {
                Some(Value::String(s)) => s.clone(),
                None | Some(Value::Null) => String::new(),
                Some(other) => other.to_string(),
            };
            let id = c
                .get("id")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map_or_else(|| format!("call_{}", i + 1), str::to_owned);
            tool_calls.push(ToolCall {
                id,
                name: name.to_owned(),
                arguments,
            });
        }
    }
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

/// Full-jitter exponential backoff for retry `n` (from 0).
fn backoff(n: u32) -> Duration {
    let cap = Duration::from_millis(500)
        .saturating_mul(1u32 << n.min(16))
        .min(MAX_BACKOFF);
    cap.mul_f64(fastrand::f64())
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
        let ((mut turn, mut redacted), latency_ms, attempts) = self
            .send(&body, |text, redacted| {
                parse_agent_turn(text).map(|t| (t, redacted))
            })
            .await?;
        // What was parsed, redacted again (a key its parts only make when joined).
        let mut again = |s: &mut String| {
            let (t, r) = crate::secrets::redact(s);
            if r {
                *s = t.into_owned();
                redacted = true;
            }
        };
        if let Some(text) = &mut turn.content {
            again(text);
        }
        for call in &mut turn.tool_calls {
            again(&mut call.arguments);
            again(&mut call.name);
            again(&mut call.id);
        }
        let c = &mut turn.completion;
        c.redacted = redacted;
        if let Some(text) = &mut turn.content {
            c.truncated = super::cap_response(text);
        }
        c.latency_ms = latency_ms;
        c.attempts = attempts;
        Ok(turn)
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

    #[test]
    fn backoff_is_bounded() {
        for n in 0..40 {
            assert!(backoff(n) <= MAX_BACKOFF);
        }
    }
}
