//! `provider: exec` — the team's own code as the target: long-lived subprocesses speaking
//! JSON lines on stdin and stdout, one request object in, one answer object out. A few
//! lines wrap a Python function, a LangChain chain or a service client
//! (docs/applications.md).
//!
//! Request: `{"case_id", "attempt_id", "seed", "turn", "messages": [{role, content}…],
//! "prompt", "context", "payload", "task"}`. Answer: `{"text": "…"}` or
//! `{"error": "…"}` (the case's error). The command is an argument list (no shell); the
//! child's environment is `PATH`, `HOME`, `LANG`, `TMPDIR` and the variables `env`
//! names — nothing else is inherited (no key leaks to it unasked).
//!
//! By default there is one process per concurrency slot, one request in flight on each.
//! With `processes` below `concurrency`, requests are pipelined: each process is given
//! several at once and answers them in the order they came (what a `for line in stdin`
//! loop does), so a process never waits for pieval between two requests. A reader task
//! per process matches each answer line to the oldest request waiting, and keeps the
//! time: `timeout_s` runs from when the process came to a request (it answered the one
//! before, or was idle), so requests queued behind a slow one are not timed out for it.
//! A process that exits, answers with a line that is not an answer, or does not answer
//! in time is killed; the request it was on is recorded as an error (with the end of its
//! stderr), and the requests queued behind it go to a new process. Its stderr is kept,
//! bounded, in the run folder (`exec-stderr.log`).

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::{Notify, oneshot};

use super::{AttemptScope, CallError, Completion, Message, Provider};
use crate::error::{Error, Result};

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ExecSection {
    /// The program and its arguments (no shell): `[python3, wrap.py]`.
    pub command: Vec<String>,
    /// Variables the child gets, as `NAME_IN_CHILD: NAME_HERE` (the value read from
    /// pieval's environment; a secret is registered for redaction).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// The child's working folder (default: pieval's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathBuf>,
    /// How many processes to start (default: one per concurrency slot). Fewer than
    /// `concurrency` pipelines the requests: each process is given several and answers
    /// them in order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes: Option<usize>,
}

/// Variables every child gets (what finding and running a program needs).
const BASE_ENV: [&str; 4] = ["PATH", "HOME", "LANG", "TMPDIR"];
/// The end of a process's stderr kept for its case's error.
const STDERR_TAIL: usize = 2048;
/// The most of all processes' stderr kept in the run folder.
const STDERR_LOG_MAX: u64 = 8 << 20;

impl ExecSection {
    /// Rules serde cannot express: (key under `exec.`, message).
    pub fn check(&self, concurrency: usize) -> std::result::Result<(), (String, String)> {
        if let Some(n) = self.processes
            && (n == 0 || n > concurrency)
        {
            return Err((
                "processes".into(),
                format!(
                    "between 1 and the model's concurrency ({concurrency}): the requests in flight are shared among the processes"
                ),
            ));
        }
        if self.command.is_empty() || self.command[0].trim().is_empty() {
            return Err((
                "command".into(),
                "the program to start, and its arguments: [python3, wrap.py]".into(),
            ));
        }
        let name = |n: &str| {
            !n.is_empty()
                && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                && !n.as_bytes()[0].is_ascii_digit()
        };
        for (k, v) in &self.env {
            if !name(k) || !name(v) {
                return Err((
                    format!("env.{k}"),
                    "NAME_IN_CHILD: NAME_HERE, both names of environment variables (the value is read from pieval's environment, never written in the config)".into(),
                ));
            }
        }
        Ok(())
    }
}

/// How a request ended on a process.
enum Outcome {
    Answer(Value),
    /// The process failed on this request: the case's error.
    Failed(String),
    /// The process failed on another request queued before this one: send it again.
    Requeue,
}

/// A request written to a process, waiting for its answer line.
struct Waiting {
    tx: oneshot::Sender<Outcome>,
    /// The request's `attempt_id` and `turn`: an answer that names them is checked.
    attempt_id: String,
    turn: u32,
}

#[derive(Default)]
struct ProcState {
    /// Requests written and not yet answered, oldest first (the answers come in order).
    waiting: VecDeque<Waiting>,
    /// Since when the process has been on the oldest request (the timeout runs from
    /// there).
    front_since: Option<Instant>,
    /// Killed or exited: nothing more is given to it.
    dead: bool,
}

/// One running child: its input (written by the callers, one whole line each, under
/// the lock, in the order they are queued) and the state its reader task shares.
struct Proc {
    stdin: tokio::sync::Mutex<Option<ChildStdin>>,
    state: Mutex<ProcState>,
    /// Woken when a request is queued (the reader starts its clock).
    queued: Notify,
    reader: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Proc {
    fn lock(&self) -> std::sync::MutexGuard<'_, ProcState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub struct ExecProvider {
    section: ExecSection,
    env: Vec<(String, String)>,
    timeout: Duration,
    seed: u64,
    /// The most processes at once.
    processes: usize,
    /// The most requests in flight on one process.
    depth: usize,
    pool: Mutex<Vec<Arc<Proc>>>,
    slots: tokio::sync::Semaphore,
    log: Arc<Mutex<Option<(std::fs::File, u64)>>>,
}

/// How often a request is sent again after other requests' faults killed the process
/// it was queued on.
const MAX_REQUEUES: usize = 3;

impl ExecProvider {
    pub fn new(model: &super::config::ModelSection, seed: u64) -> Result<Self> {
        let section = model
            .exec
            .clone()
            .ok_or_else(|| Error::State("provider exec needs the model.exec section".into()))?;
        let mut env = Vec::new();
        for var in BASE_ENV {
            if let Ok(v) = std::env::var(var) {
                env.push((var.to_owned(), v));
            }
        }
        for (child_name, here) in &section.env {
            match std::env::var(here) {
                Ok(v) => {
                    crate::secrets::register(&v);
                    env.push((child_name.clone(), v));
                }
                Err(_) => {
                    return Err(Error::State(format!(
                        "model.exec.env.{child_name} names {here}, but that environment variable is not set"
                    )));
                }
            }
        }
        let concurrency = model.concurrency.max(1);
        let processes = section
            .processes
            .unwrap_or(concurrency)
            .clamp(1, concurrency);
        Ok(Self {
            section,
            env,
            timeout: Duration::from_secs_f64(model.timeout_s),
            seed,
            processes,
            depth: concurrency.div_ceil(processes),
            pool: Mutex::new(Vec::new()),
            slots: tokio::sync::Semaphore::new(concurrency),
            log: Arc::new(Mutex::new(None)),
        })
    }

    /// The process to give a request to: a new one while fewer than `processes` run,
    /// else the live one with the fewest requests waiting.
    fn pick(&self) -> std::result::Result<Arc<Proc>, String> {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        pool.retain(|p| !p.lock().dead);
        let least = pool
            .iter()
            .map(|p| (p.lock().waiting.len(), p))
            .min_by_key(|(n, _)| *n)
            .map(|(n, p)| (n, Arc::clone(p)));
        match least {
            Some((n, p)) if n == 0 || pool.len() >= self.processes => Ok(p),
            _ => {
                let p = self.spawn()?;
                pool.push(Arc::clone(&p));
                Ok(p)
            }
        }
    }

    fn spawn(&self) -> std::result::Result<Arc<Proc>, String> {
        let mut cmd = Command::new(&self.section.command[0]);
        cmd.args(&self.section.command[1..])
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(d) = &self.section.cwd {
            cmd.current_dir(d);
        }
        let mut child = cmd.spawn().map_err(|e| {
            format!(
                "exec: cannot start {}: {e}",
                crate::text::escape_control(&self.section.command[0])
            )
        })?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let mut stderr = child.stderr.take().expect("piped");
        let tail = Arc::new(Mutex::new(VecDeque::with_capacity(STDERR_TAIL)));
        let (tail2, log) = (Arc::clone(&tail), Arc::clone(&self.log));
        tokio::spawn(async move {
            let mut buf = [0u8; 8192];
            // redacted a line at a time (a key split across two reads is still found)
            let mut pending: Vec<u8> = Vec::new();
            let flush = |bytes: &[u8]| {
                let mut l = log.lock().unwrap_or_else(|p| p.into_inner());
                if let Some((f, written)) = l.as_mut()
                    && *written < STDERR_LOG_MAX
                {
                    use std::io::Write;
                    let text = String::from_utf8_lossy(bytes);
                    let text = crate::secrets::redact(&text).0.into_owned();
                    let _ = f.write_all(text.as_bytes());
                    *written += text.len() as u64;
                }
            };
            loop {
                let n = match stderr.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                let chunk = &buf[..n];
                {
                    let mut t = tail2.lock().unwrap_or_else(|p| p.into_inner());
                    t.extend(chunk);
                    while t.len() > STDERR_TAIL {
                        t.pop_front();
                    }
                }
                pending.extend_from_slice(chunk);
                if let Some(i) = memchr::memrchr(b'\n', &pending) {
                    flush(&pending[..=i]);
                    pending.drain(..=i);
                } else if pending.len() > 64 << 10 {
                    flush(&pending);
                    pending.clear();
                }
            }
            if !pending.is_empty() {
                flush(&pending);
            }
        });
        let proc = Arc::new(Proc {
            stdin: tokio::sync::Mutex::new(Some(stdin)),
            state: Mutex::new(ProcState::default()),
            queued: Notify::new(),
            reader: Mutex::new(None),
        });
        let handle = tokio::spawn(read_answers(
            Arc::clone(&proc),
            child,
            stdout,
            tail,
            self.timeout,
        ));
        *proc.reader.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
        Ok(proc)
    }

    /// Queues `line` on `proc` and waits for its answer.
    async fn exchange(&self, proc: &Proc, line: &[u8], attempt_id: &str, turn: u32) -> Outcome {
        let (tx, rx) = oneshot::channel();
        {
            let mut stdin = proc.stdin.lock().await;
            {
                let mut st = proc.lock();
                if st.dead || stdin.is_none() {
                    return Outcome::Requeue;
                }
                if st.waiting.is_empty() {
                    st.front_since = Some(Instant::now());
                }
                st.waiting.push_back(Waiting {
                    tx,
                    attempt_id: attempt_id.to_owned(),
                    turn,
                });
            }
            proc.queued.notify_one();
            // a write that fails or blocks is the reader's to judge (the process exited,
            // or stopped reading: its clock runs out)
            if let Some(w) = stdin.as_mut()
                && w.write_all(line).await.is_err()
            {
                *stdin = None;
            }
        }
        // the reader answers every request it was given; this bound only guards
        // against a reader that is gone
        let bound = self.timeout * (self.depth as u32 + 2) + Duration::from_secs(10);
        match tokio::time::timeout(bound, rx).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => Outcome::Requeue,
            Err(_) => Outcome::Failed(format!("exec: no answer within {} s", bound.as_secs_f64())),
        }
    }
}

/// The reader of one process's answers: each line goes to the oldest request waiting;
/// the clock of that request runs from when the process came to it. On a fault the
/// process is killed, the request it was on gets the error (with its exit status and
/// the end of its stderr) and the requests behind it are sent again elsewhere.
async fn read_answers(
    proc: Arc<Proc>,
    mut child: Child,
    mut stdout: ChildStdout,
    stderr: Arc<Mutex<VecDeque<u8>>>,
    timeout: Duration,
) {
    let mut buf: Vec<u8> = Vec::with_capacity(16 << 10);
    let mut scanned = 0;
    // a fault: its message, and whether the request the process was on caused it (a
    // line out of step blames none: the requests waiting are sent again)
    let fault: Option<(String, bool)> = 'read: loop {
        // every whole line in the buffer
        while let Some(i) = memchr::memchr(b'\n', &buf[scanned..]).map(|i| scanned + i) {
            let line = &buf[..i];
            let parsed = std::str::from_utf8(line)
                .map_err(|e| e.to_string())
                .and_then(|t| serde_json::from_str::<Value>(t.trim()).map_err(|e| e.to_string()));
            let rest_empty = i + 1 == buf.len();
            let mut st = proc.lock();
            let Some(front) = st.waiting.front() else {
                break 'read Some((
                    "exec: the process wrote a line no request was waiting for".into(),
                    false,
                ));
            };
            let answer = match parsed {
                Ok(v) => v,
                Err(e) => {
                    let text = String::from_utf8_lossy(line);
                    break 'read Some((
                        format!(
                            "exec: the answer is not a JSON line ({e}): {}",
                            crate::text::excerpt(&crate::secrets::redact(text.trim()).0, 200)
                        ),
                        true,
                    ));
                }
            };
            // an answer that names its request must name the one waiting
            let named = answer.get("attempt_id").and_then(Value::as_str);
            let named_turn = answer.get("turn").and_then(Value::as_u64);
            if named.is_some_and(|a| a != front.attempt_id)
                || named_turn.is_some_and(|t| t != u64::from(front.turn))
            {
                break 'read Some((
                    "exec: the process answered another request than the one waiting (out of step)"
                        .into(),
                    false,
                ));
            }
            // more written while no other request waits: the process is out of step (it
            // would give the next case this one's answer)
            if st.waiting.len() == 1 && !rest_empty {
                break 'read Some((
                    "exec: the process wrote more than one line for one request".into(),
                    true,
                ));
            }
            let w = st.waiting.pop_front().expect("checked");
            st.front_since = (!st.waiting.is_empty()).then(Instant::now);
            drop(st);
            let _ = w.tx.send(Outcome::Answer(answer));
            buf.drain(..=i);
            scanned = 0;
        }
        scanned = buf.len();
        if buf.len() > super::MAX_BODY_BYTES {
            break Some((
                format!(
                    "exec: the answer line exceeds {} MiB",
                    super::MAX_BODY_BYTES >> 20
                ),
                true,
            ));
        }
        let since = proc.lock().front_since;
        let deadline = since.map(|t| tokio::time::Instant::from_std(t + timeout));
        tokio::select! {
            n = stdout.read_buf(&mut buf) => match n {
                Ok(0) | Err(_) => {
                    if proc.lock().waiting.is_empty() {
                        break None;
                    }
                    break Some(("exec: the process exited before it answered".into(), true));
                }
                Ok(_) => {}
            },
            () = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            } => {
                break Some((format!("exec: no answer within {} s", timeout.as_secs_f64()), true));
            }
            () = proc.queued.notified() => {}
        }
    };
    proc.lock().dead = true;
    // killed before its input is closed: a caller blocked writing to a process that
    // stopped reading holds the input's lock until the write fails
    if fault.is_some() {
        let _ = child.start_kill();
    }
    *proc.stdin.lock().await = None;
    let status = match tokio::time::timeout(Duration::from_secs(2), child.wait()).await {
        Ok(Ok(s)) => format!(" ({s})"),
        _ => {
            // the input closed at the end of the run and it did not end by itself
            let _ = child.kill().await;
            String::new()
        }
    };
    let Some((message, blame)) = fault else {
        // a request queued as the process ended goes elsewhere
        for w in std::mem::take(&mut proc.lock().waiting) {
            let _ = w.tx.send(Outcome::Requeue);
        }
        return;
    };
    // what it wrote to stderr last (give its reader a moment to catch up)
    tokio::time::sleep(Duration::from_millis(50)).await;
    let tail: Vec<u8> = stderr
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .copied()
        .collect();
    // whole lines only (a cut line could hold part of a key the redactor no longer
    // recognises), the last ones up to 500 characters
    let full = tail.len() >= STDERR_TAIL;
    let tail = String::from_utf8_lossy(&tail);
    let mut lines: Vec<&str> = tail.lines().collect();
    if full && !lines.is_empty() {
        lines.remove(0);
    }
    let mut kept: Vec<String> = Vec::new();
    let mut size = 0;
    for l in lines.iter().rev() {
        let l = crate::secrets::redact(l).0.into_owned();
        if size + l.len() > 500 {
            break;
        }
        size += l.len() + 1;
        kept.push(l);
    }
    kept.reverse();
    let t = kept.join("\n");
    let tail = if t.trim().is_empty() {
        String::new()
    } else {
        format!(
            "; its stderr ends: {}",
            crate::text::escape_control(t.trim())
        )
    };
    let waiting = std::mem::take(&mut proc.lock().waiting);
    for (i, w) in waiting.into_iter().enumerate() {
        let _ = w.tx.send(if i == 0 && blame {
            Outcome::Failed(format!("{message}{status}{tail}"))
        } else {
            Outcome::Requeue
        });
    }
}

#[async_trait]
impl Provider for ExecProvider {
    fn name(&self) -> &str {
        "exec"
    }

    async fn open_run(&self, dir: &Path, _note: super::Notes) -> Result<()> {
        let path = dir.join("exec-stderr.log");
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(Error::State(format!(
                "{} is a symbolic link",
                path.display()
            )));
        }
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| Error::io(&path, "cannot open", e))?;
        let written = f.metadata().map(|m| m.len()).unwrap_or(0);
        *self.log.lock().unwrap_or_else(|p| p.into_inner()) = Some((f, written));
        Ok(())
    }

    async fn close_run(&self) -> Option<String> {
        // the children end when their input closes; one that does not end within
        // seconds (it keeps running, or a helper it started holds its output open) is
        // killed: its reader is dropped, and the child with it (killed on drop). The
        // input's lock is waited for a bounded time (an attempt cut short mid-write may
        // hold it).
        let procs = std::mem::take(&mut *self.pool.lock().unwrap_or_else(|p| p.into_inner()));
        for p in &procs {
            if let Ok(mut stdin) =
                tokio::time::timeout(Duration::from_secs(2), p.stdin.lock()).await
            {
                *stdin = None;
            }
        }
        for p in procs {
            let reader = p.reader.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(reader) = reader {
                let abort = reader.abort_handle();
                if tokio::time::timeout(Duration::from_secs(4), reader)
                    .await
                    .is_err()
                {
                    abort.abort();
                }
            }
        }
        None
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
        let (answer, latency_ms) = self.ask(case_id, &as_json, &[]).await?;
        let Some(text) = answer.get("text").and_then(Value::as_str) else {
            return Err(CallError {
                message: format!(
                    "exec: the answer has no \"text\" (a string): {}",
                    crate::text::excerpt(&crate::secrets::redact(&answer.to_string()).0, 200)
                ),
                latency_ms,
                attempts: 1,
            });
        };
        Ok(super::AgentTurn::answer(text.to_owned(), latency_ms, 1))
    }

    /// An agent's turn: the request carries `tools` (OpenAI form) and the conversation
    /// with its tool calls and results; the answer `{"text": …, "tool_calls": [{"id",
    /// "name", "arguments"}]}` (either may be absent; the OpenAI form of a call is read
    /// too).
    async fn chat(
        &self,
        key: &str,
        messages: &[Value],
        tools: &[Value],
    ) -> std::result::Result<super::AgentTurn, CallError> {
        let (answer, latency_ms) = self.ask(key, messages, tools).await?;
        let bad = |m: String| CallError {
            message: format!("exec: {m}"),
            latency_ms,
            attempts: 1,
        };
        let tool_calls = match answer.get("tool_calls").filter(|v| !v.is_null()) {
            Some(list) => super::tool_calls_of(list).map_err(bad)?,
            None => Vec::new(),
        };
        let content = answer
            .get("text")
            .and_then(Value::as_str)
            .map(str::to_owned);
        if content.is_none() && tool_calls.is_empty() {
            return Err(bad(format!(
                "the answer has neither \"text\" nor \"tool_calls\": {}",
                crate::text::excerpt(&crate::secrets::redact(&answer.to_string()).0, 200)
            )));
        }
        Ok(super::AgentTurn {
            content,
            tool_calls,
            completion: Completion::default(),
        }
        .finished(latency_ms, 1))
    }
}

impl ExecProvider {
    /// One exchange for the attempt in scope: the answer object (its `error` already
    /// the call's error).
    async fn ask(
        &self,
        case_id: &str,
        messages: &[Value],
        tools: &[Value],
    ) -> std::result::Result<(Value, f64), CallError> {
        let start = Instant::now();
        let scope = super::ATTEMPT
            .try_with(Arc::clone)
            .unwrap_or_else(|_| Arc::new(AttemptScope::bare(case_id)));
        let turn = {
            let mut st = scope.state();
            st.turn += 1;
            st.turn
        };
        let fail = |message: String| CallError {
            message,
            latency_ms: start.elapsed().as_secs_f64() * 1e3,
            attempts: 1,
        };
        let request = json!({
            "case_id": scope.case_id,
            "attempt_id": scope.key,
            "seed": self.seed,
            "turn": turn,
            "messages": messages,
            "tools": tools,
            "prompt": messages.iter().rev().find(|m| m["role"] == "user").and_then(|m| m["content"].as_str()),
            "context": messages.iter().find(|m| m["role"] == "system").and_then(|m| m["content"].as_str()),
            "payload": scope.payload,
            "task": scope.task,
        });
        let mut line = serde_json::to_vec(&request).expect("a JSON value");
        line.push(b'\n');
        let _slot = self
            .slots
            .acquire()
            .await
            .map_err(|_| fail("exec: closed".into()))?;
        for _ in 0..=MAX_REQUEUES {
            let proc = self.pick().map_err(fail)?;
            match self.exchange(&proc, &line, &scope.key, turn).await {
                Outcome::Answer(answer) => {
                    if let Some(e) = answer.get("error").filter(|e| !e.is_null()) {
                        let e = e.as_str().map_or_else(|| e.to_string(), str::to_owned);
                        return Err(fail(format!("exec: {}", crate::secrets::redact(&e).0)));
                    }
                    return Ok((answer, start.elapsed().as_secs_f64() * 1e3));
                }
                Outcome::Failed(message) => return Err(fail(message)),
                Outcome::Requeue => {}
            }
        }
        Err(fail(format!(
            "exec: the processes this request was queued on failed {} times on other requests",
            MAX_REQUEUES + 1
        )))
    }
}
