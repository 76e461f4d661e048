//! `provider: http` — an application behind its own HTTP API (a support bot, a RAG
//! service), described as data in `model.http` ([`config::HttpSection`]).
//!
//! Each attempt: the `session` steps (log in, open a conversation; a cookie jar of its
//! own), the `setup` steps (plant the case's payload where the application reads it),
//! the request of every turn (its `answer` extracted by JSONPath or a regex; streamed
//! answers assembled), then the `teardown` steps — whatever happened: a failed request,
//! an interrupted run. What setup planted is journaled in the run folder
//! ([`plant::Journal`]) before and after, so a killed run's plants are removed by
//! `--resume` or `pieval cleanup`. Every HTTP call is recorded as sent, credentials
//! replaced by their environment variable's name, with a curl command that repeats it
//! (`requests.jsonl`).

pub mod config;
pub mod plant;
pub mod template;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde_json::{Value, json};

use self::config::{Body, Compiled, Extract, Phase, Step, StreamKind};
use self::template::{Escape, Name, Values};
use super::transport::{self, Pacing, TryError};
use super::{AttemptScope, CallError, Completion, Message, Provider};
use crate::error::{Error, Result};

pub use config::HttpSection;

pub struct HttpProvider {
    client: reqwest::Client,
    spec: Compiled,
    /// secret name → (environment variable, value)
    secrets: BTreeMap<String, (String, String)>,
    seed: u64,
    max_retries: u32,
    pacing: Pacing,
    /// The run's journal and request log, once the run folder is known.
    run: Mutex<Option<Arc<plant::RunFiles>>>,
    /// Attempts set up and not yet torn down (an interruption tears them down).
    open: Mutex<BTreeMap<String, Arc<AttemptScope>>>,
    counts: Mutex<plant::Counts>,
}

impl HttpProvider {
    pub fn new(model: &super::config::ModelSection, seed: u64) -> Result<Self> {
        let section = model
            .http
            .as_ref()
            .ok_or_else(|| Error::State("provider http needs the model.http section".into()))?;
        let spec = section
            .compile()
            .map_err(|(k, m)| Error::State(format!("model.http.{k}: {m}")))?;
        let mut secrets = BTreeMap::new();
        for (name, var) in &spec.secrets {
            let v = crate::secrets::from_env(&format!("model.http.secrets.{name}"), var)?;
            secrets.insert(name.clone(), (var.clone(), v));
        }
        // a credential written out in a header (a raw request's saved Authorization or
        // Cookie) is a secret like the environment's: never recorded
        for step in spec
            .session
            .iter()
            .chain(&spec.setup)
            .chain(std::iter::once(&spec.request))
            .chain(&spec.teardown)
        {
            for (name, t) in &step.headers {
                let sensitive = matches!(
                    name.as_str(),
                    "authorization" | "proxy-authorization" | "cookie" | "x-api-key" | "api-key"
                );
                if sensitive && t.names().next().is_none() {
                    let literal = t.literal_prefix();
                    crate::secrets::register(literal);
                    if let Some(last) = literal.split_whitespace().last() {
                        crate::secrets::register(last);
                    }
                    for pair in literal.split(';') {
                        if let Some((_, v)) = pair.split_once('=') {
                            crate::secrets::register(v.trim());
                        }
                    }
                }
            }
        }
        Ok(Self {
            client: transport::client(model.timeout_s, model.concurrency)?,
            spec,
            secrets,
            seed,
            max_retries: model.max_retries,
            pacing: Pacing::new(model.requests_per_minute),
            run: Mutex::new(None),
            open: Mutex::new(BTreeMap::new()),
            counts: Mutex::new(plant::Counts::default()),
        })
    }

    fn files(&self) -> Option<Arc<plant::RunFiles>> {
        self.run.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Run `steps` in order; the first failure stops them.
    async fn steps(&self, steps: &[Step], scope: &AttemptScope) -> std::result::Result<(), String> {
        for step in steps {
            self.call(step, scope, None).await.map_err(|e| e.message)?;
        }
        Ok(())
    }

    /// One step or request, with retries; the answer's text for the request.
    async fn call(
        &self,
        step: &Step,
        scope: &AttemptScope,
        turn: Option<&Turn<'_>>,
    ) -> std::result::Result<(Answer, f64, u32), CallError> {
        let fill = Fill {
            provider: self,
            scope,
            turn,
            phase: step.phase,
            record: false,
        };
        let shown = Fill {
            record: true,
            ..fill
        };
        let sent = render(step, &fill).map_err(|m| CallError {
            message: format!("{} {}: {m}", step.phase.as_str(), step.name),
            latency_ms: 0.0,
            attempts: 0,
        })?;
        // The request as recorded: credentials as the names of what holds them. A step
        // with no credential whose request holds no mark is recorded as it was sent.
        let credentialed = step.names().into_iter().any(|n| {
            matches!(n, Name::Secret(_))
                || matches!(n, Name::Var(v) if self.spec.secret_vars.contains(v))
        });
        let recorded = if credentialed || sent.has_marks() {
            render(step, &shown).ok().map(Cow::Owned)
        } else {
            Some(Cow::Borrowed(&sent))
        }
        .map(|mut r| {
            // the jar's cookies, each as the variable a person replaying it sets
            if let Some(c) = recorded_cookies(scope, &step.origin) {
                r.to_mut().headers.push(("cookie".into(), c));
            }
            r
        });
        // A setup step that creates something (POST, PATCH) is tried again only when
        // the server cannot have acted on it (no connection; 429): a timeout or a 5xx
        // after it was sent may have planted it once already, and the second id would
        // be the only one removed.
        let careful = step.phase == Phase::Setup
            && !matches!(
                step.method,
                reqwest::Method::GET
                    | reqwest::Method::HEAD
                    | reqwest::Method::PUT
                    | reqwest::Method::DELETE
                    | reqwest::Method::OPTIONS
            );
        let (result, latency_ms, attempts) =
            match transport::with_retries(self.max_retries, &self.pacing, || async {
                self.once(step, &sent, scope)
                    .await
                    .map_err(|(m, retry, after)| {
                        let safe = !careful
                            || m.starts_with("connection failed")
                            || m.starts_with("HTTP 429");
                        (m, retry && safe, after)
                    })
            })
            .await
            {
                Ok((answer, l, a)) => (Ok(answer), l, a),
                Err(e) => (Err(self.scrub(scope, &e.message)), e.latency_ms, e.attempts),
            };
        if let (Some(files), Some(r)) = (self.files(), recorded) {
            let logged = result
                .as_ref()
                .map(|a| a.text.clone())
                .map_err(Clone::clone);
            files.request(scope, step, &r, &logged, latency_ms, attempts);
        }
        match result {
            Ok(answer) => Ok((answer, latency_ms, attempts)),
            Err(m) => Err(CallError {
                message: format!("{} {}: {m}", step.phase.as_str(), step.name),
                latency_ms,
                attempts,
            }),
        }
    }

    /// `text` with the attempt's credentials (the variables marked `secret`, the
    /// cookies its jar holds) replaced: they are the attempt's own, not registered with
    /// the run's redactor.
    fn scrub(&self, scope: &AttemptScope, text: &str) -> String {
        let st = scope.state();
        let mut out = text.to_owned();
        let values = self
            .spec
            .secret_vars
            .iter()
            .filter_map(|v| st.vars.get(v))
            .chain(st.cookies.values());
        for v in values {
            if v.len() >= 8 && out.contains(v.as_str()) {
                out = out.replace(v.as_str(), crate::secrets::REDACTED);
            }
        }
        out
    }

    /// One try: send, check the status, extract the step's variables (and the answer).
    async fn once(
        &self,
        step: &Step,
        sent: &Rendered,
        scope: &AttemptScope,
    ) -> std::result::Result<Answer, TryError> {
        let mut req = self.client.request(step.method.clone(), &sent.url);
        for (k, v) in &sent.headers {
            req = req.header(k, v);
        }
        // the attempt's W3C trace context (its spans are joined to it), unless the
        // request sets its own
        if let Some(t) = &scope.traceparent
            && !sent
                .headers
                .iter()
                .any(|(k, _)| k.as_str().eq_ignore_ascii_case("traceparent"))
        {
            req = req.header("traceparent", t);
        }
        let cookies = scope.cookie_header(&step.origin);
        if let Some(c) = &cookies {
            req = req.header(reqwest::header::COOKIE, c);
        }
        if let Some(b) = &sent.body {
            req = req.body(b.clone());
        }
        let resp = transport::send(req).await?;
        let head = transport::head(&resp);
        let body = transport::read_body(resp, head.retry_after).await?;
        let text = {
            let raw = String::from_utf8_lossy(&body);
            crate::secrets::redact(&raw).0.into_owned()
        };
        let status = head.status.as_u16();
        if head.status.is_redirection() && !step.ok_status.contains(&status) {
            return Err(transport::redirect_error(&head, "url"));
        }
        if !head.status.is_success() && !step.ok_status.contains(&status) {
            return Err((
                format!("HTTP {status}: {}", crate::text::excerpt(text.trim(), 200)),
                self.spec.retry_status.contains(&status),
                head.retry_after,
            ));
        }
        for v in head.headers.get_all(reqwest::header::SET_COOKIE) {
            scope.set_cookie(&step.origin, &String::from_utf8_lossy(v.as_bytes()));
        }
        let mut vars = Vec::new();
        for (name, how, _) in &step.extract {
            let v = extract(how, &head.headers, &text, scope, &step.origin)
                .map_err(|m| (format!("extract {name}: {m}"), false, None))?;
            vars.push((name.clone(), v));
        }
        // an agent's tool calls, where the answer carries them (an answer that only
        // calls tools may have no text)
        let tool_calls = match &step.tool_calls {
            None => Vec::new(),
            Some(path) => {
                let v: Value = serde_json::from_str(&text).map_err(|e| {
                    (
                        format!(
                            "tool_calls: the answer is not JSON ({e}): {}",
                            crate::text::excerpt(text.trim(), 120)
                        ),
                        false,
                        None,
                    )
                })?;
                match path.query(&v).first() {
                    None | Some(Value::Null) => Vec::new(),
                    Some(list) => super::tool_calls_of(list)
                        .map_err(|m| (format!("tool_calls: {m}"), false, None))?,
                }
            }
        };
        let answer = match (&step.answer, step.stream) {
            (None, _) => None,
            (Some(how), None) => match extract(how, &head.headers, &text, scope, &step.origin) {
                Ok(a) => Some(a),
                Err(_) if !tool_calls.is_empty() => None,
                Err(m) => return Err((format!("answer: {m}"), false, None)),
            },
            (Some(how), Some(kind)) => Some(
                assemble(how, kind, &text).map_err(|m| (format!("answer: {m}"), false, None))?,
            ),
        };
        scope.set_vars(vars);
        Ok(Answer {
            text: answer,
            tool_calls,
        })
    }

    /// Tear down an attempt: its steps, the journal's line, the counts.
    async fn teardown(&self, scope: &AttemptScope) {
        let planted = scope.state().journaled;
        let result = self.steps(&self.spec.teardown, scope).await;
        let mut st = scope.state();
        match &result {
            Ok(()) => st.removed = Some(true),
            Err(m) => {
                st.removed = Some(false);
                st.cleanup_error = Some(m.clone());
            }
        }
        drop(st);
        if planted {
            if let Some(files) = self.files() {
                files.journal_end(scope, result.as_ref().err().map(String::as_str));
            }
            let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
            c.removed += u64::from(result.is_ok());
            c.left += u64::from(result.is_err());
        }
    }
}

/// What a call brought back: the answer's text and an agent's tool calls.
struct Answer {
    text: Option<String>,
    tool_calls: Vec<super::ToolCall>,
}

/// A turn's values: the conversation and the tools offered, in the OpenAI form.
struct Turn<'a> {
    messages: &'a [Value],
    tools: &'a [Value],
    number: u32,
    /// The conversation starts here (its messages hold no earlier answer: a first turn,
    /// or a PAIR / TAP query, each sent in a fresh conversation): what the request
    /// itself extracts (a conversation id) renders as not yet set.
    fresh: bool,
}

impl Turn<'_> {
    /// The text of the last message of `role` (the first, for the system's).
    fn text_of(&self, role: &str, last: bool) -> Value {
        let mut it = self.messages.iter().filter(|m| m["role"] == role);
        let m = if last { it.next_back() } else { it.next() };
        json!(m.and_then(|m| m["content"].as_str()).unwrap_or(""))
    }
}

/// The values of a step's templates.
#[derive(Clone, Copy)]
struct Fill<'a> {
    provider: &'a HttpProvider,
    scope: &'a AttemptScope,
    turn: Option<&'a Turn<'a>>,
    phase: Phase,
    /// For the request log: credentials as the name of what holds them.
    record: bool,
}

impl Values for Fill<'_> {
    fn value(&self, name: &Name) -> std::result::Result<Value, String> {
        let v = self.raw_value(name)?;
        if !self.record || matches!(name, Name::Secret(_) | Name::World(_)) {
            return Ok(v);
        }
        // only a credential's place holds the marks (a value cannot forge one)
        Ok(match v {
            Value::String(s)
                if s.contains([plant::OPEN, plant::CLOSE]) && !self.is_secret_var(name) =>
            {
                Value::String(s.replace([plant::OPEN, plant::CLOSE], "\u{FFFD}"))
            }
            Value::Array(_) | Value::Object(_) => {
                let t = v.to_string();
                if t.contains([plant::OPEN, plant::CLOSE]) {
                    serde_json::from_str(&t.replace([plant::OPEN, plant::CLOSE], "\u{FFFD}"))
                        .unwrap_or(v)
                } else {
                    v
                }
            }
            other => other,
        })
    }
}

impl Fill<'_> {
    /// A variable the request itself extracts (a conversation id), while rendering it.
    fn request_sets(&self, v: &str) -> bool {
        self.phase == Phase::Request
            && self
                .provider
                .spec
                .request
                .extract
                .iter()
                .any(|(n, _, _)| n == v)
    }

    fn is_secret_var(&self, name: &Name) -> bool {
        matches!(name, Name::Var(v) if self.provider.spec.secret_vars.contains(v))
    }

    fn raw_value(&self, name: &Name) -> std::result::Result<Value, String> {
        let s = self.scope;
        let turn = |f: &dyn Fn(&Turn) -> Value| {
            self.turn
                .map(f)
                .ok_or_else(|| format!("{} is a turn's value", name.spelled()))
        };
        Ok(match name {
            Name::Prompt => turn(&|t| t.text_of("user", true))?,
            Name::Context => turn(&|t| t.text_of("system", false))?,
            Name::Messages => turn(&|t| Value::Array(t.messages.to_vec()))?,
            Name::Tools => turn(&|t| Value::Array(t.tools.to_vec()))?,
            Name::Turn => turn(&|t| json!(t.number))?,
            Name::Payload => json!(s.payload.as_deref().unwrap_or_default()),
            Name::Task => json!(s.task.as_deref().unwrap_or_default()),
            Name::CaseId => json!(s.case_id),
            Name::Role => json!(s.role.unwrap_or_default()),
            Name::AttemptId => json!(s.key),
            Name::Seed => json!(self.provider.seed),
            Name::World(w) => json!(w.value(s, self.record)?),
            Name::Secret(k) => {
                let (var, value) = self
                    .provider
                    .secrets
                    .get(k)
                    .ok_or_else(|| format!("no secret {k}"))?;
                if self.record {
                    json!(format!("{}{var}{}", plant::OPEN, plant::CLOSE))
                } else {
                    json!(value)
                }
            }
            Name::Var(v) if self.turn.is_some_and(|t| t.fresh) && self.request_sets(v) => {
                Value::Null
            }
            Name::Var(v) => {
                let st = s.state();
                match st.vars.get(v) {
                    Some(_) if self.record && self.provider.spec.secret_vars.contains(v) => {
                        json!(format!(
                            "{}{}{}",
                            plant::OPEN,
                            v.to_ascii_uppercase(),
                            plant::CLOSE
                        ))
                    }
                    Some(x) => json!(x),
                    // a variable the request itself sets (a conversation id): none yet
                    None if self.request_sets(v) => Value::Null,
                    None => {
                        return Err(format!(
                            "{} is unknown (the step that extracts it did not run)",
                            name.spelled()
                        ));
                    }
                }
            }
        })
    }
}

/// The `Cookie` header of a request to `origin` as recorded: each value replaced by
/// `${COOKIE_<NAME>}` (they are session credentials).
fn recorded_cookies(scope: &AttemptScope, origin: &str) -> Option<String> {
    let st = scope.state();
    let pairs: Vec<String> = st
        .cookies
        .keys()
        .filter(|(o, _)| o == origin)
        .map(|(_, n)| {
            let var: String = n
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() {
                        c.to_ascii_uppercase()
                    } else {
                        '_'
                    }
                })
                .collect();
            let name = n.replace([plant::OPEN, plant::CLOSE], "\u{FFFD}");
            format!("{name}={}COOKIE_{var}{}", plant::OPEN, plant::CLOSE)
        })
        .collect();
    (!pairs.is_empty()).then(|| pairs.join("; "))
}

/// A request as sent (or as recorded).
#[derive(Clone, Debug)]
pub struct Rendered {
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Option<String>,
}

impl Rendered {
    /// Whether a credential's mark (or its percent-encoded spelling) is in it.
    fn has_marks(&self) -> bool {
        let marked = |t: &str| t.contains([plant::OPEN, plant::CLOSE]) || t.contains("%EE%80%8");
        marked(&self.url)
            || self.headers.iter().any(|(_, v)| marked(v))
            || self.body.as_deref().is_some_and(marked)
    }
}

fn render(step: &Step, fill: &Fill) -> std::result::Result<Rendered, String> {
    let marks = |s: String| {
        if fill.record {
            s.replace("%EE%80%80", "\u{E000}")
                .replace("%EE%80%81", "\u{E001}")
        } else {
            s
        }
    };
    let url = marks(format!(
        "{}{}",
        step.origin,
        step.path.render(fill, Escape::Url)?
    ));
    let mut headers = Vec::with_capacity(step.headers.len());
    for (k, t) in &step.headers {
        headers.push((k.as_str().to_owned(), t.render(fill, Escape::Header)?));
    }
    let body = match &step.body {
        Body::None => None,
        Body::Json(j) => Some(j.render(fill)?.to_string()),
        // (a plain or JSON body holds the marks themselves: a value's spelling of them
        // as percent-escapes stays text)
        Body::Text(t, Escape::Form) => Some(marks(t.render(fill, Escape::Form)?)),
        Body::Text(t, e) => Some(t.render(fill, *e)?),
    };
    Ok(Rendered { url, headers, body })
}

/// A value extracted from an answer.
fn extract(
    how: &Extract,
    headers: &reqwest::header::HeaderMap,
    text: &str,
    scope: &AttemptScope,
    origin: &str,
) -> std::result::Result<String, String> {
    match how {
        Extract::Body => Ok(text.to_owned()),
        Extract::Header(h) => headers
            .get(h)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .ok_or_else(|| format!("the answer has no {h} header")),
        Extract::Cookie(c) => scope
            .cookie(origin, c)
            .ok_or_else(|| format!("the answer set no cookie {c}")),
        Extract::Regex(re) => {
            let caps = re.captures(text).ok_or_else(|| {
                format!(
                    "/{}/ matches nothing in: {}",
                    re.as_str(),
                    crate::text::excerpt(text.trim(), 120)
                )
            })?;
            // its first group (empty when the group took no part), or the whole match
            Ok(if re.captures_len() > 1 {
                caps.get(1).map_or("", |m| m.as_str())
            } else {
                caps.get(0).map_or("", |m| m.as_str())
            }
            .to_owned())
        }
        Extract::Json(path, spelled) => {
            let v: Value = serde_json::from_str(text).map_err(|e| {
                format!(
                    "the answer is not JSON ({e}): {}",
                    crate::text::excerpt(text.trim(), 120)
                )
            })?;
            json_at(path, spelled, &v, text)
        }
    }
}

fn json_at(
    path: &serde_json_path::JsonPath,
    spelled: &str,
    v: &Value,
    text: &str,
) -> std::result::Result<String, String> {
    match path.query(v).first() {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Null) | None => Err(format!(
            "{spelled} matches nothing in: {}",
            crate::text::excerpt(text.trim(), 120)
        )),
        Some(other) => Ok(other.to_string()),
    }
}

/// The data of each server-sent event (WHATWG HTML, "server-sent events": the `data:`
/// lines of an event joined by a line feed, one space after the colon dropped, an
/// event dispatched at a blank line; comments and other fields ignored; OpenAI's
/// `[DONE]` is no event).
fn sse_events(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut data: Option<String> = None;
    for line in text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l)) {
        if line.is_empty() {
            if let Some(d) = data.take().filter(|d| d != "[DONE]") {
                out.push(d);
            }
            continue;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        if field == "data" {
            match &mut data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => data = Some(value.to_owned()),
            }
        }
    }
    if let Some(d) = data.filter(|d| d != "[DONE]") {
        out.push(d);
    }
    out
}

/// A streamed answer: each event's part, joined.
fn assemble(how: &Extract, kind: StreamKind, text: &str) -> std::result::Result<String, String> {
    let events: Vec<String> = match kind {
        StreamKind::Ndjson => text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect(),
        StreamKind::Sse => sse_events(text),
    };
    if events.is_empty() {
        return Err(format!(
            "the stream holds no events: {}",
            crate::text::excerpt(text.trim(), 120)
        ));
    }
    let mut out = String::new();
    for (i, e) in events.iter().enumerate() {
        match how {
            Extract::Json(path, _) => {
                let v: Value = serde_json::from_str(e).map_err(|err| {
                    format!(
                        "event {} is not JSON ({err}): {}",
                        i + 1,
                        crate::text::excerpt(e, 120)
                    )
                })?;
                // an event without the part (a role delta, a usage event) adds nothing
                match path.query(&v).first() {
                    Some(Value::String(s)) => out.push_str(s),
                    Some(Value::Null) | None => {}
                    Some(other) => out.push_str(&other.to_string()),
                }
            }
            Extract::Regex(re) => {
                if let Some(c) = re.captures(e) {
                    let g = if re.captures_len() > 1 {
                        c.get(1)
                    } else {
                        c.get(0)
                    };
                    out.push_str(g.map_or("", |m| m.as_str()));
                }
            }
            _ => out.push_str(e),
        }
    }
    Ok(out)
}

#[async_trait]
impl Provider for HttpProvider {
    fn name(&self) -> &str {
        "http"
    }

    async fn open_run(&self, dir: &Path, note: super::Notes) -> Result<()> {
        let files = Arc::new(plant::RunFiles::open(dir)?);
        *self.run.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::clone(&files));
        // what a killed run left planted: removed before anything new is planted
        let left = files.open_plants()?;
        if !left.is_empty() {
            let line = format!(
                "removing what an earlier, interrupted run left planted ({} attempts)",
                left.len()
            );
            note(&line);
            let mut failed = Vec::new();
            for scope in left {
                let scope = Arc::new(scope);
                let session = self.steps(&self.spec.session, &scope).await;
                let result = match session {
                    Ok(()) => self.steps(&self.spec.teardown, &scope).await,
                    Err(m) => Err(m),
                };
                files.journal_end(&scope, result.as_ref().err().map(String::as_str));
                if let Err(m) = result {
                    failed.push(format!("{}: {m}", scope.key));
                }
            }
            // said, and left in the journal: `pieval cleanup` tries again (and exits 1
            // while any is left); the run goes on with plants of its own
            if !failed.is_empty() {
                let line = format!(
                    "warning: {} of what an earlier run planted could not be removed (fix the application or the teardown, then `pieval cleanup`): {}",
                    failed.len(),
                    crate::text::excerpt(&failed.join("; "), 2000)
                );
                note(&line);
            }
        }
        Ok(())
    }

    async fn begin(&self, scope: &Arc<AttemptScope>) -> std::result::Result<(), CallError> {
        let fail = |m: String| CallError {
            message: m,
            latency_ms: 0.0,
            attempts: 0,
        };
        self.steps(&self.spec.session, scope).await.map_err(fail)?;
        if self.spec.setup.is_empty() {
            return Ok(());
        }
        self.open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(scope.key.clone(), Arc::clone(scope));
        if let Some(files) = self.files() {
            files
                .journal_begin(scope)
                .map_err(|e| fail(e.to_string()))?;
        }
        scope.state().journaled = true;
        self.counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .planted += 1;
        let result = self.steps(&self.spec.setup, scope).await;
        let vars: BTreeMap<String, String> = {
            let st = scope.state();
            self.spec
                .planted_vars
                .iter()
                .filter(|v| !self.spec.secret_vars.contains(v))
                .filter_map(|v| st.vars.get(v).map(|x| (v.clone(), x.clone())))
                .collect()
        };
        scope.state().planted = Some(serde_json::to_string(&vars).unwrap_or_default());
        if let Some(files) = self.files() {
            files.journal_planted(scope, &vars);
        }
        result.map_err(fail)
    }

    async fn end(&self, scope: &Arc<AttemptScope>) {
        let open = self
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(&scope.key);
        if open || self.spec.setup.is_empty() {
            self.teardown(scope).await;
        }
        // forgotten only once torn down: an interruption during teardown tears it down
        // again (a teardown's 404 is "already gone")
        self.open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&scope.key);
    }

    async fn close_run(&self) -> Option<String> {
        // attempts cut short (an interruption): torn down now
        let open: Vec<Arc<AttemptScope>> =
            std::mem::take(&mut *self.open.lock().unwrap_or_else(|p| p.into_inner()))
                .into_values()
                .collect();
        for scope in open {
            self.teardown(&scope).await;
        }
        if let Some(files) = self.files() {
            files.flush();
        }
        let c = *self.counts.lock().unwrap_or_else(|p| p.into_inner());
        (c.planted > 0).then(|| {
            let mut line = format!("planted {}, removed {}", c.planted, c.removed);
            if c.left > 0 {
                line.push_str(&format!(
                    "; {} could not be removed (see plants.jsonl; `pieval cleanup` tries again)",
                    c.left
                ));
            }
            line
        })
    }

    async fn complete(
        &self,
        case_id: &str,
        messages: &[Message],
    ) -> std::result::Result<Completion, CallError> {
        let as_json: Vec<Value> = messages
            .iter()
            .map(|m| json!({"role": m.role, "content": m.content}))
            .collect();
        let (answer, latency_ms, attempts) = self.turn(case_id, &as_json, &[]).await?;
        Ok(super::AgentTurn::answer(
            answer.text.unwrap_or_default(),
            latency_ms,
            attempts,
        ))
    }

    async fn chat(
        &self,
        key: &str,
        messages: &[Value],
        tools: &[Value],
    ) -> std::result::Result<super::AgentTurn, CallError> {
        // no tools offered: an agent served its world (`model.world`) answers with text
        if self.spec.request.tool_calls.is_none() && !tools.is_empty() {
            return Err(CallError {
                message: "an agentic case needs the application's tool calls: set model.http.request.tool_calls (docs/applications.md)".into(),
                latency_ms: 0.0,
                attempts: 0,
            });
        }
        let (answer, latency_ms, attempts) = self.turn(key, messages, tools).await?;
        Ok(super::AgentTurn {
            content: answer.text,
            tool_calls: answer.tool_calls,
            completion: Completion::default(),
        }
        .finished(latency_ms, attempts))
    }
}

impl HttpProvider {
    /// One turn of the attempt in scope: the request, its answer and tool calls (the
    /// attempt's credentials scrubbed from them).
    async fn turn(
        &self,
        case_id: &str,
        messages: &[Value],
        tools: &[Value],
    ) -> std::result::Result<(Answer, f64, u32), CallError> {
        let scope = super::ATTEMPT
            .try_with(Arc::clone)
            .unwrap_or_else(|_| Arc::new(AttemptScope::bare(case_id)));
        let number = {
            let mut st = scope.state();
            st.turn += 1;
            st.turn
        };
        let turn = Turn {
            messages,
            tools,
            number,
            fresh: !messages.iter().any(|m| m["role"] == "assistant"),
        };
        let (mut answer, latency_ms, attempts) =
            self.call(&self.spec.request, &scope, Some(&turn)).await?;
        answer.text = answer.text.map(|t| self.scrub(&scope, &t));
        for c in &mut answer.tool_calls {
            c.arguments = self.scrub(&scope, &c.arguments);
        }
        Ok((answer, latency_ms, attempts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_assembled() {
        let path = serde_json_path::JsonPath::parse("$.choices[0].delta.content").unwrap();
        let how = Extract::Json(path, "$.choices[0].delta.content".into());
        let sse = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"lo\"}}]}\n\ndata: [DONE]\n\n";
        assert_eq!(assemble(&how, StreamKind::Sse, sse).unwrap(), "Hello");
        let p2 = serde_json_path::JsonPath::parse("$.t").unwrap();
        let nd = Extract::Json(p2, "$.t".into());
        assert_eq!(
            assemble(&nd, StreamKind::Ndjson, "{\"t\":\"a\"}\n{\"t\":\"b\"}\n").unwrap(),
            "ab"
        );
        assert!(
            assemble(&nd, StreamKind::Ndjson, "{\"t\":\"a\"}\nnot json\n")
                .unwrap_err()
                .contains("event 2")
        );
        let plain = Extract::Body;
        assert_eq!(
            assemble(
                &plain,
                StreamKind::Sse,
                "data: Hello\n\ndata:  world\n\n: comment\n\ndata: a\ndata: b\n\n"
            )
            .unwrap(),
            "Hello worlda\nb",
            "one space after the colon dropped, the rest kept; data lines of one event joined"
        );
        assert!(
            assemble(&nd, StreamKind::Sse, "")
                .unwrap_err()
                .contains("no events")
        );
    }

    #[test]
    fn missing_paths_are_said() {
        let p = serde_json_path::JsonPath::parse("$.data.answer").unwrap();
        let scope = AttemptScope::bare("c");
        let h = reqwest::header::HeaderMap::new();
        let how = Extract::Json(p, "$.data.answer".into());
        assert_eq!(
            extract(&how, &h, r#"{"data":{"answer":"hi"}}"#, &scope, "o").unwrap(),
            "hi"
        );
        assert!(
            extract(&how, &h, r#"{"data":{}}"#, &scope, "o")
                .unwrap_err()
                .contains("matches nothing")
        );
        assert!(
            extract(&how, &h, "<html>", &scope, "o")
                .unwrap_err()
                .contains("not JSON")
        );
    }
}
