//! Replay: answer each case with the response recorded for it in a predictions file
//! (JSONL or Parquet) or in an earlier run's `predictions.jsonl`. Records are keyed by
//! their attempt id when they have one (adaptive attacks), else by case id; the first
//! record of a key wins. A key with no record fails with an error saying so (it is not
//! dropped).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::Float64Type;

use super::Message;
use super::{CallError, Completion, Provider};
use crate::corpus::predictions::PredictionsReader;
use crate::error::{Error, Result};

/// One recorded outcome.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Recorded {
    pub response_text: Option<String>,
    pub error: Option<String>,
    pub blocked_by: Option<String>,
    pub latency_ms: Option<f64>,
}

pub struct ReplayProvider {
    source: PathBuf,
    records: HashMap<String, Recorded>,
}

/// A predictions file, a run folder, or a run id under `results`.
pub fn resolve_source(spec: &str, results: &Path) -> Result<PathBuf> {
    let p = PathBuf::from(spec);
    let candidates = [
        p.clone(),
        p.join(crate::rundir::PREDICTIONS_FILE),
        results.join(spec).join(crate::rundir::PREDICTIONS_FILE),
    ];
    if !spec.contains(['/', '\\']) && !p.exists() {
        crate::rundir::check_run_id(spec)?;
    }
    candidates
        .into_iter()
        .find(|c| c.is_file())
        .ok_or_else(|| {
            Error::NotFound(format!(
                "replay source {spec:?} is neither a predictions file, a run folder nor a run id under {}",
                results.display()
            ))
        })
}

impl ReplayProvider {
    pub fn open(source: &Path) -> Result<Self> {
        let mut records = HashMap::new();
        let mut reader = PredictionsReader::open(source, 8192)?;
        for batch in reader.by_ref() {
            let batch = batch?;
            let col = |name: &str| {
                batch
                    .column_by_name(name)
                    .map(|c| c.as_string::<i32>().clone())
                    .expect("the predictions schema has every field")
            };
            let (ids, attempt_ids, resp, err, blocked) = (
                col("case_id"),
                col("attempt_id"),
                col("response_text"),
                col("error"),
                col("blocked_by"),
            );
            let latency = batch
                .column_by_name("latency_ms")
                .expect("latency_ms")
                .as_primitive::<Float64Type>()
                .clone();
            let opt = |a: &datafusion::arrow::array::StringArray, i: usize| {
                (!a.is_null(i)).then(|| a.value(i).to_owned())
            };
            for i in 0..batch.num_rows() {
                let key = if attempt_ids.is_null(i) {
                    ids.value(i)
                } else {
                    attempt_ids.value(i)
                };
                records.entry(key.to_owned()).or_insert_with(|| Recorded {
                    response_text: opt(&resp, i),
                    error: opt(&err, i),
                    blocked_by: opt(&blocked, i),
                    latency_ms: (!latency.is_null(i)).then(|| latency.value(i)),
                });
            }
        }
        Ok(Self {
            source: source.to_path_buf(),
            records,
        })
    }

    /// The record of an attempt id (adaptive attacks) or a case id.
    pub fn recorded(&self, key: &str) -> Option<&Recorded> {
        self.records.get(key)
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}

#[async_trait]
impl Provider for ReplayProvider {
    fn name(&self) -> &str {
        "replay"
    }

    async fn complete(
        &self,
        case_id: &str,
        _messages: &[Message],
    ) -> Result<Completion, CallError> {
        let missing = || CallError {
            message: format!(
                "replay: no recorded response for {} in {}",
                crate::text::excerpt(case_id, 120),
                self.source.display()
            ),
            latency_ms: 0.0,
            attempts: 1,
        };
        let r = self.records.get(case_id).ok_or_else(missing)?;
        if let Some(e) = r.error.as_deref().filter(|e| !e.is_empty()) {
            return Err(CallError {
                message: e.to_owned(),
                latency_ms: r.latency_ms.unwrap_or(0.0),
                attempts: 1,
            });
        }
        Ok(Completion {
            text: r.response_text.clone().unwrap_or_default(),
            latency_ms: r.latency_ms.unwrap_or(0.0),
            attempts: 1,
            ..Completion::default()
        })
    }
}
