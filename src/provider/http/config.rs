//! The `model.http` section: an application behind its own HTTP API, as data — the
//! request, the steps of a session, what is planted before each attempt and removed
//! after it — compiled once, when the config is loaded, into [`Compiled`]. Every error
//! names its key (`http.setup[0].extract.doc_id.json`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::template::{Escape, JsonTemplate, Name, Template};

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HttpSection {
    /// name → the environment variable holding it (`{{secret.<name>}}`): read when the
    /// run starts, sent only to the request's origin, never recorded.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub secrets: BTreeMap<String, String>,
    /// Steps run at the start of every attempt (log in, open a conversation); what they
    /// extract is `{{vars.<name>}}` for the rest of the attempt.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub session: Vec<StepSpec>,
    /// Steps run after the session, before the first request: plant the case's payload
    /// where the application reads it. Journaled: what they extract is what teardown
    /// removes, also after a kill.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub setup: Vec<StepSpec>,
    /// The request of each turn; `answer` says where the answer is.
    pub request: StepSpec,
    /// Steps run after the attempt, whatever happened: remove what setup planted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub teardown: Vec<StepSpec>,
    /// Statuses tried again (with backoff, `Retry-After` honoured); any other status
    /// outside 2xx fails the call at once.
    #[serde(default = "default_retry_status")]
    pub retry_status: Vec<u16>,
    /// `inline` (default): the case is sent as it is, its untrusted content in the
    /// message. `planted`: an indirect case's content is left out of the message —
    /// setup plants it (`{{payload}}`) where the application reads it — and the
    /// message is the case's user task alone.
    #[serde(default, skip_serializing_if = "Delivery::is_inline")]
    pub delivery: Delivery,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    #[default]
    Inline,
    Planted,
}

impl Delivery {
    fn is_inline(&self) -> bool {
        *self == Delivery::Inline
    }
}

fn default_retry_status() -> Vec<u16> {
    vec![408, 409, 425, 429, 500, 502, 503, 504]
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StepSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// GET, POST, PUT, PATCH, DELETE …; POST when there is a body, else GET.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// The whole URL; its origin (scheme, host, port) is literal, placeholders come
    /// after it and are percent-encoded. With `raw`, the origin the raw request goes to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// A structure: a JSON body whose string leaves are templates. A string: a text body,
    /// its values escaped by the `Content-Type` (JSON, form, or as they are).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<Value>,
    /// A raw HTTP request file (as Burp or a browser's devtools save it) with
    /// placeholders (`{{prompt}}`) where values go: method, path, headers and body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw: Option<PathBuf>,
    /// name → where in the answer (`{{vars.<name>}}` from then on).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extract: BTreeMap<String, ExtractSpec>,
    /// `request` only: where the answer's text is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<ExtractSpec>,
    /// `request` only: where an agent's tool calls are (`{json: PATH}` to a list, in the
    /// OpenAI form or flat `{id, name, arguments}`): agentic cases run on the target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<ExtractSpec>,
    /// `request` only: the answer is streamed as server-sent events or JSON lines;
    /// `answer` is applied to each event and the parts joined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<StreamKind>,
    /// Statuses that count as success besides 2xx; a teardown step's default is 404 and
    /// 410 (what it removes is already gone).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ok_status: Vec<u16>,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StreamKind {
    Sse,
    Ndjson,
}

/// One of `json` (a JSONPath, RFC 9535), `regex` (its first group, or the match),
/// `header`, `cookie`, or `body: true` (the whole body).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ExtractSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cookie: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub body: bool,
    /// A credential (a session token): sent only to the request's origin and never
    /// recorded.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub secret: bool,
}

/// Where a step runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Session,
    Setup,
    Request,
    Teardown,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Session => "session",
            Phase::Setup => "setup",
            Phase::Request => "request",
            Phase::Teardown => "teardown",
        }
    }
}

/// Where to find a value in an answer.
#[derive(Clone, Debug)]
pub enum Extract {
    Json(serde_json_path::JsonPath, String),
    Regex(regex::Regex),
    Header(reqwest::header::HeaderName),
    Cookie(String),
    Body,
}

#[derive(Clone, Debug)]
pub enum Body {
    None,
    Json(JsonTemplate),
    Text(Template, Escape),
}

/// A step, compiled.
#[derive(Clone, Debug)]
pub struct Step {
    pub phase: Phase,
    pub name: String,
    pub method: reqwest::Method,
    /// `scheme://host[:port]`, literal.
    pub origin: String,
    /// The rest of the URL (path and query), a template.
    pub path: Template,
    pub headers: Vec<(reqwest::header::HeaderName, Template)>,
    pub body: Body,
    pub extract: Vec<(String, Extract, bool)>,
    pub answer: Option<Extract>,
    /// Where the tool calls are (a JSONPath to a list).
    pub tool_calls: Option<serde_json_path::JsonPath>,
    pub stream: Option<StreamKind>,
    pub ok_status: Vec<u16>,
}

impl Step {
    /// Every name the step's templates use.
    pub fn names(&self) -> Vec<&Name> {
        let mut out: Vec<&Name> = self.path.names().collect();
        for (_, t) in &self.headers {
            out.extend(t.names());
        }
        match &self.body {
            Body::None => {}
            Body::Json(j) => out.extend(j.names()),
            Body::Text(t, _) => out.extend(t.names()),
        }
        out
    }
}

/// The section, compiled.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// name → environment variable.
    pub secrets: BTreeMap<String, String>,
    pub session: Vec<Step>,
    pub setup: Vec<Step>,
    pub request: Step,
    pub teardown: Vec<Step>,
    pub retry_status: Vec<u16>,
    /// Variables that are credentials (`secret: true`).
    pub secret_vars: Vec<String>,
    /// Variables setup extracts (journaled for teardown).
    pub planted_vars: Vec<String>,
}

type Bad = (String, String);

impl HttpSection {
    /// Whether a template names the attempt's world (`{{world.*}}`, `model.world`).
    pub fn uses_world(&self) -> bool {
        self.compile().is_ok_and(|c| {
            c.request
                .names()
                .iter()
                .any(|n| matches!(n, Name::World(_)))
        })
    }

    /// Compile and check it; an error is (key under `http.`, message).
    pub fn compile(&self) -> Result<Compiled, Bad> {
        let mut secret_vars = Vec::new();
        let mut steps = |specs: &[StepSpec], phase: Phase, key: &str| -> Result<Vec<Step>, Bad> {
            specs
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let k = format!("{key}[{i}]");
                    let step = s.compile(phase, &k)?;
                    for (name, _, secret) in &step.extract {
                        if *secret {
                            secret_vars.push(name.clone());
                        }
                    }
                    Ok(step)
                })
                .collect()
        };
        let session = steps(&self.session, Phase::Session, "session")?;
        let setup = steps(&self.setup, Phase::Setup, "setup")?;
        let request = steps(
            std::slice::from_ref(&self.request),
            Phase::Request,
            "request",
        )
        .map_err(|(k, m)| (k.replacen("request[0]", "request", 1), m))?
        .remove(0);
        let teardown = steps(&self.teardown, Phase::Teardown, "teardown")?;
        for (name, env) in &self.secrets {
            let ok_name = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
            if !ok_name {
                return Err((
                    format!("secrets.{name}"),
                    "a secret's name is letters, digits, _ and -".into(),
                ));
            }
            let ok_env = !env.is_empty()
                && env.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                && !env.as_bytes()[0].is_ascii_digit();
            if !ok_env {
                return Err((
                    format!("secrets.{name}"),
                    "must be the NAME of an environment variable (letters, digits, _), not the secret itself".into(),
                ));
            }
        }
        if self.delivery == Delivery::Planted
            && !setup.iter().any(|s| s.names().contains(&&Name::Payload))
        {
            return Err((
                "delivery".into(),
                "planted delivery needs a setup step that plants {{payload}} (upload a document, create a ticket …)".into(),
            ));
        }
        if request.answer.is_none() {
            return Err((
                "request.answer".into(),
                "say where the answer is: {json: \"$.answer\"}, {regex: \"…\"} or {body: true}"
                    .into(),
            ));
        }
        if self
            .retry_status
            .iter()
            .any(|s| (200..400).contains(s) || *s > 599)
        {
            return Err((
                "retry_status".into(),
                "statuses to retry are 4xx or 5xx".into(),
            ));
        }
        // Every variable used is extracted by an earlier step (or a turn before); a
        // teardown's only by the session and setup (it runs also after a kill, when the
        // request's were never kept), and none of setup's is extracted again (what is
        // removed is what was planted).
        let mut known: Vec<String> = Vec::new();
        let planted_vars: Vec<String> = setup
            .iter()
            .flat_map(|s| s.extract.iter().map(|(n, _, _)| n.clone()))
            .collect();
        let session_vars: Vec<String> = session
            .iter()
            .flat_map(|s| s.extract.iter().map(|(n, _, _)| n.clone()))
            .collect();
        if let Some((n, _, _)) = request
            .extract
            .iter()
            .chain(session.iter().flat_map(|s| s.extract.iter()))
            .find(|(n, _, _)| planted_vars.contains(n))
        {
            return Err((
                "setup".into(),
                format!(
                    "setup extracts {n}, and another step extracts it again: teardown would remove what that step found, not what setup planted; name them apart"
                ),
            ));
        }
        let phases: [(&str, &[Step]); 4] = [
            ("session", &session),
            ("setup", &setup),
            ("request", std::slice::from_ref(&request)),
            ("teardown", &teardown),
        ];
        for (key, list) in phases {
            for (i, step) in list.iter().enumerate() {
                let here = if key == "request" {
                    key.to_owned()
                } else {
                    format!("{key}[{i}]")
                };
                for name in step.names() {
                    match name {
                        Name::Var(v)
                            if key == "teardown"
                                && !planted_vars.contains(v)
                                && !session_vars.contains(v) =>
                        {
                            return Err((
                                here,
                                format!(
                                    "{}: teardown may use only what the session and setup extract (it runs also after a kill, from the journal)",
                                    name.spelled()
                                ),
                            ));
                        }
                        Name::Var(v)
                            if !known.contains(v)
                                && !(key == "request"
                                    && step.extract.iter().any(|(n, _, _)| n == v)) =>
                        {
                            return Err((
                                here,
                                format!("{} is used before any step extracts it", name.spelled()),
                            ));
                        }
                        Name::Secret(s) if !self.secrets.contains_key(s) => {
                            return Err((
                                here,
                                format!(
                                    "{} is not one of `secrets` (name it there, with the environment variable that holds it)",
                                    name.spelled()
                                ),
                            ));
                        }
                        Name::Prompt
                        | Name::Context
                        | Name::Messages
                        | Name::Tools
                        | Name::Turn
                            if key != "request" =>
                        {
                            return Err((
                                here,
                                format!(
                                    "{} is a turn's; {key} steps have the case (payload, task, case_id, attempt_id, seed), vars and secrets",
                                    name.spelled()
                                ),
                            ));
                        }
                        Name::World(_) if key != "request" => {
                            return Err((
                                here,
                                format!(
                                    "{}: the attempt's world is served to its request (it opens after {key})",
                                    name.spelled()
                                ),
                            ));
                        }
                        Name::Payload | Name::Task if key == "teardown" => {
                            return Err((
                                here,
                                format!(
                                    "{}: teardown runs also after a kill, from the journal, which keeps only case_id, attempt_id, seed and setup's vars",
                                    name.spelled()
                                ),
                            ));
                        }
                        _ => {}
                    }
                    // credentials go to the request's origin only
                    let credential = matches!(name, Name::Secret(_))
                        || matches!(name, Name::Var(v) if secret_vars.contains(v));
                    if credential && step.origin != request.origin {
                        return Err((
                            here,
                            format!(
                                "{} would be sent to {}, but credentials go only to the request's origin {}",
                                name.spelled(),
                                step.origin,
                                request.origin
                            ),
                        ));
                    }
                }
                if key != "teardown" {
                    known.extend(step.extract.iter().map(|(n, _, _)| n.clone()));
                }
            }
        }
        Ok(Compiled {
            secrets: self.secrets.clone(),
            session,
            setup,
            request,
            teardown,
            retry_status: self.retry_status.clone(),
            secret_vars,
            planted_vars,
        })
    }

    /// Every origin its steps call (for a run folder received from someone else: each
    /// must be confirmed before anything is sent).
    pub fn origins(&self) -> Vec<String> {
        let mut out: Vec<String> = match self.compile() {
            Ok(c) => c
                .session
                .iter()
                .chain(&c.setup)
                .chain(std::iter::once(&c.request))
                .chain(&c.teardown)
                .map(|s| s.origin.clone())
                .collect(),
            // a section that does not compile calls nothing; its error comes later
            Err(_) => Vec::new(),
        };
        out.sort();
        out.dedup();
        out
    }

    /// Local files it names (raw request files), as (key, path).
    pub fn local_paths(&self) -> Vec<(String, PathBuf)> {
        let mut out = Vec::new();
        let mut add = |key: String, s: &StepSpec| {
            if let Some(p) = &s.raw {
                out.push((format!("{key}.raw"), p.clone()));
            }
        };
        add("request".into(), &self.request);
        for (k, list) in [
            ("session", &self.session),
            ("setup", &self.setup),
            ("teardown", &self.teardown),
        ] {
            for (i, s) in list.iter().enumerate() {
                add(format!("{k}[{i}]"), s);
            }
        }
        out
    }
}

/// `scheme://authority` and the rest, when the origin is literal.
fn split_origin(url: &Template, key: &str) -> Result<(String, Template), Bad> {
    split_origin_of(url, key, &["http", "https"])
}

/// `scheme://authority` and the rest, when the origin is literal and its scheme one of
/// `schemes`.
pub(crate) fn split_origin_of(
    url: &Template,
    key: &str,
    schemes: &[&str],
) -> Result<(String, Template), Bad> {
    let prefix = url.literal_prefix();
    let Some(scheme_end) = schemes
        .iter()
        .find(|s| prefix.starts_with(&format!("{s}://")))
        .map(|s| s.len() + 3)
    else {
        return Err((
            format!("{key}.url"),
            format!(
                "must start with {} (the origin written out, not a placeholder)",
                schemes
                    .iter()
                    .map(|s| format!("{s}://"))
                    .collect::<Vec<_>>()
                    .join(" or ")
            ),
        ));
    };
    let rest = &prefix[scheme_end..];
    let (end, whole) = match rest.find(['/', '?', '#']) {
        Some(end) => (end, false),
        // the whole URL is the origin, if nothing follows
        None if url.names().next().is_some() => {
            return Err((
                format!("{key}.url"),
                "the host and port are literal: placeholders may only follow the path's first /"
                    .into(),
            ));
        }
        None => (rest.len(), true),
    };
    let authority = &rest[..end];
    if authority.is_empty() || authority.contains('@') {
        return Err((
            format!("{key}.url"),
            "needs a host (and no user:password@)".into(),
        ));
    }
    let origin = prefix[..scheme_end + end].to_owned();
    // the origin as a URL parser reads it: a bad host or port is said now, not per case
    match reqwest::Url::parse(&origin) {
        Ok(u) if u.host_str().is_some() && u.path() == "/" && u.query().is_none() => {}
        Ok(_) | Err(_) => {
            return Err((
                format!("{key}.url"),
                format!("{origin:?} is not a scheme, a host and a port"),
            ));
        }
    }
    if whole {
        return Ok((origin, Template::parse("/").expect("literal")));
    }
    let spelled: String = url_text(url);
    let path = Template::parse(&spelled[origin.len()..]).map_err(|m| (format!("{key}.url"), m))?;
    Ok((origin, path))
}

/// A template written back as text (to split it at a literal position).
pub(crate) fn url_text(t: &Template) -> String {
    struct Spell;
    impl super::template::Values for Spell {
        fn value(&self, name: &Name) -> Result<Value, String> {
            Ok(Value::String(name.spelled()))
        }
    }
    t.render(&Spell, Escape::Plain)
        .expect("spelling cannot fail")
}

pub(crate) fn header_name(h: &str, key: &str) -> Result<reqwest::header::HeaderName, Bad> {
    reqwest::header::HeaderName::from_bytes(h.as_bytes())
        .map_err(|_| (key.to_owned(), format!("{h:?} is not a header name")))
}

impl ExtractSpec {
    pub(crate) fn compile(&self, key: &str) -> Result<Extract, Bad> {
        let given = [
            self.json.is_some(),
            self.regex.is_some(),
            self.header.is_some(),
            self.cookie.is_some(),
            self.body,
        ]
        .iter()
        .filter(|b| **b)
        .count();
        if given != 1 {
            return Err((
                key.to_owned(),
                "give exactly one of json (a JSONPath), regex, header, cookie, body: true".into(),
            ));
        }
        if let Some(p) = &self.json {
            let path = serde_json_path::JsonPath::parse(p).map_err(|e| {
                (
                    format!("{key}.json"),
                    format!("not a JSONPath (RFC 9535): {e}"),
                )
            })?;
            return Ok(Extract::Json(path, p.clone()));
        }
        if let Some(r) = &self.regex {
            let re = regex::RegexBuilder::new(r)
                .size_limit(1 << 20)
                .build()
                .map_err(|e| (format!("{key}.regex"), format!("not a regex: {e}")))?;
            return Ok(Extract::Regex(re));
        }
        if let Some(h) = &self.header {
            return Ok(Extract::Header(header_name(h, &format!("{key}.header"))?));
        }
        if let Some(c) = &self.cookie {
            return Ok(Extract::Cookie(c.clone()));
        }
        Ok(Extract::Body)
    }
}

impl StepSpec {
    fn compile(&self, phase: Phase, key: &str) -> Result<Step, Bad> {
        let name = self.name.clone().unwrap_or_else(|| key.to_owned());
        let (mut method, mut url_text_, mut headers, mut body_text): (
            Option<String>,
            Option<String>,
            BTreeMap<String, String>,
            Option<String>,
        ) = (
            self.method.clone(),
            self.url.clone(),
            self.headers.clone(),
            None,
        );
        if let Some(raw) = &self.raw {
            if self.body.is_some() {
                return Err((
                    format!("{key}.body"),
                    "a raw request holds its own body".into(),
                ));
            }
            let r = RawRequest::read(raw).map_err(|m| (format!("{key}.raw"), m))?;
            method = Some(method.unwrap_or(r.method));
            let origin = match &self.url {
                Some(u) => u.trim_end_matches('/').to_owned(),
                None => format!("https://{}", r.host),
            };
            url_text_ = Some(format!("{origin}{}", r.target));
            for (k, v) in r.headers {
                headers.entry(k).or_insert(v);
            }
            body_text = r.body;
        }
        let Some(url) = url_text_ else {
            return Err((format!("{key}.url"), "a step needs url (or raw)".into()));
        };
        let url_t = Template::parse(&url).map_err(|m| (format!("{key}.url"), m))?;
        let (origin, path) = split_origin(&url_t, key)?;
        let method = match method {
            Some(m) => reqwest::Method::from_bytes(m.trim().to_ascii_uppercase().as_bytes())
                .map_err(|_| {
                    (
                        format!("{key}.method"),
                        format!("{m:?} is not an HTTP method"),
                    )
                })?,
            None if self.body.is_some() || body_text.is_some() => reqwest::Method::POST,
            None => reqwest::Method::GET,
        };
        let mut compiled_headers = Vec::new();
        let mut content_type: Option<String> = None;
        for (h, v) in &headers {
            let hk = format!("{key}.headers.{h}");
            let name = header_name(h, &hk)?;
            if name == reqwest::header::CONTENT_LENGTH || name == reqwest::header::HOST {
                continue; // computed from the request sent
            }
            if name == reqwest::header::CONTENT_TYPE {
                content_type = Some(v.to_ascii_lowercase());
            }
            let t = Template::parse(v).map_err(|m| (hk.clone(), m))?;
            // its literal text must make a header value (placeholders are checked as
            // they are filled)
            if reqwest::header::HeaderValue::from_str(&url_text(&t).replace(['{', '}'], ""))
                .is_err()
            {
                return Err((hk, "not a valid header value (control characters?)".into()));
            }
            compiled_headers.push((name, t));
        }
        let text_escape = |ct: Option<&str>| match ct {
            Some(c) if c.contains("json") => Escape::JsonString,
            Some(c) if c.contains("x-www-form-urlencoded") => Escape::Form,
            _ => Escape::Plain,
        };
        let text_body = match (&self.body, &body_text) {
            (Some(Value::String(s)), _) | (None, Some(s)) => Some(s.as_str()),
            _ => None,
        };
        let body = match (&self.body, text_body) {
            (_, Some(s)) => {
                let t = Template::parse(s).map_err(|m| (format!("{key}.body"), m))?;
                Body::Text(t, text_escape(content_type.as_deref()))
            }
            (Some(v), _) => {
                if content_type.is_none() {
                    compiled_headers.push((
                        reqwest::header::CONTENT_TYPE,
                        Template::parse("application/json").expect("literal"),
                    ));
                }
                Body::Json(JsonTemplate::parse(v, &format!("{key}.body"))?)
            }
            (None, None) => Body::None,
        };
        let mut extract = Vec::new();
        for (var, spec) in &self.extract {
            let vk = format!("{key}.extract.{var}");
            if var.is_empty()
                || !var
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            {
                return Err((vk, "a variable's name is letters, digits, _ and -".into()));
            }
            extract.push((var.clone(), spec.compile(&vk)?, spec.secret));
        }
        let answer = match (&self.answer, phase) {
            (Some(a), Phase::Request) => Some(a.compile(&format!("{key}.answer"))?),
            (Some(_), _) => {
                return Err((
                    format!("{key}.answer"),
                    "only the request has an answer (steps extract variables)".into(),
                ));
            }
            (None, _) => None,
        };
        if self.stream.is_some()
            && extract
                .iter()
                .any(|(_, e, _)| !matches!(e, Extract::Header(_) | Extract::Cookie(_)))
        {
            return Err((
                format!("{key}.extract"),
                "a streamed answer's variables come from its headers or cookies (json, regex and body read the answer, which is assembled from events)".into(),
            ));
        }
        let tool_calls = match (&self.tool_calls, phase) {
            (None, _) => None,
            (Some(spec), Phase::Request) => match spec.compile(&format!("{key}.tool_calls"))? {
                Extract::Json(p, _) if self.stream.is_none() => Some(p),
                _ => {
                    return Err((
                        format!("{key}.tool_calls"),
                        "a JSONPath to the list of tool calls ({json: \"$.tool_calls\"}), on an answer that is not streamed".into(),
                    ));
                }
            },
            (Some(_), _) => {
                return Err((
                    format!("{key}.tool_calls"),
                    "only the request has tool calls".into(),
                ));
            }
        };
        if self.stream.is_some() && phase != Phase::Request {
            return Err((
                format!("{key}.stream"),
                "only the request is streamed".into(),
            ));
        }
        if let Some(Extract::Header(_) | Extract::Cookie(_)) = &answer
            && self.stream.is_some()
        {
            return Err((
                format!("{key}.answer"),
                "a streamed answer is read from its events (json, regex or body)".into(),
            ));
        }
        // a teardown's 404 or 410: what it removes is already gone (a retried delete, a
        // cleanup after a kill that came after the delete)
        let ok_status = if phase == Phase::Teardown && self.ok_status.is_empty() {
            vec![404, 410]
        } else {
            self.ok_status.clone()
        };
        Ok(Step {
            phase,
            name,
            method,
            origin,
            path,
            headers: compiled_headers,
            body,
            extract,
            answer,
            tool_calls,
            stream: self.stream,
            ok_status,
        })
    }
}

/// A raw HTTP/1.1 request file.
#[derive(Debug)]
struct RawRequest {
    method: String,
    target: String,
    host: String,
    headers: Vec<(String, String)>,
    body: Option<String>,
}

impl RawRequest {
    fn read(path: &std::path::Path) -> Result<Self, String> {
        let bytes = crate::files::read_bounded(
            path,
            crate::files::Links::Follow,
            crate::files::bounds::SMALL_TEXT,
        )
        .map_err(|e| e.to_string())?;
        let text =
            String::from_utf8(bytes).map_err(|_| format!("{}: not UTF-8", path.display()))?;
        Self::parse(&text).map_err(|m| format!("{}: {m}", path.display()))
    }

    fn parse(text: &str) -> Result<Self, String> {
        let (head, body) = match text.find("\r\n\r\n") {
            Some(i) => (&text[..i], &text[i + 4..]),
            None => match text.find("\n\n") {
                Some(i) => (&text[..i], &text[i + 2..]),
                None => (text, ""),
            },
        };
        let mut lines = head.lines();
        let first = lines.next().unwrap_or_default().trim();
        let mut parts = first.split_whitespace();
        let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
            return Err(format!(
                "line 1: not a request line (METHOD /path HTTP/1.1): {}",
                crate::text::excerpt(first, 80)
            ));
        };
        let mut headers = Vec::new();
        let mut host = None;
        for (i, l) in lines.enumerate() {
            let Some((k, v)) = l.split_once(':') else {
                return Err(format!("line {}: not a header (Name: value)", i + 2));
            };
            let (k, v) = (k.trim().to_owned(), v.trim().to_owned());
            if k.eq_ignore_ascii_case("host") {
                host = Some(v);
            } else {
                headers.push((k, v));
            }
        }
        // an absolute-form target carries the origin itself
        let (target, host) = if let Some(rest) = target
            .strip_prefix("http://")
            .or_else(|| target.strip_prefix("https://"))
        {
            let i = rest.find('/').unwrap_or(rest.len());
            (
                if i == rest.len() {
                    "/".to_owned()
                } else {
                    rest[i..].to_owned()
                },
                host.unwrap_or_else(|| rest[..i].to_owned()),
            )
        } else {
            (
                target.to_owned(),
                host.ok_or("no Host header (and the request line has no origin)")?,
            )
        };
        let body = body.trim_end_matches(['\r', '\n']);
        Ok(Self {
            method: method.to_owned(),
            target,
            host,
            headers,
            body: (!body.is_empty()).then(|| body.to_owned()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(yaml: &str) -> HttpSection {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    #[test]
    fn a_section_compiles() {
        let c = section(
            r#"
secrets: {password: BOT_PASSWORD}
session:
  - {name: login, url: "http://127.0.0.1:9/login", body: {password: "{{secret.password}}"}, extract: {token: {json: "$.token", secret: true}}}
setup:
  - {url: "http://127.0.0.1:9/docs", headers: {Authorization: "Bearer {{vars.token}}"}, body: {text: "{{payload}}"}, extract: {doc: {json: "$.id"}}}
request: {url: "http://127.0.0.1:9/chat?c={{case_id}}", body: {q: "{{prompt}}"}, answer: {json: "$.data.answer"}}
teardown:
  - {method: delete, url: "http://127.0.0.1:9/docs/{{vars.doc}}", ok_status: [404]}
"#,
        )
        .compile()
        .unwrap();
        assert_eq!(c.request.origin, "http://127.0.0.1:9");
        assert_eq!(c.secret_vars, vec!["token".to_owned()]);
        assert_eq!(c.planted_vars, vec!["doc".to_owned()]);
        assert_eq!(c.teardown[0].method, reqwest::Method::DELETE);
    }

    #[test]
    fn bad_sections_name_the_key() {
        let err = |y: &str| section(y).compile().unwrap_err();
        let e = err(r#"request: {url: "http://{{vars.host}}/x", answer: {body: true}}"#);
        assert_eq!(e.0, "request.url");
        let e =
            err(r#"request: {url: "http://a/x", body: {q: "{{promt}}"}, answer: {body: true}}"#);
        assert_eq!(e.0, "request.body.q");
        assert!(e.1.contains("did you mean"));
        let e =
            err(r#"request: {url: "http://a/x", body: {q: "{{vars.doc}}"}, answer: {body: true}}"#);
        assert!(e.1.contains("before any step extracts it"), "{e:?}");
        let e = err(r#"request: {url: "http://a/x"}"#);
        assert_eq!(e.0, "request.answer");
        let e = err(r#"request: {url: "http://a/x", answer: {json: "$[", regex: "x"}}"#);
        assert!(e.1.contains("exactly one"));
        let e = err(r#"request: {url: "http://a/x", answer: {json: "$["}}"#);
        assert_eq!(e.0, "request.answer.json");
        let e = err(r#"
secrets: {k: KEY}
session: [{url: "http://evil.example/login", body: {k: "{{secret.k}}"}}]
request: {url: "http://a/x", answer: {body: true}}"#);
        assert!(e.1.contains("only to the request's origin"), "{e:?}");
        let e = err(r#"
setup: [{url: "http://a/d", body: {t: "{{payload}}"}}]
request: {url: "http://a/x", answer: {body: true}}
teardown: [{url: "http://a/d", body: {t: "{{payload}}"}}]"#);
        assert_eq!(e.0, "teardown[0]");
        let e = err(
            r#"{secrets: {k: "sk-live-123"}, request: {url: "http://a/x", answer: {body: true}}}"#,
        );
        assert!(e.1.contains("NAME of an environment variable"));
    }

    #[test]
    fn raw_requests_parse() {
        let r = RawRequest::parse(
            "POST /api/chat?x=1 HTTP/1.1\r\nHost: bot.example:8443\r\nContent-Type: application/json\r\nContent-Length: 99\r\n\r\n{\"q\": \"{{prompt}}\"}\r\n",
        )
        .unwrap();
        assert_eq!(
            (r.method.as_str(), r.target.as_str(), r.host.as_str()),
            ("POST", "/api/chat?x=1", "bot.example:8443")
        );
        assert_eq!(r.body.as_deref(), Some("{\"q\": \"{{prompt}}\"}"));
        assert!(RawRequest::parse("garbage").is_err());
        assert!(
            RawRequest::parse("GET / HTTP/1.1\nAccept: x\n\n")
                .unwrap_err()
                .contains("Host")
        );
    }
}
