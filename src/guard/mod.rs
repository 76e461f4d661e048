//! Guardrails under test (docs/guardrails.md): a prompt-injection classifier — an
//! application's `http` or `exec` target, or one of pieval's own detectors (`provider:
//! builtin`) — given texts that carry an injection and texts that do not, each in the
//! role it would see it in, and measured as a buyer would: TPR and FPR with Wilson
//! intervals, recall at a fixed false-positive rate read from the scores, ROC and
//! precision–recall curves with their areas, NotInject's over-defence accuracy on
//! hard-benign texts, latency percentiles; per family, surface, language, converter.
//!
//! A guardrail run is an ordinary run (`pieval run`) whose config has a `guardrail`
//! section. Its texts (*items*, `guard_items.jsonl`) are expanded deterministically from
//! the corpus's selected cases — each attack's located payload alone (`payload`), and the
//! untrusted text it hides in (`carried`); each benign control's texts (`benign`) — and
//! from labelled files (`labelled`, `data/labels/guardrail.jsonl`'s form), then each
//! positive through every converter pipeline of the `attack` section (evasions). Each
//! answer is checkpointed in `guard_predictions.jsonl` (resumable); the run ends with
//! `guard_results.parquet` (one row per item), `case_results` in the contract's form
//! (a positive let through is a successful attack; a negative flagged is an
//! over-refusal) and `summary.json` with a `guardrail` block (the runner's
//! guard.rs runs it; this module holds the config, the answer mapping, the items and the
//! classifiers).

pub mod answer;
pub mod items;
pub mod target;

use std::path::PathBuf;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use serde::{Deserialize, Serialize};

pub use answer::{AnswerMap, AnswerSection, Verdict};
pub use items::{Item, Role};

/// A guardrail run's files in its run folder: the texts given, the answers (the
/// checkpoint), the results.
pub const ITEMS_FILE: &str = "guard_items.jsonl";
pub const PREDICTIONS_FILE: &str = "guard_predictions.jsonl";
pub const RESULTS_FILE: &str = "guard_results.parquet";

/// The `guardrail` section of an experiment config.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GuardSection {
    /// How the target's answer is read (not for `provider: builtin`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<AnswerSection>,
    /// Which texts of the selected cases are given: `payload`, `carried`, `benign`.
    #[serde(default = "default_forms")]
    pub forms: Vec<items::Form>,
    /// Labelled text files (`data/labels/guardrail.jsonl`'s fields).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<PathBuf>,
    /// Which rows of the labelled files: `test` (default), `dev` or `all`.
    #[serde(default)]
    pub split: items::SplitChoice,
    /// Only the texts in these roles (every role when absent): a guardrail API that is
    /// asked differently per role (Azure Prompt Shields' `userPrompt` and `documents`)
    /// is measured by one run per request shape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roles: Option<Vec<Role>>,
}

fn default_forms() -> Vec<items::Form> {
    vec![
        items::Form::Payload,
        items::Form::Carried,
        items::Form::Benign,
    ]
}

/// `guard_results.parquet`'s schema: one row per text given (an item and its answer).
pub fn results_schema() -> SchemaRef {
    let text = |n: &str, nullable: bool| Field::new(n, DataType::Utf8, nullable);
    let flag = |n: &str, nullable: bool| Field::new(n, DataType::Boolean, nullable);
    Arc::new(Schema::new(vec![
        text("run_id", false),
        text("item_id", false),
        text("case_id", true),
        text("text", false),
        text("role", false),
        flag("label", false),
        flag("hard_benign", false),
        text("form", false),
        text("converter", true),
        text("family", true),
        text("surface", true),
        text("language", true),
        text("source", false),
        text("split", true),
        flag("flagged", true),
        Field::new("score", DataType::Float64, true),
        text("category", true),
        Field::new("latency_ms", DataType::Float64, true),
        text("error", true),
        text("answer", true),
        text("provider", false),
        text("model_name", false),
    ]))
}

/// The longest line of a labelled file, in bytes.
pub const MAX_LINE_BYTES: usize = 16 << 20;
/// The longest line of the files a run writes itself (an item, an answer): a labelled
/// text near [`MAX_LINE_BYTES`] through a converter that grows it (base64) still reads.
pub const RUN_LINE_BYTES: usize = 256 << 20;

/// One line of a guardrail run's JSONL file, as [`each_line`] gives it.
pub struct LineAt<'a> {
    /// 1-based.
    pub number: u64,
    pub bytes: &'a [u8],
    /// Where the line starts in the file.
    pub offset: u64,
    /// The last line of a file that does not end in a line break (a write cut short).
    pub unterminated: bool,
}

/// Each non-empty line of `path` (a regular file, not a link), streamed: one line in
/// memory at a time, whatever the file's size; a line longer than `max_line` bytes is an
/// error naming it. `f` answers whether to go on.
pub fn each_line(
    path: &std::path::Path,
    max_line: usize,
    mut f: impl FnMut(LineAt<'_>) -> crate::error::Result<bool>,
) -> crate::error::Result<()> {
    use crate::corpus::lines::{Line, LineReader};
    use crate::error::Error;
    use std::os::unix::fs::FileExt as _;
    let file = crate::files::open_regular(path, crate::files::Links::Refuse)?;
    let len = file
        .metadata()
        .map_err(|e| Error::io(path, "cannot read", e))?
        .len();
    let mut last = [b'\n'];
    if len > 0 {
        file.read_exact_at(&mut last, len - 1)
            .map_err(|e| Error::io(path, "cannot read", e))?;
    }
    let mut reader = LineReader::without_hash(file, max_line);
    loop {
        let offset = reader.consumed();
        let number = reader.line_no() + 1;
        let line = reader
            .next_line()
            .map_err(|e| Error::io(path, "cannot read", e))?;
        let bytes = match line {
            None => return Ok(()),
            Some(Line::TooLong { len }) => {
                return Err(Error::input(
                    path,
                    number,
                    None,
                    format!("a line of {len} bytes (at most {max_line})"),
                ));
            }
            Some(Line::Bytes(b)) => b,
        };
        if bytes.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        // a line ended by a line break ends before the file's last byte
        let unterminated = last[0] != b'\n' && offset + bytes.len() as u64 + 1 >= len;
        if !f(LineAt {
            number,
            bytes,
            offset,
            unterminated,
        })? {
            return Ok(());
        }
    }
}
