//! `pieval sql`: the standard tables across runs, user tables, output formats, read-only,
//! and golden outputs of the shipped queries.

use crate::common;

use std::path::Path;

use common::{pieval, repo, run};
use serde_json::{Value, json};

/// A results folder with one scored run of 40 deterministic predictions.
fn scored_run(dir: &Path) -> std::path::PathBuf {
    let results = dir.join("results");
    let cases: Vec<Value> =
        std::fs::read_to_string(repo("data/normalized/attack_cases.enriched.jsonl"))
            .unwrap()
            .lines()
            .step_by(53)
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
    let preds: String = cases
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let target = c["expected_target"].as_str().unwrap_or("");
            let response = match i % 3 {
                0 => format!("Sure. {target}"),
                1 => "I'm sorry, but I can't help with that.".to_owned(),
                _ => "Here is a short summary.".to_owned(),
            };
            format!(
                "{}\n",
                json!({"case_id": c["case_id"], "response_text": response, "latency_ms": 100 + i})
            )
        })
        .collect();
    let p = dir.join("p.jsonl");
    std::fs::write(&p, preds).unwrap();
    let r = run(pieval()
        .args(["score", "--run-id", "golden", "--predictions"])
        .arg(&p)
        .arg("--output")
        .arg(results.join("golden")));
    assert_eq!(r.code, 0, "{}", r.stderr);
    results
}

#[test]
fn summary_sql_golden() {
    let dir = tempfile::tempdir().unwrap();
    let results = scored_run(dir.path());
    let r = run(pieval()
        .args([
            "sql",
            "--file",
            "queries/summary.sql",
            "--format",
            "csv",
            "--results",
        ])
        .arg(&results));
    assert_eq!(r.code, 0, "{}", r.stderr);
    insta::assert_snapshot!("summary_sql", r.stdout);
}

#[test]
fn corpus_stats_sql_golden() {
    let r = run(pieval().args([
        "sql",
        "--file",
        "queries/corpus_stats.sql",
        "--format",
        "csv",
    ]));
    assert_eq!(r.code, 0, "{}", r.stderr);
    insta::assert_snapshot!("corpus_stats_sql", r.stdout);
}

#[test]
fn tables_span_runs_and_user_files() {
    let dir = tempfile::tempdir().unwrap();
    let results = scored_run(dir.path());
    let r = run(pieval()
        .args(["sql", "--format", "json", "--results"])
        .arg(&results)
        .arg("SELECT r.run_id, count(*) AS n, max(s.total) AS total FROM case_results r JOIN summaries s USING (run_id) JOIN runs USING (run_id) GROUP BY r.run_id"));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v, json!([{"run_id": "golden", "n": 41, "total": 41}]));

    let csv = dir.path().join("t.csv");
    std::fs::write(&csv, "word,n\nPWNED,1\nsafe,2\n").unwrap();
    let r = run(pieval()
        .arg("sql")
        .arg("--table")
        .arg(format!("words={}", csv.display()))
        .arg(
            "SELECT word, pi_criteria_match(word, 'contains:pwned') AS hit FROM words ORDER BY n",
        ));
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.contains("| PWNED | true  |") && r.stdout.contains("| safe  | false |"),
        "{}",
        r.stdout
    );

    let out = dir.path().join("f.parquet");
    let r = run(pieval()
        .args(["sql", "--format", "parquet", "--results"])
        .arg(&results)
        .arg("--output")
        .arg(&out)
        .arg("SELECT * FROM findings"));
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(out.exists());
}

#[test]
fn read_only_and_clear_errors() {
    for statement in [
        "DROP TABLE attack_cases",
        "CREATE TABLE x AS SELECT 1",
        "INSERT INTO runs VALUES ('a')",
        "SET datafusion.execution.batch_size = 1",
    ] {
        let r = run(pieval().args(["sql", statement]));
        assert_eq!(r.code, 2, "{statement} was allowed");
        assert!(
            r.stderr.starts_with("error: the query cannot run:"),
            "{}",
            r.stderr
        );
    }
    let r = run(pieval().args(["sql", "SELEC 1"]));
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("SELEC"), "{}", r.stderr);
    let r = run(pieval().args(["sql", "SELECT nope FROM attack_cases"]));
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("nope"), "{}", r.stderr);
    let r = run(pieval().args(["sql", "--table", "bad-name=x.csv", "SELECT 1"]));
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("table name \"bad-name\""), "{}", r.stderr);
    let r = run(pieval().args(["sql", "--table", "t=missing.parquet", "SELECT 1"]));
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("missing.parquet: cannot open table file"),
        "{}",
        r.stderr
    );
    let r = run(pieval().args(["sql", "--format", "parquet", "SELECT 1"]));
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("--format parquet needs --output"),
        "{}",
        r.stderr
    );
    let r = run(pieval().args(["sql"]));
    assert_eq!(r.code, 2);
}
