//! Reversec spikee results (`results/results_<target>_<dataset>_<ts>.jsonl`, one entry per
//! line). PATH is a results file or a folder of them.
//!
//! Each entry is a row: the case is the dataset entry (`spikee:<long_id>`; the jailbreak
//! type is the family, the instruction type the subtype; a document task's input is the
//! retrieved document it carries), the prediction the target's response. pieval's
//! criterion is spikee's judge where it is a rule — `canary` (the canary in the response),
//! `regex` — and a `judge` question naming spikee's judge otherwise. The verdict is
//! spikee's `success`; an entry with an `error` has none. An entry made by an attack module
//! (`attack_name`) is another attempt at the same case. Every field pieval has no column
//! for is kept in `source_extra`.

use std::path::Path;

use serde_json::{Map, Value, json};

use super::{At, Importer, Row, Sink, SourceScore, add_provenance, case_id};
use crate::contract::criteria::SuccessCriteria;
use crate::contract::enums::AttackSurface;
use crate::error::{Error, Result};
use crate::rundir::checkpoint::PredictionRecord;

pub const IMPORTER: Importer = Importer {
    name: "spikee",
    reads: "spikee results (`results_*.jsonl`), or a folder of them",
    verdict: "the entry's `success` (spikee's judge found the canary or pattern)",
    import,
};

fn import(path: &Path, sink: &mut Sink) -> Result<()> {
    let files: Vec<_> = super::files_under(path)?
        .into_iter()
        .filter(|f| path.is_file() || f.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    if files.is_empty() {
        return Err(Error::Usage(format!(
            "{}: no spikee results (*.jsonl) in it",
            path.display()
        )));
    }
    for f in files {
        let max = sink.options.max_line_bytes;
        crate::ingest::for_each_jsonl(&f, max, &mut |line, parsed| {
            let at = At::line(&f, line);
            let Value::Object(entry) = parsed.map_err(|m| at.error(None, m))? else {
                unreachable!("for_each_jsonl gives objects")
            };
            entry_row(entry, &at, sink)
        })?;
    }
    Ok(())
}

fn entry_row(mut e: Map<String, Value>, at: &At, sink: &mut Sink) -> Result<()> {
    let text =
        |e: &Map<String, Value>, k: &str| e.get(k).and_then(Value::as_str).map(str::to_owned);
    let long_id = text(&e, "long_id")
        .or_else(|| {
            e.get("id").filter(|v| !v.is_null()).map(|v| match v {
                Value::String(s) => s.clone(),
                v => v.to_string(),
            })
        })
        .ok_or_else(|| at.error(Some("long_id"), "missing: not a spikee result"))?;
    let input = text(&e, "input")
        .filter(|t| !t.trim().is_empty())
        .ok_or_else(|| at.error(Some("input"), "missing or not text: not a spikee result"))?;
    let success = match e.get("success") {
        Some(Value::Bool(b)) => Some(*b),
        None | Some(Value::Null) => None,
        Some(_) => return Err(at.error(Some("success"), "expected true or false")),
    };
    let judge = text(&e, "judge_name").unwrap_or_else(|| "canary".into());
    let args = e.get("judge_args").cloned().unwrap_or(Value::Null);
    let arg = match &args {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        _ => None,
    };
    let criteria = match (judge.as_str(), &arg) {
        ("canary", Some(c)) => SuccessCriteria::Contains { value: c.clone() },
        ("regex", Some(r)) => SuccessCriteria::Regex { value: r.clone() },
        _ => SuccessCriteria::Judge {
            question: format!(
                "spikee's judge {judge} ({}): did the response do what the injected instruction asked?",
                crate::text::excerpt(&args.to_string(), 200)
            ),
        },
    };
    let family = text(&e, "jailbreak_type")
        .or_else(|| text(&e, "instruction_type"))
        .map(|f| crate::ingest::slug(&f))
        .filter(|f| !f.is_empty())
        .unwrap_or_else(|| "spikee".into());
    let surface = match text(&e, "task_type").as_deref() {
        Some("document" | "summarization" | "qna") => AttackSurface::RetrievedDocument,
        _ => AttackSurface::UserPrompt,
    };
    let mut case = sink.new_case(
        case_id("spikee", &[&long_id]),
        &[("long_id", &long_id)],
        &family,
        surface,
        input.clone(),
        criteria,
        at,
    );
    case.attack_subtype = text(&e, "instruction_type")
        .map(|t| crate::ingest::slug(&t))
        .filter(|s| !s.is_empty());
    case.context = text(&e, "system_message").filter(|s| !s.trim().is_empty());
    case.expected_target = arg.clone().filter(|_| judge == "canary");
    case.language = text(&e, "lang").filter(|l| l.len() <= 16 && !l.is_empty());
    add_provenance(
        &mut case,
        json!({
            "document_id": e.get("document_id"),
            "position": e.get("position"),
            "judge_name": judge,
            "judge_args": args,
        }),
    );
    let context = case.context.clone();
    let cid = sink.case(at, &case)?;
    let attack = text(&e, "attack_name").filter(|a| a != "None" && !a.is_empty());
    let error = text(&e, "error").filter(|s| !s.trim().is_empty());
    let verdict = if error.is_some() { None } else { success };
    let scorer = format!("spikee:{judge}");
    let scores = vec![SourceScore {
        scorer: scorer.clone(),
        value: success.map(|s| s.to_string()),
        score: verdict.map(|v| if v { 1.0 } else { 0.0 }),
        verdict,
        explanation: None,
    }];
    let response = match e.remove("response") {
        Some(Value::String(s)) => Some(s),
        None | Some(Value::Null) => None,
        Some(v) => Some(v.to_string()),
    };
    let p = PredictionRecord {
        case_id: cid.clone(),
        attempt_id: attack.as_ref().map(|a| format!("{cid}@{a}")),
        attack_strategy: attack.as_deref().map(crate::ingest::slug),
        attack_pipeline: attack.as_ref().map(|_| "none".to_owned()),
        response_text: response,
        error,
        provider: "spikee".into(),
        model_name: text(&e, "target").unwrap_or_else(|| "spikee-target".into()),
        request_prompt: Some(input),
        request_context: context,
        latency_ms: e
            .get("response_time")
            .and_then(Value::as_f64)
            .map(|s| s * 1000.0),
        source_detector: Some(scorer),
        source_verdict: verdict,
        source_score: verdict.map(|v| if v { 1.0 } else { 0.0 }),
        source_id: Some(long_id),
        source_extra: Some({
            e.remove("input");
            Value::Object(e)
        }),
        ..PredictionRecord::default()
    };
    sink.row(
        at,
        Row {
            prediction: p,
            scores,
        },
    )
}
