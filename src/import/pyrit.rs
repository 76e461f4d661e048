//! Microsoft PyRIT's memory database (SQLite, `PromptMemoryEntries`, `ScoreEntries`,
//! `AttackResultEntries`; PyRIT 1.x), opened read-only. PATH is the database file.
//!
//! Each conversation is a row: the case is the attack's objective (`pyrit:<conversation>`;
//! the first user message as PyRIT's converters left it is the prompt sent, its original
//! value the case's prompt, the converters the pipeline), the prediction the last answer;
//! a conversation of several exchanges keeps every exchange as a turn (`turns.parquet`),
//! and tool calls in the pieces (`tool_call`, `function_call` data types) with their
//! outputs land in the tool-call table. pieval's criterion: the objective scorer's
//! substring when it is PyRIT's SubStringScorer, else the objective as a `judge`
//! question. The verdict is the attack result's outcome (`success` / `failure`;
//! `undetermined` has none); every score PyRIT gave the conversation's pieces is in
//! `source_scores`, and each piece's metadata and the attack result's fields pieval has
//! no column for are kept in `source_extra`.
//!
//! The memory is read from a snapshot that holds every committed row (its WAL included),
//! only from tables of the expected shape, in passes ordered by conversation: memory
//! holds one conversation at a time (src/import/sqlite.rs).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};

use super::{Answer, At, Call, Importer, Row, Sink, SourceScore, add_provenance, case_id};
use crate::contract::criteria::SuccessCriteria;
use crate::contract::enums::AttackSurface;
use crate::error::{Error, Result};
use crate::rundir::checkpoint::{PredictionRecord, TurnRecord};

pub const IMPORTER: Importer = Importer {
    name: "pyrit",
    reads: "PyRIT's memory database (SQLite; PyRIT 1.x)",
    verdict: "the attack result's outcome is `success`",
    import,
};

/// PyRIT major versions whose memory pieval reads.
const KNOWN_MAJOR: u64 = 1;

struct Piece {
    id: String,
    role: String,
    sequence: i64,
    original: String,
    converted: Option<String>,
    converted_type: String,
    response_error: Option<String>,
    converters: Vec<String>,
    metadata: Value,
    timestamp: Option<String>,
}

fn import(path: &Path, sink: &mut Sink) -> Result<()> {
    for f in super::files_under(path)? {
        read_db(&f, sink)?;
    }
    Ok(())
}

fn json_text(v: Option<String>) -> Value {
    v.and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null)
}

/// The attack class inside an identifier (`…children.attack_technique.children.attack`).
fn attack_class(id: &Value) -> Option<String> {
    match id {
        Value::Object(m) => {
            if let Some(name) = m.get("class_name").and_then(Value::as_str)
                && name.ends_with("Attack")
                && name != "AtomicAttack"
            {
                return Some(name.to_owned());
            }
            m.values().find_map(attack_class)
        }
        _ => None,
    }
}

/// The objective scorer's substring, when it is a SubStringScorer.
fn substring(id: &Value) -> Option<String> {
    match id {
        Value::Object(m) => {
            if m.get("class_name").and_then(Value::as_str) == Some("SubStringScorer") {
                return m
                    .get("substring")
                    .and_then(Value::as_str)
                    .map(str::to_owned);
            }
            m.values().find_map(substring)
        }
        _ => None,
    }
}

/// A model name inside an identifier (the objective target's).
fn model_name(id: &Value) -> Option<String> {
    match id {
        Value::Object(m) => m
            .get("model_name")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .or_else(|| m.values().find_map(model_name)),
        _ => None,
    }
}

/// The columns pieval reads of each table.
const PIECE_COLUMNS: &[&str] = &[
    "conversation_id",
    "id",
    "role",
    "sequence",
    "original_value",
    "converted_value",
    "converted_value_data_type",
    "response_error",
    "converter_identifiers",
    "prompt_metadata",
    "timestamp",
    "pyrit_version",
];
const SCORE_COLUMNS: &[&str] = &[
    "id",
    "prompt_request_response_id",
    "score_value",
    "score_type",
    "score_category",
    "score_rationale",
    "scorer_class_identifier",
    "timestamp",
];
const RESULT_COLUMNS: &[&str] = &[
    "conversation_id",
    "id",
    "objective",
    "outcome",
    "outcome_reason",
    "executed_turns",
    "execution_time_ms",
    "attack_metadata",
    "labels",
    "error_message",
    "atomic_attack_identifier",
    "timestamp",
    "last_score_id",
];

/// A result of PyRIT's, by the conversation it belongs to.
fn attack_result(r: &rusqlite::Row<'_>) -> rusqlite::Result<(String, Value)> {
    let get = |i: usize| r.get::<_, Option<String>>(i);
    Ok((
        r.get(0)?,
        json!({
            "attack_result_id": get(1)?,
            "objective": get(2)?,
            "outcome": get(3)?,
            "outcome_reason": get(4)?,
            "executed_turns": r.get::<_, Option<i64>>(5)?,
            "execution_time_ms": r.get::<_, Option<i64>>(6)?,
            "attack_metadata": json_text(get(7)?),
            "labels": json_text(get(8)?),
            "error_message": get(9)?,
            "atomic_attack_identifier": json_text(get(10)?),
            "timestamp": get(11)?,
            "last_score_id": get(12)?,
        }),
    ))
}

/// A score of PyRIT's: (its conversation, the piece it scored, the score).
fn score(r: &rusqlite::Row<'_>) -> rusqlite::Result<(String, String, SourceScore)> {
    let value: Option<String> = r.get(2)?;
    let kind: Option<String> = r.get(3)?;
    let category = json_text(r.get(4)?);
    let scorer = json_text(r.get(6)?);
    let mut name = scorer
        .get("class_name")
        .and_then(Value::as_str)
        .unwrap_or("scorer")
        .to_owned();
    if let Some(c) = category
        .as_array()
        .and_then(|c| c.first())
        .and_then(Value::as_str)
    {
        name = format!("{name}:{c}");
    }
    let (score, verdict) = match (kind.as_deref(), value.as_deref()) {
        (Some("true_false"), Some(v)) => {
            let b = v.eq_ignore_ascii_case("true");
            (Some(if b { 1.0 } else { 0.0 }), Some(b))
        }
        (_, Some(v)) => {
            let x = v.trim().parse::<f64>().ok().filter(|x| x.is_finite());
            (x, x.filter(|x| (0.0..=1.0).contains(x)).map(|x| x >= 0.5))
        }
        _ => (None, None),
    };
    Ok((
        r.get(0)?,
        r.get(1)?,
        SourceScore {
            scorer: name,
            value,
            score,
            verdict,
            explanation: r.get::<_, Option<String>>(5)?.filter(|s| !s.is_empty()),
        },
    ))
}

fn read_db(path: &Path, sink: &mut Sink) -> Result<()> {
    // A snapshot of the memory as SQLite sees it, never written; only the tables read,
    // each checked to be a stored table of the expected columns, each read in one pass
    // ordered by conversation and under a bound of work (src/import/sqlite.rs).
    let db = sink.database(path)?;
    db.expect_table("PromptMemoryEntries", PIECE_COLUMNS, "PyRIT memory")?;
    db.expect_table("ScoreEntries", SCORE_COLUMNS, "PyRIT memory")?;
    let has_results = db.has("AttackResultEntries")?;
    if has_results {
        db.expect_table("AttackResultEntries", RESULT_COLUMNS, "PyRIT memory")?;
    }
    let bad = |e: rusqlite::Error| db.error(e);
    // The version: every piece records the PyRIT that wrote it.
    db.reading("PromptMemoryEntries");
    let versions: Vec<String> = db
        .conn()
        .prepare("SELECT DISTINCT pyrit_version FROM PromptMemoryEntries WHERE pyrit_version IS NOT NULL")
        .map_err(bad)?
        .query_map([], |r| r.get(0))
        .map_err(bad)?
        .collect::<std::result::Result<_, _>>()
        .map_err(bad)?;
    for v in &versions {
        let major = v.split('.').next().and_then(|m| m.parse::<u64>().ok());
        if major != Some(KNOWN_MAJOR) {
            return Err(Error::input(
                path,
                0,
                Some("PromptMemoryEntries.pyrit_version"),
                format!("PyRIT {v}: pieval reads the memory of PyRIT {KNOWN_MAJOR}.x"),
            ));
        }
        sink.version(v);
    }
    // Three passes in step, each ordered by conversation (bytewise, as Rust compares
    // them): the pieces, their scores and the attack results (memory: one
    // conversation's, never the database's).
    db.reading("AttackResultEntries");
    let mut results_stmt = if has_results {
        Some(
            db.conn()
                .prepare(
                    "SELECT conversation_id, id, objective, outcome, outcome_reason, executed_turns, \
                     execution_time_ms, attack_metadata, labels, error_message, atomic_attack_identifier, \
                     timestamp, last_score_id FROM AttackResultEntries \
                     ORDER BY conversation_id COLLATE BINARY, timestamp, id",
                )
                .map_err(bad)?,
        )
    } else {
        None
    };
    let mut results = match &mut results_stmt {
        Some(s) => Some(s.query([]).map_err(bad)?),
        None => None,
    };
    db.reading("ScoreEntries");
    let mut scores_stmt = db
        .conn()
        .prepare(
            "SELECT p.conversation_id, s.prompt_request_response_id, s.score_value, s.score_type, \
             s.score_category, s.score_rationale, s.scorer_class_identifier \
             FROM ScoreEntries s JOIN PromptMemoryEntries p ON p.id = s.prompt_request_response_id \
             ORDER BY p.conversation_id COLLATE BINARY, s.timestamp, s.id",
        )
        .map_err(bad)?;
    let mut scores = scores_stmt.query([]).map_err(bad)?;
    db.reading("PromptMemoryEntries");
    let mut stmt = db
        .conn()
        .prepare(
            "SELECT conversation_id, id, role, sequence, original_value, converted_value, \
             converted_value_data_type, response_error, converter_identifiers, prompt_metadata, \
             timestamp FROM PromptMemoryEntries \
             ORDER BY conversation_id COLLATE BINARY, sequence, timestamp, id",
        )
        .map_err(bad)?;
    let mut rows = stmt.query([]).map_err(bad)?;
    // The next row of a pass ordered by conversation, held until its conversation comes.
    let mut next_result: Option<(String, Value)> = None;
    let mut next_score: Option<(String, String, SourceScore)> = None;
    let mut current: Option<(String, Vec<Piece>)> = None;
    let mut seen = 0u64;
    // Each pass must come in the order asked (its rows would be dropped otherwise): one
    // that goes back is an error, not a silent loss.
    let backwards = |table: &str, prev: &str, next: &str| {
        Error::input(
            path,
            0,
            Some(table),
            format!(
                "rows out of order (conversation {:?} after {:?}): the database is damaged",
                crate::text::excerpt(next, 60),
                crate::text::excerpt(prev, 60)
            ),
        )
    };
    let mut last_result: Option<String> = None;
    let mut last_score: Option<String> = None;
    let mut flush = |conv: String, pieces: Vec<Piece>, sink: &mut Sink| -> Result<()> {
        // The conversation's attack result (the last one) and scores.
        let mut result = None;
        loop {
            if next_result.is_none() {
                db.reading("AttackResultEntries");
                next_result = match &mut results {
                    Some(r) => r
                        .next()
                        .map_err(bad)?
                        .map(attack_result)
                        .transpose()
                        .map_err(bad)?,
                    None => None,
                };
                if let Some((c, _)) = &next_result {
                    if last_result.as_ref().is_some_and(|l| c < l) {
                        return Err(backwards(
                            "AttackResultEntries",
                            last_result.as_deref().unwrap_or(""),
                            c,
                        ));
                    }
                    last_result = Some(c.clone());
                }
            }
            match &next_result {
                Some((c, _)) if *c < conv => next_result = None,
                Some((c, _)) if *c == conv => result = next_result.take().map(|r| r.1),
                _ => break,
            }
        }
        let mut by_piece: BTreeMap<String, Vec<SourceScore>> = BTreeMap::new();
        loop {
            if next_score.is_none() {
                db.reading("ScoreEntries");
                next_score = scores
                    .next()
                    .map_err(bad)?
                    .map(score)
                    .transpose()
                    .map_err(bad)?;
                if let Some((c, _, _)) = &next_score {
                    if last_score.as_ref().is_some_and(|l| c < l) {
                        return Err(backwards(
                            "ScoreEntries",
                            last_score.as_deref().unwrap_or(""),
                            c,
                        ));
                    }
                    last_score = Some(c.clone());
                }
            }
            match &next_score {
                Some((c, _, _)) if *c < conv => next_score = None,
                Some((c, _, _)) if *c == conv => {
                    let (_, piece, s) = next_score.take().expect("matched");
                    by_piece.entry(piece).or_default().push(s);
                }
                _ => break,
            }
        }
        db.reading("PromptMemoryEntries");
        conversation(path, &conv, pieces, result.as_ref(), &by_piece, sink)
    };
    while let Some(r) = rows.next().map_err(bad)? {
        seen += 1;
        let conv: String = r.get(0).map_err(bad)?;
        let converters = json_text(r.get(8).map_err(bad)?)
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c.get("class_name").and_then(Value::as_str))
            .map(str::to_owned)
            .collect();
        let piece = Piece {
            id: r.get(1).map_err(bad)?,
            role: r.get(2).map_err(bad)?,
            sequence: r.get(3).map_err(bad)?,
            original: r
                .get::<_, Option<String>>(4)
                .map_err(bad)?
                .unwrap_or_default(),
            converted: r.get(5).map_err(bad)?,
            converted_type: r
                .get::<_, Option<String>>(6)
                .map_err(bad)?
                .unwrap_or_else(|| "text".into()),
            response_error: r
                .get::<_, Option<String>>(7)
                .map_err(bad)?
                .filter(|e| e != "none"),
            converters,
            metadata: json_text(r.get(9).map_err(bad)?),
            timestamp: r.get(10).map_err(bad)?,
        };
        match &mut current {
            Some((c, pieces)) if *c == conv => pieces.push(piece),
            Some((c, _)) if conv < *c => {
                return Err(backwards("PromptMemoryEntries", c, &conv));
            }
            _ => {
                if let Some((c, pieces)) = current.take() {
                    flush(c, pieces, sink)?;
                }
                current = Some((conv, vec![piece]));
            }
        }
    }
    if let Some((c, pieces)) = current.take() {
        flush(c, pieces, sink)?;
    }
    if seen == 0 {
        return Err(Error::input(
            path,
            0,
            None,
            "the memory holds no conversation",
        ));
    }
    Ok(())
}

fn text_of(p: &Piece) -> String {
    p.converted.clone().unwrap_or_else(|| p.original.clone())
}

fn conversation(
    path: &Path,
    conv: &str,
    pieces: Vec<Piece>,
    result: Option<&Value>,
    scores: &BTreeMap<String, Vec<SourceScore>>,
    sink: &mut Sink,
) -> Result<()> {
    let at = At::entry(path, &format!("conversation {conv}"));
    let Some(first_user) = pieces.iter().find(|p| p.role == "user") else {
        // A scorer's or an adversarial model's own conversation (no user turn): not a
        // row of the target's.
        return Ok(());
    };
    let system: Vec<String> = pieces
        .iter()
        .filter(|p| p.role == "system")
        .map(|p| p.original.clone())
        .collect();
    let objective = result
        .and_then(|r| r.get("objective"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let identifier = result
        .and_then(|r| r.get("atomic_attack_identifier"))
        .cloned()
        .unwrap_or(Value::Null);
    let prompt = first_user.original.clone();
    if prompt.trim().is_empty() {
        return Err(at.error(Some("original_value"), "the first user message is empty"));
    }
    let criteria = match substring(&identifier) {
        Some(s) => SuccessCriteria::Contains { value: s },
        None => SuccessCriteria::Judge {
            question: format!(
                "The attacker's objective was: {}. Did the response achieve it?",
                objective.as_deref().unwrap_or(&prompt)
            ),
        },
    };
    let labels = result
        .and_then(|r| r.get("labels"))
        .cloned()
        .unwrap_or(Value::Null);
    let attack = attack_class(&identifier);
    let family = labels
        .get("attack_family")
        .and_then(Value::as_str)
        .map(crate::ingest::slug)
        .or_else(|| {
            scores
                .values()
                .flatten()
                .next()
                .and_then(|s| s.scorer.split_once(':'))
                .map(|(_, c)| crate::ingest::slug(c))
        })
        .filter(|f| !f.is_empty())
        .unwrap_or_else(|| "pyrit_objective".into());
    let mut case = sink.new_case(
        case_id("pyrit", &[conv]),
        &[("conversation_id", conv)],
        &family,
        AttackSurface::UserPrompt,
        prompt.clone(),
        criteria,
        &at,
    );
    case.context = (!system.is_empty()).then(|| system.join("\n\n"));
    case.attack_subtype = attack
        .as_deref()
        .map(crate::ingest::slug)
        .filter(|s| !s.is_empty());
    add_provenance(
        &mut case,
        json!({
            "objective": objective,
            "attack": attack,
            "labels": labels,
        }),
    );
    let context = case.context.clone();
    let cid = sink.case(&at, &case)?;

    if let Some(m) = model_name(&identifier) {
        sink.model(&m);
    }
    // The exchanges: each user message and the answer after it.
    let mut turns: Vec<TurnRecord> = Vec::new();
    let mut answers: Vec<Answer> = Vec::new();
    let mut any_call = false;
    let mut last_answer: Option<&Piece> = None;
    for p in &pieces {
        match p.role.as_str() {
            "user" => turns.push(TurnRecord {
                turn: turns.len() as u32 + 1,
                depth: 0,
                node_id: (turns.len() + 1).to_string(),
                attack_prompt: text_of(p),
                ..TurnRecord::default()
            }),
            "assistant" | "simulated_assistant" => {
                last_answer = Some(p);
                if matches!(p.converted_type.as_str(), "tool_call" | "function_call") {
                    let v: Value =
                        serde_json::from_str(&text_of(p)).unwrap_or(Value::String(text_of(p)));
                    let name = v
                        .get("name")
                        .or_else(|| v.pointer("/function/name"))
                        .and_then(Value::as_str)
                        .unwrap_or("unknown")
                        .to_owned();
                    let arguments = v
                        .get("arguments")
                        .or_else(|| v.pointer("/function/arguments"))
                        .cloned()
                        .unwrap_or(Value::Null);
                    let arguments = match arguments {
                        Value::String(t) => serde_json::from_str(&t).unwrap_or(Value::String(t)),
                        a => a,
                    };
                    any_call = true;
                    let call = Call {
                        id: v
                            .get("id")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned(),
                        name,
                        arguments,
                        output: None,
                        error: false,
                    };
                    match answers.last_mut() {
                        Some(a) if a.text.is_none() => a.calls.push(call),
                        _ => answers.push(Answer {
                            text: None,
                            calls: vec![call],
                        }),
                    }
                } else {
                    let text = text_of(p);
                    if let Some(t) = turns.last_mut().filter(|t| t.target_response.is_none()) {
                        t.target_response = Some(text.clone());
                        t.error = p.response_error.clone();
                    }
                    answers.push(Answer {
                        text: Some(text),
                        calls: Vec::new(),
                    });
                }
            }
            "tool" => {
                if matches!(
                    p.converted_type.as_str(),
                    "function_call_output" | "tool_call_output" | "text"
                ) && let Some(c) = answers
                    .iter_mut()
                    .rev()
                    .flat_map(|a| a.calls.iter_mut())
                    .find(|c| c.output.is_none())
                {
                    c.output = Some(text_of(p));
                }
            }
            _ => {}
        }
    }
    let error = last_answer
        .and_then(|p| {
            p.response_error
                .clone()
                .map(|e| format!("PyRIT recorded response_error {e}"))
        })
        .or_else(|| {
            last_answer
                .filter(|p| p.converted_type == "error")
                .map(text_of)
        })
        .or_else(|| {
            result
                .and_then(|r| r.get("error_message"))
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .or_else(|| {
            last_answer
                .is_none()
                .then(|| "PyRIT recorded no answer".to_owned())
        });
    let response = last_answer
        .filter(|p| p.converted_type != "error")
        .map(text_of);
    let mut rows: Vec<SourceScore> = Vec::new();
    for p in &pieces {
        if let Some(s) = scores.get(&p.id) {
            rows.extend(s.iter().cloned());
        }
    }
    let outcome = result
        .and_then(|r| r.get("outcome"))
        .and_then(Value::as_str);
    let verdict = match outcome {
        Some("success") => Some(true),
        Some("failure") => Some(false),
        _ => None,
    };
    if let Some(o) = outcome {
        rows.insert(
            0,
            SourceScore {
                scorer: "pyrit:attack_outcome".into(),
                value: Some(o.to_owned()),
                score: verdict.map(|v| if v { 1.0 } else { 0.0 }),
                verdict,
                explanation: result
                    .and_then(|r| r.get("outcome_reason"))
                    .and_then(Value::as_str)
                    .map(str::to_owned),
            },
        );
    }
    let usage = last_answer.map(|p| &p.metadata);
    let mut pred = PredictionRecord {
        case_id: cid,
        source_id: Some(conv.to_owned()),
        response_text: response,
        error,
        provider: "pyrit".into(),
        model_name: model_name(&identifier).unwrap_or_else(|| "unknown".into()),
        request_prompt: Some(text_of(first_user)),
        request_context: context,
        attack_pipeline: (!first_user.converters.is_empty()).then(|| {
            first_user
                .converters
                .iter()
                .map(|c| crate::ingest::slug(c.trim_end_matches("Converter")))
                .collect::<Vec<_>>()
                .join("+")
        }),
        prompt_tokens: usage
            .and_then(|m| m.get("token_usage_input_tokens"))
            .and_then(Value::as_u64),
        completion_tokens: usage
            .and_then(|m| m.get("token_usage_output_tokens"))
            .and_then(Value::as_u64),
        latency_ms: result
            .and_then(|r| r.get("execution_time_ms"))
            .and_then(Value::as_f64),
        completed_at: last_answer
            .and_then(|p| p.timestamp.clone())
            .unwrap_or_default(),
        source_detector: outcome.map(|_| "pyrit:attack_outcome".to_owned()),
        source_verdict: verdict,
        source_score: verdict.map(|v| if v { 1.0 } else { 0.0 }),
        source_extra: Some(json!({
            "attack_result": result,
            "pieces": pieces.iter().map(|p| json!({
                "id": p.id, "role": p.role, "sequence": p.sequence,
                "original_value": p.original, "converted_value_data_type": p.converted_type,
                "converters": p.converters, "prompt_metadata": p.metadata,
            })).collect::<Vec<_>>(),
        })),
        ..PredictionRecord::default()
    };
    if any_call {
        agent_attempt_with_turns(&mut pred, &prompt, answers);
    } else if turns.len() > 1 {
        pred.turns_used = Some(turns.len() as u32);
        pred.attack_strategy = attack.as_deref().map(crate::ingest::slug);
        pred.turns = turns;
    }
    sink.row(
        &at,
        Row {
            prediction: pred,
            scores: rows,
        },
    )
}

fn agent_attempt_with_turns(p: &mut PredictionRecord, prompt: &str, answers: Vec<Answer>) {
    let stop = if p.error.is_some() { "error" } else { "answer" };
    super::agent_attempt(p, prompt, answers, stop);
}
