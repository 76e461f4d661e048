//! Replaying an adaptive run: the attacker's, the evaluator's, the target's and the
//! translator's recorded answers, looked up by the key each call is made with
//! ([`key`]): `<attempt_id>#<node_id>#attacker`, `…#on_topic`, `…#target`,
//! `<attempt_id>#translate`. With `provider: replay` for the target and the attacker,
//! the same config and seed rebuild every prompt from those answers, so the transcript
//! and the results come out byte for byte as recorded.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use async_trait::async_trait;

use crate::error::{Error, Result};
use crate::provider::{CallError, Completion, Message, Provider};
use crate::rundir::PredictionRecord;
use crate::rundir::checkpoint::scan_checkpoint;

/// How a turn's `error` names the side that failed.
pub const ATTACKER_ERROR: &str = "attacker: ";
pub const TARGET_ERROR: &str = "target: ";
/// How an attempt's `error` names a failed translation.
pub const TRANSLATOR_ERROR: &str = "translator: ";

/// The key of one call of an attempt.
pub fn key(attempt_id: &str, node_id: &str, role: &str) -> String {
    format!("{attempt_id}#{node_id}#{role}")
}

/// The key of an attempt's translation.
pub fn translate_key(attempt_id: &str) -> String {
    format!("{attempt_id}#translate")
}

#[derive(Clone, Debug)]
struct Answer {
    text: Option<String>,
    error: Option<String>,
    latency_ms: f64,
}

/// Answers recorded in a run's checkpoint.
pub struct TranscriptReplay {
    source: PathBuf,
    answers: HashMap<String, Answer>,
}

impl TranscriptReplay {
    /// `source`: a run's `predictions.jsonl` (found by
    /// `crate::provider::replay::resolve_source`).
    pub fn open(source: &Path) -> Result<TranscriptReplay> {
        if source
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("parquet"))
        {
            return Err(Error::config(
                source,
                "replaying attackers and translators needs a run's predictions.jsonl (the transcripts are not in a Parquet predictions file)",
            ));
        }
        let mut answers = HashMap::new();
        let mut put = |k: String, text: Option<String>, error: Option<String>, latency: f64| {
            answers.entry(k).or_insert(Answer {
                text,
                error,
                latency_ms: latency,
            });
        };
        // Read only: a replay source is never repaired (it may be another run's checkpoint).
        scan_checkpoint(source, |r: PredictionRecord| {
            let id = r.key().to_owned();
            if let Some(t) = r.translation {
                put(translate_key(&id), Some(t), None, 0.0);
            } else if let Some(e) = r
                .error
                .as_deref()
                .and_then(|e| e.strip_prefix(TRANSLATOR_ERROR))
            {
                put(translate_key(&id), None, Some(e.to_owned()), 0.0);
            }
            for t in r.turns {
                let err = t.error.as_deref().unwrap_or_default();
                if let Some(a) = t.attacker_response {
                    put(key(&id, &t.node_id, "attacker"), Some(a), None, 0.0);
                } else if let Some(e) = err.strip_prefix(ATTACKER_ERROR) {
                    put(
                        key(&id, &t.node_id, "attacker"),
                        None,
                        Some(e.to_owned()),
                        0.0,
                    );
                }
                if let Some(on) = t.on_topic {
                    let yes = if on { "yes" } else { "no" };
                    put(
                        key(&id, &t.node_id, "on_topic"),
                        Some(yes.into()),
                        None,
                        0.0,
                    );
                }
                if let Some(v) = t.judge_verdict {
                    let score = t.judge_score.map(|s| format!(" {s}")).unwrap_or_default();
                    let text = format!("{}{score}", if v { "yes" } else { "no" });
                    put(key(&id, &t.node_id, "judge"), Some(text), None, 0.0);
                }
                let target_error = err.strip_prefix(TARGET_ERROR).map(str::to_owned);
                if !t.pruned && (t.target_response.is_some() || target_error.is_some()) {
                    put(
                        key(&id, &t.node_id, "target"),
                        t.target_response,
                        target_error,
                        t.latency_ms.unwrap_or(0.0),
                    );
                }
            }
        })?;
        Ok(TranscriptReplay {
            source: source.to_path_buf(),
            answers,
        })
    }

    /// A turn's recorded judge verdict and score (`None`: none recorded).
    pub fn judged(&self, attempt_id: &str, node_id: &str) -> Option<(bool, Option<f64>)> {
        let text = self
            .answers
            .get(&key(attempt_id, node_id, "judge"))?
            .text
            .as_deref()?;
        let mut parts = text.split(' ');
        let verdict = parts.next()? == "yes";
        Some((verdict, parts.next().and_then(|s| s.parse().ok())))
    }

    pub fn len(&self) -> usize {
        self.answers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.answers.is_empty()
    }
}

#[async_trait]
impl Provider for TranscriptReplay {
    fn name(&self) -> &str {
        "replay"
    }

    async fn complete(&self, key: &str, _messages: &[Message]) -> Result<Completion, CallError> {
        let fail = |message: String, latency_ms: f64| CallError {
            message,
            latency_ms,
            attempts: 1,
        };
        let a = self.answers.get(key).ok_or_else(|| {
            fail(
                format!(
                    "replay: no recorded answer for {} in {}",
                    crate::text::excerpt(key, 120),
                    self.source.display()
                ),
                0.0,
            )
        })?;
        if let Some(e) = a.error.as_deref().filter(|e| !e.is_empty()) {
            return Err(fail(e.to_owned(), a.latency_ms));
        }
        Ok(Completion {
            text: a.text.clone().unwrap_or_default(),
            latency_ms: a.latency_ms,
            attempts: 1,
            ..Completion::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn received_sources_are_read_never_repaired_and_bad_ones_are_clear() {
        let dir = tempfile::tempdir().unwrap();
        // A corrupt line in the middle: an error naming the file and the line.
        let p = dir.path().join("predictions.jsonl");
        let good = r#"{"case_id":"a","run_id":"r","provider":"p","model_name":"m","execution_mode":"live","mitigation":"none","attempt_id":"a#pair","turns":[{"turn":1,"depth":1,"node_id":"1","attacker_response":"{}","attack_prompt":"hi","target_response":"yo","latency_ms":3.0}]}"#;
        std::fs::write(&p, format!("{good}\nnot json\n{good}\n")).unwrap();
        let e = TranscriptReplay::open(&p).err().unwrap().to_string();
        assert!(e.contains("predictions.jsonl:2"), "{e}");
        // A torn tail is skipped and the file is left as it was.
        let torn = format!("{good}\n{{\"case_id\":\"b");
        std::fs::write(&p, &torn).unwrap();
        let r = TranscriptReplay::open(&p).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), torn, "never repaired");
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let answer = rt
            .block_on(r.complete(&key("a#pair", "1", "target"), &[]))
            .unwrap();
        assert_eq!((answer.text.as_str(), answer.latency_ms), ("yo", 3.0));
        let missing = rt
            .block_on(r.complete(&key("a#pair", "2", "target"), &[]))
            .unwrap_err();
        assert!(
            missing.message.contains("no recorded answer"),
            "{}",
            missing.message
        );
        // A Parquet predictions file holds no transcripts.
        let e = TranscriptReplay::open(&dir.path().join("p.parquet"))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("predictions.jsonl"), "{e}");
    }
}
