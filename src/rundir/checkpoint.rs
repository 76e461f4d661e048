//! The checkpoint, `predictions.jsonl`: one [`PredictionRecord`] per finished case,
//! appended as each case finishes; a torn last line (a kill mid-write) is repaired.
//!
//! A multi-turn attempt is written as its turns, one **turn line** each (marked
//! `"pieval_record": "turn"`, keyed by the attempt id and the turn's index), then its
//! prediction line, which says how many turn lines came before it (`turn_lines`). No
//! line is ever longer than [`MAX_LINE_BYTES`], what every reader accepts: a turn whose
//! line would be long (a long answer of control characters, escaped six-fold) is
//! written as `turn_part` lines holding its JSON in slices, then a turn line naming the
//! parts. A kill mid-way leaves turn lines with no prediction after them: readers skip
//! that incomplete attempt and `--resume` cuts it off and runs the attempt again, so no
//! turn is lost or written twice. Older checkpoints, with the turns inside the
//! prediction line (`turns`), are read as before.

use std::collections::HashSet;
use std::io::{BufRead, Read, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The longest line of a predictions file any reader accepts (scoring's predictions
/// reader, the checkpoint scan of `--resume`, replay and `turns.parquet`); a longer line
/// in a received file is an error naming the file and the line. Pieval never writes one
/// ([`write_attempt`]).
pub const MAX_LINE_BYTES: usize = 16 << 20;
/// A turn whose line would be longer than this is written in parts.
const TURN_LINE_BYTES: usize = 8 << 20;
/// The turn's JSON per part line; escaped as a JSON string it at most doubles (JSON text
/// holds no control character), so a part line stays near 8 MiB.
const TURN_PART_BYTES: usize = 4 << 20;
/// The most text (bytes of strings) a multi-turn attempt holds at once: its
/// conversation, its attacker's histories, the requests in flight and its transcript
/// (`attack::strategy` ends the attempt with an error when the next turn would
/// pass it). A reader buffers one attempt's turns and refuses more than this.
pub const MAX_ATTEMPT_BYTES: u64 = 256 << 20;
/// The key marking a line of a predictions file that is not a prediction, and its
/// values: a turn of a multi-turn attempt, or a slice of a long turn's JSON.
pub const RECORD_KEY: &str = "pieval_record";
/// What a turn costs a reader besides its text, counted against the attempt's bound.
const TURN_OVERHEAD_BYTES: u64 = 256;
pub const TURN_LINE: &str = "turn";
pub const TURN_PART_LINE: &str = "turn_part";
/// A prediction line longer than [`MAX_LINE_BYTES`] (its request fields hold a huge
/// case, say) has its longest text fields cut to this many bytes, escaped, each; the
/// fields cut are named in `cut_fields`.
const FIELD_CUT_BYTES: usize = 2 << 20;

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
    /// Written as turn lines before the prediction line ([`write_attempt`]); inside the
    /// line in checkpoints written before them. Readers fill it either way.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub turns: Vec<TurnRecord>,
    /// How many turn lines came before this line: the attempt's transcript.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_lines: Option<u32>,
    /// An agent's attempt (a case with an `environment`): its tool calls in order as
    /// JSON text (`[{"name": …, "arguments": …}]`, what the criteria over actions read),
    /// the environment's record store at the end (JSON text, for `state` criteria),
    /// whether the injected payload reached the model at all (`false`: the attack was
    /// not delivered, which is not the agent resisting it; absent without a payload),
    /// and why the loop ended (`answer`, `budget`, `error`, `blocked`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_actions: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_state: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub injection_delivered: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_stop: Option<String>,
    /// An application target's setup ran for this attempt: what it planted (its
    /// extracted variables as JSON, credentials left out), whether teardown removed it,
    /// and why not (`provider::http`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planted: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removed: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleanup_error: Option<String>,
    /// Text fields cut so that the line stays under [`MAX_LINE_BYTES`] (never for an
    /// answer within `provider::MAX_RESPONSE_BYTES` and a case within the corpus reader's
    /// line limit).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cut_fields: Vec<String>,
    /// An imported row (`pieval import`, src/import/mod.rs): the tool that produced it,
    /// its own verdict (true: the attack succeeded by the tool's reading), the detector or
    /// scorer behind it and its score, and where it came from (`file:line`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_tool: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_verdict: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_detector: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_score: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_ref: Option<String>,
    /// The tool's own id of the record, verbatim (an Inspect sample id, a garak attempt
    /// uuid): the case id is made from it but cannot always keep it (src/import/mod.rs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_id: Option<String>,
    /// The source record's fields that have no column here, kept as the tool wrote them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_extra: Option<serde_json::Value>,
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
    /// An agent's turn: the tool calls the model asked for in this answer, each with
    /// what the environment returned (written to `tool_calls.parquet`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallRecord>,
}

/// One tool call of an agent's turn and its result.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ToolCallRecord {
    /// The call's id, as the model gave it (`call_<n>` when it gave none).
    pub id: String,
    pub name: String,
    /// The arguments as the model sent them (JSON text, unparsed: maybe malformed).
    pub arguments: String,
    /// What the model received as the tool's result (after the mitigation).
    pub output: String,
    /// A tool error: unknown tool, malformed or invalid arguments, no such record, an
    /// error output of the environment.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub error: bool,
    /// The environment carried the call out (`false`: rejected before it ran: a tool not
    /// offered, arguments that are not JSON or break the tool's schema, past the calls
    /// an answer may make). Calls of offered tools are actions either way.
    #[serde(default)]
    pub executed: bool,
    /// The call is one of the model's actions, what the criteria read: a call of a tool
    /// it was offered (a prefill call, made on its behalf, is not).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub action: bool,
    /// The environment's output held the injected payload.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub injected: bool,
    /// The mitigation withheld the output (a prompt-injection detector): its rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_by: Option<String>,
}

impl ToolCallRecord {
    fn text_bytes(&self) -> usize {
        self.id.len()
            + self.name.len()
            + self.arguments.len()
            + self.output.len()
            + self.blocked_by.as_ref().map_or(0, String::len)
    }
}

impl TurnRecord {
    /// The bytes of its text: what an attempt holds for it, and what a reader buffers.
    pub fn text_bytes(&self) -> u64 {
        let opt = |s: &Option<String>| s.as_ref().map_or(0, String::len);
        (self.node_id.len()
            + opt(&self.parent_id)
            + opt(&self.attacker_response)
            + self.attack_prompt.len()
            + opt(&self.target_response)
            + opt(&self.error)
            + opt(&self.blocked_by)
            + self
                .tool_calls
                .iter()
                .map(ToolCallRecord::text_bytes)
                .sum::<usize>()) as u64
    }
}

/// A turn line as written: the attempt it belongs to, its index (1-based, in transcript
/// order), and the turn, or the count of part lines holding it.
#[derive(Clone, Copy, Serialize)]
struct TurnLineOut<'a> {
    pieval_record: &'static str,
    case_id: &'a str,
    attempt_id: &'a str,
    index: u32,
    run_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    attack_strategy: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    turn: Option<&'a TurnRecord>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parts: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
}

/// A turn or part line as read.
#[derive(Deserialize)]
struct TurnLineIn {
    pieval_record: String,
    attempt_id: String,
    index: u32,
    #[serde(default)]
    turn: Option<TurnRecord>,
    #[serde(default)]
    parts: Option<u32>,
    #[serde(default)]
    text: Option<String>,
}

/// Which kind of line: `None` for a prediction.
#[derive(Deserialize)]
struct Peek {
    #[serde(default)]
    pieval_record: Option<String>,
}

/// The length of `s` as a JSON string's contents (serde_json's escaping).
fn escaped_len(s: &str) -> usize {
    s.chars()
        .map(|c| match c {
            '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
            c if (c as u32) < 0x20 => 6,
            c => c.len_utf8(),
        })
        .sum()
}

/// Cut `s` so that it is at most `max` bytes escaped; whether it was cut.
fn cut_escaped(s: &mut String, max: usize) -> bool {
    let (mut n, mut end) = (0usize, None);
    for (i, c) in s.char_indices() {
        n += escaped_len(c.encode_utf8(&mut [0; 4]));
        if n > max {
            end = Some(i);
            break;
        }
    }
    match end {
        Some(i) => {
            s.truncate(i);
            true
        }
        None => false,
    }
}

/// Append one finished attempt to a checkpoint: a multi-turn attempt's turns as turn
/// lines (in parts when a turn's line would be long), then its prediction line with
/// `turn_lines` set; `rec.turns` is emptied. No line written is longer than
/// [`MAX_LINE_BYTES`]. A kill mid-way leaves an incomplete attempt that readers skip.
/// Returns the lines written (the prediction's is the last of them).
pub fn write_attempt(out: &mut impl Write, path: &Path, rec: &mut PredictionRecord) -> Result<u64> {
    let io = |e| Error::io(path, "cannot append to checkpoint", e);
    fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>> {
        let mut line = serde_json::to_vec(v)
            .map_err(|e| Error::Internal(format!("cannot encode a checkpoint line: {e}")))?;
        line.push(b'\n');
        Ok(line)
    }
    let turns = std::mem::take(&mut rec.turns);
    if !turns.is_empty() {
        rec.turn_lines = Some(turns.len() as u32);
    }
    // The prediction line first (cut if it must be): an attempt whose line cannot be
    // written writes nothing.
    let mut line = encode(&*rec)?;
    // Only a case far over the corpus reader's line limit (or an imported record of
    // long texts) gets here: its request fields are cut, and say so; to a quarter of
    // a mebibyte each when 2 MiB each is still too long.
    for cap in [FIELD_CUT_BYTES, FIELD_CUT_BYTES / 8] {
        if line.len() <= MAX_LINE_BYTES {
            break;
        }
        let fields: [(&str, &mut Option<String>); 7] = [
            ("request_context", &mut rec.request_context),
            ("request_task_input", &mut rec.request_task_input),
            ("request_prompt", &mut rec.request_prompt),
            ("probe_response", &mut rec.probe_response),
            ("translation", &mut rec.translation),
            ("response_text", &mut rec.response_text),
            ("error", &mut rec.error),
        ];
        for (name, v) in fields {
            if let Some(s) = v
                && cut_escaped(s, cap)
                && !rec.cut_fields.iter().any(|c| c == name)
            {
                rec.cut_fields.push(name.to_owned());
            }
        }
        line = encode(&*rec)?;
    }
    if line.len() > MAX_LINE_BYTES {
        // Its other fields alone are too long: never written, so never a line a
        // reader refuses.
        rec.turns = turns;
        rec.turn_lines = None;
        return Err(Error::State(format!(
            "a prediction line of {} bytes even with its text fields cut, more than the {} MiB every reader accepts",
            line.len(),
            MAX_LINE_BYTES >> 20
        )));
    }
    // Lines written before the prediction's own, which comes last.
    let mut lines = 0u64;
    if !turns.is_empty() {
        let attempt = rec.key().to_owned();
        for (i, t) in turns.iter().enumerate() {
            let head = TurnLineOut {
                pieval_record: TURN_LINE,
                case_id: &rec.case_id,
                attempt_id: &attempt,
                index: i as u32 + 1,
                run_id: &rec.run_id,
                attack_strategy: rec.attack_strategy.as_deref(),
                turn: Some(t),
                parts: None,
                text: None,
            };
            let line = encode(&head)?;
            if line.len() <= TURN_LINE_BYTES {
                out.write_all(&line).map_err(io)?;
                lines += 1;
                continue;
            }
            // A long turn: its JSON in slices (on character boundaries), then the turn
            // line naming them.
            let json = serde_json::to_string(t)
                .map_err(|e| Error::Internal(format!("cannot encode a turn: {e}")))?;
            let mut parts = 0u32;
            let mut rest = json.as_str();
            while !rest.is_empty() {
                let mut end = rest.len().min(TURN_PART_BYTES);
                while !rest.is_char_boundary(end) {
                    end -= 1;
                }
                let part = TurnLineOut {
                    pieval_record: TURN_PART_LINE,
                    turn: None,
                    text: Some(&rest[..end]),
                    ..head
                };
                out.write_all(&encode(&part)?).map_err(io)?;
                lines += 1;
                parts += 1;
                rest = &rest[end..];
            }
            let named = TurnLineOut {
                turn: None,
                parts: Some(parts),
                ..head
            };
            out.write_all(&encode(&named)?).map_err(io)?;
            lines += 1;
        }
    }
    out.write_all(&line).map_err(io)?;
    rec.turns = turns;
    Ok(lines + 1)
}

/// The case ids already in a checkpoint. A torn last line (a kill mid-write) is cut off
/// so appending continues on a line boundary; so is an attempt whose turn lines have no
/// prediction line after them.
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

/// Every record of a checkpoint, without repairing it (a torn tail is skipped). Each
/// record comes with its turns, from turn lines or from inside its line.
pub fn scan_checkpoint(path: &Path, each: impl FnMut(PredictionRecord)) -> Result<()> {
    scan(path, false, each).map(|_| ())
}

/// The turn lines read since the last prediction: one attempt's transcript, so far.
#[derive(Default)]
struct Group {
    attempt: Option<String>,
    turns: Vec<TurnRecord>,
    parts: String,
    part_count: u32,
    bytes: u64,
}

impl Group {
    fn is_empty(&self) -> bool {
        self.attempt.is_none()
    }

    /// Take one turn or part line; an error message when it does not fit the attempt.
    fn push(&mut self, l: TurnLineIn) -> std::result::Result<(), String> {
        match &self.attempt {
            Some(a) if *a != l.attempt_id => {
                return Err(format!(
                    "a turn of attempt {:?} among the turns of {:?}",
                    crate::text::excerpt(&l.attempt_id, 80),
                    crate::text::excerpt(a, 80)
                ));
            }
            Some(_) => {}
            None => self.attempt = Some(l.attempt_id),
        }
        let want = self.turns.len() as u32 + 1;
        if l.index != want {
            return Err(format!("turn index {} where {want} was due", l.index));
        }
        let turn = match (l.pieval_record.as_str(), l.turn, l.parts, l.text) {
            (TURN_PART_LINE, None, None, Some(text)) => {
                self.bytes += text.len() as u64;
                self.check()?;
                self.parts.push_str(&text);
                self.part_count += 1;
                return Ok(());
            }
            (TURN_LINE, Some(t), None, None) if self.part_count == 0 => t,
            (TURN_LINE, None, Some(n), None) if n == self.part_count => {
                let t = serde_json::from_str::<TurnRecord>(&self.parts)
                    .map_err(|e| format!("a turn's parts do not make a turn: {e}"))?;
                self.bytes -= self.parts.len() as u64;
                self.parts = String::new();
                self.part_count = 0;
                t
            }
            _ => return Err("not a turn line of this version".into()),
        };
        // Text, plus a fixed cost per turn for what is not text (a million empty turns
        // are not free).
        self.bytes += turn.text_bytes() + TURN_OVERHEAD_BYTES;
        self.check()?;
        self.turns.push(turn);
        Ok(())
    }

    fn check(&self) -> std::result::Result<(), String> {
        if self.bytes > MAX_ATTEMPT_BYTES {
            return Err(format!(
                "an attempt's turns hold over {} MiB, more than any attempt holds",
                MAX_ATTEMPT_BYTES >> 20
            ));
        }
        Ok(())
    }
}

fn scan(
    path: &Path,
    repair: bool,
    mut each: impl FnMut(PredictionRecord),
) -> Result<HashSet<String>> {
    let mut done = HashSet::new();
    // A regular file opened without following a link: a planted `predictions.jsonl ->
    // /dev/zero` or a FIFO is an error, not a read that never ends.
    let file = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(done),
        _ => crate::files::open_regular(path, crate::files::Links::Refuse)?,
    };
    let read_err = |e| Error::io(path, "cannot read checkpoint", e);
    let mut input = std::io::BufReader::with_capacity(1 << 20, file);
    let mut buf: Vec<u8> = Vec::new();
    // Bytes read, and the end of the last whole attempt.
    let (mut offset, mut good_end) = (0u64, 0u64);
    let mut line_no = 0u64;
    let mut group = Group::default();
    loop {
        buf.clear();
        let n = input
            .by_ref()
            .take(MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut buf)
            .map_err(read_err)?;
        if n == 0 {
            break;
        }
        line_no += 1;
        if buf.last() != Some(&b'\n') {
            if buf.len() <= MAX_LINE_BYTES {
                break; // torn tail: no newline
            }
            // Over the limit: find where the line ends.
            let mut len = buf.len() as u64;
            let ended = loop {
                let chunk = input.fill_buf().map_err(read_err)?;
                if chunk.is_empty() {
                    break false;
                }
                match memchr::memchr(b'\n', chunk) {
                    Some(i) => {
                        len += i as u64;
                        input.consume(i + 1);
                        break true;
                    }
                    None => {
                        let k = chunk.len();
                        len += k as u64;
                        input.consume(k);
                    }
                }
            };
            if !ended {
                break; // a torn tail, however long
            }
            return Err(Error::input(
                path,
                line_no,
                None,
                format!(
                    "line is {len} bytes, over the limit of {} MiB",
                    MAX_LINE_BYTES >> 20
                ),
            ));
        }
        let line = &buf[..buf.len() - 1];
        let last = input.fill_buf().map_err(read_err)?.is_empty();
        // The fast paths are taken only when they give what reading the key would (a
        // prediction line that also names a record kind is read by its key, as the
        // predictions reader reads it: one rule for both readers).
        let names_kind = memchr::memmem::find(line, b"\"pieval_record\"").is_some();
        let kind = if line.starts_with(b"{\"case_id\"") && !names_kind {
            None
        } else if line.starts_with(b"{\"pieval_record\":\"turn\"") {
            Some(TURN_LINE.to_owned())
        } else if line.starts_with(b"{\"pieval_record\":\"turn_part\"") {
            Some(TURN_PART_LINE.to_owned())
        } else {
            serde_json::from_slice::<Peek>(line)
                .ok()
                .and_then(|p| p.pieval_record)
        };
        let corrupt = |msg: String| Error::input(path, line_no, None, msg);
        match kind.as_deref() {
            None => match serde_json::from_slice::<PredictionRecord>(line) {
                Ok(mut r) => {
                    match r.turn_lines {
                        Some(n) => {
                            if group.attempt.as_deref() != Some(r.key()) && n > 0
                                || group.turns.len() as u32 != n
                                || group.part_count > 0
                            {
                                return Err(corrupt(format!(
                                    "the attempt names {n} turn lines before it, and {} came",
                                    group.turns.len()
                                )));
                            }
                            r.turns = std::mem::take(&mut group).turns;
                        }
                        None if !group.is_empty() => {
                            return Err(corrupt(
                                "a prediction after turn lines that are not its own".into(),
                            ));
                        }
                        None => {}
                    }
                    done.insert(r.key().to_owned());
                    each(r);
                    good_end = offset + n as u64;
                }
                Err(_) if last => break, // a torn final line that happens to end in a newline
                Err(e) => return Err(corrupt(format!("corrupt checkpoint line: {e}"))),
            },
            Some(TURN_LINE | TURN_PART_LINE) => match serde_json::from_slice::<TurnLineIn>(line) {
                Ok(l) => group.push(l).map_err(corrupt)?,
                Err(_) if last => break,
                Err(e) => return Err(corrupt(format!("corrupt turn line: {e}"))),
            },
            Some(other) => {
                return Err(corrupt(format!(
                    "unknown {RECORD_KEY} {:?} (a newer pieval's checkpoint?)",
                    crate::text::excerpt(other, 40)
                )));
            }
        }
        offset += n as u64;
    }
    // Turn lines with no prediction after them: an attempt a kill cut short. Skipped,
    // and cut off on repair (the attempt runs again on --resume).
    if repair {
        let len = std::fs::metadata(path)
            .map_err(|e| Error::io(path, "cannot repair checkpoint", e))?
            .len();
        if good_end < len {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(|e| Error::io(path, "cannot repair checkpoint", e))?;
            f.set_len(good_end)
                .map_err(|e| Error::io(path, "cannot repair checkpoint", e))?;
        }
    }
    Ok(done)
}

/// A table of a run folder written from the checkpoint row by row: one builder per
/// column of its schema, flushed as a batch to an atomic Parquet file every 8,192 rows
/// or [`MAX_TABLE_BATCH_BYTES`] of text (inside an attempt too: a column's text stays
/// far below the 2 GiB its 32-bit offsets address). With no row, a stale file is removed.
/// The batches are encoded, compressed and written on a thread of the table's own while
/// the next fills: at most three batches are held (one filling, one waiting, one being
/// written), each its own row group. Over an import of 476,515 tool calls the Parquet
/// writer had been a fifth of the importing thread's time.
pub struct TableWriter {
    out: std::path::PathBuf,
    schema: datafusion::arrow::datatypes::SchemaRef,
    columns: Vec<Column>,
    /// The next column of the row being filled.
    next: usize,
    rows: usize,
    bytes: usize,
    writer: Option<Background>,
}

/// The thread writing a table's batches: it ends when the channel closes, giving back
/// the file (uncommitted: dropped, it leaves nothing), or at the first error.
struct Background {
    batches: Option<std::sync::mpsc::SyncSender<datafusion::arrow::array::RecordBatch>>,
    thread: Option<std::thread::JoinHandle<Result<crate::atomic::ParquetFile>>>,
}

impl Background {
    fn start(file: crate::atomic::ParquetFile) -> Result<Self> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<datafusion::arrow::array::RecordBatch>(1);
        let thread = std::thread::Builder::new()
            .name("pieval-table".into())
            .spawn(move || {
                let mut file = file;
                // A row group a batch: the writer holds one batch's encoded pages, not
                // 64 Ki rows of tool outputs.
                for batch in rx {
                    file.write(&batch)?;
                    file.end_row_group()?;
                }
                Ok(file)
            })
            .map_err(|e| Error::Internal(format!("cannot start a table writer: {e}")))?;
        Ok(Background {
            batches: Some(tx),
            thread: Some(thread),
        })
    }

    fn send(&mut self, batch: datafusion::arrow::array::RecordBatch) -> Result<()> {
        let sent = self.batches.as_ref().map(|tx| tx.send(batch));
        match sent {
            Some(Ok(())) => Ok(()),
            // the thread stopped: its error
            _ => self.end().map(drop),
        }
    }

    /// Close the channel and wait: the file with every batch written.
    fn end(&mut self) -> Result<crate::atomic::ParquetFile> {
        self.batches.take();
        match self.thread.take().map(std::thread::JoinHandle::join) {
            Some(Ok(done)) => done,
            Some(Err(_)) => Err(Error::Internal("a table writer panicked".into())),
            None => Err(Error::Internal("a table writer ended before".into())),
        }
    }
}

impl Drop for Background {
    /// Not ended (an error elsewhere): the thread is waited for, so nothing writes into
    /// a folder being removed; its file, uncommitted, leaves nothing.
    fn drop(&mut self) {
        self.batches.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

enum Column {
    Text(datafusion::arrow::array::StringBuilder),
    Int(datafusion::arrow::array::Int64Builder),
    Flag(datafusion::arrow::array::BooleanBuilder),
    Float(datafusion::arrow::array::Float64Builder),
}

/// Text bytes of a table held before a batch is written.
const MAX_TABLE_BATCH_BYTES: usize = 64 << 20;

impl TableWriter {
    pub fn new(out: std::path::PathBuf, schema: datafusion::arrow::datatypes::SchemaRef) -> Self {
        use datafusion::arrow::array::{
            BooleanBuilder, Float64Builder, Int64Builder, StringBuilder,
        };
        use datafusion::arrow::datatypes::DataType;
        let columns = schema
            .fields()
            .iter()
            .map(|f| match f.data_type() {
                DataType::Utf8 => Column::Text(StringBuilder::new()),
                DataType::Int64 => Column::Int(Int64Builder::new()),
                DataType::Boolean => Column::Flag(BooleanBuilder::new()),
                _ => Column::Float(Float64Builder::new()),
            })
            .collect();
        TableWriter {
            out,
            schema,
            columns,
            next: 0,
            rows: 0,
            bytes: 0,
            writer: None,
        }
    }

    fn column(&mut self) -> &mut Column {
        self.next += 1;
        &mut self.columns[self.next - 1]
    }

    pub fn text(&mut self, v: Option<&str>) -> &mut Self {
        self.bytes += v.map_or(0, str::len);
        match self.column() {
            Column::Text(b) => b.append_option(v),
            _ => unreachable!("a text column"),
        }
        self
    }

    pub fn int(&mut self, v: Option<i64>) -> &mut Self {
        match self.column() {
            Column::Int(b) => b.append_option(v),
            _ => unreachable!("an int column"),
        }
        self
    }

    pub fn flag(&mut self, v: Option<bool>) -> &mut Self {
        match self.column() {
            Column::Flag(b) => b.append_option(v),
            _ => unreachable!("a flag column"),
        }
        self
    }

    pub fn float(&mut self, v: Option<f64>) -> &mut Self {
        match self.column() {
            Column::Float(b) => b.append_option(v),
            _ => unreachable!("a float column"),
        }
        self
    }

    /// The row is complete (every column filled, in schema order).
    pub fn end_row(&mut self) -> Result<()> {
        debug_assert_eq!(self.next, self.columns.len(), "a row fills every column");
        self.next = 0;
        self.rows += 1;
        if self.rows >= 8192 || self.bytes >= MAX_TABLE_BATCH_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        use datafusion::arrow::array::{ArrayRef, RecordBatch};
        use std::sync::Arc;
        if self.rows == 0 {
            return Ok(());
        }
        let columns: Vec<ArrayRef> = self
            .columns
            .iter_mut()
            .map(|c| -> ArrayRef {
                match c {
                    Column::Text(b) => Arc::new(b.finish()),
                    Column::Int(b) => Arc::new(b.finish()),
                    Column::Flag(b) => Arc::new(b.finish()),
                    Column::Float(b) => Arc::new(b.finish()),
                }
            })
            .collect();
        let batch = RecordBatch::try_new(Arc::clone(&self.schema), columns)?;
        if self.writer.is_none() {
            self.writer = Some(Background::start(crate::atomic::ParquetFile::create(
                &self.out,
                Arc::clone(&self.schema),
            )?)?);
        }
        self.writer.as_mut().expect("created").send(batch)?;
        self.rows = 0;
        self.bytes = 0;
        Ok(())
    }

    /// Write the last batch and commit; the rows written (0: no file, a stale one removed).
    pub fn finish(mut self) -> Result<u64> {
        self.flush()?;
        match self.writer.take() {
            Some(mut w) => w.end()?.commit(),
            None => {
                match std::fs::remove_file(&self.out) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(Error::io(&self.out, "cannot remove a stale table", e)),
                }
                Ok(0)
            }
        }
    }
}

/// The tables derived from a run's attempts, filled record by record: `turns.parquet`
/// (every turn of an attempt that has turns: a multi-turn strategy's, an agent's) and
/// `tool_calls.parquet` (every call of an agent's attempt). Each is written atomically
/// when it has rows; a stale one is removed when it has none.
pub struct AttemptTables {
    turns: TableWriter,
    tool_calls: TableWriter,
}

impl AttemptTables {
    pub fn new(dir: &Path) -> Self {
        Self {
            turns: TableWriter::new(
                dir.join(super::TURNS_FILE),
                crate::contract::arrow::turns_schema(),
            ),
            tool_calls: TableWriter::new(
                dir.join(super::TOOL_CALLS_FILE),
                crate::contract::arrow::tool_calls_schema(),
            ),
        }
    }

    /// Add one attempt's rows.
    pub fn add(&mut self, r: &PredictionRecord) -> Result<()> {
        let attempt = r.key();
        let w = &mut self.turns;
        for t in &r.turns {
            w.text(Some(&r.run_id))
                .text(Some(&r.case_id))
                .text(Some(attempt))
                .text(r.attack_strategy.as_deref());
            turn_columns(t, w);
            w.end_row()?;
        }
        if r.agent_stop.is_none() {
            return Ok(());
        }
        let w = &mut self.tool_calls;
        let mut seq = 0i64;
        for t in &r.turns {
            for c in &t.tool_calls {
                seq += 1;
                w.text(Some(&r.run_id))
                    .text(Some(&r.case_id))
                    .text(Some(attempt))
                    .int(Some(i64::from(t.turn)))
                    .int(Some(seq))
                    .text(Some(&c.id))
                    .text(Some(&c.name))
                    .text(Some(&c.arguments))
                    .text(Some(&c.output))
                    .flag(Some(c.error))
                    .flag(Some(c.executed))
                    .flag(Some(c.action))
                    .flag(Some(c.injected))
                    .text(c.blocked_by.as_deref())
                    .end_row()?;
            }
        }
        Ok(())
    }

    /// Write the last batches and commit both; the rows of (turns, tool_calls).
    pub fn finish(self) -> Result<(u64, u64)> {
        Ok((self.turns.finish()?, self.tool_calls.finish()?))
    }
}

/// Write `turns.parquet` and `tool_calls.parquet` from a run's checkpoint, in one pass
/// over it ([`AttemptTables`]). Returns the rows of each.
pub fn write_attempt_tables(dir: &Path) -> Result<(u64, u64)> {
    let mut tables = AttemptTables::new(dir);
    let mut failed = None;
    scan_checkpoint(&dir.join(super::PREDICTIONS_FILE), |r| {
        if failed.is_none()
            && let Err(e) = tables.add(&r)
        {
            failed = Some(e);
        }
    })?;
    if let Some(e) = failed {
        return Err(e);
    }
    tables.finish()
}

/// A turn's columns of `turns.parquet`, in schema order after the attempt's.
fn turn_columns(t: &TurnRecord, w: &mut TableWriter) {
    w.int(Some(i64::from(t.turn)))
        .int(Some(i64::from(t.depth)))
        .text(Some(&t.node_id))
        .text(t.parent_id.as_deref())
        .text(t.attacker_response.as_deref())
        .text(Some(&t.attack_prompt))
        .flag(t.on_topic)
        .flag(Some(t.pruned))
        .text(t.target_response.as_deref())
        .text(t.error.as_deref())
        .flag(t.refused)
        .flag(t.success)
        .int(t.score.map(i64::from))
        .flag(t.judge_verdict)
        .float(t.judge_score)
        .flag(Some(t.backtracked))
        .text(t.blocked_by.as_deref())
        .float(t.latency_ms);
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

    fn turn(i: u32, text: &str) -> TurnRecord {
        TurnRecord {
            turn: i,
            depth: i,
            node_id: i.to_string(),
            attack_prompt: format!("prompt {i}"),
            attacker_response: Some(text.to_owned()),
            target_response: Some(text.to_owned()),
            ..TurnRecord::default()
        }
    }

    #[test]
    fn turns_are_lines_of_their_own_read_back_whole_and_repaired() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("predictions.jsonl");
        let mut f = std::fs::File::create(&p).unwrap();
        // A turn of control characters escapes six-fold (12 MiB): written in parts.
        let mut a = PredictionRecord {
            case_id: "c".into(),
            run_id: "r".into(),
            attempt_id: Some("c#crescendo".into()),
            turns: vec![
                turn(1, "a"),
                turn(2, &"\u{1}".repeat(1 << 20)),
                turn(3, "b"),
            ],
            ..PredictionRecord::default()
        };
        write_attempt(&mut f, &p, &mut a).unwrap();
        assert_eq!(a.turn_lines, Some(3));
        // A case far over the corpus's line limit: its request fields are cut, and say so.
        let mut b = PredictionRecord {
            case_id: "d".into(),
            request_context: Some("\u{2}".repeat(3 << 20)),
            ..PredictionRecord::default()
        };
        write_attempt(&mut f, &p, &mut b).unwrap();
        drop(f);
        let text = std::fs::read(&p).unwrap();
        let lines: Vec<&[u8]> = text
            .split(|c| *c == b'\n')
            .filter(|l| !l.is_empty())
            .collect();
        assert!(lines.iter().all(|l| l.len() <= MAX_LINE_BYTES));
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(b"{\"pieval_record\":\"turn_part\""))
        );
        let mut back = Vec::new();
        scan_checkpoint(&p, |r| back.push(r)).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(back[0].turns, a.turns, "the transcript whole");
        assert_eq!(back[1].cut_fields, ["request_context"]);
        let kept = escaped_len(back[1].request_context.as_deref().unwrap());
        assert!(
            kept <= FIELD_CUT_BYTES && kept > FIELD_CUT_BYTES - 6,
            "{kept}"
        );

        // A kill after two of an attempt's turn lines: skipped, and cut off on repair.
        let whole = text.len();
        let mut c = PredictionRecord {
            case_id: "e".into(),
            attempt_id: Some("e#pair".into()),
            turns: vec![turn(1, "x"), turn(2, "y")],
            ..PredictionRecord::default()
        };
        let mut tail = Vec::new();
        write_attempt(&mut tail, &p, &mut c).unwrap();
        let cut = tail.iter().rposition(|b| *b == b'\n').unwrap();
        let cut = tail[..cut].iter().rposition(|b| *b == b'\n').unwrap() + 1;
        let mut torn = text.clone();
        torn.extend_from_slice(&tail[..cut]);
        std::fs::write(&p, &torn).unwrap();
        let mut n = 0;
        scan_checkpoint(&p, |_| n += 1).unwrap();
        assert_eq!(n, 2, "the incomplete attempt is skipped");
        let done = read_checkpoint(&p).unwrap();
        assert!(!done.contains("e#pair"));
        assert_eq!(
            std::fs::metadata(&p).unwrap().len() as usize,
            whole,
            "cut off"
        );

        // Turn lines of one attempt before another's prediction: corrupt, located.
        let mut other = tail[..cut].to_vec();
        other.extend_from_slice(b"{\"case_id\":\"f\",\"run_id\":\"r\",\"provider\":\"p\",\"model_name\":\"m\",\"execution_mode\":\"live\",\"mitigation\":\"none\"}\n");
        let mut bad = text.clone();
        bad.extend_from_slice(&other);
        std::fs::write(&p, &bad).unwrap();
        let e = scan_checkpoint(&p, |_| {}).unwrap_err().to_string();
        assert!(
            e.contains("predictions.jsonl:") && e.contains("not its own"),
            "{e}"
        );

        // An older checkpoint: the transcript inside the prediction line.
        let old = PredictionRecord {
            case_id: "g".into(),
            attempt_id: Some("g#tap".into()),
            turns: vec![turn(1, "z")],
            ..PredictionRecord::default()
        };
        std::fs::write(&p, format!("{}\n", serde_json::to_string(&old).unwrap())).unwrap();
        let mut back = Vec::new();
        scan_checkpoint(&p, |r| back.push(r)).unwrap();
        assert_eq!(back, [old]);
    }
}
