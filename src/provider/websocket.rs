//! `provider: websocket` — a chat behind a WebSocket (RFC 6455): one connection per
//! attempt (opened with the configured headers and subprotocol, kept across the turns of
//! a multi-turn attack, closed when the attempt ends); each turn sends one text frame
//! filled from a template (`provider::http::template`: one pass, JSON-escaped) and
//! collects the frames that come back until a condition — a JSONPath test on a frame, a
//! number of frames, or a silence — then extracts the answer from them (JSONPath or regex
//! on each frame, the parts joined, as for a streamed HTTP answer). Secrets come from the
//! environment and go only to the configured origin; every frame sent is recorded in
//! `requests.jsonl`, credentials as `${VARIABLE}`.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message as Frame;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use super::http::config::{Extract, ExtractSpec, header_name, split_origin_of, url_text};
use super::http::plant::{CLOSE, OPEN, RunFiles, shown};
use super::http::template::{Escape, JsonTemplate, Name, Template, Values};
use super::{AttemptScope, CallError, Completion, Message, Provider};
use crate::error::{Error, Result};

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WebsocketSection {
    /// name → environment variable (`{{secret.<name>}}`), sent only to `url`'s origin.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub secrets: BTreeMap<String, String>,
    /// `ws://` or `wss://`; its origin literal, placeholders after it percent-encoded.
    pub url: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// `Sec-WebSocket-Protocol` asked for; the server must choose it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subprotocol: Option<String>,
    /// The frame of each turn: a structure is JSON (its string leaves templates), a
    /// string a text frame with its values as they are.
    pub send: Value,
    /// When the answer is complete.
    pub until: Until,
    /// Where the answer is in each frame (`json`, `regex` or `body: true`).
    pub answer: ExtractSpec,
}

/// One of: a frame whose `json` path equals `equals` (that frame is the last), a number
/// of `frames`, or `silence_s` seconds without a frame.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Until {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub equals: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frames: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub silence_s: Option<f64>,
}

enum Stop {
    Test(serde_json_path::JsonPath, Value),
    Frames(u32),
    Silence(Duration),
}

enum Send {
    Json(JsonTemplate),
    Text(Template),
}

struct Compiled {
    origin: String,
    path: Template,
    headers: Vec<(reqwest::header::HeaderName, Template)>,
    send: Send,
    stop: Stop,
    answer: Extract,
}

type Bad = (String, String);

impl WebsocketSection {
    fn compile(&self) -> std::result::Result<Compiled, Bad> {
        let url = Template::parse(&self.url).map_err(|m| ("url".to_owned(), m))?;
        let (origin, path) =
            split_origin_of(&url, "", &["ws", "wss"]).map_err(|(_, m)| ("url".to_owned(), m))?;
        let mut headers = Vec::new();
        for (h, v) in &self.headers {
            let key = format!("headers.{h}");
            let name = header_name(h, &key)?;
            let t = Template::parse(v).map_err(|m| (key.clone(), m))?;
            if reqwest::header::HeaderValue::from_str(&url_text(&t).replace(['{', '}'], ""))
                .is_err()
            {
                return Err((key, "not a valid header value".into()));
            }
            headers.push((name, t));
        }
        let send = match &self.send {
            Value::String(s) => Send::Text(Template::parse(s).map_err(|m| ("send".to_owned(), m))?),
            v => Send::Json(JsonTemplate::parse(v, "send")?),
        };
        let u = &self.until;
        let given = [u.json.is_some(), u.frames.is_some(), u.silence_s.is_some()]
            .iter()
            .filter(|b| **b)
            .count();
        let stop = match (given, u) {
            (
                1,
                Until {
                    json: Some(p),
                    equals: Some(v),
                    ..
                },
            ) => Stop::Test(
                serde_json_path::JsonPath::parse(p).map_err(|e| {
                    (
                        "until.json".to_owned(),
                        format!("not a JSONPath (RFC 9535): {e}"),
                    )
                })?,
                v.clone(),
            ),
            (1, Until { json: Some(_), .. }) => {
                return Err((
                    "until.equals".into(),
                    "the value the path must have on the last frame".into(),
                ));
            }
            (
                1,
                Until {
                    frames: Some(n), ..
                },
            ) if *n > 0 => Stop::Frames(*n),
            (
                1,
                Until {
                    silence_s: Some(s), ..
                },
            ) if s.is_finite() && *s > 0.0 && *s <= 600.0 => {
                Stop::Silence(Duration::from_secs_f64(*s))
            }
            _ => {
                return Err((
                    "until".into(),
                    "give one of {json: PATH, equals: VALUE}, {frames: N > 0}, {silence_s: S (0 < S <= 600)}".into(),
                ));
            }
        };
        let answer = self.answer.compile("answer")?;
        if matches!(answer, Extract::Header(_) | Extract::Cookie(_)) {
            return Err((
                "answer".into(),
                "a frame has no headers or cookies: json, regex or body".into(),
            ));
        }
        let names: Vec<Name> = url
            .names()
            .cloned()
            .chain(headers.iter().flat_map(|(_, t)| t.names().cloned()))
            .chain(match &send {
                Send::Json(j) => j.names().into_iter().cloned().collect::<Vec<_>>(),
                Send::Text(t) => t.names().cloned().collect(),
            })
            .collect();
        for n in &names {
            match n {
                Name::Var(_) => {
                    return Err((
                        "send".into(),
                        format!(
                            "{}: a WebSocket target has no steps that extract variables",
                            n.spelled()
                        ),
                    ));
                }
                Name::Secret(s) if !self.secrets.contains_key(s) => {
                    return Err((
                        "secrets".into(),
                        format!("{} is not one of `secrets`", n.spelled()),
                    ));
                }
                _ => {}
            }
        }
        for (name, env) in &self.secrets {
            let ok = !env.is_empty()
                && env.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                && !env.as_bytes()[0].is_ascii_digit();
            if !ok {
                return Err((
                    format!("secrets.{name}"),
                    "must be the NAME of an environment variable".into(),
                ));
            }
        }
        Ok(Compiled {
            origin,
            path,
            headers,
            send,
            stop,
            answer,
        })
    }

    /// Whether a template names the attempt's world (`{{world.*}}`, `model.world`).
    pub fn uses_world(&self) -> bool {
        self.compile().is_ok_and(|c| {
            let mut names: Vec<&Name> = c.path.names().collect();
            names.extend(c.headers.iter().flat_map(|(_, t)| t.names()));
            match &c.send {
                Send::Json(j) => names.extend(j.names()),
                Send::Text(t) => names.extend(t.names()),
            }
            names.iter().any(|n| matches!(n, Name::World(_)))
        })
    }

    /// Rules serde cannot express: (key under `websocket.`, message).
    pub fn check(&self) -> std::result::Result<(), Bad> {
        self.compile().map(|_| ())
    }

    /// The origin it connects to (confirmed before a received run calls it).
    pub fn origin(&self) -> Option<String> {
        self.compile().ok().map(|c| c.origin)
    }
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

pub struct WebsocketProvider {
    spec: Compiled,
    subprotocol: Option<String>,
    secrets: BTreeMap<String, (String, String)>,
    seed: u64,
    timeout: Duration,
    max_retries: u32,
    pacing: super::transport::Pacing,
    /// Each attempt's connection, while it runs.
    conns: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Socket>>>>,
    run: Mutex<Option<Arc<RunFiles>>>,
}

struct Fill<'a> {
    p: &'a WebsocketProvider,
    scope: &'a AttemptScope,
    messages: &'a [Message],
    turn: u32,
    record: bool,
}

impl Values for Fill<'_> {
    fn value(&self, name: &Name) -> std::result::Result<Value, String> {
        let clean = |s: &str| {
            if self.record {
                s.replace([OPEN, CLOSE], "\u{FFFD}")
            } else {
                s.to_owned()
            }
        };
        Ok(match name {
            Name::Prompt => json!(clean(
                self.messages
                    .iter()
                    .rev()
                    .find(|m| m.role == "user")
                    .map_or("", |m| m.content.as_str())
            )),
            Name::Context => json!(clean(
                self.messages
                    .iter()
                    .find(|m| m.role == "system")
                    .map_or("", |m| m.content.as_str())
            )),
            Name::Messages => serde_json::from_str(&clean(
                &serde_json::to_string(self.messages).unwrap_or_default(),
            ))
            .unwrap_or(Value::Null),
            Name::Turn => json!(self.turn),
            Name::Tools => json!([]),
            Name::Payload => json!(clean(self.scope.payload.as_deref().unwrap_or_default())),
            Name::Task => json!(clean(self.scope.task.as_deref().unwrap_or_default())),
            Name::CaseId => json!(clean(&self.scope.case_id)),
            Name::Role => json!(self.scope.role.unwrap_or_default()),
            Name::AttemptId => json!(clean(&self.scope.key)),
            Name::Seed => json!(self.p.seed),
            Name::World(w) => json!(w.value(self.scope, self.record)?),
            Name::Secret(k) => {
                let (var, value) = self
                    .p
                    .secrets
                    .get(k)
                    .ok_or_else(|| format!("no secret {k}"))?;
                if self.record {
                    json!(format!("{OPEN}{var}{CLOSE}"))
                } else {
                    json!(value)
                }
            }
            Name::Var(v) => return Err(format!("no variable {v}")),
        })
    }
}

impl WebsocketProvider {
    pub fn new(model: &super::config::ModelSection, seed: u64) -> Result<Self> {
        let section = model.websocket.as_ref().ok_or_else(|| {
            Error::State("provider websocket needs the model.websocket section".into())
        })?;
        let spec = section
            .compile()
            .map_err(|(k, m)| Error::State(format!("model.websocket.{k}: {m}")))?;
        let mut secrets = BTreeMap::new();
        for (name, var) in &section.secrets {
            let v = crate::secrets::from_env(&format!("model.websocket.secrets.{name}"), var)?;
            secrets.insert(name.clone(), (var.clone(), v));
        }
        Ok(Self {
            spec,
            subprotocol: section.subprotocol.clone(),
            secrets,
            seed,
            timeout: Duration::from_secs_f64(model.timeout_s),
            max_retries: model.max_retries,
            pacing: super::transport::Pacing::new(model.requests_per_minute),
            conns: Mutex::new(HashMap::new()),
            run: Mutex::new(None),
        })
    }

    fn render_url(&self, fill: &Fill) -> std::result::Result<String, String> {
        Ok(format!(
            "{}{}",
            self.spec.origin,
            self.spec.path.render(fill, Escape::Url)?
        ))
    }

    fn render_frame(&self, fill: &Fill) -> std::result::Result<String, String> {
        match &self.spec.send {
            Send::Json(j) => Ok(j.render(fill)?.to_string()),
            Send::Text(t) => t.render(fill, Escape::Plain),
        }
    }

    /// Open the attempt's connection.
    async fn connect(
        &self,
        fill: &Fill<'_>,
    ) -> std::result::Result<Socket, super::transport::TryError> {
        let url = self
            .render_url(fill)
            .map_err(|m| (format!("url: {m}"), false, None))?;
        let mut req = url
            .as_str()
            .into_client_request()
            .map_err(|e| (format!("not a WebSocket URL: {e}"), false, None))?;
        for (k, t) in &self.spec.headers {
            let v = t
                .render(fill, Escape::Header)
                .map_err(|m| (format!("headers.{k}: {m}"), false, None))?;
            let v = tokio_tungstenite::tungstenite::http::HeaderValue::from_str(&v)
                .map_err(|_| (format!("headers.{k}: not a header value"), false, None))?;
            let name =
                tokio_tungstenite::tungstenite::http::HeaderName::from_bytes(k.as_str().as_bytes())
                    .map_err(|_| (format!("headers.{k}: not a header name"), false, None))?;
            req.headers_mut().insert(name, v);
        }
        if let Some(p) = &self.subprotocol {
            let v = tokio_tungstenite::tungstenite::http::HeaderValue::from_str(p)
                .map_err(|_| ("subprotocol: not a header value".to_owned(), false, None))?;
            req.headers_mut().insert("sec-websocket-protocol", v);
        }
        let connected =
            tokio::time::timeout(self.timeout, tokio_tungstenite::connect_async(req)).await;
        match connected {
            Err(_) => Err(("connecting timed out".into(), true, None)),
            Ok(Err(e)) => {
                use tokio_tungstenite::tungstenite::Error as E;
                let (retry, after) = match &e {
                    E::Http(resp) => {
                        let code = resp.status().as_u16();
                        let after = resp
                            .headers()
                            .get("retry-after")
                            .and_then(|v| v.to_str().ok())
                            .and_then(super::openai::parse_retry_after);
                        (matches!(code, 408 | 429) || code >= 500, after)
                    }
                    E::Io(_) => (true, None),
                    _ => (false, None),
                };
                Err((
                    format!(
                        "connection failed: {}",
                        crate::secrets::redact(&e.to_string()).0
                    ),
                    retry,
                    after,
                ))
            }
            Ok(Ok((socket, resp))) => {
                if let Some(p) = &self.subprotocol {
                    let chosen = resp
                        .headers()
                        .get("sec-websocket-protocol")
                        .and_then(|v| v.to_str().ok());
                    if chosen != Some(p.as_str()) {
                        return Err((
                            format!(
                                "the server did not choose the subprotocol {p:?} (it said {chosen:?})"
                            ),
                            false,
                            None,
                        ));
                    }
                }
                Ok(socket)
            }
        }
    }

    /// Collect the answer's frames after a frame is sent.
    async fn collect(
        &self,
        socket: &mut Socket,
    ) -> std::result::Result<(Vec<String>, bool), String> {
        let deadline = Instant::now() + self.timeout;
        let mut frames: Vec<String> = Vec::new();
        let mut size = 0usize;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let wait = match &self.spec.stop {
                Stop::Silence(s) => (*s).min(left),
                _ => left,
            };
            let next = tokio::time::timeout(wait, socket.next()).await;
            let frame = match next {
                Err(_) => {
                    if matches!(self.spec.stop, Stop::Silence(_)) && Instant::now() < deadline {
                        return Ok((frames, true));
                    }
                    return Err(format!(
                        "no complete answer within {} s ({} frames)",
                        self.timeout.as_secs_f64(),
                        frames.len()
                    ));
                }
                Ok(None) => {
                    return Err(format!(
                        "the server closed the connection mid-answer (after {} frames)",
                        frames.len()
                    ));
                }
                Ok(Some(Err(e))) => {
                    return Err(format!(
                        "the connection failed mid-answer (after {} frames): {e}",
                        frames.len()
                    ));
                }
                Ok(Some(Ok(f))) => f,
            };
            let text = match frame {
                Frame::Text(t) => t.as_str().to_owned(),
                Frame::Binary(b) => String::from_utf8_lossy(&b).into_owned(),
                Frame::Close(c) => {
                    return Err(format!(
                        "the server closed the connection mid-answer (after {} frames{})",
                        frames.len(),
                        c.map(|c| format!(", {} {}", u16::from(c.code), c.reason))
                            .unwrap_or_default()
                    ));
                }
                // pings are answered by the library; pongs and raw frames are not answers
                _ => continue,
            };
            size += text.len();
            if size > super::MAX_BODY_BYTES {
                return Err(format!(
                    "the answer's frames exceed {} MiB",
                    super::MAX_BODY_BYTES >> 20
                ));
            }
            let text = crate::secrets::redact(&text).0.into_owned();
            frames.push(text);
            let last = frames.last().expect("pushed");
            let done = match &self.spec.stop {
                Stop::Frames(n) => frames.len() >= *n as usize,
                Stop::Test(path, want) => serde_json::from_str::<Value>(last)
                    .ok()
                    .is_some_and(|v| path.query(&v).first() == Some(want)),
                Stop::Silence(_) => false,
            };
            if done {
                return Ok((frames, false));
            }
        }
    }

    fn answer(&self, frames: &[String]) -> std::result::Result<String, String> {
        let mut out = String::new();
        let mut found = false;
        for (i, f) in frames.iter().enumerate() {
            match &self.spec.answer {
                Extract::Json(path, _) => {
                    let Ok(v) = serde_json::from_str::<Value>(f) else {
                        return Err(format!(
                            "frame {} is not JSON: {}",
                            i + 1,
                            crate::text::excerpt(f, 120)
                        ));
                    };
                    match path.query(&v).first() {
                        Some(Value::String(s)) => {
                            out.push_str(s);
                            found = true;
                        }
                        Some(Value::Null) | None => {}
                        Some(other) => {
                            out.push_str(&other.to_string());
                            found = true;
                        }
                    }
                }
                Extract::Regex(re) => {
                    if let Some(c) = re.captures(f) {
                        let g = if re.captures_len() > 1 {
                            c.get(1)
                        } else {
                            c.get(0)
                        };
                        out.push_str(g.map_or("", |m| m.as_str()));
                        found = true;
                    }
                }
                _ => {
                    out.push_str(f);
                    found = true;
                }
            }
        }
        if !found {
            let spelled = match &self.spec.answer {
                Extract::Json(_, s) => s.clone(),
                Extract::Regex(re) => format!("/{}/", re.as_str()),
                _ => "the answer".into(),
            };
            return Err(format!(
                "{spelled} matches nothing in the {} frames: {}",
                frames.len(),
                crate::text::excerpt(&frames.join(" | "), 160)
            ));
        }
        Ok(out)
    }

    async fn turn(
        &self,
        scope: &Arc<AttemptScope>,
        messages: &[Message],
    ) -> std::result::Result<(String, u32), CallError> {
        let start = Instant::now();
        let turn = {
            let mut st = scope.state();
            st.turn += 1;
            st.turn
        };
        let fill = Fill {
            p: self,
            scope,
            messages,
            turn,
            record: false,
        };
        let fail = |message: String, attempts: u32| CallError {
            message,
            latency_ms: start.elapsed().as_secs_f64() * 1e3,
            attempts,
        };
        let frame = self
            .render_frame(&fill)
            .map_err(|m| fail(format!("send: {m}"), 0))?;
        // the attempt's connection, opened on its first turn (with retries); a turn whose
        // messages hold no earlier answer starts a conversation (a PAIR or TAP query is
        // sent in a fresh one), so it gets a connection of its own
        let fresh = !messages.iter().any(|m| m.role == "assistant");
        let existing = if fresh {
            None
        } else {
            self.conns
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&scope.key)
                .cloned()
        };
        let (conn, tries) = match existing {
            Some(c) => (c, 1),
            None => {
                let (socket, _, tries) =
                    super::transport::with_retries(self.max_retries, &self.pacing, || {
                        self.connect(&fill)
                    })
                    .await
                    .map_err(|e| fail(e.message, e.attempts))?;
                let c = Arc::new(tokio::sync::Mutex::new(socket));
                self.conns
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(scope.key.clone(), Arc::clone(&c));
                (c, tries)
            }
        };
        let files = self.run.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(files) = &files {
            let shown_fill = Fill {
                record: true,
                ..fill
            };
            files.record(&json!({
                "attempt_id": scope.key,
                "case_id": scope.case_id,
                "phase": "request",
                "step": "websocket",
                "url": self.render_url(&shown_fill).map(|u| shown(&u).into_owned()).ok(),
                "frame": self.render_frame(&shown_fill).map(|f| shown(&f).into_owned()).ok(),
                "turn": turn,
            }));
        }
        let mut socket = conn.lock().await;
        socket
            .send(Frame::text(frame))
            .await
            .map_err(|e| fail(format!("the frame could not be sent: {e}"), tries))?;
        let (frames, _) = self
            .collect(&mut socket)
            .await
            .map_err(|m| fail(m, tries))?;
        let text = self
            .answer(&frames)
            .map_err(|m| fail(format!("answer: {m}"), tries))?;
        Ok((text, tries))
    }
}

#[async_trait]
impl Provider for WebsocketProvider {
    fn name(&self) -> &str {
        "websocket"
    }

    async fn open_run(&self, dir: &Path, _note: super::Notes) -> Result<()> {
        *self.run.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(RunFiles::open(dir)?));
        Ok(())
    }

    async fn end(&self, scope: &Arc<AttemptScope>) {
        let conn = self
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&scope.key);
        if let Some(c) = conn {
            let mut s = c.lock().await;
            let _ = tokio::time::timeout(Duration::from_secs(2), s.close(None)).await;
        }
    }

    async fn close_run(&self) -> Option<String> {
        let conns: Vec<_> = self
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .map(|(_, c)| c)
            .collect();
        for c in conns {
            if let Ok(mut s) = c.try_lock() {
                let _ = tokio::time::timeout(Duration::from_secs(2), s.close(None)).await;
            }
        }
        if let Some(f) = self.run.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            f.flush();
        }
        None
    }

    async fn complete(
        &self,
        case_id: &str,
        messages: &[Message],
    ) -> std::result::Result<Completion, CallError> {
        let start = Instant::now();
        let scope = super::ATTEMPT
            .try_with(Arc::clone)
            .unwrap_or_else(|_| Arc::new(AttemptScope::bare(case_id)));
        let result = self.turn(&scope, messages).await;
        if result.is_err() {
            // a connection that failed mid-answer is not used again
            let conn = self
                .conns
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&scope.key);
            drop(conn);
        }
        let (text, attempts) = result?;
        Ok(super::AgentTurn::answer(
            text,
            start.elapsed().as_secs_f64() * 1e3,
            attempts,
        ))
    }
}
