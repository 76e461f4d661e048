//! The `model` section of an experiment config: which provider, which model, how it is
//! called; and the endpoint checks a model and a judge share.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    Local,
    Openai,
    Replay,
    Http,
    Exec,
    Anthropic,
    Websocket,
    /// One of pieval's own detectors, as the classifier of a guardrail run (src/guard).
    Builtin,
}

impl ProviderKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Local => "local",
            ProviderKind::Openai => "openai",
            ProviderKind::Replay => "replay",
            ProviderKind::Http => "http",
            ProviderKind::Exec => "exec",
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::Websocket => "websocket",
            ProviderKind::Builtin => "builtin",
        }
    }
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ExecutionMode {
    #[default]
    Live,
    Replay,
    DryRun,
}

impl ExecutionMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ExecutionMode::Live => "live",
            ExecutionMode::Replay => "replay",
            ExecutionMode::DryRun => "dry_run",
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    pub provider: ProviderKind,
    pub name: String,
    /// `openai`: the API root, e.g. `https://api.openai.com/v1` or `http://127.0.0.1:8080/v1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// The environment variable holding the API key (never the key itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u32,
    #[serde(default)]
    pub temperature: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    #[serde(default)]
    pub execution_mode: ExecutionMode,
    /// Requests in flight at once.
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    /// Requests started per minute, at most; unlimited when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<u32>,
    /// Seconds before one request is abandoned (and retried).
    #[serde(default = "default_timeout_s")]
    pub timeout_s: f64,
    /// Retries after the first attempt, on timeouts, connection errors, 429 and 5xx.
    #[serde(default = "default_max_retries")]
    pub max_retries: u32,
    /// `local`: a GGUF file to run instead of the default model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// `replay`: a predictions file (JSONL / Parquet) or a run folder / run id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_from: Option<String>,
    /// `http`: the application's API (`provider::http`, docs/applications.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<crate::provider::http::HttpSection>,
    /// `exec`: the team's own code, a process speaking JSON lines (`provider::exec`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<crate::provider::exec::ExecSection>,
    /// `websocket`: a chat behind a WebSocket (`provider::websocket`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub websocket: Option<crate::provider::websocket::WebsocketSection>,
    /// Each agentic case's world served to the target, an agent with its own loop
    /// (docs/agents.md, "Your own agent"): set, the target is sent the user's task
    /// once and the world's address, and the agent's calls to the world are its actions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world: Option<WorldSection>,
    /// An OTLP/HTTP trace receiver for an agent whose tools are real
    /// (docs/agents.md, "traces"): each agentic attempt's calls are read
    /// from the spans of the trace pieval started for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traces: Option<TracesSection>,
}

/// `model.traces`: where the receiver listens, how long an attempt's trace may take.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TracesSection {
    /// A loopback address (`127.0.0.1:4318`, the default: OTLP/HTTP's port, where an
    /// exporter sends by default).
    #[serde(default = "default_traces_listen")]
    pub listen: String,
    /// Seconds to wait, after the agent's answer, for its trace to end (its root span).
    #[serde(default = "default_traces_wait_s")]
    pub wait_s: f64,
}

fn default_traces_listen() -> String {
    "127.0.0.1:4318".into()
}

fn default_traces_wait_s() -> f64 {
    10.0
}

impl TracesSection {
    pub fn addr(&self) -> std::result::Result<std::net::SocketAddr, String> {
        loopback(&self.listen)
    }
}

/// `model.world`: where the worlds are served.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WorldSection {
    /// The address the world server binds: a loopback address (`127.0.0.1:0`, the
    /// default: any free port).
    #[serde(default = "default_world_listen")]
    pub listen: String,
}

fn default_world_listen() -> String {
    "127.0.0.1:0".into()
}

impl WorldSection {
    /// The address to bind, or why not (a loopback address only: the server answers
    /// only to a loopback `Host`).
    pub fn addr(&self) -> std::result::Result<std::net::SocketAddr, String> {
        loopback(&self.listen)
    }
}

/// A loopback address and port, or why not.
fn loopback(listen: &str) -> std::result::Result<std::net::SocketAddr, String> {
    let a: std::net::SocketAddr = listen
        .parse()
        .map_err(|_| format!("{listen:?} is not an address and port (127.0.0.1:0)"))?;
    if !a.ip().is_loopback() {
        return Err(format!(
            "{} is not a loopback address: pieval serves on this machine only (127.0.0.1 or ::1)",
            a.ip()
        ));
    }
    Ok(a)
}

pub(crate) fn default_max_tokens() -> u32 {
    128
}
pub(crate) fn default_concurrency() -> usize {
    8
}
pub(crate) fn default_timeout_s() -> f64 {
    60.0
}
pub(crate) fn default_max_retries() -> u32 {
    4
}

/// The longest timeout accepted, in seconds (a day).
pub const MAX_TIMEOUT_S: f64 = 86_400.0;

/// The most retries accepted: with `Retry-After` honoured up to 5 minutes, 20 retries
/// already let one request wait 100 minutes.
pub const MAX_RETRIES: u32 = 20;

/// The settings a model endpoint and a judge endpoint share, checked one way.
pub(crate) struct Endpoint<'a> {
    pub(crate) provider: ProviderKind,
    pub(crate) name: &'a str,
    pub(crate) base_url: Option<&'a str>,
    pub(crate) api_key_env: Option<&'a str>,
    pub(crate) concurrency: usize,
    pub(crate) requests_per_minute: Option<u32>,
    pub(crate) timeout_s: f64,
    pub(crate) max_retries: u32,
    pub(crate) max_tokens: u32,
}

impl Endpoint<'_> {
    pub(crate) fn check(&self) -> std::result::Result<(), (&'static str, String)> {
        if self.name.trim().is_empty() {
            return Err(("name", "must not be empty".into()));
        }
        if self.max_tokens == 0 {
            return Err(("max_tokens", "must be at least 1".into()));
        }
        if self.concurrency == 0 || self.concurrency > 4096 {
            return Err(("concurrency", "must be between 1 and 4096".into()));
        }
        if self.requests_per_minute == Some(0) {
            return Err((
                "requests_per_minute",
                "must be at least 1 (leave it out for no limit)".into(),
            ));
        }
        if !(self.timeout_s.is_finite() && self.timeout_s > 0.0) {
            return Err(("timeout_s", "must be a positive number".into()));
        }
        if self.timeout_s > MAX_TIMEOUT_S {
            return Err((
                "timeout_s",
                format!("{} is more than a day ({MAX_TIMEOUT_S} s)", self.timeout_s),
            ));
        }
        if self.max_retries > MAX_RETRIES {
            return Err((
                "max_retries",
                format!(
                    "{} is more than {MAX_RETRIES} (each retry may wait up to 5 minutes when the server sends Retry-After)",
                    self.max_retries
                ),
            ));
        }
        if let Some(env) = self.api_key_env {
            let ok = !env.is_empty()
                && env.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                && !env.as_bytes()[0].is_ascii_digit();
            if !ok {
                return Err((
                    "api_key_env",
                    "must be the NAME of an environment variable (letters, digits, _), not a key"
                        .into(),
                ));
            }
        }
        if self.provider == ProviderKind::Anthropic
            && let Some(url) = self.base_url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return Err(("base_url", format!("{url:?} is not an http(s) URL")));
        }
        if self.provider == ProviderKind::Openai {
            let Some(url) = self.base_url else {
                return Err((
                    "base_url",
                    "the openai provider needs base_url (e.g. https://api.openai.com/v1)".into(),
                ));
            };
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(("base_url", format!("{url:?} is not an http(s) URL")));
            }
        }
        Ok(())
    }
}
