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
    /// Adaptive attacks (`attack` in the config): this attempt's stable id, the
    /// converter pipeline and the strategy that made it (`none` for the unconverted or
    /// single-turn attempt), the turns a strategy used and the one that succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attack_pipeline: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attack_strategy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turns_used: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success_turn: Option<u32>,
    /// `translate`: the translator's answer (replayed by `provider: replay`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub translation: Option<String>,
    /// Where the converters found the payload (`provenance`, `segments`, `whole`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_located: Option<String>,
    /// A multi-turn strategy's whole transcript, one entry per target query (and per
    /// branch pruned before one); written to `turns.parquet` when the run is scored.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub turns: Vec<TurnRecord>,
}

impl PredictionRecord {
    /// The checkpoint key: the attempt id of an adaptive attempt, else the case id.
    pub fn key(&self) -> &str {
        self.attempt_id.as_deref().unwrap_or(&self.case_id)
    }
}

/// One turn of a multi-turn strategy: the attacker's answer, the prompt it yielded, the
/// target's answer and the scorer's verdict. `turn` numbers the target queries of the
/// attempt from 1; `node_id` names the turn's place in the strategy (`3` for the third
/// turn of a linear strategy, `2.1.3` in a TAP tree) and `parent_id` its parent.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct TurnRecord {
    pub turn: u32,
    pub depth: u32,
    pub node_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<String>,
    /// The attacker model's raw answer (the JSON holding the prompt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attacker_response: Option<String>,
    /// What was sent to the target as the user's message.
    pub attack_prompt: String,
    /// TAP's first pruning: the evaluator judged the prompt on the objective's topic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_topic: Option<bool>,
    /// Pruned before the target was asked (off topic).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pruned: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_response: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<bool>,
    /// The case's success criteria on this answer (None: undecided or not asked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success: Option<bool>,
    /// The judge's verdict on this answer, when the criteria needed one (`judge` parts)
    /// and a judge is configured; its score in [0, 1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge_verdict: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge_score: Option<f64>,
    /// The scorer's feedback to the attacker, 1 to 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<u32>,
    /// The application's mitigation blocked the prompt before the target saw it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_by: Option<String>,
    /// Crescendo: the target refused and this exchange was taken out of its memory.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub backtracked: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<f64>,
}

/// The case ids already in a checkpoint. A torn last line (a kill mid-write) is cut off
/// so appending continues on a line boundary.
pub fn read_checkpoint(path: &Path) -> Result<HashSet<String>> {
    read_checkpoint_with(path, |_| {})
}

/// [`read_checkpoint`], handing every record read to `each` (after the repair).
pub fn read_checkpoint_with(
    path: &Path,
    each: impl FnMut(PredictionRecord),
) -> Result<HashSet<String>> {
    scan(path, true, each)
}

/// Every record of a checkpoint, without repairing it (a torn tail is skipped).
pub fn scan_checkpoint(path: &Path, each: impl FnMut(PredictionRecord)) -> Result<()> {
    scan(path, false, each).map(|_| ())
}

fn scan(
    path: &Path,
    repair: bool,
    mut each: impl FnMut(PredictionRecord),
) -> Result<HashSet<String>> {
    let mut done = HashSet::new();
    // A regular file opened without following a link: a planted `predictions.jsonl ->
    // /dev/zero` or a FIFO is an error, not a read that never ends.
    let bytes = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(done),
        _ => {
            use std::io::Read;
            let mut f = crate::files::open_regular(path, crate::files::Links::Refuse)?;
            let mut b = Vec::new();
            f.read_to_end(&mut b)
                .map_err(|e| Error::io(path, "cannot read checkpoint", e))?;
            b
        }
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
                done.insert(r.key().to_owned());
                each(r);
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
    if repair && good_end < bytes.len() {
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

/// Write `turns.parquet` from a run's checkpoint (atomically), when any attempt has
/// turns; otherwise remove a stale one. Returns the rows written.
pub fn write_turns(dir: &Path) -> Result<u64> {
    use std::sync::Arc;

    use datafusion::arrow::array::{
        ArrayRef, BooleanBuilder, Float64Builder, Int64Builder, RecordBatch, StringBuilder,
    };

    let out = dir.join(super::TURNS_FILE);
    let schema = crate::contract::arrow::turns_schema();
    let mut writer: Option<crate::atomic::ParquetFile> = None;
    #[derive(Default)]
    struct Cols {
        text: Vec<StringBuilder>,
        int: Vec<Int64Builder>,
        flag: Vec<BooleanBuilder>,
        float: Vec<Float64Builder>,
        rows: usize,
    }
    let mut cols = Cols::default();
    let flush = |cols: &mut Cols, writer: &mut Option<crate::atomic::ParquetFile>| -> Result<()> {
        if cols.rows == 0 {
            return Ok(());
        }
        let mut t = cols.text.iter_mut();
        let mut i = cols.int.iter_mut();
        let mut f = cols.flag.iter_mut();
        let mut x = cols.float.iter_mut();
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
        for field in schema.fields() {
            columns.push(match field.data_type() {
                datafusion::arrow::datatypes::DataType::Utf8 => {
                    Arc::new(t.next().expect("a text column").finish())
                }
                datafusion::arrow::datatypes::DataType::Int64 => {
                    Arc::new(i.next().expect("an int column").finish())
                }
                datafusion::arrow::datatypes::DataType::Boolean => {
                    Arc::new(f.next().expect("a flag column").finish())
                }
                _ => Arc::new(x.next().expect("a float column").finish()),
            });
        }
        let batch = RecordBatch::try_new(Arc::clone(&schema), columns)?;
        if writer.is_none() {
            *writer = Some(crate::atomic::ParquetFile::create(
                &out,
                Arc::clone(&schema),
            )?);
        }
        writer.as_mut().expect("created").write(&batch)?;
        cols.rows = 0;
        Ok(())
    };
    cols.text = (0..11).map(|_| StringBuilder::new()).collect();
    cols.int = (0..3).map(|_| Int64Builder::new()).collect();
    cols.flag = (0..6).map(|_| BooleanBuilder::new()).collect();
    cols.float = (0..2).map(|_| Float64Builder::new()).collect();
    let mut failed = None;
    scan_checkpoint(&dir.join(super::PREDICTIONS_FILE), |r| {
        if failed.is_some() || r.turns.is_empty() {
            return;
        }
        let attempt = r.key().to_owned();
        for t in &r.turns {
            // In schema order: text 0 run_id, 1 case_id, 2 attempt_id, 3 strategy, 4 node,
            // 5 parent, 6 attacker_response, 7 prompt, 8 target_response, 9 error,
            // 10 blocked_by; int 0 turn, 1 depth, 2 score; flag 0 on_topic, 1 pruned,
            // 2 refused, 3 success, 4 judge_verdict, 5 backtracked; float 0 judge_score,
            // 1 latency_ms.
            let texts: [Option<&str>; 11] = [
                Some(&r.run_id),
                Some(&r.case_id),
                Some(&attempt),
                r.attack_strategy.as_deref(),
                Some(&t.node_id),
                t.parent_id.as_deref(),
                t.attacker_response.as_deref(),
                Some(&t.attack_prompt),
                t.target_response.as_deref(),
                t.error.as_deref(),
                t.blocked_by.as_deref(),
            ];
            for (b, v) in cols.text.iter_mut().zip(texts) {
                b.append_option(v);
            }
            for (b, v) in cols.int.iter_mut().zip([
                Some(i64::from(t.turn)),
                Some(i64::from(t.depth)),
                t.score.map(i64::from),
            ]) {
                b.append_option(v);
            }
            for (b, v) in cols.flag.iter_mut().zip([
                t.on_topic,
                Some(t.pruned),
                t.refused,
                t.success,
                t.judge_verdict,
                Some(t.backtracked),
            ]) {
                b.append_option(v);
            }
            for (b, v) in cols.float.iter_mut().zip([t.judge_score, t.latency_ms]) {
                b.append_option(v);
            }
            cols.rows += 1;
        }
        if cols.rows >= 8192
            && let Err(e) = flush(&mut cols, &mut writer)
        {
            failed = Some(e);
        }
    })?;
    if let Some(e) = failed {
        return Err(e);
    }
    flush(&mut cols, &mut writer)?;
    match writer {
        Some(w) => w.commit(),
        None => {
            match std::fs::remove_file(&out) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(&out, "cannot remove a stale turns file", e)),
            }
            Ok(0)
        }
    }
}
