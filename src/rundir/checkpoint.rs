//! The checkpoint, `predictions.jsonl`: one [`PredictionRecord`] per finished case,
//! appended as each case finishes; a torn last line (a kill mid-write) is repaired.

use std::collections::HashSet;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// One line of `predictions.jsonl`: the contract's prediction fields plus run details.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct PredictionRecord {
    pub case_id: String,
    pub response_text: Option<String>,
    pub run_id: String,
    pub provider: String,
    pub model_name: String,
    pub latency_ms: Option<f64>,
    pub error: Option<String>,
    pub request_prompt: Option<String>,
    pub request_context: Option<String>,
    pub request_task_input: Option<String>,
    pub execution_mode: String,
    pub mitigation: String,
    pub blocked_by: Option<String>,
    #[serde(default)]
    pub attempts: u32,
    #[serde(default)]
    pub prompt_tokens: Option<u64>,
    #[serde(default)]
    pub completion_tokens: Option<u64>,
    /// `known_answer`: the detection call's answer.
    #[serde(default)]
    pub probe_response: Option<String>,
    /// Local models: seconds on the prompt and on generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_secs: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation_secs: Option<f64>,
    #[serde(default)]
    pub completed_at: String,
    /// The endpoint's answer held the API key and was stored with `[REDACTED]` in its
    /// place (never silently: this flag says so).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub response_redacted: bool,
    /// The answer was longer than `provider::MAX_RESPONSE_BYTES` and was cut there.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub response_truncated: bool,
}

/// The case ids already in a checkpoint. A torn last line (a kill mid-write) is cut off
/// so appending continues on a line boundary.
pub fn read_checkpoint(path: &Path) -> Result<HashSet<String>> {
    let mut done = HashSet::new();
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(done),
        Err(e) => return Err(Error::io(path, "cannot read checkpoint", e)),
    };
    let mut good_end = 0usize;
    let mut start = 0usize;
    let mut line_no = 0u64;
    while start < bytes.len() {
        let Some(nl) = bytes[start..].iter().position(|b| *b == b'\n') else {
            break; // torn tail: no newline
        };
        line_no += 1;
        let line = &bytes[start..start + nl];
        match serde_json::from_slice::<PredictionRecord>(line) {
            Ok(r) => {
                done.insert(r.case_id);
                good_end = start + nl + 1;
            }
            Err(e) if start + nl + 1 == bytes.len() => {
                let _ = e; // a torn final line that happens to end in a newline
                break;
            }
            Err(e) => {
                return Err(Error::input(
                    path,
                    line_no,
                    None,
                    format!("corrupt checkpoint line: {e}"),
                ));
            }
        }
        start += nl + 1;
    }
    if good_end < bytes.len() {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(|e| Error::io(path, "cannot repair checkpoint", e))?;
        f.set_len(good_end as u64)
            .map_err(|e| Error::io(path, "cannot repair checkpoint", e))?;
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(id: &str) -> String {
        let r = PredictionRecord {
            case_id: id.into(),
            ..PredictionRecord::default()
        };
        format!("{}\n", serde_json::to_string(&r).unwrap())
    }

    #[test]
    fn a_torn_tail_is_cut_and_a_corrupt_line_is_located() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("predictions.jsonl");
        std::fs::write(&p, format!("{}{}{{\"case_id\":\"to", line("a"), line("b"))).unwrap();
        let done = read_checkpoint(&p).unwrap();
        assert_eq!(done.len(), 2);
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            format!("{}{}", line("a"), line("b"))
        );
        std::fs::write(&p, format!("{}not json\n{}", line("a"), line("b"))).unwrap();
        let e = read_checkpoint(&p).unwrap_err().to_string();
        assert!(
            e.contains("predictions.jsonl:2") && e.contains("corrupt checkpoint"),
            "{e}"
        );
        assert!(
            read_checkpoint(&dir.path().join("none.jsonl"))
                .unwrap()
                .is_empty()
        );
    }
}
