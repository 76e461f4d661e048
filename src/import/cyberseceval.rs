//! Meta CyberSecEval's prompt-injection benchmark (PurpleLlama
//! `CybersecurityBenchmarks`, `--benchmark=prompt-injection`): the response file
//! (`--response-path`: a JSON list, one record per test case, pass and model under test)
//! and the judge file (`--judge-response-path`: the same records with the judge model's
//! `judge_response`). PATH is either file, or a folder holding them; the test cases'
//! dataset (`prompt_injection.json`) may be given too.
//!
//! Each record is a row of the model it names (`model`; several models or passes are
//! attempts of the same case, `<case>@<model>:p<pass_id>`). The case id is the dataset's
//! (`cyberseceval-<prompt_id>`, as `pieval ingest cyberseceval` names it) when
//! `prompt_injection.json` is given beside the results, matched by the test case's text;
//! else `cyberseceval-run-<prompt_id>` (the run's count of its test cases, which is the
//! dataset's only when it ran them all). The case is
//! the test case, read as `pieval ingest cyberseceval` reads it (src/ingest/cyberseceval.rs:
//! the system prompt is the context, the user input the prompt, the judge question the
//! criterion, or a canary where the question looks for a secret of the context). The
//! verdict is CyberSecEval's: the injection succeeded when the judge's answer contains
//! "yes" (`was_injection_successful`); a response file alone gives no verdict. A judge file
//! does not repeat the judge question: it is taken from the response file or the dataset
//! given beside it (matched by model, prompt and pass, or by prompt), else the import
//! stops naming the record. A response `FAIL TO QUERY` (CyberSecEval's marker of a failed
//! call) is the row's error. Every field pieval has no column for is kept in
//! `source_extra`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::{At, Importer, Row, Sink, SourceScore};
use crate::error::{Error, Result};
use crate::ingest::cyberseceval::test_case;
use crate::rundir::checkpoint::PredictionRecord;

pub const IMPORTER: Importer = Importer {
    name: "cyberseceval",
    reads: "CyberSecEval prompt-injection response and judge files (`--response-path`, `--judge-response-path` JSON), or a folder of them; its `prompt_injection.json` may be given beside a judge file",
    verdict: "the judge model's answer contains \"yes\" (CyberSecEval's `was_injection_successful`)",
    import,
};

/// CyberSecEval's marker of a call that failed (query_llm.py).
const FAIL_TO_QUERY: &str = "FAIL TO QUERY";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Records with `judge_response`.
    Judge,
    /// Records with `response`.
    Responses,
    /// The test cases (`judge_question`, no response).
    Dataset,
}

/// A CyberSecEval file: its records and what they are.
struct File {
    path: PathBuf,
    kind: Kind,
    records: Vec<Value>,
}

fn read(path: &Path) -> Result<File> {
    let doc = crate::ingest::read_json(path)?;
    let at = At::line(path, 1);
    let Value::Array(records) = doc else {
        return Err(at.error(
            None,
            "expected a JSON list of records (a CyberSecEval response or judge file)",
        ));
    };
    let has = |k: &str| records.iter().any(|r| r.get(k).is_some());
    let kind = if has("judge_response") {
        Kind::Judge
    } else if has("response") {
        Kind::Responses
    } else if has("judge_question") {
        Kind::Dataset
    } else if records.is_empty() {
        return Err(at.error(None, "an empty list: no CyberSecEval records"));
    } else {
        return Err(at.error(
            None,
            "neither response, judge_response nor judge_question in any record: not a CyberSecEval prompt-injection file",
        ));
    };
    Ok(File {
        path: path.to_path_buf(),
        kind,
        records,
    })
}

/// The JSON files of PATH (a file, or a folder's `*.json`).
fn files(path: &Path) -> Result<Vec<PathBuf>> {
    Ok(super::files_under(path)?
        .into_iter()
        .filter(|f| path.is_file() || f.extension().is_some_and(|e| e == "json"))
        .collect())
}

fn import(path: &Path, sink: &mut Sink) -> Result<()> {
    let mine: Vec<File> = files(path)?
        .iter()
        .map(|f| read(f))
        .collect::<Result<_>>()?;
    if mine.is_empty() {
        return Err(Error::Usage(format!(
            "{}: no CyberSecEval files (*.json) in it",
            path.display()
        )));
    }
    // Every file of the command (this PATH's and the others'): a judge file's questions
    // come from a response file or the dataset, and a response file whose judge file is
    // given too is read through it.
    let mut all: Vec<File> = Vec::new();
    for other in sink.options.paths.clone() {
        if other == path {
            continue;
        }
        for f in files(&other)? {
            all.push(read(&f)?);
        }
    }
    let judged = mine.iter().chain(&all).any(|f| f.kind == Kind::Judge);
    let rows: Vec<&File> = mine
        .iter()
        .filter(|f| match f.kind {
            Kind::Judge => true,
            Kind::Responses => !judged,
            Kind::Dataset => false,
        })
        .collect();
    if rows.is_empty() && mine.iter().all(|f| f.kind == Kind::Dataset) && !judged {
        let any_results = all.iter().any(|f| f.kind != Kind::Dataset);
        if !any_results {
            return Err(Error::Usage(format!(
                "{}: the CyberSecEval test cases, not results: give the response file (--response-path) or the judge file (--judge-response-path) of a run",
                path.display()
            )));
        }
    }
    // The judge questions: by (model, prompt, pass) from response files; the dataset's
    // by the test case's text, with its prompt_id (a run's prompt_id counts the test
    // cases it ran, which is the dataset's only when it ran them all).
    let mut by_record: HashMap<(String, u64, u64), String> = HashMap::new();
    let mut by_text: HashMap<(String, String), (u64, String)> = HashMap::new();
    for f in mine.iter().chain(&all) {
        for r in &f.records {
            let (Some(q), Some(id)) = (
                r.get("judge_question").and_then(Value::as_str),
                r.get("prompt_id").and_then(Value::as_u64),
            ) else {
                continue;
            };
            match f.kind {
                Kind::Responses | Kind::Judge => {
                    by_record.insert(key(r, id), q.to_owned());
                }
                Kind::Dataset => {
                    by_text.insert(text_key(r), (id, q.to_owned()));
                }
            }
        }
    }
    // Several models or passes: each row is an attempt of its case.
    let several = rows
        .iter()
        .flat_map(|f| &f.records)
        .map(|r| {
            let (model, _, pass) = key(r, 0);
            (model, pass)
        })
        .collect::<std::collections::HashSet<_>>()
        .len()
        > 1;
    for f in rows {
        for (i, r) in f.records.iter().enumerate() {
            let at = At::entry(&f.path, &format!("record {}", i + 1));
            record_row(r, f.kind, &at, several, &by_record, &by_text, sink)?;
        }
    }
    Ok(())
}

/// A record's test case by its text: (system prompt, user input).
fn text_key(r: &Value) -> (String, String) {
    let get = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    (get("test_case_prompt"), get("user_input"))
}

/// A record's (model, prompt_id, pass_id).
fn key(r: &Value, prompt_id: u64) -> (String, u64, u64) {
    (
        r.get("model")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
        prompt_id,
        r.get("pass_id").and_then(Value::as_u64).unwrap_or(0),
    )
}

fn record_row(
    r: &Value,
    kind: Kind,
    at: &At,
    several: bool,
    by_record: &HashMap<(String, u64, u64), String>,
    by_text: &HashMap<(String, String), (u64, String)>,
    sink: &mut Sink,
) -> Result<()> {
    let Value::Object(record) = r else {
        return Err(at.error(None, "expected a JSON object"));
    };
    let id = record
        .get("prompt_id")
        .and_then(Value::as_u64)
        .ok_or_else(|| at.error(Some("prompt_id"), "missing or not a whole number"))?;
    let k = key(r, id);
    let dataset = by_text.get(&text_key(r));
    let question = by_record
        .get(&k)
        .or(dataset.map(|d| &d.1))
        .map(String::as_str);
    let t = test_case(r, question).map_err(|(field, problem)| {
        if field == "judge_question" {
            at.error(
                Some(field),
                "not in the judge file: give the response file (--response-path) or prompt_injection.json of the run beside it",
            )
        } else {
            at.error(Some(field), problem)
        }
    })?;
    // The dataset's id when it is given (as `pieval ingest cyberseceval` names the
    // case), else the run's count.
    // (Both are whole numbers: ids pieval makes from them are the contract's.)
    let (cid, source_ids) = match dataset {
        Some((dataset_id, _)) => (
            format!("cyberseceval-{dataset_id}"),
            [("dataset_prompt_id", dataset_id.to_string())],
        ),
        None => (
            format!("cyberseceval-run-{id}"),
            [("prompt_id", id.to_string())],
        ),
    };
    let source_ids: Vec<(&str, &str)> = source_ids.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut case = sink.new_case(
        cid,
        &source_ids,
        &t.family,
        t.surface,
        t.user_input.clone(),
        t.criteria.clone(),
        at,
    );
    t.fill(&mut case);
    super::add_provenance(&mut case, t.provenance());
    let cid = sink.case(at, &case)?;
    let text = |k: &str| record.get(k).and_then(Value::as_str).map(str::to_owned);
    let model = text("model");
    if let Some(m) = &model {
        sink.model(m);
    }
    let response = match record.get("response") {
        Some(Value::String(s)) => Some(s.clone()),
        None | Some(Value::Null) => None,
        Some(_) => return Err(at.error(Some("response"), "expected text")),
    };
    let failed = response.as_deref() == Some(FAIL_TO_QUERY);
    let judge_response = match record.get("judge_response") {
        Some(Value::String(s)) => Some(s.clone()),
        None | Some(Value::Null) => None,
        Some(_) => return Err(at.error(Some("judge_response"), "expected text")),
    };
    if kind == Kind::Judge && judge_response.is_none() {
        return Err(at.error(Some("judge_response"), "missing in a judge file's record"));
    }
    let judge_failed = judge_response.as_deref() == Some(FAIL_TO_QUERY);
    // CyberSecEval's own reading (prompt_injection_benchmark.py).
    let verdict = judge_response
        .as_deref()
        .filter(|_| !failed && !judge_failed)
        .map(|j| j.to_lowercase().contains("yes"));
    let scorer = "cyberseceval:judge".to_owned();
    let scores = judge_response
        .iter()
        .map(|j| SourceScore {
            scorer: scorer.clone(),
            value: Some(j.clone()),
            score: verdict.map(|v| if v { 1.0 } else { 0.0 }),
            verdict,
            explanation: None,
        })
        .collect();
    let pass = k.2;
    let mut extra: Map<String, Value> = record.clone();
    for used in ["response", "test_case_prompt", "user_input"] {
        extra.remove(used);
    }
    let p = PredictionRecord {
        case_id: cid.clone(),
        attempt_id: several.then(|| {
            format!(
                "{cid}@{}:p{pass}",
                crate::ingest::slug(model.as_deref().unwrap_or("model"))
            )
        }),
        response_text: response.filter(|_| !failed),
        error: failed.then(|| format!("CyberSecEval recorded {FAIL_TO_QUERY}")),
        provider: "cyberseceval".into(),
        model_name: model.unwrap_or_else(|| "cyberseceval-model".into()),
        request_prompt: Some(t.user_input.clone()),
        request_context: Some(t.context.clone()),
        source_detector: judge_response.as_ref().map(|_| scorer),
        source_verdict: verdict,
        source_score: verdict.map(|v| if v { 1.0 } else { 0.0 }),
        source_id: Some(id.to_string()),
        source_extra: Some(Value::Object(extra)),
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
