//! `provider: exec` — the team's own code as the target: a long-lived subprocess per
//! concurrency slot speaking JSON lines on stdin and stdout, one request object in, one
//! answer object out. A few lines wrap a Python function, a LangChain chain or a service
//! client (docs/applications.md).
//!
//! Request: `{"case_id", "attempt_id", "seed", "turn", "messages": [{role, content}…],
//! "prompt", "context", "payload", "task"}`. Answer: `{"text": "…"}` or
//! `{"error": "…"}` (the case's error). The command is an argument list (no shell); the
//! child's environment is `PATH`, `HOME`, `LANG`, `TMPDIR` and the variables `env`
//! names — nothing else is inherited (no key leaks to it unasked). A process that exits,
//! answers with a line that is not an answer, or does not answer within `timeout_s` is
//! killed, its case recorded as an error (with the end of its stderr), and started again
//! for the next case. Its stderr is kept, bounded, in the run folder (`exec-stderr.log`).

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

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
}

/// Variables every child gets (what finding and running a program needs).
const BASE_ENV: [&str; 4] = ["PATH", "HOME", "LANG", "TMPDIR"];
/// The end of a process's stderr kept for its case's error.
const STDERR_TAIL: usize = 2048;
/// The most of all processes' stderr kept in the run folder.
const STDERR_LOG_MAX: u64 = 8 << 20;

impl ExecSection {
    /// Rules serde cannot express: (key under `exec.`, message).
    pub fn check(&self) -> std::result::Result<(), (String, String)> {
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

/// One running child.
struct Proc {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    stderr: Arc<Mutex<VecDeque<u8>>>,
}

pub struct ExecProvider {
    section: ExecSection,
    env: Vec<(String, String)>,
    timeout: Duration,
    seed: u64,
    /// Idle processes (a slot's process is taken for a call and put back after).
    idle: tokio::sync::Mutex<Vec<Proc>>,
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
        Ok(Self {
            section,
            env,
            timeout: Duration::from_secs_f64(model.timeout_s),
            seed,
            idle: tokio::sync::Mutex::new(Vec::new()),
            slots: tokio::sync::Semaphore::new(model.concurrency.max(1)),
            log: Arc::new(Mutex::new(None)),
        })
    }

    fn spawn(&self) -> std::result::Result<Proc, String> {
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
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut stderr = child.stderr.take().expect("piped");
        let tail = Arc::new(Mutex::new(VecDeque::with_capacity(STDERR_TAIL)));
        let (tail2, log) = (Arc::clone(&tail), Arc::clone(&self.log));
        tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
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
        Ok(Proc {
            child,
            stdin,
            stdout,
            stderr: tail,
        })
    }

    /// One exchange on `proc`: Ok(answer) or Err(message, whether the process is
    /// spoilt).
    async fn exchange(
        proc: &mut Proc,
        line: &[u8],
        timeout: Duration,
    ) -> std::result::Result<Value, (String, bool)> {
        let Proc { stdin, stdout, .. } = proc;
        // written and read at once: a child that answers (or logs to stdout) before it
        // has read a large request does not block on a full pipe
        let write = async {
            stdin
                .write_all(line)
                .await
                .and(stdin.flush().await)
                .map_err(|e| {
                    (
                        format!("exec: the process does not read its input ({e})"),
                        true,
                    )
                })
        };
        let read = async {
            let mut answer = Vec::new();
            loop {
                let buf = stdout
                    .fill_buf()
                    .await
                    .map_err(|e| (format!("exec: cannot read the answer ({e})"), true))?;
                if buf.is_empty() {
                    return Err(("exec: the process exited before it answered".into(), true));
                }
                let (take, done) = match memchr::memchr(b'\n', buf) {
                    Some(i) => (i + 1, true),
                    None => (buf.len(), false),
                };
                if answer.len() + take > super::MAX_BODY_BYTES {
                    return Err((
                        format!(
                            "exec: the answer line exceeds {} MiB",
                            super::MAX_BODY_BYTES >> 20
                        ),
                        true,
                    ));
                }
                answer.extend_from_slice(&buf[..take]);
                stdout.consume(take);
                if done {
                    break;
                }
            }
            // more already written: the process is out of step (it would give the next
            // case this one's answer)
            if !stdout.buffer().is_empty() {
                return Err((
                    "exec: the process wrote more than one line for one request".into(),
                    true,
                ));
            }
            Ok(answer)
        };
        let work = async {
            let ((), answer) = tokio::try_join!(write, read)?;
            let text = String::from_utf8_lossy(&answer);
            serde_json::from_str::<Value>(text.trim()).map_err(|e| {
                (
                    format!(
                        "exec: the answer is not a JSON line ({e}): {}",
                        crate::text::excerpt(&crate::secrets::redact(text.trim()).0, 200)
                    ),
                    true,
                )
            })
        };
        match tokio::time::timeout(timeout, work).await {
            Ok(r) => r,
            Err(_) => Err((
                format!("exec: no answer within {} s", timeout.as_secs_f64()),
                true,
            )),
        }
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
        // the children end when their input closes; those that do not are killed
        let procs = std::mem::take(&mut *self.idle.lock().await);
        for mut p in procs {
            drop(p.stdin);
            if tokio::time::timeout(Duration::from_secs(2), p.child.wait())
                .await
                .is_err()
            {
                let _ = p.child.kill().await;
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
        let (text, redacted) = crate::secrets::redact(text);
        let mut text = text.into_owned();
        let truncated = super::cap_response(&mut text);
        Ok(Completion {
            text,
            latency_ms,
            attempts: 1,
            redacted,
            truncated,
            ..Completion::default()
        })
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
        let mut tool_calls = match answer.get("tool_calls").filter(|v| !v.is_null()) {
            Some(list) => super::tool_calls_of(list).map_err(bad)?,
            None => Vec::new(),
        };
        let mut content = answer
            .get("text")
            .and_then(Value::as_str)
            .map(|t| crate::secrets::redact(t).0.into_owned());
        if content.is_none() && tool_calls.is_empty() {
            return Err(bad(format!(
                "the answer has neither \"text\" nor \"tool_calls\": {}",
                crate::text::excerpt(&crate::secrets::redact(&answer.to_string()).0, 200)
            )));
        }
        for c in &mut tool_calls {
            c.arguments = crate::secrets::redact(&c.arguments).0.into_owned();
        }
        let mut truncated = false;
        if let Some(t) = &mut content {
            truncated = super::cap_response(t);
        }
        let redacted = content
            .as_deref()
            .is_some_and(|t| t.contains(crate::secrets::REDACTED));
        Ok(super::AgentTurn {
            content,
            tool_calls,
            completion: Completion {
                latency_ms,
                attempts: 1,
                redacted,
                truncated,
                ..Completion::default()
            },
        })
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
        let mut line = request.to_string();
        line.push('\n');
        let _slot = self
            .slots
            .acquire()
            .await
            .map_err(|_| fail("exec: closed".into()))?;
        let popped = self.idle.lock().await.pop();
        let mut proc = match popped {
            Some(p) => p,
            None => self.spawn().map_err(fail)?,
        };
        match Self::exchange(&mut proc, line.as_bytes(), self.timeout).await {
            Ok(answer) => {
                self.idle.lock().await.push(proc);
                if let Some(e) = answer.get("error").filter(|e| !e.is_null()) {
                    let e = e.as_str().map_or_else(|| e.to_string(), str::to_owned);
                    return Err(fail(format!("exec: {}", crate::secrets::redact(&e).0)));
                }
                Ok((answer, start.elapsed().as_secs_f64() * 1e3))
            }
            Err((message, _spoilt)) => {
                // the process is not trusted again: killed, and a new one started for
                // the next case
                let _ = proc.child.start_kill();
                let status =
                    match tokio::time::timeout(Duration::from_secs(2), proc.child.wait()).await {
                        Ok(Ok(s)) => format!(" ({s})"),
                        _ => String::new(),
                    };
                // what it wrote to stderr last (give its reader a moment to catch up)
                tokio::time::sleep(Duration::from_millis(50)).await;
                let tail: Vec<u8> = proc
                    .stderr
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .copied()
                    .collect();
                // whole lines only (a cut line could hold part of a key the redactor
                // no longer recognises), the last ones up to 500 characters
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
                Err(fail(format!("{message}{status}{tail}")))
            }
        }
    }
}
