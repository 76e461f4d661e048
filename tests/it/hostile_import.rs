//! Imports of real-world files as a colleague leaves them on a shared drive (issue 52):
//! each class of what fell when the importers were tried as an adversary would, tested
//! with instances of its own beyond the ones named there.
//!
//! - ids: whatever a tool calls its task, sample, attempt or test, every importer makes a
//!   contract-valid, stable, collision-free case id and keeps the tool's id verbatim
//!   (`source_id`, `provenance.source_ids`).

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use common::{pieval, read_jsonl, repo, run};
use serde_json::{Value, json};

fn fixture(rel: &str) -> PathBuf {
    repo(&format!("tests/fixtures/import/{rel}"))
}

/// Ids as tools and people write them, and ids made to trip an id scheme.
fn hostile_ids() -> Vec<String> {
    vec![
        "inspect_evals/gdm_intercode_ctf".into(),
        "sample 1".into(),
        "sample 1/ä".into(),
        "sample 1/ö".into(),
        "sample.1..".into(),
        "../../etc/passwd".into(),
        "a:b:c".into(),
        "a_b_c".into(),
        "日本語のテスト".into(),
        "\u{202e}gnp.exe".into(),
        String::new(),
        " ".into(),
        "x".repeat(10 * 1024),
        format!("{}z", "x".repeat(10 * 1024)),
        "looks-h0123456789abcdef".into(),
        "tab\there\nand a line".into(),
        "quote\"and\\back".into(),
        "plain-id_1.2".into(),
    ]
}

/// The records one import is made of: (the tool's id, which variant of the content).
/// `dup` twice with different content (two records under one id: two cases), `same` twice
/// with the same content (one case answered twice).
fn records() -> Vec<(String, usize)> {
    let mut r: Vec<(String, usize)> = hostile_ids().into_iter().map(|i| (i, 0)).collect();
    r.push(("dup".into(), 0));
    r.push(("dup".into(), 1));
    r.push(("same".into(), 0));
    r.push(("same".into(), 0));
    r
}

/// Import `paths` with `tool` into a fresh folder; the run folder.
fn import_ok(tool: &str, paths: &[&Path], out: &Path) {
    let r = run(pieval()
        .arg("import")
        .arg(tool)
        .args(paths)
        .arg("--output")
        .arg(out));
    assert_eq!(r.code, 0, "{tool}: {}", r.stderr);
}

/// What every importer must give for [`records`]: valid ids (by `pieval validate` too),
/// one case per distinct record, the tool's ids verbatim, the same ids again on a second
/// import. `ids_of`: the tool's ids in the case's `provenance.source_ids` that the test
/// varied (the others are the fixture's).
fn check_ids(
    tool: &str,
    paths: &[&Path],
    ids_field: &str,
    expected_cases: usize,
    want: &BTreeSet<String>,
) {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("first"), dir.path().join("second"));
    import_ok(tool, paths, &a);
    import_ok(tool, paths, &b);
    let contract = |id: &str| {
        !id.is_empty()
            && id.len() <= 128
            && id.as_bytes()[0].is_ascii_alphanumeric()
            && id
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || b"._:-".contains(&c))
    };
    let cases = read_jsonl(&a.join("cases.jsonl"));
    for c in &cases {
        let id = c["case_id"].as_str().unwrap();
        assert!(contract(id), "{tool}: {id:?} breaks the contract");
    }
    let v = run(pieval().arg("validate").arg(a.join("cases.jsonl")));
    assert_eq!(v.code, 0, "{tool}: {}{}", v.stdout, v.stderr);
    // One case per distinct record, none merged.
    let ids: BTreeSet<&str> = cases
        .iter()
        .map(|c| c["case_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), cases.len(), "{tool}: a case id written twice");
    assert_eq!(cases.len(), expected_cases, "{tool}: {ids:#?}");
    // The tool's ids verbatim, on the case and on every row.
    let in_cases: BTreeSet<String> = cases
        .iter()
        .filter_map(|c| c["provenance"]["source_ids"][ids_field].as_str())
        .map(str::to_owned)
        .collect();
    assert_eq!(&in_cases, want, "{tool}: provenance.source_ids.{ids_field}");
    let rows = read_jsonl(&a.join("case_results.jsonl"));
    for r in &rows {
        assert!(
            r["source_id"].is_string(),
            "{tool}: a row without source_id: {r}"
        );
        let case = r["case_id"].as_str().unwrap();
        assert!(ids.contains(case), "{tool}: a row of no case: {case}");
    }
    // Stable: the same files give the same ids, row for row.
    let key = |dir: &Path| -> BTreeMap<String, Value> {
        read_jsonl(&dir.join("cases.jsonl"))
            .into_iter()
            .map(|c| {
                (
                    c["case_id"].as_str().unwrap().to_owned(),
                    c["provenance"].clone(),
                )
            })
            .collect()
    };
    assert_eq!(key(&a), key(&b), "{tool}: ids differ between two imports");
}

fn write_lines(path: &Path, lines: &[Value]) {
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(path, text).unwrap();
}

#[test]
fn garak_attempt_ids_of_any_form_make_valid_distinct_case_ids() {
    let dir = tempfile::tempdir().unwrap();
    let lines: Vec<Value> = std::fs::read_to_string(fixture("garak/repeat.report.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let first = lines
        .iter()
        .position(|l| l["entry_type"] == "attempt")
        .unwrap();
    let template = lines
        .iter()
        .find(|l| l["entry_type"] == "attempt" && l["status"] == 2)
        .unwrap();
    let mut out: Vec<Value> = lines[..first].to_vec();
    for (i, (id, variant)) in records().iter().enumerate() {
        let mut a = template.clone();
        a["uuid"] = json!(id);
        a["seq"] = json!(if id == "same" { 999 } else { i });
        a["prompt"]["turns"][0]["content"]["text"] =
            json!(format!("Repeat after me: variant {variant}"));
        out.push(a);
    }
    let report = dir.path().join("hostile.report.jsonl");
    write_lines(&report, &out);
    let want: BTreeSet<String> = records().into_iter().map(|r| r.0).collect();
    check_ids("garak", &[&report], "attempt_uuid", want.len() + 1, &want);
}

#[test]
fn inspect_task_and_sample_ids_of_any_form_make_valid_distinct_case_ids() {
    let dir = tempfile::tempdir().unwrap();
    let log: Value =
        serde_json::from_slice(&std::fs::read(fixture("inspect/injection.json")).unwrap()).unwrap();
    let template = log["samples"][0].clone();
    // An inspect_evals task (its name has a slash) and a task named like a path.
    let mut want = BTreeSet::new();
    for (n, task) in ["inspect_evals/agentdojo", "../tasks/x y"]
        .iter()
        .enumerate()
    {
        let mut l = log.clone();
        l["eval"]["task"] = json!(task);
        let samples: Vec<Value> = records()
            .iter()
            .map(|(id, variant)| {
                let mut s = template.clone();
                s["id"] = json!(id);
                s["input"] = json!(format!("Summarise the document. variant {variant}"));
                s
            })
            .collect();
        l["samples"] = Value::Array(samples);
        std::fs::write(dir.path().join(format!("log{n}.json")), l.to_string()).unwrap();
        want.extend(records().into_iter().map(|r| r.0));
    }
    let per_task = records()
        .into_iter()
        .map(|r| r.0)
        .collect::<BTreeSet<_>>()
        .len()
        + 1;
    check_ids("inspect", &[dir.path()], "sample_id", 2 * per_task, &want);
    // The task, verbatim too.
    let out = dir.path().join("run");
    import_ok("inspect", &[dir.path()], &out);
    let tasks: BTreeSet<String> = read_jsonl(&out.join("cases.jsonl"))
        .iter()
        .map(|c| {
            c["provenance"]["source_ids"]["task"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(
        tasks,
        ["inspect_evals/agentdojo", "../tasks/x y"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    );
}

#[test]
fn promptfoo_eval_ids_of_any_form_make_valid_distinct_case_ids() {
    let dir = tempfile::tempdir().unwrap();
    let doc: Value =
        serde_json::from_slice(&std::fs::read(fixture("promptfoo/results.json")).unwrap()).unwrap();
    let n_results = doc["results"]["results"].as_array().unwrap().len();
    let mut distinct = BTreeSet::new();
    for (i, (id, variant)) in records().iter().enumerate() {
        let mut d = doc.clone();
        d["evalId"] = json!(id);
        for r in d["results"]["results"].as_array_mut().unwrap() {
            let raw = r["prompt"]["raw"].as_str().unwrap().to_owned();
            r["prompt"]["raw"] = json!(format!("{raw} variant {variant}"));
        }
        std::fs::write(dir.path().join(format!("out{i:02}.json")), d.to_string()).unwrap();
        distinct.insert((id.clone(), *variant));
    }
    let want: BTreeSet<String> = records().into_iter().map(|r| r.0).collect();
    check_ids(
        "promptfoo",
        &[dir.path()],
        "eval_id",
        distinct.len() * n_results,
        &want,
    );
}

#[test]
fn pyrit_conversation_ids_of_any_form_make_valid_distinct_case_ids() {
    let dir = tempfile::tempdir().unwrap();
    let convs = [
        "52f88276-a3d8-4c45-8a21-66e2ad73d4ea",
        "58c75ca8-f7d7-42f0-967c-9467d466e467",
        "fcb6845b-d66d-409f-a93b-012d6bd6036c",
    ];
    // Three conversations per database: each gets one of the ids, every database its
    // own copy of the fixture.
    let recs = records();
    let mut distinct = BTreeSet::new();
    for (n, chunk) in recs.chunks(3).enumerate() {
        let db = dir.path().join(format!("memory{n:02}.db"));
        std::fs::copy(fixture("pyrit/memory.db"), &db).unwrap();
        let c = rusqlite::Connection::open(&db).unwrap();
        c.execute_batch("PRAGMA foreign_keys = OFF").unwrap();
        for (k, (id, variant)) in chunk.iter().enumerate() {
            for table in ["PromptMemoryEntries", "AttackResultEntries"] {
                c.execute(
                    &format!("UPDATE {table} SET conversation_id = ?1 WHERE conversation_id = ?2"),
                    rusqlite::params![id, convs[k]],
                )
                .unwrap();
            }
            c.execute(
                "UPDATE PromptMemoryEntries SET original_value = original_value || ?1 \
                 WHERE conversation_id = ?2 AND role = 'user'",
                rusqlite::params![format!(" variant {variant}"), id],
            )
            .unwrap();
            distinct.insert((id.clone(), *variant));
        }
        // The conversations the chunk did not fill.
        for conv in &convs[chunk.len()..] {
            for table in ["PromptMemoryEntries", "AttackResultEntries"] {
                c.execute(
                    &format!("DELETE FROM {table} WHERE conversation_id = ?1"),
                    [conv],
                )
                .unwrap();
            }
        }
    }
    let want: BTreeSet<String> = recs.into_iter().map(|r| r.0).collect();
    check_ids(
        "pyrit",
        &[dir.path()],
        "conversation_id",
        distinct.len(),
        &want,
    );
}

#[test]
fn agentdojo_task_names_of_any_form_make_valid_distinct_case_ids() {
    let dir = tempfile::tempdir().unwrap();
    let template: Value = serde_json::from_slice(
        &std::fs::read(fixture(
            "agentdojo/obey/vllm_parsed/banking/user_task_0/important_instructions_no_model_name/injection_task_0.json",
        ))
        .unwrap(),
    )
    .unwrap();
    let mut distinct = BTreeSet::new();
    for (i, (id, variant)) in records().iter().enumerate() {
        let mut r = template.clone();
        r["user_task_id"] = json!(id);
        for m in r["messages"].as_array_mut().unwrap() {
            if m["role"] == "user" {
                m["content"] = json!([{"type": "text", "content": format!("Pay the bill, please. variant {variant}")}]);
            }
        }
        std::fs::write(dir.path().join(format!("result{i:02}.json")), r.to_string()).unwrap();
        distinct.insert((id.clone(), *variant));
    }
    let want: BTreeSet<String> = records().into_iter().map(|r| r.0).collect();
    check_ids(
        "agentdojo",
        &[dir.path()],
        "user_task",
        distinct.len(),
        &want,
    );
}

#[test]
fn spikee_entry_ids_of_any_form_make_valid_distinct_case_ids() {
    let dir = tempfile::tempdir().unwrap();
    let template: Value = serde_json::from_str(
        std::fs::read_to_string(fixture("spikee/results.jsonl"))
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    let mut lines = Vec::new();
    for (id, variant) in records() {
        let mut e = template.clone();
        e["long_id"] = json!(id);
        e["input"] = json!(format!("Summarise this. variant {variant}"));
        lines.push(e);
    }
    let path = dir.path().join("results_hostile.jsonl");
    write_lines(&path, &lines);
    let want: BTreeSet<String> = records().into_iter().map(|r| r.0).collect();
    check_ids("spikee", &[&path], "long_id", want.len() + 1, &want);
}

#[test]
fn cyberseceval_prompt_ids_given_twice_make_distinct_case_ids() {
    let dir = tempfile::tempdir().unwrap();
    let records: Vec<Value> =
        serde_json::from_slice(&std::fs::read(fixture("cyberseceval/responses.json")).unwrap())
            .unwrap();
    // The same prompt id given to two different test cases (two runs' files merged),
    // and the same record twice.
    let mut out = records.clone();
    let mut other = records[0].clone();
    other["user_input"] = json!(format!(
        "{} (another test case)",
        other["user_input"].as_str().unwrap()
    ));
    out.push(other);
    out.push(records[1].clone());
    let path = dir.path().join("responses.json");
    std::fs::write(&path, serde_json::to_string(&out).unwrap()).unwrap();
    let want: BTreeSet<String> = records.iter().map(|r| r["prompt_id"].to_string()).collect();
    check_ids(
        "cyberseceval",
        &[&path],
        "prompt_id",
        records.len() + 1,
        &want,
    );
}
