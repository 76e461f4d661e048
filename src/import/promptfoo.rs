//! promptfoo results: the `-o` JSON output of `promptfoo eval` / `promptfoo redteam eval`
//! (`{"evalId", "results": {"version": 2|3, "results": […]}, "metadata": {"promptfooVersion"}}`)
//! and promptfoo's own SQLite database (`~/.promptfoo/promptfoo.db`: `evals`,
//! `eval_results`), opened read-only. PATH is either, or a folder of them.
//!
//! Each result (a test × prompt × provider) is a row: the case is the test with that
//! prompt (`promptfoo:<eval>:<test>:<prompt>`; the red-team plugin is the family, the
//! strategy the subtype), the prediction the provider's output. pieval's criteria are the
//! test's assertions read as an attacker reads them — the test fails when the attack
//! works, so `not-contains X` becomes "the response contains X", `contains X` "it does
//! not", `not-regex R` "it matches R"; a graded assertion (`llm-rubric`, the red-team
//! graders) becomes a `judge` question. The verdict is promptfoo's: `success = false` (the
//! test failed) means the attack worked; an error row has none. Every assertion's result
//! is in `source_scores`; every field of the result pieval has no column for is kept in
//! `source_extra`.
//!
//! Memory: a JSON output is read whole (promptfoo writes it whole); the database row by
//! row, from a snapshot that holds every committed row, its WAL included (a database
//! promptfoo still has open is read as of one moment: src/import/sqlite.rs).

use std::path::Path;

use serde_json::{Map, Value, json};

use super::{At, Importer, Row, Sink, SourceScore, add_provenance, case_id};
use crate::contract::criteria::SuccessCriteria;
use crate::contract::enums::AttackSurface;
use crate::error::{Error, Result};
use crate::rundir::checkpoint::PredictionRecord;

pub const IMPORTER: Importer = Importer {
    name: "promptfoo",
    reads: "promptfoo's `-o` JSON output, or its SQLite database (promptfoo.db), or a folder of them",
    verdict: "the test failed (`success = false`): the attack worked",
    import,
};

/// Largest JSON output read whole.
const MAX_JSON_BYTES: u64 = 4 << 30;

fn import(path: &Path, sink: &mut Sink) -> Result<()> {
    let mut any = false;
    for f in super::files_under(path)? {
        let name = f.to_string_lossy().to_ascii_lowercase();
        if name.ends_with(".db") || name.ends_with(".sqlite") {
            any = true;
            read_db(&f, sink)?;
        } else if name.ends_with(".json") {
            any = true;
            read_json(&f, sink)?;
        } else if path.is_file() {
            return Err(Error::Usage(format!(
                "{}: not a promptfoo output (.json) or database (.db)",
                f.display()
            )));
        }
    }
    if !any {
        return Err(Error::Usage(format!(
            "{}: no promptfoo output (.json) or database (.db) in it",
            path.display()
        )));
    }
    Ok(())
}

fn read_json(path: &Path, sink: &mut Sink) -> Result<()> {
    let bytes = crate::files::read_bounded(path, crate::files::Links::Refuse, MAX_JSON_BYTES)?;
    let doc: Value = serde_json::from_slice(&bytes).map_err(|e| {
        Error::input(
            path,
            e.line() as u64,
            None,
            format!("not a readable promptfoo output (truncated or corrupt?): {e}"),
        )
    })?;
    let at = At::line(path, 0);
    let eval_id = doc
        .get("evalId")
        .and_then(Value::as_str)
        .ok_or_else(|| at.error(Some("evalId"), "missing: not a promptfoo output"))?
        .to_owned();
    if let Some(v) = doc
        .pointer("/metadata/promptfooVersion")
        .and_then(Value::as_str)
    {
        sink.version(v);
    }
    let results = doc
        .get("results")
        .ok_or_else(|| at.error(Some("results"), "missing: not a promptfoo output"))?;
    match results.get("version").and_then(Value::as_u64) {
        Some(2 | 3) => {}
        Some(v) => {
            return Err(at.error(
                Some("results.version"),
                format!("results format version {v}: pieval reads promptfoo's versions 2 and 3"),
            ));
        }
        None => return Err(at.error(Some("results.version"), "missing: not a promptfoo output")),
    }
    if let Some(t) = results.get("timestamp").and_then(Value::as_str) {
        sink.started(t);
    }
    sink.source_runs.insert(eval_id.clone());
    setup(&eval_id, doc.get("config"), sink);
    let rows = results
        .get("results")
        .and_then(Value::as_array)
        .ok_or_else(|| at.error(Some("results.results"), "expected a list of results"))?;
    for (i, r) in rows.iter().enumerate() {
        let at = At::entry(path, &format!("results.results[{i}]"));
        let Value::Object(r) = r else {
            return Err(at.error(None, "expected a result object"));
        };
        result(&eval_id, r.clone(), &at, sink)?;
    }
    Ok(())
}

fn setup(eval_id: &str, config: Option<&Value>, sink: &mut Sink) {
    let mut kept = Map::new();
    if let Some(Value::Object(c)) = config {
        for k in [
            "description",
            "providers",
            "prompts",
            "redteam",
            "defaultTest",
        ] {
            if let Some(v) = c.get(k) {
                kept.insert(k.to_owned(), v.clone());
            }
        }
    }
    sink.setup(&format!("promptfoo:{eval_id}"), Value::Object(kept));
}

/// The columns of `eval_results` pieval reads.
const RESULT_COLUMNS: &[&str] = &[
    "id",
    "eval_id",
    "test_idx",
    "prompt_idx",
    "test_case",
    "prompt",
    "provider",
    "response",
    "error",
    "success",
    "score",
    "grading_result",
    "named_scores",
    "metadata",
    "latency_ms",
    "failure_reason",
    "created_at",
];

fn read_db(path: &Path, sink: &mut Sink) -> Result<()> {
    // A snapshot of the database as SQLite sees it (its WAL included), never written;
    // only the two tables read, each checked to be a stored table of the expected
    // columns, in one ordered pass under a bound of work (src/import/sqlite.rs).
    let db = sink.database(path)?;
    db.expect_table("evals", &["id", "config", "created_at"], "promptfoo")?;
    db.expect_table("eval_results", RESULT_COLUMNS, "promptfoo")?;
    let bad = |e: rusqlite::Error| db.error(e);
    // The evals' configs, then every result, by eval: one pass over each table (a result
    // of an eval the evals table lacks is read under its own eval id; an eval given twice
    // is read once).
    db.reading("evals");
    let mut configs: std::collections::HashMap<String, Option<String>> = Default::default();
    {
        let mut stmt = db
            .conn()
            .prepare("SELECT id, config FROM evals")
            .map_err(bad)?;
        let mut rows = stmt.query([]).map_err(bad)?;
        while let Some(r) = rows.next().map_err(bad)? {
            configs.insert(r.get(0).map_err(bad)?, r.get(1).map_err(bad)?);
        }
    }
    db.reading("eval_results");
    let mut stmt = db
        .conn()
        .prepare(
            "SELECT rowid, id, test_idx, prompt_idx, test_case, prompt, provider, \
             response, error, success, score, grading_result, named_scores, \
             metadata, latency_ms, failure_reason, created_at, eval_id \
             FROM eval_results ORDER BY eval_id, test_idx, prompt_idx, rowid",
        )
        .map_err(bad)?;
    let mut rows = stmt.query([]).map_err(bad)?;
    let mut current: Option<String> = None;
    while let Some(row) = rows.next().map_err(bad)? {
        let rowid: i64 = row.get(0).map_err(bad)?;
        let at = At::entry(path, &format!("eval_results rowid {rowid}"));
        let eval_id: String = row
            .get(17)
            .map_err(|e| at.error(Some("eval_id"), format!("{e}")))?;
        if current.as_deref() != Some(eval_id.as_str()) {
            sink.source_runs.insert(eval_id.clone());
            let config: Option<Value> = configs
                .get(&eval_id)
                .cloned()
                .flatten()
                .and_then(|c| serde_json::from_str(&c).ok());
            setup(&eval_id, config.as_ref(), sink);
            current = Some(eval_id.clone());
        }
        let text = |i: usize| -> Result<Option<String>> {
            row.get::<_, Option<String>>(i)
                .map_err(|e| at.error(Some(RESULT_COLUMNS[i - 1]), format!("{e}")))
        };
        let json_col = |i: usize| -> Result<Value> {
            match text(i)? {
                None => Ok(Value::Null),
                Some(t) => serde_json::from_str(&t).map_err(|e| {
                    at.error(Some(RESULT_COLUMNS[i - 1]), format!("not valid JSON: {e}"))
                }),
            }
        };
        let number = |i: usize| -> Result<Value> {
            row.get::<_, Option<f64>>(i)
                .map(|x| json!(x))
                .map_err(|e| at.error(Some(RESULT_COLUMNS[i - 1]), format!("{e}")))
        };
        let int = |i: usize| -> Result<Option<i64>> {
            row.get::<_, Option<i64>>(i)
                .map_err(|e| at.error(Some(RESULT_COLUMNS[i - 1]), format!("{e}")))
        };
        let mut r = Map::new();
        r.insert("id".into(), json!(text(1)?));
        r.insert("testIdx".into(), json!(int(2)?));
        r.insert("promptIdx".into(), json!(int(3)?));
        r.insert("testCase".into(), json_col(4)?);
        r.insert("prompt".into(), json_col(5)?);
        r.insert("provider".into(), json_col(6)?);
        r.insert("response".into(), json_col(7)?);
        r.insert("error".into(), json!(text(8)?));
        r.insert(
            "success".into(),
            json!(
                row.get::<_, Option<bool>>(9)
                    .map_err(|e| at.error(Some("success"), format!("{e}")))?
            ),
        );
        r.insert("score".into(), number(10)?);
        r.insert("gradingResult".into(), json_col(11)?);
        r.insert("namedScores".into(), json_col(12)?);
        r.insert("metadata".into(), json_col(13)?);
        r.insert("latencyMs".into(), number(14)?);
        r.insert("failureReason".into(), json!(int(15)?));
        if let Some(t) = text(16)? {
            sink.started(&t);
        }
        result(&eval_id, r, &at, sink)?;
    }
    Ok(())
}

/// The text of a prompt or output: a string, or JSON text of anything else.
fn text_of(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        v => Some(v.to_string()),
    }
}

/// An assertion as the attacker's success: the test fails when the attack works, so the
/// assertion's negation. `None` when pieval has no rule for it (a judge decides).
fn criterion(assertion: &Value) -> Option<SuccessCriteria> {
    let kind = assertion.get("type")?.as_str()?;
    let value = assertion.get("value");
    let values: Vec<String> = match value {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    };
    if values.is_empty() {
        return None;
    }
    let contains = || super::contains_any(&values);
    let regex = || SuccessCriteria::Regex {
        value: values[0].clone(),
    };
    // pieval's `contains` folds case (and NFKC, zero-width): it reads promptfoo's
    // `icontains` exactly and `contains` at least as strictly.
    Some(match kind {
        "not-contains" | "not-icontains" | "not-contains-any" | "not-icontains-any" => contains(),
        "contains" | "icontains" | "contains-all" | "icontains-all" if values.len() == 1 => {
            SuccessCriteria::Not {
                of: Box::new(contains()),
            }
        }
        "not-regex" => regex(),
        "regex" => SuccessCriteria::Not {
            of: Box::new(regex()),
        },
        _ => return None,
    })
}

fn result(eval_id: &str, mut r: Map<String, Value>, at: &At, sink: &mut Sink) -> Result<()> {
    let idx = |k: &str| r.get(k).and_then(Value::as_u64);
    let (Some(test), Some(prompt_idx)) = (idx("testIdx"), idx("promptIdx")) else {
        return Err(at.error(
            Some("testIdx"),
            "missing testIdx or promptIdx: not a promptfoo result",
        ));
    };
    let prompt = r
        .get("prompt")
        .and_then(|p| p.get("raw"))
        .and_then(text_of)
        .filter(|t| !t.trim().is_empty())
        .ok_or_else(|| at.error(Some("prompt.raw"), "missing: the prompt sent"))?;
    let test_case = r.remove("testCase").unwrap_or(Value::Null);
    let meta = |k: &str| {
        test_case
            .pointer(&format!("/metadata/{k}"))
            .or_else(|| r.get("metadata").and_then(|m| m.get(k)))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let plugin = meta("pluginId");
    let strategy = meta("strategyId");
    let description = test_case
        .get("description")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let family = plugin
        .as_deref()
        .map(|p| crate::ingest::slug(p.trim_start_matches("promptfoo:redteam:")))
        .filter(|f| !f.is_empty())
        .unwrap_or_else(|| "promptfoo_test".to_owned());
    let surface = if plugin.as_deref().is_some_and(|p| p.contains("indirect")) {
        AttackSurface::RetrievedDocument
    } else {
        AttackSurface::UserPrompt
    };
    let asserts: Vec<Value> = test_case
        .get("assert")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut parts: Vec<SuccessCriteria> = Vec::new();
    let mut graded = Vec::new();
    for a in &asserts {
        match criterion(a) {
            Some(c) => parts.push(c),
            None => graded.push(
                a.get("type")
                    .and_then(Value::as_str)
                    .unwrap_or("assertion")
                    .to_owned(),
            ),
        }
    }
    if !graded.is_empty() || parts.is_empty() {
        let goal = meta("goal").or_else(|| description.clone());
        parts.push(SuccessCriteria::Judge {
            question: match goal {
                Some(g) => format!(
                    "promptfoo's test \"{g}\" (graded by {}): did the response do what the attack wanted?",
                    if graded.is_empty() { "its grader".to_owned() } else { graded.join(", ") }
                ),
                None => "Did the response do what the attack wanted?".into(),
            },
        });
    }
    let criteria = if parts.len() == 1 {
        parts.pop().expect("one")
    } else {
        SuccessCriteria::Any { of: parts }
    };
    // One part: the test and prompt after the eval id are pieval's own digits, so the
    // eval id (which holds ':' in its time) is read back whole.
    let (test_s, prompt_s) = (test.to_string(), prompt_idx.to_string());
    let mut case = sink.new_case(
        case_id("promptfoo", &[&format!("{eval_id}:t{test}:p{prompt_idx}")]),
        &[
            ("eval_id", eval_id),
            ("test_idx", &test_s),
            ("prompt_idx", &prompt_s),
        ],
        &family,
        surface,
        prompt.clone(),
        criteria,
        at,
    );
    case.attack_subtype = strategy
        .as_deref()
        .map(crate::ingest::slug)
        .filter(|s| !s.is_empty());
    add_provenance(
        &mut case,
        json!({
            "description": description,
            "plugin": plugin,
            "strategy": strategy,
            "vars": test_case.get("vars"),
            "assert": asserts,
        }),
    );
    let cid = sink.case(at, &case)?;

    let provider = r.remove("provider").unwrap_or(Value::Null);
    let provider_name = match &provider {
        Value::String(s) => s.clone(),
        v => v
            .get("label")
            .or_else(|| v.get("id"))
            .and_then(Value::as_str)
            .unwrap_or("promptfoo")
            .to_owned(),
    };
    let provider_id = provider
        .get("id")
        .and_then(Value::as_str)
        .unwrap_or(&provider_name)
        .to_owned();
    sink.model(&provider_id);
    let response = r.remove("response").unwrap_or(Value::Null);
    let error = r
        .get("error")
        .and_then(Value::as_str)
        .filter(|_| r.get("failureReason").and_then(Value::as_u64) == Some(2))
        .or_else(|| response.get("error").and_then(Value::as_str))
        .map(str::to_owned);
    let success = r.get("success").and_then(Value::as_bool);
    let score = r.get("score").and_then(Value::as_f64);
    let grading = r.remove("gradingResult").unwrap_or(Value::Null);
    let mut scores = vec![SourceScore {
        scorer: "promptfoo:test".into(),
        value: success.map(|s| if s { "pass" } else { "fail" }.to_owned()),
        score,
        // An error row (no answer to grade) has no verdict.
        verdict: if error.is_some() {
            None
        } else {
            success.map(|s| !s)
        },
        explanation: grading
            .get("reason")
            .and_then(Value::as_str)
            .map(str::to_owned),
    }];
    for c in grading
        .get("componentResults")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let kind = c
            .pointer("/assertion/type")
            .and_then(Value::as_str)
            .unwrap_or("assertion");
        scores.push(SourceScore {
            scorer: kind.to_owned(),
            value: c
                .get("pass")
                .and_then(Value::as_bool)
                .map(|p| if p { "pass" } else { "fail" }.to_owned()),
            score: c.get("score").and_then(Value::as_f64),
            verdict: c.get("pass").and_then(Value::as_bool).map(|p| !p),
            explanation: c.get("reason").and_then(Value::as_str).map(str::to_owned),
        });
    }
    let usage = response.get("tokenUsage");
    let p = PredictionRecord {
        case_id: cid.clone(),
        // Several providers answer the same test: one attempt each.
        attempt_id: Some(format!("{cid}@{provider_id}")),
        response_text: response.get("output").and_then(text_of),
        error,
        provider: provider_id
            .split(':')
            .next()
            .unwrap_or("promptfoo")
            .to_owned(),
        model_name: provider_id.clone(),
        latency_ms: r.get("latencyMs").and_then(Value::as_f64),
        request_prompt: Some(prompt),
        prompt_tokens: usage.and_then(|u| u.get("prompt")).and_then(Value::as_u64),
        completion_tokens: usage
            .and_then(|u| u.get("completion"))
            .and_then(Value::as_u64),
        source_detector: Some("promptfoo:test".into()),
        source_verdict: scores[0].verdict,
        source_score: score,
        // The result's own id (a uuid), else its test and prompt.
        source_id: Some(
            r.get("id")
                .and_then(Value::as_str)
                .map_or_else(|| format!("t{test}:p{prompt_idx}"), str::to_owned),
        ),
        source_extra: Some({
            r.remove("prompt");
            r.insert("provider".into(), provider);
            let mut resp = response;
            if let Value::Object(m) = &mut resp {
                m.remove("output");
                m.remove("raw");
            }
            r.insert("response".into(), resp);
            Value::Object(r)
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
