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

/// DataFusion inlines every reference to a CTE, so each extra reference to `trials` in
/// summary.sql reads case_results again, once per use of `counts`. The framework-tag
/// dimensions, first written as four more references, made the plan read case_results
/// 672 times, and the summary of 268,435 results took 16.5 s and 2.4 GB instead of 2.1 s
/// (docs/performance.md, "Scoring in one pass"); every dimension now comes from one
/// unnest of `trials`, and every metric from one unnest of `counts` (the eight metrics as
/// eight references to `counts` still read it 36 times): `trials` twice (single attempts,
/// attempts grouped), and `any_attempt` over `trials` twice more.
#[test]
fn summary_sql_reads_case_results_a_bounded_number_of_times() {
    let dir = tempfile::tempdir().unwrap();
    let results = scored_run(dir.path());
    let sql = std::fs::read_to_string(repo("queries/summary.sql")).unwrap();
    let explain = dir.path().join("explain.sql");
    std::fs::write(&explain, format!("EXPLAIN {sql}")).unwrap();
    let r = run(pieval()
        .args(["sql", "--format", "csv", "--file"])
        .arg(&explain)
        .arg("--results")
        .arg(&results));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let scans = r.stdout.matches("StreamingTableExec").count();
    assert!(
        scans > 0,
        "no scan of case_results in the plan: {}",
        r.stdout
    );
    assert!(
        scans <= 4,
        "summary.sql's plan reads case_results {scans} times"
    );
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
fn datafusion_settings_come_from_the_environment_and_a_bad_one_is_named() {
    let partitions = |value: &str| {
        let r = run(pieval()
            .env("DATAFUSION_EXECUTION_TARGET_PARTITIONS", value)
            .args([
                "sql",
                "--format",
                "csv",
                "SELECT value FROM information_schema.df_settings \
                 WHERE name = 'datafusion.execution.target_partitions'",
            ]));
        assert_eq!(r.code, 0, "{}", r.stderr);
        (r.stdout, r.stderr)
    };
    let (out, err) = partitions("3");
    assert_eq!(out.trim(), "value\n3");
    assert!(err.is_empty(), "{err}");
    // Not a number: nothing from the environment applies, and stderr says why (escaped).
    let (out, err) = partitions("three\u{1b}[2J");
    assert_ne!(out.trim(), "value\nthree");
    assert!(
        err.starts_with("warning: DATAFUSION_* settings ignored:"),
        "{err}"
    );
    assert!(!err.contains('\u{1b}'), "{err:?}");
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

/// Every file under `queries/` is registered in `engine::queries`, and every registered
/// query plans against empty tables of the schemas it reads (each statement of a control).
#[test]
fn every_query_file_is_registered_and_plans() {
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::datasource::MemTable;
    use pieval::contract::arrow::{case_results_schema, enriched_case_schema, findings_schema};
    use pieval::engine::queries;
    use std::sync::Arc;

    fn sql_files(dir: &Path, base: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sql_files(&path, base, out);
            } else if path.extension().is_some_and(|e| e == "sql") {
                out.push(
                    path.strip_prefix(base)
                        .unwrap()
                        .to_str()
                        .unwrap()
                        .to_owned(),
                );
            }
        }
    }
    let base = repo("queries");
    let mut files = Vec::new();
    sql_files(&base, &base, &mut files);
    files.sort();
    let mut registered: Vec<String> = queries::all().iter().map(|q| q.path.to_owned()).collect();
    registered.sort();
    assert_eq!(files, registered, "queries/ and engine::queries differ");
    for q in queries::all() {
        assert_eq!(q.sql, std::fs::read_to_string(base.join(q.path)).unwrap());
    }

    let rt = pieval::engine::runtime().unwrap();
    rt.block_on(async {
        let ctx = pieval::engine::session();
        let empty =
            |schema: Arc<Schema>| Arc::new(MemTable::try_new(schema, vec![vec![]]).unwrap());
        ctx.register_table("attack_cases", empty(enriched_case_schema()))
            .unwrap();
        ctx.register_table(
            "predictions",
            empty(pieval::corpus::predictions::predictions_table_schema()),
        )
        .unwrap();
        let params = Arc::new(Schema::new(vec![
            Field::new("run_id", DataType::Utf8, true),
            Field::new("mitigation", DataType::Utf8, true),
            Field::new("leakage_threshold", DataType::Float64, true),
            Field::new("judge_enabled", DataType::Boolean, true),
        ]));
        ctx.register_table("score_params", empty(params)).unwrap();
        pieval::ops::score::register_reviews(&ctx, &[]).unwrap();
        for name in ["case_results", "a", "b"] {
            ctx.register_table(name, empty(case_results_schema()))
                .unwrap();
        }
        ctx.register_table(
            "controls",
            empty(pieval::contract::arrow::controls_schema()),
        )
        .unwrap();
        ctx.register_table("findings", empty(findings_schema()))
            .unwrap();
        // queries/import/ read an imported run's source scores
        ctx.register_table(
            "source_scores",
            empty(pieval::contract::arrow::source_scores_schema()),
        )
        .unwrap();
        // findings.sql reads each batch of the scored stream
        ctx.register_table("scored", empty(pieval::scoring::scored_schema()))
            .unwrap();
        let ids = Arc::new(Schema::new(vec![
            Field::new("case_id", DataType::Utf8, true),
            Field::new("attempt_id", DataType::Utf8, true),
        ]));
        ctx.register_table("selected_cases", empty(ids)).unwrap();
        // summary.sql and metrics/totals.sql read case_results' partial aggregates.
        pieval::engine::register_summary_partial(&ctx)
            .await
            .unwrap();
        // queries/guardrail/ read a guardrail run's results, and the view guard_roc
        ctx.register_table("guard_results", empty(pieval::guard::results_schema()))
            .unwrap();
        pieval::engine::tables::register_guard_views(&ctx).unwrap();
        ctx.register_table("labels", empty(pieval::ops::calibrate::labels_schema()))
            .unwrap();
        // `judged` is what calibrate.sql makes of the labels.
        let judged = ctx.sql(queries::CALIBRATE.sql).await.unwrap().into_view();
        ctx.register_table("judged", judged).unwrap();

        // `pieval detectors eval` reads its own labelled table, in its own session.
        let detectors = pieval::engine::session();
        detectors
            .register_table("labels", empty(pieval::ops::detector_eval::labels_schema()))
            .unwrap();
        let params = Arc::new(Schema::new(vec![
            Field::new("detector", DataType::Utf8, false),
            Field::new("rule_id", DataType::Utf8, true),
            Field::new("threshold", DataType::Float64, true),
        ]));
        detectors
            .register_table("eval_params", empty(params))
            .unwrap();
        let evaluated = detectors
            .sql(queries::DETECTOR_EVALUATE.sql)
            .await
            .unwrap()
            .into_view();
        detectors.register_table("evaluated", evaluated).unwrap();

        for q in queries::all() {
            let ctx = if q.path.starts_with("detectors/") {
                &detectors
            } else {
                &ctx
            };
            let statements = datafusion::sql::parser::DFParser::parse_sql(q.sql)
                .unwrap_or_else(|e| panic!("{}: {e}", q.path));
            assert!(!statements.is_empty(), "{}: no statement", q.path);
            // A control's second statement reads its first as `evidence`.
            let _ = ctx.deregister_table("evidence");
            for statement in statements {
                let plan = ctx
                    .state()
                    .statement_to_plan(statement)
                    .await
                    .unwrap_or_else(|e| panic!("queries/{} does not plan: {e}", q.path));
                if q.path.starts_with("controls/") && !ctx.table_exist("evidence").unwrap() {
                    let view = datafusion::dataframe::DataFrame::new(ctx.state(), plan);
                    ctx.register_table("evidence", view.into_view()).unwrap();
                }
            }
        }
    });
}
