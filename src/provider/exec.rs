//! `provider: exec` — the team's own code as the target: long-lived subprocesses speaking
//! JSON lines on stdin and stdout, one request object in, one answer object out. A few
//! lines wrap a Python function, a LangChain chain or a service client
//! (docs/applications.md).
//!
//! Request: `{"request_id", "case_id", "attempt_id", "seed", "turn", "messages":
//! [{role, content}…], "prompt", "context", "payload", "task"}`. Answer: `{"text": "…"}`
//! or `{"error": "…"}` (the case's error), with the request's `request_id` if it names
//! it. In a guardrail run (src/guard) the request also has `role` (the text's), the text
//! is `prompt` and `payload`, and the answer object itself is the guardrail's verdict
//! (`{"flagged": …, "score": …}`), read by the run's answer mapping. The command is an argument list (no shell); the child's environment is `PATH`,
//! `HOME`, `LANG`, `TMPDIR` and the variables `env` names — nothing else is inherited
//! (no key leaks to it unasked).
//!
//! By default there is one process per concurrency slot, one request in flight on each.
//! With `processes` below `concurrency`, requests are pipelined: each process is given
//! several at once, so it never waits for pieval between two requests, and each answer
//! must carry its request's `request_id` (an answer that does not cannot be told from
//! another's). A task per process owns it: it writes the requests, gives each answer
//! line to the request it names, and keeps the time — `timeout_s` runs from when the
//! process came to the oldest request waiting (it answered the one before, or was
//! idle), so requests queued behind a slow one are not timed out for it. A process that
//! exits, answers with a line that is not an answer, or does not answer in time is
//! killed; the request it was on is recorded as an error (with the end of its stderr),
//! and the requests queued behind it go to a new process (each fault fails one request,
//! so this ends). Its stderr is kept, bounded, in the run folder (`exec-stderr.log`).

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::{Notify, mpsc, oneshot};

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
    /// `concurrency` pipelines the requests: each process is given several, and each
    /// answer must carry its request's `request_id`.
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
    /// The process failed on another request, or ended, before answering this one: send
    /// it again. The cause is this request's error should it never be answered; `counts`
    /// when no request was failed for the fault (only those are bounded: a fault that
    /// fails one request can happen only as many times as there are requests).
    Requeue {
        cause: String,
        counts: bool,
    },
}

/// A request given to a process.
struct Job {
    line: Arc<[u8]>,
    request_id: String,
    tx: oneshot::Sender<Outcome>,
}

/// A request written to a process, waiting for its answer line.
struct Waiting {
    tx: oneshot::Sender<Outcome>,
    request_id: String,
}

/// One running child. Its task owns the child: it writes the requests given to it (a
/// writer task of its own, so a full pipe never stops the reading), reads the answers,
/// keeps the time and ends the child; the callers only send it requests and wait.
struct Proc {
    jobs: mpsc::UnboundedSender<Job>,
    /// Requests given to it and not yet resolved (counted when picked, so a burst of
    /// requests is spread before any of them reaches the process).
    load: AtomicUsize,
    /// Ended: nothing more is given to it.
    dead: Arc<AtomicBool>,
    /// The end of the run: finish (at once when requests are still on it).
    close: Arc<Notify>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The copy of its stderr to the run's log, awaited at the end of the run so the
    /// log holds the child's last words whatever runtime the run's calls are on.
    stderr_task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// A request counted on its process until it is resolved, or dropped (an interrupted
/// run).
struct Load<'a>(&'a AtomicUsize);

impl Drop for Load<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
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
    /// `close_run` has run: no process is started any more.
    closed: AtomicBool,
    slots: tokio::sync::Semaphore,
    log: Arc<Mutex<Option<(std::fs::File, u64)>>>,
}

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
            closed: AtomicBool::new(false),
            slots: tokio::sync::Semaphore::new(concurrency),
            log: Arc::new(Mutex::new(None)),
        })
    }

    /// Pipelined: several requests on one process, each answer naming its request.
    fn pipelined(&self) -> bool {
        self.depth > 1
    }

    /// How often a request is sent again after a fault that failed no request (a process
    /// that answers a request not waiting, or ends while requests are on it). Resends
    /// after a fault that failed the request the process was on are not counted: there
    /// can be only as many of those as there are requests.
    fn max_requeues(&self) -> usize {
        8 + self.depth
    }

    /// The process to give a request to (counted on it): a new one while fewer than
    /// `processes` run, else the live one with the fewest requests.
    fn pick(&self) -> std::result::Result<Arc<Proc>, String> {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        if self.closed.load(Ordering::Acquire) {
            return Err("exec: the run has ended".into());
        }
        pool.retain(|p| !p.dead.load(Ordering::Acquire));
        let least = pool
            .iter()
            .min_by_key(|p| p.load.load(Ordering::Relaxed))
            .map(Arc::clone);
        let p = match least {
            Some(p) if p.load.load(Ordering::Relaxed) == 0 || pool.len() >= self.processes => p,
            _ => {
                let p = self.spawn()?;
                pool.push(Arc::clone(&p));
                p
            }
        };
        p.load.fetch_add(1, Ordering::Relaxed);
        Ok(p)
    }

    fn spawn(&self) -> std::result::Result<Arc<Proc>, String> {
        let mut cmd = Command::new(&self.section.command[0]);
        cmd.args(&self.section.command[1..])
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // a group of its own: a launcher (`uv run`, `npm start`, a script) and what
            // it starts are ended together
            .process_group(0)
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
        let stderr = child.stderr.take().expect("piped");
        let tail = Arc::new(Mutex::new(VecDeque::with_capacity(STDERR_TAIL)));
        let stderr_task = tokio::spawn(keep_stderr(
            stderr,
            Arc::clone(&tail),
            Arc::clone(&self.log),
        ));
        let (jobs, rx) = mpsc::unbounded_channel();
        let (dead, close) = (Arc::new(AtomicBool::new(false)), Arc::new(Notify::new()));
        let group = Group(child.id().map_or(0, |id| id as i32));
        let serve = Serve {
            group,
            child,
            stdout,
            stderr: tail,
            jobs: rx,
            dead: Arc::clone(&dead),
            close: Arc::clone(&close),
            timeout: self.timeout,
            named: self.pipelined(),
        };
        let task = tokio::spawn(serve.run(stdin));
        Ok(Arc::new(Proc {
            jobs,
            load: AtomicUsize::new(0),
            dead,
            close,
            task: Mutex::new(Some(task)),
            stderr_task: Mutex::new(Some(stderr_task)),
        }))
    }
}

/// Copies a child's stderr to the run's `exec-stderr.log` (redacted a line at a time, so
/// a key split across two reads is still found; bounded) and keeps its end for errors.
async fn keep_stderr(
    mut stderr: tokio::process::ChildStderr,
    tail: Arc<Mutex<VecDeque<u8>>>,
    log: Arc<Mutex<Option<(std::fs::File, u64)>>>,
) {
    let mut buf = [0u8; 8192];
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
            let mut t = tail.lock().unwrap_or_else(|p| p.into_inner());
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
}

/// How a process's service ended.
enum End {
    /// It exited with nothing waiting.
    Exited,
    /// It exited with requests waiting: a crash (the request it was on to blame), or,
    /// with a clean exit status, a program that ends after some requests by itself.
    ExitedBusy,
    /// The run ended (its input closed) and it did not exit within seconds.
    Lingered,
    /// A fault: the message, and whether the request the process was on (the oldest
    /// waiting) caused it — else every request waiting is sent again.
    Fault(String, bool),
}

/// A child's process group, killed whole when its task ends (a fault, a child that
/// lingers, the task dropped): what the child started does not outlive it.
struct Group(i32);

impl Group {
    fn kill(&self) {
        if self.0 > 0 {
            // SAFETY: a plain system call; the group is the child's own (`process_group(0)`)
            unsafe { libc::kill(-self.0, libc::SIGKILL) };
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The task that owns one child (see [`Proc`]).
struct Serve {
    group: Group,
    child: Child,
    stdout: ChildStdout,
    stderr: Arc<Mutex<VecDeque<u8>>>,
    jobs: mpsc::UnboundedReceiver<Job>,
    dead: Arc<AtomicBool>,
    close: Arc<Notify>,
    timeout: Duration,
    /// Several requests at once: each answer must carry its request's `request_id`.
    named: bool,
}

/// The most request bytes gathered into one write.
const WRITE_BATCH: usize = 256 << 10;

impl Serve {
    /// Writes the requests, matches each answer line to its request, times the request
    /// the process is on from when it came to it, and ends the child: on a fault it is
    /// killed, the request it was on gets the error (with its exit status and the end of
    /// its stderr) and the others are sent again elsewhere.
    async fn run(mut self, stdin: ChildStdin) {
        let (lines, mut to_write) = mpsc::unbounded_channel::<Vec<u8>>();
        // the writer: requests in the order given, those already queued in one write;
        // dropped (the child's input closed) when the run ends or the process fails,
        // even in the middle of a write to a process that no longer reads
        let writer = tokio::spawn(async move {
            let mut stdin = stdin;
            while let Some(mut batch) = to_write.recv().await {
                while batch.len() < WRITE_BATCH
                    && let Ok(more) = to_write.try_recv()
                {
                    batch.extend_from_slice(&more);
                }
                if stdin.write_all(&batch).await.is_err() {
                    // the process closed its input (it exited): its reader judges
                    return;
                }
            }
        });
        let mut lines = Some(lines);
        let mut waiting: VecDeque<Waiting> = VecDeque::new();
        // since when the process has been on the oldest request waiting
        let mut front_since: Option<tokio::time::Instant> = None;
        let mut closing: Option<tokio::time::Instant> = None;
        let timer = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(timer);
        let mut armed: Option<tokio::time::Instant> = None;
        let mut buf: Vec<u8> = Vec::with_capacity(16 << 10);
        let mut scanned = 0;
        let end = 'serve: loop {
            // every whole line in the buffer, one answer each
            let mut start = 0;
            while let Some(i) = memchr::memchr(b'\n', &buf[scanned..]).map(|i| scanned + i) {
                let more = i + 1 < buf.len();
                if let Err(fault) =
                    self.answer(&buf[start..i], more, &mut waiting, &mut front_since)
                {
                    break 'serve fault;
                }
                start = i + 1;
                scanned = start;
            }
            buf.drain(..start);
            scanned = buf.len();
            if buf.len() > super::MAX_BODY_BYTES {
                break End::Fault(
                    format!(
                        "exec: the answer line exceeds {} MiB",
                        super::MAX_BODY_BYTES >> 20
                    ),
                    !waiting.is_empty(),
                );
            }
            // one timer, re-armed lazily: the deadline only moves later while requests
            // wait (each answer restarts the clock), so it is set when it is first due
            // and, on firing early, set again to the deadline of the moment
            let due = match closing {
                Some(at) => Some(at + Duration::from_secs(2)),
                None => front_since.map(|t| t + self.timeout),
            };
            if let Some(d) = due
                && armed.is_none_or(|a| d < a)
            {
                timer.as_mut().reset(d);
                armed = Some(d);
            }
            // what the process wrote is judged before a new request is given to it (a
            // line printed twice, or its exit, is not taken for the next request's)
            tokio::select! {
                biased;
                () = self.close.notified(), if closing.is_none() => {
                    if !waiting.is_empty() {
                        // an interrupted run: what is still on it is not wanted
                        break End::Fault("exec: the run was stopped".into(), false);
                    }
                    // its input closes once the writer is done; it has seconds to exit
                    lines = None;
                    closing = Some(tokio::time::Instant::now());
                }
                n = self.stdout.read_buf(&mut buf) => match n {
                    Ok(0) | Err(_) if waiting.is_empty() => break End::Exited,
                    Ok(0) | Err(_) => break End::ExitedBusy,
                    Ok(_) => {}
                },
                job = self.jobs.recv(), if closing.is_none() => {
                    let Some(job) = job else {
                        // nothing can send to it any more: the same as the end of the run
                        if !waiting.is_empty() {
                            break End::Fault("exec: the run was stopped".into(), false);
                        }
                        lines = None;
                        closing = Some(tokio::time::Instant::now());
                        continue;
                    };
                    // those queued behind it too, in one write
                    let mut batch = Vec::with_capacity(job.line.len());
                    let mut next = Some(job);
                    while let Some(job) = next {
                        if waiting.is_empty() {
                            front_since = Some(tokio::time::Instant::now());
                        }
                        batch.extend_from_slice(&job.line);
                        waiting.push_back(Waiting { tx: job.tx, request_id: job.request_id });
                        next = if batch.len() < WRITE_BATCH {
                            self.jobs.try_recv().ok()
                        } else {
                            None
                        };
                    }
                    if let Some(l) = &lines {
                        let _ = l.send(batch);
                    }
                }
                () = &mut timer, if armed.is_some() => {
                    armed = None;
                    let now = tokio::time::Instant::now();
                    if closing.is_some_and(|at| now >= at + Duration::from_secs(2)) {
                        break End::Lingered;
                    }
                    if closing.is_none() && front_since.is_some_and(|t| now >= t + self.timeout) {
                        break End::Fault(
                            format!("exec: no answer within {} s", self.timeout.as_secs_f64()),
                            true,
                        );
                    }
                    // fired early: armed again at the top of the loop
                }
            }
        };
        self.dead.store(true, Ordering::Release);
        self.jobs.close();
        writer.abort();
        let end = match end {
            End::ExitedBusy => {
                match tokio::time::timeout(Duration::from_secs(2), self.child.wait()).await {
                    // it ended by itself (it serves some requests and exits): the next one
                    // it was given was never its to blame
                    Ok(Ok(s)) if s.success() => End::Fault(
                        format!("exec: the process exited ({s}) before it answered"),
                        false,
                    ),
                    _ => End::Fault("exec: the process exited before it answered".into(), true),
                }
            }
            end => end,
        };
        if !matches!(end, End::Exited) {
            let _ = self.child.start_kill();
            self.group.kill();
        }
        // the requests not to blame go elsewhere at once (the process can no longer
        // run them): those waiting behind the one it failed on, and those given to it
        // as it ended (a send under way is waited for)
        let (blamed, cause, counts) = match &end {
            End::Fault(message, blame) => {
                let blamed = if *blame { waiting.pop_front() } else { None };
                (blamed, message.clone(), !*blame)
            }
            End::Exited | End::Lingered | End::ExitedBusy => {
                (None, "exec: the process ended".into(), true)
            }
        };
        let requeue = || Outcome::Requeue {
            cause: cause.clone(),
            counts,
        };
        for w in waiting.drain(..) {
            let _ = w.tx.send(requeue());
        }
        while let Some(job) = self.jobs.recv().await {
            let _ = job.tx.send(requeue());
        }
        let status = match tokio::time::timeout(Duration::from_secs(2), self.child.wait()).await {
            Ok(Ok(s)) => format!(" ({s})"),
            _ => String::new(),
        };
        // what it started ends with it (and only once: the number is free again after)
        self.group.kill();
        self.group.0 = 0;
        if let Some(w) = blamed {
            // what it wrote to stderr last (give its reader a moment to catch up)
            tokio::time::sleep(Duration::from_millis(50)).await;
            let _ = w.tx.send(Outcome::Failed(format!(
                "{cause}{status}{}",
                stderr_end(&self.stderr)
            )));
        }
    }

    /// One answer line: given to the request it names, else (one request at a time) to
    /// the request waiting. `more`: the process wrote more after it.
    fn answer(
        &self,
        line: &[u8],
        more: bool,
        waiting: &mut VecDeque<Waiting>,
        front_since: &mut Option<tokio::time::Instant>,
    ) -> std::result::Result<(), End> {
        if waiting.is_empty() {
            return Err(End::Fault(
                "exec: the process wrote a line no request was waiting for".into(),
                false,
            ));
        }
        let answer = std::str::from_utf8(line)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str::<Value>(t.trim()).map_err(|e| e.to_string()))
            .map_err(|e| {
                let text = String::from_utf8_lossy(line);
                End::Fault(
                    format!(
                        "exec: the answer is not a JSON line ({e}): {}",
                        crate::text::excerpt(&crate::secrets::redact(text.trim()).0, 200)
                    ),
                    true,
                )
            })?;
        let at = match answer.get("request_id") {
            Some(Value::String(id)) => waiting
                .iter()
                .position(|w| w.request_id == *id)
                .ok_or_else(|| {
                    End::Fault(
                        format!(
                            "exec: the process answered request {}, which is not waiting (answered already, or never sent)",
                            crate::text::excerpt(&crate::text::escape_control(id), 80)
                        ),
                        false,
                    )
                })?,
            Some(_) => {
                return Err(End::Fault(
                    "exec: the answer's \"request_id\" is not a string".into(),
                    true,
                ));
            }
            None if self.named => {
                return Err(End::Fault(
                    "exec: the answer does not carry its request's \"request_id\": with processes below concurrency, requests are pipelined and each answer must name its request (docs/applications.md)".into(),
                    true,
                ));
            }
            // more written while no other request waits: the process is out of step (it
            // would give the next case this one's answer)
            None if more && waiting.len() == 1 => {
                return Err(End::Fault(
                    "exec: the process wrote more than one line for one request".into(),
                    true,
                ));
            }
            None => 0,
        };
        let w = waiting.remove(at).expect("a position in the queue");
        if at == 0 {
            *front_since = (!waiting.is_empty()).then(tokio::time::Instant::now);
        }
        let _ = w.tx.send(Outcome::Answer(answer));
        Ok(())
    }
}

/// The end of a process's stderr for an error: whole lines only (a cut line could hold
/// part of a key the redactor no longer recognises), the last ones up to 500 characters,
/// redacted and escaped.
fn stderr_end(stderr: &Mutex<VecDeque<u8>>) -> String {
    let tail: Vec<u8> = stderr
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .copied()
        .collect();
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
    if t.trim().is_empty() {
        String::new()
    } else {
        format!(
            "; its stderr ends: {}",
            crate::text::escape_control(t.trim())
        )
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
        // each process's input is closed and it has seconds to exit, else it is killed
        // (it keeps running, or a helper it started holds its output open); one with
        // requests still on it (an interrupted run) is killed at once
        let procs = {
            let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
            self.closed.store(true, Ordering::Release);
            std::mem::take(&mut *pool)
        };
        for p in &procs {
            p.close.notify_one();
        }
        let tasks = procs.iter().filter_map(|p| {
            let task = p.task.lock().unwrap_or_else(|p| p.into_inner()).take()?;
            let stderr = p
                .stderr_task
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            let abort = task.abort_handle();
            // its task ends the child within seconds; if it does not, the task is
            // aborted and the child's group killed with it
            Some(async move {
                if tokio::time::timeout(Duration::from_secs(6), task)
                    .await
                    .is_err()
                {
                    abort.abort();
                }
                // the child is gone: its stderr ends (unless a helper it started still
                // holds it open, which is not waited for long)
                if let Some(stderr) = stderr {
                    let abort = stderr.abort_handle();
                    if tokio::time::timeout(Duration::from_secs(2), stderr)
                        .await
                        .is_err()
                    {
                        abort.abort();
                    }
                }
            })
        });
        futures::future::join_all(tasks).await;
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
        let (mut answer, latency_ms) = self.ask(case_id, &as_json, &[]).await?;
        // A guardrail's answer (src/guard): the whole object is the verdict, read by
        // the run's answer mapping.
        if crate::provider::ATTEMPT
            .try_with(|s| s.role.is_some())
            .unwrap_or(false)
        {
            if let Some(m) = answer.as_object_mut() {
                m.remove("request_id");
            }
            return Ok(super::AgentTurn::answer(answer.to_string(), latency_ms, 1));
        }
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
        // unique among the requests in flight: an attempt's turns come one after another
        let request_id = format!("{}#{turn}", scope.key);
        let request = json!({
            "request_id": request_id,
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
            "role": scope.role,
            "world": scope.state().world,
            "traceparent": scope.traceparent,
            "otlp_traces_url": scope.otlp_traces_url,
        });
        let mut line = serde_json::to_vec(&request).expect("a JSON value");
        line.push(b'\n');
        let line: Arc<[u8]> = line.into();
        let _slot = self
            .slots
            .acquire()
            .await
            .map_err(|_| fail("exec: closed".into()))?;
        let mut last = String::new();
        let mut counted = 0;
        while counted <= self.max_requeues() {
            let proc = self.pick().map_err(fail)?;
            let _load = Load(&proc.load);
            let (tx, rx) = oneshot::channel();
            let job = Job {
                line: Arc::clone(&line),
                request_id: request_id.clone(),
                tx,
            };
            let outcome = match proc.jobs.send(job) {
                Ok(()) => rx.await.unwrap_or_else(|_| Outcome::Requeue {
                    cause: "exec: the process's task ended".into(),
                    counts: true,
                }),
                Err(_) => Outcome::Requeue {
                    cause: "exec: the process had ended".into(),
                    counts: true,
                },
            };
            match outcome {
                Outcome::Answer(answer) => {
                    if let Some(e) = answer.get("error").filter(|e| !e.is_null()) {
                        let e = e.as_str().map_or_else(|| e.to_string(), str::to_owned);
                        return Err(fail(format!("exec: {}", crate::secrets::redact(&e).0)));
                    }
                    return Ok((answer, start.elapsed().as_secs_f64() * 1e3));
                }
                Outcome::Failed(message) => return Err(fail(message)),
                Outcome::Requeue { cause, counts } => {
                    counted += usize::from(counts);
                    last = cause;
                }
            }
        }
        Err(fail(format!(
            "exec: sent again {} times, each time the process ended before answering it without another request to blame; the last: {last}",
            self.max_requeues() + 1
        )))
    }
}
