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

// ---------------------------------------------------------------------------------------
// SQLite sources: read as SQLite sees them (WAL included, one moment), never written, and
// only as far as expected.

/// The fixture's promptfoo database in `dir`, with a connection open on it as promptfoo
/// holds one while it runs (WAL mode; no checkpoint, so what it commits stays in the
/// -wal file until it closes).
fn live_promptfoo(dir: &Path) -> (PathBuf, rusqlite::Connection) {
    let db = dir.join("promptfoo.db");
    std::fs::copy(fixture("promptfoo/promptfoo.db"), &db).unwrap();
    let c = rusqlite::Connection::open(&db).unwrap();
    let mode: String = c
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    c.execute_batch("PRAGMA wal_autocheckpoint = 0").unwrap();
    (db, c)
}

/// Commit three results of one new test (`test_idx` 100 + `batch`), in one transaction.
fn add_batch(c: &rusqlite::Connection, batch: u32) {
    c.execute_batch("BEGIN IMMEDIATE").unwrap();
    for p in 0..3 {
        c.execute(
            "INSERT INTO eval_results (id, created_at, updated_at, eval_id, prompt_idx, test_idx, \
             test_case, prompt, prompt_id, provider, latency_ms, cost, response, error, success, \
             score, grading_result, named_scores, metadata, failure_reason) \
             SELECT ?1, created_at, updated_at, eval_id, ?2, ?3, test_case, prompt, prompt_id, \
             provider, latency_ms, cost, response, error, success, score, grading_result, \
             named_scores, metadata, failure_reason FROM eval_results \
             WHERE test_idx = 0 AND prompt_idx = 0",
            rusqlite::params![format!("added-{batch}-{p}"), p, 100 + batch],
        )
        .unwrap();
    }
    c.execute_batch("COMMIT").unwrap();
}

/// Every file of `dir` with its digest (what must not change when a database is read).
fn digests(dir: &Path) -> BTreeMap<String, String> {
    use sha2::Digest;
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file() && !p.to_string_lossy().ends_with("-shm"))
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                hex::encode(sha2::Sha256::digest(std::fs::read(&p).unwrap())),
            )
        })
        .collect()
}

fn names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

fn import_json(tool: &str, path: &Path, out: &Path, env: &[(&str, &str)]) -> common::Output {
    let mut cmd = pieval();
    cmd.arg("import")
        .arg(tool)
        .arg(path)
        .arg("--output")
        .arg(out)
        .arg("--json");
    for (k, v) in env {
        cmd.env(k, v);
    }
    run(&mut cmd)
}

fn manifest(dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap()
}

#[test]
fn a_database_promptfoo_still_has_open_is_read_with_every_committed_row() {
    let src = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let (db, writer) = live_promptfoo(src.path());
    add_batch(&writer, 0);
    add_batch(&writer, 1);
    // The rows are committed and only in the -wal: the main file alone is older.
    let alone = rusqlite::Connection::open_with_flags(
        format!("file:{}?mode=ro&immutable=1", db.display()),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_URI,
    )
    .unwrap();
    let in_main: i64 = alone
        .query_row("SELECT count(*) FROM eval_results", [], |r| r.get(0))
        .unwrap();
    drop(alone);
    assert_eq!(in_main, 3, "the test's rows should be in the -wal only");
    let before = (names(src.path()), digests(src.path()));

    // Read in place, through SQLite's locks: every committed row.
    let first = out.path().join("live-1");
    let r = import_json("promptfoo", &db, &first, &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let report: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(report["predictions"], 3 + 6, "{report}");
    let source = &manifest(&first)["import"]["sources"][0];
    assert_eq!(source["sqlite"]["how"], "online backup", "{source}");
    assert_eq!(
        source["sqlite"]["files"].as_array().unwrap().len(),
        2,
        "{source}"
    );
    // Nothing written beside it: the same files, the database and its -wal unchanged.
    assert_eq!((names(src.path()), digests(src.path())), before);

    // The files copied without the -shm (a shared drive): recovered in a copy, not
    // read as the main file alone, and nothing made beside them.
    let copied = tempfile::tempdir().unwrap();
    for f in ["promptfoo.db", "promptfoo.db-wal"] {
        std::fs::copy(src.path().join(f), copied.path().join(f)).unwrap();
    }
    let before_copy = names(copied.path());
    let second = out.path().join("copied");
    let r = import_json(
        "promptfoo",
        &copied.path().join("promptfoo.db"),
        &second,
        &[],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let report: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(report["predictions"], 9, "{report}");
    assert_eq!(
        manifest(&second)["import"]["sources"][0]["sqlite"]["how"],
        "recovered copy"
    );
    assert_eq!(
        names(copied.path()),
        before_copy,
        "files were made beside a copied database"
    );
    // The same rows either way.
    let rows = |dir: &Path| -> Vec<(String, Value)> {
        let mut v: Vec<_> = read_jsonl(&dir.join("case_results.jsonl"))
            .into_iter()
            .map(|r| {
                (
                    r["case_id"].as_str().unwrap().to_owned(),
                    r["source_verdict"].clone(),
                )
            })
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    };
    assert_eq!(rows(&first), rows(&second));

    // The digest is of what was read: a new commit in the -wal changes it, though the
    // main file is the same bytes.
    let main_before = digests(src.path())["promptfoo.db"].clone();
    add_batch(&writer, 2);
    let third = out.path().join("live-2");
    let r = import_json("promptfoo", &db, &third, &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(digests(src.path())["promptfoo.db"], main_before);
    let (a, b) = (
        manifest(&first)["import"]["sources"][0]["sha256"].clone(),
        manifest(&third)["import"]["sources"][0]["sha256"].clone(),
    );
    assert_ne!(a, b, "the manifest's digest does not cover the -wal's rows");
    drop(writer);
}

#[test]
fn a_database_written_while_it_is_read_is_read_as_of_one_moment() {
    let src = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let (db, writer) = live_promptfoo(src.path());
    // SQLite's own checkpoints go on as promptfoo's do.
    writer
        .execute_batch("PRAGMA wal_autocheckpoint = 100")
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let committed = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let thread = {
        let (stop, committed) = (stop.clone(), committed.clone());
        std::thread::spawn(move || {
            let mut b = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                add_batch(&writer, b);
                b += 1;
                committed.store(b, std::sync::atomic::Ordering::Relaxed);
            }
        })
    };
    while committed.load(std::sync::atomic::Ordering::Relaxed) < 20 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let run = out.path().join("while-written");
    let r = import_json("promptfoo", &db, &run, &[]);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    thread.join().unwrap();
    assert_eq!(r.code, 0, "{}", r.stderr);
    // Every batch whole: three results of each test, none of a half-read transaction.
    let mut per_test: BTreeMap<u64, usize> = BTreeMap::new();
    for c in read_jsonl(&run.join("cases.jsonl")) {
        let t: u64 = c["provenance"]["source_ids"]["test_idx"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        *per_test.entry(t).or_default() += 1;
    }
    let batches: Vec<_> = per_test.iter().filter(|(t, _)| **t >= 100).collect();
    assert!(batches.len() >= 20, "{per_test:?}");
    for (t, n) in &batches {
        assert_eq!(
            **n, 3,
            "test {t}: {n} of its 3 results: a transaction read half"
        );
    }
    // And they are the first batches, with none missing between.
    let tests: Vec<u64> = batches.iter().map(|(t, _)| **t).collect();
    assert_eq!(tests, (100..100 + tests.len() as u64).collect::<Vec<_>>());
}

/// The fixture's promptfoo database in `dir`, changed by `sql` (and closed: its WAL
/// checkpointed into it).
fn hostile_promptfoo(dir: &Path, name: &str, sql: &str) -> PathBuf {
    let db = dir.join(format!("{name}.db"));
    std::fs::copy(fixture("promptfoo/promptfoo.db"), &db).unwrap();
    let c = rusqlite::Connection::open(&db).unwrap();
    c.execute_batch(sql).unwrap();
    drop(c);
    db
}

/// The columns of promptfoo's eval_results, for tables rebuilt around them.
const RESULT_COLUMNS: &str = "id, created_at, updated_at, eval_id, prompt_idx, test_idx, test_case, prompt, \
     prompt_id, provider, latency_ms, cost, response, error, success, score, grading_result, \
     named_scores, metadata, failure_reason";

#[test]
fn hostile_databases_are_read_only_as_far_as_expected() {
    let src = tempfile::tempdir().unwrap();
    let endless_view = format!(
        "ALTER TABLE eval_results RENAME TO kept; \
         CREATE VIEW eval_results AS WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n) \
         SELECT k.* FROM kept k, n;"
    );
    let cases: Vec<(&str, String, &[&str])> = vec![
        ("endless-view", endless_view, &["eval_results", "a view, not a table"]),
        (
            "evals-view",
            "ALTER TABLE evals RENAME TO e2; CREATE VIEW evals AS SELECT * FROM e2;".into(),
            &["evals", "a view, not a table"],
        ),
        (
            "computed-column",
            format!(
                "ALTER TABLE eval_results RENAME TO kept; \
                 CREATE TABLE eval_results (id, created_at, updated_at, eval_id, prompt_idx, test_idx, \
                 test_case, prompt, prompt_id, provider, latency_ms, cost, raw, error, success, score, \
                 grading_result, named_scores, metadata, failure_reason, \
                 response AS (printf('%.*c', 900000000, 'x')) VIRTUAL); \
                 INSERT INTO eval_results ({}) SELECT {} FROM kept;",
                RESULT_COLUMNS.replace("response", "raw"),
                RESULT_COLUMNS
            ),
            &["eval_results", "column response is computed"],
        ),
        (
            "virtual-table",
            format!(
                "ALTER TABLE eval_results RENAME TO kept; \
                 CREATE VIRTUAL TABLE eval_results USING fts5({RESULT_COLUMNS});"
            ),
            &["eval_results", "a virtual table"],
        ),
        (
            "missing-column",
            "DROP INDEX eval_result_grading_result_reason_idx; \
             DROP INDEX eval_result_grading_result_comment_idx; \
             ALTER TABLE eval_results DROP COLUMN grading_result;"
                .into(),
            &["eval_results", "no column grading_result"],
        ),
        (
            "huge-value",
            "UPDATE eval_results SET response = json_object('output', printf('%.*c', 2000000, 'x')) \
             WHERE test_idx = 1;"
                .into(),
            &["eval_results", "a value longer than the limit of 1 MiB"],
        ),
    ];
    for (name, sql, want) in &cases {
        let db = hostile_promptfoo(src.path(), name, sql);
        let parent = tempfile::tempdir().unwrap();
        let before = names(src.path());
        let r = run(pieval()
            .args(["import", "promptfoo"])
            .arg(&db)
            .arg("--output")
            .arg(parent.path().join("run"))
            .args(["--max-line-bytes", "1048576"]));
        assert_eq!(r.code, 2, "{name}: {}{}", r.stdout, r.stderr);
        assert!(
            r.stderr.contains(&db.display().to_string()),
            "{name}: the file is not named: {}",
            r.stderr
        );
        for w in *want {
            assert!(r.stderr.contains(w), "{name}: {w:?} not in: {}", r.stderr);
        }
        let left: Vec<_> = std::fs::read_dir(parent.path()).unwrap().collect();
        assert!(
            left.is_empty(),
            "{name}: an import that failed left {left:?}"
        );
        assert_eq!(
            names(src.path()),
            before,
            "{name}: files made beside the database"
        );
    }

    // Text stored as UTF-16 (the order of its rows is another than pieval's), and a
    // virtual table whose SQL was written by hand to hide it.
    for (name, sql, want) in [
        ("utf16", "", "stored as UTF-16"),
        (
            "virtual-commented",
            "ALTER TABLE eval_results RENAME TO kept; \
             CREATE VIRTUAL TABLE eval_results USING fts5(x);",
            "a virtual table",
        ),
    ] {
        let db = src.path().join(format!("{name}.db"));
        if name == "utf16" {
            // The fixture's two tables, row for row, in a database of UTF-16 text.
            let c = rusqlite::Connection::open(&db).unwrap();
            c.execute_batch("PRAGMA encoding = 'UTF-16le'").unwrap();
            let from = rusqlite::Connection::open(fixture("promptfoo/promptfoo.db")).unwrap();
            for table in ["evals", "eval_results"] {
                let sql: String = from
                    .query_row(
                        "SELECT sql FROM sqlite_schema WHERE name = ?1",
                        [table],
                        |r| r.get(0),
                    )
                    .unwrap();
                c.execute_batch(&sql).unwrap();
                let mut stmt = from.prepare(&format!("SELECT * FROM {table}")).unwrap();
                let n = stmt.column_count();
                let marks = vec!["?"; n].join(", ");
                let mut rows = stmt.query([]).unwrap();
                while let Some(row) = rows.next().unwrap() {
                    let values: Vec<rusqlite::types::Value> =
                        (0..n).map(|i| row.get(i).unwrap()).collect();
                    c.execute(
                        &format!("INSERT INTO {table} VALUES ({marks})"),
                        rusqlite::params_from_iter(values),
                    )
                    .unwrap();
                }
            }
        } else {
            let db2 = hostile_promptfoo(src.path(), name, sql);
            let c = rusqlite::Connection::open(&db2).unwrap();
            c.execute_batch("PRAGMA writable_schema = ON").unwrap();
            c.execute(
                "UPDATE sqlite_schema SET sql = replace(sql, 'CREATE VIRTUAL TABLE', 'CREATE /* a table */ VIRTUAL TABLE') WHERE name = 'eval_results'",
                [],
            )
            .unwrap();
        }
        let parent = tempfile::tempdir().unwrap();
        let r = import_json("promptfoo", &db, &parent.path().join("run"), &[]);
        assert_eq!(r.code, 2, "{name}: {}{}", r.stdout, r.stderr);
        assert!(
            r.stderr.contains(want),
            "{name}: {want:?} not in {}",
            r.stderr
        );
        assert!(std::fs::read_dir(parent.path()).unwrap().next().is_none());
    }

    // A trigger that would empty the database if anything wrote it: nothing does.
    let db = hostile_promptfoo(
        src.path(),
        "trigger",
        "CREATE TRIGGER wipe AFTER UPDATE ON evals BEGIN DELETE FROM eval_results; END; \
         CREATE TRIGGER wipe2 AFTER INSERT ON eval_results BEGIN DELETE FROM evals; END;",
    );
    let out = tempfile::tempdir().unwrap();
    let r = import_json("promptfoo", &db, &out.path().join("run"), &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        serde_json::from_str::<Value>(&r.stdout).unwrap()["predictions"],
        3
    );

    // Work past the bound (here a bound made tiny for the test): stopped, the table named.
    let db = src.path().join("bounded.db");
    std::fs::copy(fixture("promptfoo/promptfoo.db"), &db).unwrap();
    let parent = tempfile::tempdir().unwrap();
    let r = import_json(
        "promptfoo",
        &db,
        &parent.path().join("run"),
        &[("PIEVAL_TEST_SQLITE_STEPS", "100")],
    );
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains("stopped after") && r.stderr.contains(&db.display().to_string()),
        "{}",
        r.stderr
    );
    let left: Vec<_> = std::fs::read_dir(parent.path()).unwrap().collect();
    assert!(left.is_empty(), "an import that failed left {left:?}");
}

/// PyRIT's memory with a million scores of pieces it does not hold (a table of millions
/// of rows the importer reads): read in one pass, the same three conversations out.
fn pyrit_with_orphan_scores(dir: &Path, n: u64) -> PathBuf {
    let db = dir.join("memory.db");
    std::fs::copy(fixture("pyrit/memory.db"), &db).unwrap();
    let c = rusqlite::Connection::open(&db).unwrap();
    c.execute_batch("PRAGMA foreign_keys = OFF").unwrap();
    let cols: Vec<String> = c
        .prepare("SELECT name FROM pragma_table_info('ScoreEntries')")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let values: Vec<String> = cols
        .iter()
        .map(|c| match c.as_str() {
            "id" => "'orphan-' || i".to_owned(),
            "prompt_request_response_id" => "'no-such-piece-' || i".to_owned(),
            _ => c.clone(),
        })
        .collect();
    c.execute(
        &format!(
            "INSERT INTO ScoreEntries ({cols}) WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1) \
             SELECT {values} FROM n, (SELECT * FROM ScoreEntries LIMIT 1)",
            cols = cols.join(", "),
            values = values.join(", ")
        ),
        [n],
    )
    .unwrap();
    drop(c);
    db
}

#[test]
fn a_database_of_millions_of_rows_is_read_in_one_pass_and_a_killed_import_leaves_nothing() {
    let src = tempfile::tempdir().unwrap();
    let db = pyrit_with_orphan_scores(src.path(), 1_000_000);
    let parent = tempfile::tempdir().unwrap();
    let r = import_json("pyrit", &db, &parent.path().join("run"), &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let report: Value = serde_json::from_str(&r.stdout).unwrap();
    let plain = import_json(
        "pyrit",
        &fixture("pyrit/memory.db"),
        &parent.path().join("plain"),
        &[],
    );
    let plain: Value = serde_json::from_str(&plain.stdout).unwrap();
    assert_eq!(report["predictions"], 3, "{report}");
    assert_eq!(report["source_scores"], plain["source_scores"], "{report}");

    // Killed while it reads: what it left (the run folder and the snapshot, under
    // temporary names) is removed by the next import into the same folder, which can
    // tell that their process is gone.
    let mut child = pieval()
        .args(["import", "pyrit"])
        .arg(&db)
        .arg("--output")
        .arg(parent.path().join("killed"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let temporary = |dir: &Path| -> Vec<String> {
        names(dir)
            .into_iter()
            .filter(|n| n.starts_with(".killed"))
            .collect()
    };
    while temporary(parent.path()).len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the import made no snapshot in 60 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let left = temporary(parent.path());
    assert!(left.iter().any(|n| n.contains(".sources.tmp-")), "{left:?}");
    let r = import_json(
        "garak",
        &fixture("garak/repeat.report.jsonl"),
        &parent.path().join("next"),
        &[],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(temporary(parent.path()), Vec::<String>::new());
}

// ---------------------------------------------------------------------------------------
// Inspect archives: members within bounds before they are inflated.

/// Run `cmd` (pieval) to its end: its output and its peak resident memory (bytes), as the
/// process itself reads it as it ends (`PIEVAL_TEST_PEAK_MEMORY_FILE`, debug builds: the
/// kernel's accounting of a child also counts the test process it was forked from).
fn run_measured(cmd: &mut std::process::Command) -> (common::Output, u64) {
    let file = tempfile::NamedTempFile::new().unwrap();
    let r = run(cmd.env("PIEVAL_TEST_PEAK_MEMORY_FILE", file.path()));
    let peak: u64 = std::fs::read_to_string(file.path())
        .unwrap()
        .trim()
        .parse()
        .expect("pieval wrote its peak memory");
    (r, peak)
}

/// An `.eval` archive of `entries` (name, then the JSON text in pieces written in turn:
/// a piece repeated to make a long value is written without being held), compressed
/// with zstd as Inspect compresses them.
fn write_eval(path: &Path, entries: &[(&str, Vec<(Vec<u8>, usize)>)]) {
    use std::io::Write;
    let mut z = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
    let opts = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Zstd)
        .large_file(true);
    for (name, pieces) in entries {
        z.start_file(*name, opts).unwrap();
        for (bytes, times) in pieces {
            for _ in 0..*times {
                z.write_all(bytes).unwrap();
            }
        }
    }
    z.finish().unwrap();
}

/// The fixture's header and first sample, as JSON values.
fn inspect_parts() -> (Value, Value) {
    use std::io::Read;
    let mut z =
        zip::ZipArchive::new(std::fs::File::open(fixture("inspect/injection.eval")).unwrap())
            .unwrap();
    let mut read = |name: &str| -> Value {
        let mut s = String::new();
        z.by_name(name).unwrap().read_to_string(&mut s).unwrap();
        serde_json::from_str(&s).unwrap()
    };
    (read("header.json"), read("samples/forward-3_epoch_1.json"))
}

/// `sample` with the field at `key` (a top-level key) a text of `n` copies of `fill`,
/// as pieces for [`write_eval`].
fn with_long_field(sample: &Value, key: &str, prefix: &str, n: usize) -> Vec<(Vec<u8>, usize)> {
    let mut s = sample.clone();
    s.as_object_mut().unwrap().remove(key);
    let text = s.to_string();
    let head = format!("{},\"{key}\":{prefix}\"", &text[..text.len() - 1]);
    let close = if prefix.is_empty() {
        "\"}".to_owned()
    } else {
        "\"}]}".to_owned()
    };
    vec![
        (head.into_bytes(), 1),
        (vec![b'A'; 1 << 20], n),
        (close.into_bytes(), 1),
    ]
}

const MAX_RSS: u64 = 300 << 20;

#[test]
fn inspect_archive_members_are_bounded_before_they_are_inflated() {
    let dir = tempfile::tempdir().unwrap();
    let (header, sample) = inspect_parts();
    let header_bytes = header.to_string().into_bytes();
    let name = "samples/forward-3_epoch_1.json";
    let import = |file: &Path, env: &[(&str, &str)]| {
        let out = dir.path().join(format!("run-{}", fastrand::u64(..)));
        let mut cmd = pieval();
        cmd.args(["import", "inspect"])
            .arg(file)
            .arg("--output")
            .arg(&out)
            .arg("--json");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let (r, rss) = run_measured(&mut cmd);
        assert!(
            rss < MAX_RSS,
            "{}: {} MiB peak memory",
            file.display(),
            rss >> 20
        );
        (r, out)
    };

    // A sample whose message is 600 MiB (a 100 KB file): refused at what can be used,
    // while it streams.
    let big = dir.path().join("big-message.eval");
    write_eval(
        &big,
        &[
            ("header.json", vec![(header_bytes.clone(), 1)]),
            (
                name,
                with_long_field(&sample, "messages", "[{\"role\":\"user\",\"content\":", 600),
            ),
        ],
    );
    assert!(std::fs::metadata(&big).unwrap().len() < 1 << 20);
    let (r, out) = import(&big, &[]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains(name) && r.stderr.contains("more than 64 MiB"),
        "{}",
        r.stderr
    );
    assert!(!out.exists());

    // A 300 MiB event transcript: read past, never held; the sample is imported.
    let events = dir.path().join("big-events.eval");
    write_eval(
        &events,
        &[
            ("header.json", vec![(header_bytes.clone(), 1)]),
            (
                name,
                with_long_field(&sample, "events", "[{\"event\":\"log\",\"message\":", 300),
            ),
        ],
    );
    let (r, _) = import(&events, &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        serde_json::from_str::<Value>(&r.stdout).unwrap()["predictions"],
        1
    );
    // The same past the entry's bound (made small for the test): refused as it inflates.
    let (r, _) = import(&events, &[("PIEVAL_TEST_MAX_ENTRY_BYTES", "67108864")]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains(name)
            && r.stderr.contains("inflates to")
            && r.stderr.contains("more than 64 MiB"),
        "{}",
        r.stderr
    );

    // A header of 100 MiB: refused at the header's bound.
    let mut h = header.clone();
    h.as_object_mut().unwrap().remove("plan");
    let huge_header = dir.path().join("big-header.eval");
    write_eval(
        &huge_header,
        &[
            ("header.json", with_long_field(&h, "plan", "", 100)),
            (name, vec![(sample.to_string().into_bytes(), 1)]),
        ],
    );
    let (r, _) = import(&huge_header, &[]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("header.json") && r.stderr.contains("more than 16 MiB"),
        "{}",
        r.stderr
    );

    // Six samples of 40 MiB each (under the bound): imported one large sample at a time.
    let many = dir.path().join("many-large.eval");
    let mut entries: Vec<(String, Vec<(Vec<u8>, usize)>)> =
        vec![("header.json".into(), vec![(header_bytes.clone(), 1)])];
    for i in 0..6 {
        let mut s = sample.clone();
        s["id"] = json!(format!("large-{i}"));
        entries.push((
            format!("samples/large-{i}_epoch_1.json"),
            with_long_field(&s, "notes", "", 40),
        ));
    }
    let refs: Vec<(&str, Vec<(Vec<u8>, usize)>)> = entries
        .iter()
        .map(|(n, p)| (n.as_str(), p.clone()))
        .collect();
    write_eval(&many, &refs);
    let (r, out) = import(&many, &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        serde_json::from_str::<Value>(&r.stdout).unwrap()["predictions"],
        6
    );
    // A field too long for a row's line is left in the log, and the row says so.
    let rows: Vec<Value> = read_jsonl(&out.join("predictions.jsonl"))
        .into_iter()
        .filter(|p| p.get("pieval_record").is_none())
        .collect();
    assert_eq!(rows.len(), 6);
    for p in rows {
        assert_eq!(
            p["cut_fields"],
            json!(["source_extra.notes"]),
            "{}",
            p["case_id"]
        );
    }

    // A .json log with a 100 MiB sample: the same bound, streamed.
    let mut log: Value =
        serde_json::from_slice(&std::fs::read(fixture("inspect/injection.json")).unwrap()).unwrap();
    let first = log["samples"][0].clone();
    log["samples"] = json!([]);
    let text = log.to_string();
    let at = text.find("\"samples\":[]").unwrap() + "\"samples\":[".len();
    let mut body = text[..at].as_bytes().to_vec();
    for (bytes, times) in
        with_long_field(&first, "messages", "[{\"role\":\"user\",\"content\":", 100)
    {
        for _ in 0..times {
            body.extend_from_slice(&bytes);
        }
    }
    body.extend_from_slice(text[at..].as_bytes());
    let json_log = dir.path().join("big-sample.json");
    std::fs::write(&json_log, &body).unwrap();
    drop(body);
    let (r, _) = import(&json_log, &[]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("samples[0]") && r.stderr.contains("more than 64 MiB"),
        "{}",
        r.stderr
    );
}

#[test]
fn an_archive_naming_an_entry_twice_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let (header, sample) = inspect_parts();
    let mut other = sample.clone();
    other["output"]["completion"] = json!("a different answer under the same name");
    // Python's zipfile writes a name twice (with a warning); the zip crate will not.
    let script = r#"
import sys, warnings, zipfile
warnings.simplefilter("ignore")
out, header, a, b = sys.argv[1:5]
with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
    z.writestr("header.json", open(header).read())
    z.writestr("samples/forward-3_epoch_1.json", open(a).read())
    z.writestr("samples/forward-3_epoch_1.json", open(b).read())
    z.writestr("header.json", open(header).read())
"#;
    let (h, a, b) = (
        dir.path().join("h.json"),
        dir.path().join("a.json"),
        dir.path().join("b.json"),
    );
    std::fs::write(&h, header.to_string()).unwrap();
    std::fs::write(&a, sample.to_string()).unwrap();
    std::fs::write(&b, other.to_string()).unwrap();
    let eval = dir.path().join("twice.eval");
    let made = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .args([&eval, &h, &a, &b])
        .output()
        .expect("python3 (the test writes the archive with its zipfile)");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let parent = tempfile::tempdir().unwrap();
    let r = import_json("inspect", &eval, &parent.path().join("run"), &[]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    for want in [
        "same name twice",
        "\"samples/forward-3_epoch_1.json\"",
        "\"header.json\"",
    ] {
        assert!(r.stderr.contains(want), "{want:?} not in {}", r.stderr);
    }
    let left: Vec<_> = std::fs::read_dir(parent.path()).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn an_archive_member_larger_than_it_says_is_refused_as_it_inflates() {
    let dir = tempfile::tempdir().unwrap();
    let (header, mut sample) = inspect_parts();
    sample["events"] = json!([{"event": "log", "message": "A".repeat(8 << 20)}]);
    let (h, a) = (dir.path().join("h.json"), dir.path().join("a.json"));
    std::fs::write(&h, header.to_string()).unwrap();
    std::fs::write(&a, sample.to_string()).unwrap();
    // The sample's sizes in its local header and the central directory say 5,000 bytes.
    let script = r#"
import struct, sys, zipfile
out, header, sample = sys.argv[1:4]
name = b"samples/forward-3_epoch_1.json"
with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
    z.writestr("header.json", open(header).read())
    z.writestr(name.decode(), open(sample).read())
b = bytearray(open(out, "rb").read())
for sig, size_at, name_len_at, name_at in ((b"PK\x03\x04", 22, 26, 30), (b"PK\x01\x02", 24, 28, 46)):
    i = b.find(sig)
    while i >= 0:
        n = struct.unpack("<H", b[i + name_len_at:i + name_len_at + 2])[0]
        if b[i + name_at:i + name_at + n] == name:
            b[i + size_at:i + size_at + 4] = struct.pack("<I", 5000)
        i = b.find(sig, i + 4)
open(out, "wb").write(b)
"#;
    let eval = dir.path().join("lying.eval");
    let made = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .args([&eval, &h, &a])
        .output()
        .expect("python3 (the test writes the archive with its zipfile)");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let parent = tempfile::tempdir().unwrap();
    let r = import_json("inspect", &eval, &parent.path().join("run"), &[]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("samples/forward-3_epoch_1.json")
            && r.stderr.contains("larger than its declared"),
        "{}",
        r.stderr
    );
    let left: Vec<_> = std::fs::read_dir(parent.path()).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

/// Archives that would make the parser hold far more than they say: references to one
/// large attachment repeated, arrays of tiny values, nesting without end, many entries
/// that each stay under the entry's bound, fields given twice.
#[test]
fn inspect_samples_that_multiply_in_memory_are_refused_while_they_stream() {
    let dir = tempfile::tempdir().unwrap();
    let (header, sample) = inspect_parts();
    let header_bytes = header.to_string().into_bytes();
    let name = "samples/forward-3_epoch_1.json";
    let import = |file: &Path, env: &[(&str, &str)]| {
        let out = dir.path().join(format!("run-{}", fastrand::u64(..)));
        let mut cmd = pieval();
        cmd.args(["import", "inspect"])
            .arg(file)
            .arg("--output")
            .arg(&out);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let (r, rss) = run_measured(&mut cmd);
        assert!(
            rss < MAX_RSS,
            "{}: {} MiB peak memory",
            file.display(),
            rss >> 20
        );
        assert!(!out.exists());
        r
    };
    // 10,000 references to one attachment of 30 MiB: 300 GB of copies, asked for by a
    // few hundred kilobytes.
    let mut s = sample.clone();
    let parts: Vec<Value> = (0..10_000)
        .map(|_| json!({"type": "text", "text": "attachment://a"}))
        .collect();
    s["messages"] =
        json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": parts}]);
    s.as_object_mut().unwrap().remove("attachments");
    let text = s.to_string();
    let fan = dir.path().join("fan-out.eval");
    write_eval(
        &fan,
        &[
            ("header.json", vec![(header_bytes.clone(), 1)]),
            (
                name,
                vec![
                    (
                        format!("{},\"attachments\":{{\"a\":\"", &text[..text.len() - 1])
                            .into_bytes(),
                        1,
                    ),
                    (vec![b'A'; 1 << 20], 30),
                    (b"\"}}".to_vec(), 1),
                ],
            ),
        ],
    );
    let r = import(&fan, &[]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("attachment references resolve to more than 64 MiB"),
        "{}",
        r.stderr
    );

    // An array of forty million zeros (80 MB of JSON, gigabytes as values).
    let zeros = dir.path().join("zeros.eval");
    let mut s = sample.clone();
    s.as_object_mut().unwrap().remove("metadata");
    let text = s.to_string();
    write_eval(
        &zeros,
        &[
            ("header.json", vec![(header_bytes.clone(), 1)]),
            (
                name,
                vec![
                    (
                        format!("{},\"metadata\":{{\"z\":[0", &text[..text.len() - 1]).into_bytes(),
                        1,
                    ),
                    (b",0".repeat(1 << 19), 80),
                    (b"]}}".to_vec(), 1),
                ],
            ),
        ],
    );
    let r = import(&zeros, &[]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("more than 64 MiB"), "{}", r.stderr);

    // Nesting without end inside the transcript read past.
    let deep = dir.path().join("deep.eval");
    let mut s = sample.clone();
    s.as_object_mut().unwrap().remove("events");
    let text = s.to_string();
    write_eval(
        &deep,
        &[
            ("header.json", vec![(header_bytes.clone(), 1)]),
            (
                name,
                vec![
                    (
                        format!("{},\"events\":", &text[..text.len() - 1]).into_bytes(),
                        1,
                    ),
                    (vec![b'['; 1 << 20], 200),
                ],
            ),
        ],
    );
    let r = import(&deep, &[]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("nested more than 256 deep"),
        "{}",
        r.stderr
    );

    // Entries each under the entry's bound, over the archive's together (the archive's
    // bound made small for the test: at least 4 GiB otherwise).
    let many = dir.path().join("many.eval");
    let mut entries: Vec<(String, Vec<(Vec<u8>, usize)>)> =
        vec![("header.json".into(), vec![(header_bytes.clone(), 1)])];
    for i in 0..4 {
        let mut s = sample.clone();
        s["id"] = json!(format!("many-{i}"));
        entries.push((
            format!("samples/many-{i}_epoch_1.json"),
            with_long_field(&s, "events", "[{\"event\":\"log\",\"message\":", 40),
        ));
    }
    let refs: Vec<(&str, Vec<(Vec<u8>, usize)>)> = entries
        .iter()
        .map(|(n, p)| (n.as_str(), p.clone()))
        .collect();
    write_eval(&many, &refs);
    let r = import(&many, &[("PIEVAL_TEST_MAX_ARCHIVE_BYTES", "104857600")]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("the archive's entries inflate to more than 100 MiB together"),
        "{}",
        r.stderr
    );

    // A .json log naming a field twice.
    let mut log: Value =
        serde_json::from_slice(&std::fs::read(fixture("inspect/injection.json")).unwrap()).unwrap();
    let samples = log["samples"].take();
    log.as_object_mut().unwrap().remove("samples");
    let text = log.to_string();
    let twice = format!(
        "{},\"events\":[],\"events\":[],\"samples\":{samples}}}",
        &text[..text.len() - 1]
    );
    let path = dir.path().join("twice.json");
    std::fs::write(&path, twice).unwrap();
    let r = import(&path, &[]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("events: given twice"), "{}", r.stderr);
}

/// A writer that died mid-write: its journal (rollback mode) or its -wal and -shm (WAL
/// mode) left beside the database, nothing holding them. Read as SQLite would recover
/// them, in a copy: the journal rolled back, the WAL's committed rows kept — and nothing
/// beside the source written.
#[test]
fn files_a_dead_writer_left_are_recovered_in_a_copy() {
    let dir = tempfile::tempdir().unwrap();
    // A python process writes, then is killed (SQLite's files as a crash leaves them).
    let crash = |script: &str| {
        let mut child = std::process::Command::new("python3")
            .arg("-c")
            .arg(script)
            .current_dir(dir.path())
            .spawn()
            .expect("python3 (the test's writer)");
        let ready = dir.path().join("ready");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !ready.exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "the writer did not get ready"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        std::fs::remove_file(ready).unwrap();
    };
    // Rollback mode: a transaction that spilled pages and was never committed.
    std::fs::copy(fixture("pyrit/memory.db"), dir.path().join("memory.db")).unwrap();
    crash(
        "import sqlite3, time\n\
         c = sqlite3.connect('memory.db', isolation_level=None)\n\
         c.execute('PRAGMA journal_mode = PERSIST'); c.execute('PRAGMA cache_size = 1')\n\
         c.execute('BEGIN'); c.execute(\"UPDATE PromptMemoryEntries SET original_value = 'TORN'\")\n\
         [c.execute('CREATE TABLE junk%d (x)' % i) for i in range(50)]\n\
         open('ready', 'w').close(); time.sleep(60)",
    );
    let db = dir.path().join("memory.db");
    assert!(dir.path().join("memory.db-journal").exists());
    let before = digests(dir.path());
    let out = tempfile::tempdir().unwrap();
    let r = import_json("pyrit", &db, &out.path().join("run"), &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        digests(dir.path()),
        before,
        "the source's files were written"
    );
    assert_eq!(
        manifest(&out.path().join("run"))["import"]["sources"][0]["sqlite"]["how"],
        "recovered copy"
    );
    for c in read_jsonl(&out.path().join("run").join("cases.jsonl")) {
        assert_ne!(c["prompt"], "TORN", "an uncommitted write was read");
    }

    // WAL mode: rows committed to the -wal, the -shm left, no process holding it.
    let wal_dir = dir.path().join("wal");
    std::fs::create_dir(&wal_dir).unwrap();
    std::fs::copy(
        fixture("promptfoo/promptfoo.db"),
        wal_dir.join("promptfoo.db"),
    )
    .unwrap();
    crash(
        "import sqlite3, time\n\
         c = sqlite3.connect('wal/promptfoo.db', isolation_level=None)\n\
         c.execute('PRAGMA journal_mode = WAL'); c.execute('PRAGMA wal_autocheckpoint = 0')\n\
         c.execute('BEGIN')\n\
         c.execute(\"INSERT INTO eval_results SELECT 'crash-1', created_at, updated_at, eval_id, 0, 77, test_case, prompt, prompt_id, provider, latency_ms, cost, response, error, success, score, grading_result, named_scores, metadata, failure_reason FROM eval_results WHERE test_idx = 0 AND prompt_idx = 0\")\n\
         c.execute('COMMIT')\n\
         open('ready', 'w').close(); time.sleep(60)",
    );
    let db = wal_dir.join("promptfoo.db");
    assert!(wal_dir.join("promptfoo.db-shm").exists() && wal_dir.join("promptfoo.db-wal").exists());
    let before: BTreeMap<String, String> = {
        use sha2::Digest;
        names(&wal_dir)
            .into_iter()
            .map(|n| {
                let d = hex::encode(sha2::Sha256::digest(
                    std::fs::read(wal_dir.join(&n)).unwrap(),
                ));
                (n, d)
            })
            .collect()
    };
    let r = import_json("promptfoo", &db, &out.path().join("wal-run"), &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let report: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(
        report["predictions"], 4,
        "the -wal's committed row is read: {report}"
    );
    let after: BTreeMap<String, String> = {
        use sha2::Digest;
        names(&wal_dir)
            .into_iter()
            .map(|n| {
                let d = hex::encode(sha2::Sha256::digest(
                    std::fs::read(wal_dir.join(&n)).unwrap(),
                ));
                (n, d)
            })
            .collect()
    };
    assert_eq!(
        after, before,
        "the -wal or -shm beside the source was written"
    );
    assert_eq!(
        manifest(&out.path().join("wal-run"))["import"]["sources"][0]["sqlite"]["how"],
        "recovered copy"
    );
}

/// The zstd entries of a log Inspect wrote, read whole by pieval's own decompression
/// context: a sample whose CRC-32 (in both headers) is not its data's, or whose compressed
/// data is damaged, is an error naming the entry, and nothing is left behind; the archive
/// as Inspect wrote it imports.
#[test]
fn a_damaged_zstd_sample_of_an_inspect_log_is_an_error_at_its_entry() {
    let original = std::fs::read(fixture("inspect/injection.eval")).unwrap();
    let name = b"samples/forward-3_epoch_1.json";
    // (local header: CRC at 14, compressed size at 18, name length at 26, name at 30;
    // central directory: CRC at 16, name length at 28, name at 46)
    let find = |bytes: &[u8], sig: &[u8], name_len_at: usize, name_at: usize| -> usize {
        (0..bytes.len() - 4)
            .find(|&i| {
                bytes[i..i + 4] == *sig && {
                    let n = u16::from_le_bytes([bytes[i + name_len_at], bytes[i + name_len_at + 1]])
                        as usize;
                    bytes.get(i + name_at..i + name_at + n) == Some(&name[..])
                }
            })
            .expect("the sample's header")
    };
    let local = find(&original, b"PK\x03\x04", 26, 30);
    let central = find(&original, b"PK\x01\x02", 28, 46);
    assert_eq!(
        u16::from_le_bytes([original[local + 8], original[local + 9]]),
        93,
        "Inspect compresses its samples with zstd"
    );
    let mut wrong_crc = original.clone();
    for at in [local + 14, central + 16] {
        wrong_crc[at] ^= 0x01;
    }
    let mut damaged = original.clone();
    let extra = u16::from_le_bytes([original[local + 28], original[local + 29]]) as usize;
    let data = local + 30 + name.len() + extra;
    let packed = u32::from_le_bytes(original[local + 18..local + 22].try_into().unwrap()) as usize;
    for b in &mut damaged[data + packed / 2..data + packed / 2 + 8] {
        *b ^= 0x5a;
    }
    let dir = tempfile::tempdir().unwrap();
    for (label, bytes, ok) in [
        ("as written", &original, true),
        ("wrong crc", &wrong_crc, false),
        ("damaged", &damaged, false),
    ] {
        let eval = dir.path().join(format!("{}.eval", label.replace(' ', "-")));
        std::fs::write(&eval, bytes).unwrap();
        let parent = tempfile::tempdir().unwrap();
        let r = import_json("inspect", &eval, &parent.path().join("run"), &[]);
        if ok {
            assert_eq!(r.code, 0, "{label}: {}", r.stderr);
            continue;
        }
        assert_eq!(r.code, 2, "{label}: {}", r.stderr);
        assert!(
            r.stderr.contains("samples/forward-3_epoch_1.json"),
            "{label}: {}",
            r.stderr
        );
        let left: Vec<_> = std::fs::read_dir(parent.path()).unwrap().collect();
        assert!(left.is_empty(), "{label}: {left:?}");
    }
}
