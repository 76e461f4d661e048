//! Model clients. A provider turns chat messages into a completion or a recorded
//! failure; the runner never drops a case because a call failed.
//!
//! - [`openai::OpenAiProvider`]: any OpenAI-compatible `/v1/chat/completions` (OpenAI,
//!   vLLM, Ollama, llama.cpp server, LM Studio …), with timeouts, retries with exponential
//!   backoff and jitter that honour `Retry-After`, and a requests-per-minute limit.
//! - [`replay::ReplayProvider`]: the responses of a predictions file or an earlier run.

pub mod anthropic;
pub mod config;
pub mod exec;
pub mod gguf_tokenizer;
pub mod http;
pub mod local;
pub mod openai;
pub mod replay;
pub mod sampling;
pub(crate) mod transport;
pub mod websocket;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;

use crate::error::{Error, Result};
use config::{ModelSection, ProviderKind};

/// A model's answer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Completion {
    pub text: String,
    pub latency_ms: f64,
    /// Attempts made (1 when the first succeeded).
    pub attempts: u32,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    /// Local models: seconds spent on the prompt and on generating (for tokens/s).
    pub prompt_secs: Option<f64>,
    pub generation_secs: Option<f64>,
    /// The endpoint's answer held the API key, which was replaced by `[REDACTED]` before
    /// anything was kept (recorded on the prediction as `response_redacted`).
    pub redacted: bool,
    /// The answer was longer than [`MAX_RESPONSE_BYTES`] and was cut there (recorded on
    /// the prediction as `response_truncated`).
    pub truncated: bool,
}

/// The longest answer kept, in bytes (UTF-8): a checkpoint line stays far below what the
/// predictions reader accepts, so a run can always be scored.
pub const MAX_RESPONSE_BYTES: usize = 1 << 20;

/// The largest HTTP response body read from an endpoint.
pub const MAX_BODY_BYTES: usize = 16 << 20;

/// Cut `text` to [`MAX_RESPONSE_BYTES`] on a character boundary; whether it was cut.
pub fn cap_response(text: &mut String) -> bool {
    if text.len() <= MAX_RESPONSE_BYTES {
        return false;
    }
    let mut end = MAX_RESPONSE_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    true
}

/// A call that failed for good (after retries): recorded on the case as `error`.
#[derive(Clone, Debug, PartialEq)]
pub struct CallError {
    pub message: String,
    pub latency_ms: f64,
    pub attempts: u32,
}

#[async_trait]
pub trait Provider: Send + Sync {
    /// `provider` as recorded in predictions (`openai`, `local`, `replay`).
    fn name(&self) -> &str;
    /// What computes the answers, when it matters for reproducibility (a local model's
    /// decoder: greedy outputs are deterministic per backend, not across backends).
    fn backend(&self) -> Option<String> {
        None
    }
    /// How many model instances answer side by side (a local model pool); tokens/s
    /// are reported per instance.
    fn instances(&self) -> usize {
        1
    }
    async fn complete(&self, case_id: &str, messages: &[Message]) -> Result<Completion, CallError>;

    /// Once per run, before any attempt, with the run folder: a target that keeps files
    /// there opens them, and completes what a killed run left (an application target
    /// removes what it had planted). `note` tells the user.
    async fn open_run(&self, dir: &Path, note: Notes) -> Result<()> {
        let _ = (dir, note);
        Ok(())
    }

    /// Before an attempt's first call (an application's session, what is planted for
    /// it). The attempt's calls run inside [`ATTEMPT`]'s scope.
    async fn begin(&self, scope: &Arc<AttemptScope>) -> Result<(), CallError> {
        let _ = scope;
        Ok(())
    }

    /// After an attempt, whatever happened (what was planted is removed).
    async fn end(&self, scope: &Arc<AttemptScope>) {
        let _ = scope;
    }

    /// Once per run, after the last attempt or an interruption: attempts begun and not
    /// ended are ended; a line for the user ("planted N, removed N").
    async fn close_run(&self) -> Option<String> {
        None
    }

    /// One assistant turn of an agent: `messages` in the OpenAI chat form (system, user,
    /// assistant with `tool_calls`, `tool` results) and the `tools` offered. `key` names
    /// the attempt and the turn (`<attempt>#<turn>`), for providers that answer from
    /// records.
    async fn chat(
        &self,
        key: &str,
        messages: &[serde_json::Value],
        tools: &[serde_json::Value],
    ) -> Result<AgentTurn, CallError> {
        if tools.is_empty() {
            // no tools offered (an agent served its world, `model.world`): the
            // conversation as text messages, the answer its text
            let text: Vec<Message> = messages
                .iter()
                .filter_map(|m| {
                    let role = match m["role"].as_str()? {
                        "system" => "system",
                        "user" => "user",
                        "tool" => "tool",
                        _ => "assistant",
                    };
                    let content = m["content"].as_str()?.to_owned();
                    Some(Message { role, content })
                })
                .collect();
            let c = self.complete(key, &text).await?;
            return Ok(AgentTurn {
                content: Some(c.text.clone()),
                tool_calls: Vec::new(),
                completion: c,
            });
        }
        Err(CallError {
            message: format!(
                "provider {} cannot run an agent (tool calls): use an OpenAI-compatible endpoint (provider: openai) or replay a recorded agent run",
                self.name()
            ),
            latency_ms: 0.0,
            attempts: 0,
        })
    }
}

/// An assistant turn of an agent: its text, and the tool calls it asks for (in order;
/// several are parallel calls). `completion` holds the call's latency, attempts, tokens
/// and flags (its `text` is unused).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AgentTurn {
    pub content: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    pub completion: Completion,
}

impl AgentTurn {
    /// Every target's last step on an answer: the text and the calls redacted once more
    /// (a key their parts only make when joined), the text capped at
    /// [`MAX_RESPONSE_BYTES`], the flags and the call's measures set; what else the
    /// completion holds (tokens, times) is kept.
    pub fn finished(mut self, latency_ms: f64, attempts: u32) -> AgentTurn {
        let mut redacted = self.completion.redacted;
        let mut again = |s: &mut String| {
            let (t, r) = crate::secrets::redact(s);
            if r {
                *s = t.into_owned();
                redacted = true;
            }
        };
        if let Some(text) = &mut self.content {
            again(text);
        }
        for call in &mut self.tool_calls {
            again(&mut call.arguments);
            again(&mut call.name);
            again(&mut call.id);
        }
        let marked = |s: &str| s.contains(crate::secrets::REDACTED);
        let c = &mut self.completion;
        c.redacted = redacted
            || self.content.as_deref().is_some_and(marked)
            || self
                .tool_calls
                .iter()
                .any(|t| marked(&t.arguments) || marked(&t.name));
        c.truncated = self.content.as_mut().is_some_and(cap_response);
        c.latency_ms = latency_ms;
        c.attempts = attempts;
        self
    }

    /// A plain answer's [`AgentTurn::finished`]: the text alone.
    pub fn answer(text: String, latency_ms: f64, attempts: u32) -> Completion {
        AgentTurn {
            content: Some(text),
            tool_calls: Vec::new(),
            completion: Completion::default(),
        }
        .finished(latency_ms, attempts)
        .into_completion()
    }

    /// The turn as a plain completion (its text; the calls dropped).
    pub fn into_completion(self) -> Completion {
        Completion {
            text: self.content.unwrap_or_default(),
            ..self.completion
        }
    }
}

/// Tool calls given as a JSON list, in the OpenAI form (`{id, type: function, function:
/// {name, arguments}}`) or flat (`{id, name, arguments}`, or `input` for the arguments as
/// an object): an application's answer may carry either (docs/applications.md). An
/// `arguments` that is not text keeps its JSON text; a call without an id gets
/// `call_<n>`.
pub fn tool_calls_of(v: &serde_json::Value) -> std::result::Result<Vec<ToolCall>, String> {
    use serde_json::Value;
    let calls = v.as_array().ok_or("tool_calls is not a list")?;
    let mut out = Vec::with_capacity(calls.len());
    for (i, c) in calls.iter().enumerate() {
        let f = c.get("function").unwrap_or(c);
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("tool_calls[{i}] has no function.name (or name)"))?;
        let arguments = match f.get("arguments").or_else(|| f.get("input")) {
            Some(Value::String(s)) => s.clone(),
            None | Some(Value::Null) => String::new(),
            Some(other) => other.to_string(),
        };
        let id = c
            .get("id")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map_or_else(|| format!("call_{}", i + 1), str::to_owned);
        out.push(ToolCall {
            id,
            name: name.to_owned(),
            arguments,
        });
    }
    Ok(out)
}

/// One tool call as the model sent it: `arguments` is its JSON text, unparsed.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// A calling provider for a model section: `openai`, or `local` (a pool of in-process
/// models; the GGUF is `path`, or the registry model `name`, pulled on first use with
/// its progress lines given to `progress`). `replay` answers from records and is built
/// by its users. A pool of local models is fastest with one thread each: set
/// `RAYON_NUM_THREADS=1` before any thread starts ([`single_threaded_models`]).
pub fn build(
    model: &ModelSection,
    seed: u64,
    progress: &mut dyn FnMut(&str),
) -> Result<Box<dyn Provider>> {
    match model.provider {
        ProviderKind::Openai => Ok(Box::new(openai::OpenAiProvider::new(model, seed)?)),
        ProviderKind::Local => {
            use local::{GenerationConfig, LocalModel, LocalProvider};
            let path = match &model.path {
                Some(p) => p.clone(),
                None => crate::model::ensure(&model.name, progress)?,
            };
            let n = LocalProvider::pool_size(model.concurrency);
            let models = (0..n)
                .map(|_| LocalModel::load(&path))
                .collect::<Result<Vec<_>>>()?;
            Ok(Box::new(LocalProvider::new(
                models,
                GenerationConfig {
                    max_tokens: model.max_tokens,
                    temperature: model.temperature,
                    top_p: model.top_p,
                    seed,
                },
            )))
        }
        ProviderKind::Http => Ok(Box::new(http::HttpProvider::new(model, seed)?)),
        ProviderKind::Exec => Ok(Box::new(exec::ExecProvider::new(model, seed)?)),
        ProviderKind::Anthropic => Ok(Box::new(anthropic::AnthropicProvider::new(model)?)),
        ProviderKind::Websocket => Ok(Box::new(websocket::WebsocketProvider::new(model, seed)?)),
        ProviderKind::Replay => Err(Error::Internal(
            "a replay provider answers from records, not calls".into(),
        )),
        ProviderKind::Builtin => Err(Error::Usage(
            "provider builtin is a guardrail run's classifier (a `guardrail` section): it answers no prompts".into(),
        )),
    }
}

/// Make every local model single-threaded (one per core is faster than one on every
/// core), unless the user chose otherwise. Call before any other thread starts: it
/// writes the environment.
pub fn single_threaded_models() {
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        // SAFETY: called from the main thread before the async runtime or any model
        // starts; no other thread reads or writes the environment at that point.
        unsafe { std::env::set_var("RAYON_NUM_THREADS", "1") };
    }
}

/// One chat message of a request.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Message {
    pub role: &'static str,
    pub content: String,
}

impl Message {
    pub fn system(content: String) -> Self {
        Self {
            role: "system",
            content,
        }
    }
    pub fn user(content: String) -> Self {
        Self {
            role: "user",
            content,
        }
    }
    pub fn assistant(content: String) -> Self {
        Self {
            role: "assistant",
            content,
        }
    }
}

/// Lines for the user while a target sets up (a model pulled, plants left by a killed
/// run removed).
pub type Notes = Arc<dyn Fn(&str) + Send + Sync>;

tokio::task_local! {
    /// The attempt the running calls belong to (set by the runner around each attempt).
    pub static ATTEMPT: Arc<AttemptScope>;
}

/// One attempt, as a target that keeps state per attempt sees it.
pub struct AttemptScope {
    /// The attempt's key (its attempt id, or the case id).
    pub key: String,
    pub case_id: String,
    /// The case's injection (what setup plants) and its user task.
    pub payload: Option<String>,
    pub task: Option<String>,
    /// The W3C `traceparent` sent with the attempt's requests (docs/agents.md):
    /// an agent's spans carry its trace id, which joins them to the attempt.
    pub traceparent: Option<String>,
    /// Where the run's trace receiver takes the agent's spans (`model.traces`).
    pub otlp_traces_url: Option<String>,
    /// A guardrail run's call (src/guard): the role of the text classified
    /// (`user_prompt`, `retrieved_document`, `tool_output`; `{{role}}`, exec's `role`).
    pub role: Option<&'static str>,
    state: std::sync::Mutex<AttemptState>,
}

/// What an attempt gathers as it runs.
#[derive(Debug, Default)]
pub struct AttemptState {
    /// What steps extracted (`{{vars.<name>}}`).
    pub vars: BTreeMap<String, String>,
    /// (origin, name) → value.
    pub cookies: BTreeMap<(String, String), String>,
    pub turn: u32,
    /// What setup planted (JSON of its variables), when it ran.
    pub planted: Option<String>,
    /// Setup began and is in the journal, as `plant_id` (unique in the run folder: an
    /// attempt run again after a resume plants anew).
    pub journaled: bool,
    pub plant_id: Option<String>,
    /// Whether teardown removed it.
    pub removed: Option<bool>,
    pub cleanup_error: Option<String>,
    /// Where the attempt's world is served (`model.world`), once it is open.
    pub world: Option<WorldAddress>,
}

/// Where an attempt's world is served, for the agent (`{{world.*}}` in a request
/// template, `world` in an `exec` request, `X-Pieval-World-*` headers of an `openai` or
/// `anthropic` request): docs/agents.md.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct WorldAddress {
    /// The MCP endpoint (streamable HTTP).
    pub mcp_url: String,
    /// The plain HTTP tools: `GET` lists them, `POST <http_url>/<name>` calls one with
    /// its arguments as the JSON body.
    pub http_url: String,
    /// This world's token (`Authorization: Bearer <token>`): another attempt's world
    /// does not answer to it.
    pub token: String,
}

/// A part of the attempt's world address (`{{world.<field>}}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WorldField {
    McpUrl,
    HttpUrl,
    Token,
}

impl WorldField {
    pub const ALL: [WorldField; 3] = [WorldField::McpUrl, WorldField::HttpUrl, WorldField::Token];

    pub fn as_str(self) -> &'static str {
        match self {
            WorldField::McpUrl => "mcp_url",
            WorldField::HttpUrl => "http_url",
            WorldField::Token => "token",
        }
    }

    /// Its header in an `openai` or `anthropic` request.
    pub fn header(self) -> &'static str {
        match self {
            WorldField::McpUrl => "x-pieval-world-mcp-url",
            WorldField::HttpUrl => "x-pieval-world-http-url",
            WorldField::Token => "x-pieval-world-token",
        }
    }

    /// Its value for the attempt in `scope`: the token, in a recorded request, as the
    /// place of a credential (`OPEN NAME CLOSE`, shown as `${PIEVAL_WORLD_TOKEN}`).
    pub fn value(self, scope: &AttemptScope, record: bool) -> Result<String, String> {
        let st = scope.state();
        let w = st.world.as_ref().ok_or_else(|| {
            format!(
                "{{{{world.{}}}}}: no world is served to this attempt (model.world serves one to each agentic case)",
                self.as_str()
            )
        })?;
        Ok(match self {
            WorldField::McpUrl => w.mcp_url.clone(),
            WorldField::HttpUrl => w.http_url.clone(),
            WorldField::Token if record => {
                use http::plant::{CLOSE, OPEN};
                format!("{OPEN}PIEVAL_WORLD_TOKEN{CLOSE}")
            }
            WorldField::Token => w.token.clone(),
        })
    }
}

impl AttemptScope {
    pub fn new(key: &str, case: &crate::contract::case::AttackCase) -> Self {
        // the untrusted content that carries the injection: the document, e-mail, page
        // or tool output of an indirect case; the prompt of a direct one
        let indirect = case.attack_surface.is_indirect() && case.task_input.is_some();
        Self {
            key: key.to_owned(),
            case_id: case.case_id.clone(),
            payload: Some(if indirect {
                case.task_input.clone().unwrap_or_default()
            } else {
                case.prompt.clone()
            }),
            task: Some(case.prompt.clone()),
            traceparent: None,
            otlp_traces_url: None,
            role: None,
            state: Default::default(),
        }
    }

    /// A call outside any attempt (a judge's), or one rebuilt from a journal.
    pub fn bare(case_id: &str) -> Self {
        Self::bare_attempt(case_id, case_id)
    }

    pub fn bare_attempt(key: &str, case_id: &str) -> Self {
        Self {
            key: key.to_owned(),
            case_id: case_id.to_owned(),
            payload: None,
            task: None,
            traceparent: None,
            otlp_traces_url: None,
            role: None,
            state: Default::default(),
        }
    }

    pub fn state(&self) -> std::sync::MutexGuard<'_, AttemptState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set_vars(&self, vars: Vec<(String, String)>) {
        self.state().vars.extend(vars);
    }

    /// A `Set-Cookie` header from `origin` (its name and value; attributes ignored: the
    /// jar is the attempt's, and sends a cookie only back to the origin that set it).
    pub fn set_cookie(&self, origin: &str, header: &str) {
        let pair = header.split(';').next().unwrap_or_default();
        if let Some((name, value)) = pair.split_once('=') {
            let name = name.trim();
            if !name.is_empty() {
                self.state().cookies.insert(
                    (origin.to_owned(), name.to_owned()),
                    value.trim().to_owned(),
                );
            }
        }
    }

    pub fn cookie(&self, origin: &str, name: &str) -> Option<String> {
        self.state()
            .cookies
            .get(&(origin.to_owned(), name.to_owned()))
            .cloned()
    }

    /// The `Cookie` header for a request to `origin`.
    pub fn cookie_header(&self, origin: &str) -> Option<String> {
        let st = self.state();
        let pairs: Vec<String> = st
            .cookies
            .iter()
            .filter(|((o, _), _)| o == origin)
            .map(|((_, n), v)| format!("{n}={v}"))
            .collect();
        (!pairs.is_empty()).then(|| pairs.join("; "))
    }
}
