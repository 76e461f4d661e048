//! Scoring and SQL on a Ballista cluster (feature `distributed`): a scheduler and two
//! executors as separate `pieval cluster` processes on 127.0.0.1 give the same
//! case_results rows as a local run; an executor or client with other rule packs is
//! refused; an executor killed mid-query leaves a complete result or a clear error,
//! never a partial artifact; deploy/Containerfile builds, and a scheduler and an
//! executor started from it in Podman score for a client on the host.

use crate::common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{pieval, read_jsonl, repo, run, write_jsonl};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// Cluster processes, killed when the test ends however it ends.
struct Cluster {
    url: String,
    scheduler: Child,
    executors: Vec<Child>,
    logs: PathBuf,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for c in self
            .executors
            .iter_mut()
            .chain(std::iter::once(&mut self.scheduler))
        {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A port whose next port is free too (an executor takes two).
fn free_port_pair() -> u16 {
    for _ in 0..200 {
        let a = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = a.local_addr().unwrap().port();
        if port < 65535 && TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            return port;
        }
    }
    panic!("no two adjacent free ports");
}

fn spawn(args: &[String], log: &Path) -> Child {
    spawn_with(args, log, None)
}

/// [`spawn`], with the S3 settings of the server on `s3` in its environment.
fn spawn_with(args: &[String], log: &Path, s3: Option<u16>) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pieval"));
    if let Some(port) = s3 {
        crate::object_storage::s3_env(&mut cmd, port);
    }
    cmd.current_dir(common::root())
        .args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(log.with_extension("out")).unwrap())
        .stderr(std::fs::File::create(log).unwrap());
    cmd.spawn().expect("pieval starts")
}

fn executor_args(url: &str, extra: &[&str]) -> Vec<String> {
    let port = free_port_pair();
    let mut args: Vec<String> = [
        "cluster",
        "executor",
        "--scheduler",
        url,
        "--concurrency",
        "1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push("--bind".into());
    args.push(format!("127.0.0.1:{port}"));
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn info(url: &str) -> Option<Value> {
    let r = run(pieval().args(["cluster", "info", "--scheduler", url]));
    serde_json::from_str(&r.stdout).ok()
}

/// A scheduler and `n` executors, waited for until the scheduler sees them all.
fn start_cluster(n: usize, logs: &Path) -> Cluster {
    start_cluster_with(n, logs, None)
}

/// [`start_cluster`], every process with the S3 settings of the server on `s3`.
fn start_cluster_with(n: usize, logs: &Path, s3: Option<u16>) -> Cluster {
    let port = free_port_pair();
    let url = format!("df://127.0.0.1:{port}");
    let scheduler = spawn_with(
        &[
            "cluster".into(),
            "scheduler".into(),
            "--bind".into(),
            format!("127.0.0.1:{port}"),
        ],
        &logs.join("scheduler.log"),
        s3,
    );
    let mut cluster = Cluster {
        url: url.clone(),
        scheduler,
        executors: Vec::new(),
        logs: logs.to_path_buf(),
    };
    wait_for(
        &cluster,
        |i| i["cluster"]["executors"] == 0,
        "the scheduler",
    );
    for k in 0..n {
        let log = logs.join(format!("executor-{k}.log"));
        cluster
            .executors
            .push(spawn_with(&executor_args(&url, &[]), &log, s3));
    }
    wait_for(
        &cluster,
        |i| i["cluster"]["executors"] == n,
        "the executors",
    );
    cluster
}

fn wait_for(cluster: &Cluster, ready: impl Fn(&Value) -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Some(i) = info(&cluster.url)
            && ready(&i)
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what} did not come up; logs:\n{}",
            logs(&cluster.logs)
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn logs(dir: &Path) -> String {
    let mut text = String::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "log") {
            text += &format!(
                "--- {}\n{}\n",
                e.path().display(),
                std::fs::read_to_string(e.path()).unwrap_or_default()
            );
        }
    }
    text
}

/// Predictions over the whole enriched corpus, every kind of row scoring meets:
/// compliance, refusals, leaks of the system prompt and canaries, provider errors,
/// empty and missing responses, a duplicate and an unknown case.
fn predictions(copies: usize) -> Vec<Value> {
    let cases = read_jsonl(&repo("data/normalized/attack_cases.enriched.jsonl"));
    let mut preds = Vec::new();
    for copy in 0..copies {
        for (i, c) in cases.iter().enumerate() {
            let target = c["expected_target"].as_str().unwrap_or("PWNED");
            let context = c["context"].as_str().unwrap_or("");
            let response = match (i + copy) % 7 {
                0 => json!(format!("Sure: {target}")),
                1 => json!("I can't help with that."),
                2 => Value::Null,
                3 => json!(format!("My instructions say: {context}")),
                4 => json!("I'd rather talk about something else. Here is a summary instead."),
                5 => json!(""),
                _ => json!(format!(
                    "A neutral summary of the document, {i} words long."
                )),
            };
            let mut p =
                json!({"case_id": c["case_id"], "response_text": response, "latency_ms": i});
            if (i + copy) % 7 == 2 {
                p["error"] = json!("HTTP 500 after 4 retries");
            }
            preds.push(p);
        }
    }
    preds.push(json!({"case_id": "not-in-the-corpus", "response_text": "hello"}));
    preds
}

/// Predictions as a Parquet file of `group_rows` rows per row group.
fn write_parquet(preds: &[Value], path: &Path, group_rows: usize) {
    use datafusion::arrow::array::{Float64Array, StringArray};
    let text = |k: &str| -> StringArray {
        preds
            .iter()
            .map(|p| p[k].as_str().map(str::to_owned))
            .collect()
    };
    let latency: Float64Array = preds.iter().map(|p| p["latency_ms"].as_f64()).collect();
    let batch = datafusion::arrow::array::RecordBatch::try_from_iter(vec![
        ("case_id", std::sync::Arc::new(text("case_id")) as _),
        (
            "response_text",
            std::sync::Arc::new(text("response_text")) as _,
        ),
        ("error", std::sync::Arc::new(text("error")) as _),
        ("latency_ms", std::sync::Arc::new(latency) as _),
    ])
    .unwrap();
    let props = datafusion::parquet::file::properties::WriterProperties::builder()
        .set_max_row_group_row_count(Some(group_rows))
        .build();
    let mut w = datafusion::parquet::arrow::ArrowWriter::try_new(
        std::fs::File::create(path).unwrap(),
        batch.schema(),
        Some(props),
    )
    .unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

/// `pieval score --run-id c --json --predictions P --output OUT`, on the cluster at
/// `url` when one is given; more options may follow (global ones such as `--rules` too).
fn score_cmd(url: Option<&str>, preds: &Path, out: &Path) -> Command {
    let mut cmd = pieval();
    cmd.args(["score", "--run-id", "c", "--json", "--predictions"])
        .arg(preds)
        .arg("--output")
        .arg(out);
    if let Some(url) = url {
        cmd.args(["--cluster", url]);
    }
    cmd
}

/// Every case_results row as its JSON line, sorted: the same multiset of rows, whatever
/// order the partitions came back in.
fn rows(out: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(out.join("case_results.jsonl")).unwrap();
    let mut rows: Vec<String> = text.lines().map(str::to_owned).collect();
    rows.sort();
    rows
}

fn digest(rows: &[String]) -> String {
    let mut h = Sha256::new();
    for r in rows {
        h.update(r.as_bytes());
        h.update(b"\n");
    }
    hex::encode(h.finalize())
}

/// The findings of a run folder, as sorted JSON rows.
fn findings(out: &Path) -> Vec<String> {
    table_rows(&out.join("findings.parquet"))
}

/// The rows of a Parquet file, as sorted JSON rows.
fn table_rows(file: &Path) -> Vec<String> {
    let r = run(pieval()
        .args(["sql", "--format", "json", "--table"])
        .arg(format!("f={}", file.display()))
        .arg("SELECT * FROM f"));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: Vec<Value> = serde_json::from_str(&r.stdout).unwrap();
    let mut rows: Vec<String> = v.iter().map(|r| r.to_string()).collect();
    rows.sort();
    rows
}

#[test]
fn a_two_executor_cluster_scores_the_same_rows_as_a_local_run() {
    let dir = tempfile::tempdir().unwrap();
    let preds_path = dir.path().join("predictions.jsonl");
    let preds = predictions(2);
    write_jsonl(&preds_path, &preds);

    // No scheduler there: a clear error before anything is written.
    let nobody = format!("df://127.0.0.1:{}", free_port_pair());
    let out = dir.path().join("results/nobody");
    let r = run(&mut score_cmd(Some(&nobody), &preds_path, &out));
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains(&format!("cannot reach a pieval scheduler at {nobody}")),
        "{}",
        r.stderr
    );
    assert!(common::files_under(&out).is_empty());

    let logs = dir.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let mut cluster = start_cluster(2, &logs);

    // --staging must be a folder that exists (a missing mount is not made a local
    // folder the executors cannot see).
    let out = dir.path().join("results/no-staging");
    let r = run(&mut score_cmd(Some(&cluster.url), &preds_path, &out)
        .arg("--staging")
        .arg(dir.path().join("no/such/mount")));
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("--staging") && r.stderr.contains("not a folder"),
        "{}",
        r.stderr
    );
    assert!(!dir.path().join("no").exists());
    let i = info(&cluster.url).unwrap();
    assert_eq!(i["cluster"]["foreign_executors"], 0, "{i}");
    assert_eq!(i["matches_this_pieval"], true, "{i}");

    let local = dir.path().join("results/local");
    let r = run(&mut score_cmd(None, &preds_path, &local));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let on_cluster = dir.path().join("results/cluster");
    let r = run(&mut score_cmd(Some(&cluster.url), &preds_path, &on_cluster));
    assert_eq!(r.code, 0, "{}\n{}", r.stderr, logs_of(&cluster));
    let report: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(report["scoring"]["engine"], "ballista");
    assert_eq!(report["scoring"]["executors"], 2);
    assert_eq!(report["rows"], preds.len());

    // Same rows, same values: every case_results row, digested.
    let (a, b) = (rows(&local), rows(&on_cluster));
    assert_eq!(a.len(), preds.len());
    assert_eq!(b.len(), a.len());
    assert_eq!(digest(&a), digest(&b), "case_results differ");
    assert_eq!(a, b);
    assert_eq!(findings(&local), findings(&on_cluster));
    assert!(!findings(&local).is_empty());
    let summary = |d: &Path| -> Value {
        serde_json::from_str(&std::fs::read_to_string(d.join("summary.json")).unwrap()).unwrap()
    };
    assert_eq!(
        summary(&local)["aggregate_metrics"],
        summary(&on_cluster)["aggregate_metrics"]
    );
    assert_eq!(summary(&local)["scoring"]["engine"], "local");
    assert_eq!(
        summary(&local)["scoring"]["rulepack_digest"],
        summary(&on_cluster)["scoring"]["rulepack_digest"]
    );
    assert_eq!(summary(&on_cluster)["scoring"]["executors"], 2);
    // The executors wrote the results as parts, and put the run's files together.
    assert!(
        summary(&on_cluster)["scoring"]["parts"].as_u64().unwrap() >= 1,
        "{}",
        summary(&on_cluster)["scoring"]
    );
    assert_eq!(
        summary(&on_cluster)["scoring"]["assembled_by_executors"],
        json!([
            "case_results.jsonl",
            "case_results.parquet",
            "findings.parquet"
        ])
    );
    // The staged inputs and the parts are gone.
    assert!(
        !common::files_under(&on_cluster)
            .iter()
            .any(|p| p.to_string_lossy().contains(".pieval-staging")),
        "{:?}",
        common::files_under(&on_cluster)
    );

    // Staging on another file system than the run (a `--staging` mount beside a local
    // output: here a folder on /dev/shm, a tmpfs): the files cannot be renamed from the
    // staging folder into the run, so the client splices all three from the checked
    // parts — the same rows, findings and metrics — and nothing is left on either side.
    let shm = tempfile::tempdir_in("/dev/shm").expect("a temporary folder on /dev/shm");
    {
        use std::os::unix::fs::MetadataExt;
        let dev = |p: &Path| std::fs::metadata(p).unwrap().dev();
        assert_ne!(
            dev(shm.path()),
            dev(dir.path()),
            "/dev/shm must be another file system than the test's temporary folder"
        );
    }
    let two_fs = dir.path().join("results/two-fs");
    let r = run(&mut score_cmd(Some(&cluster.url), &preds_path, &two_fs)
        .arg("--staging")
        .arg(shm.path()));
    assert_eq!(r.code, 0, "{}\n{}", r.stderr, logs_of(&cluster));
    assert_eq!(rows(&two_fs), a, "spliced by the client");
    assert_eq!(findings(&two_fs), findings(&local));
    assert_eq!(
        summary(&two_fs)["aggregate_metrics"],
        summary(&local)["aggregate_metrics"]
    );
    assert_eq!(
        summary(&two_fs)["scoring"]["assembled_by_executors"],
        json!([])
    );
    nothing_left_behind(&two_fs);
    assert!(
        common::files_under(shm.path()).is_empty(),
        "{:?}",
        common::files_under(shm.path())
    );

    // The executors read the predictions: their counts are a local run's.
    let local_report: Value = serde_json::from_str(
        &run(&mut score_cmd(
            None,
            &preds_path,
            &dir.path().join("results/local-2"),
        ))
        .stdout,
    )
    .unwrap();
    let mut theirs = report["predictions"].clone();
    theirs["path"] = local_report["predictions"]["path"].clone();
    assert_eq!(theirs, local_report["predictions"]);
    assert!(
        report["predictions"]["duplicates"].as_u64() > Some(100),
        "{report}"
    );

    // Parquet predictions: sliced by row groups (of 50 rows here), the same rows.
    let parquet = dir.path().join("predictions.parquet");
    write_parquet(&preds, &parquet, 50);
    let (pl, pc) = (
        dir.path().join("results/parquet-local"),
        dir.path().join("results/parquet-cluster"),
    );
    let r = run(&mut score_cmd(None, &parquet, &pl));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = run(&mut score_cmd(Some(&cluster.url), &parquet, &pc));
    assert_eq!(r.code, 0, "{}\n{}", r.stderr, logs_of(&cluster));
    assert_eq!(rows(&pl).len(), preds.len());
    assert_eq!(rows(&pl), rows(&pc));
    // A truncated Parquet file: the error names the user's file, as a local run's does.
    let cut = dir.path().join("cut.parquet");
    let bytes = std::fs::read(&parquet).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let r = run(&mut score_cmd(
        Some(&cluster.url),
        &cut,
        &dir.path().join("results/cut"),
    ));
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains(&cut.display().to_string()) && !r.stderr.contains(".pieval-staging"),
        "{}",
        r.stderr
    );

    // A bad line far into the file (a later slice): the error a local run gives, with
    // the same line number, and nothing written.
    let bad = dir.path().join("bad.jsonl");
    let mut text = std::fs::read_to_string(&preds_path).unwrap();
    let at = preds.len() - 3;
    let mut lines: Vec<&str> = text.lines().collect();
    lines[at] = r#"{"case_id": "x", "latency_ms": "slow"}"#;
    text = lines.join("\n");
    std::fs::write(&bad, text).unwrap();
    let r_local = run(&mut score_cmd(
        None,
        &bad,
        &dir.path().join("results/bad-local"),
    ));
    let out = dir.path().join("results/bad-cluster");
    let r = run(&mut score_cmd(Some(&cluster.url), &bad, &out));
    assert_eq!((r.code, r_local.code), (2, 2), "{}", r.stderr);
    assert_eq!(r.stderr, r_local.stderr);
    assert!(
        r.stderr
            .contains(&format!("bad.jsonl:{}: latency_ms:", at + 1)),
        "{}",
        r.stderr
    );
    assert!(
        common::files_under(&out).is_empty(),
        "{:?}",
        common::files_under(&out)
    );

    // SQL on the cluster: the executors run the detector UDFs over every run.
    let q = "SELECT run_id, count(*) AS n, sum(CASE WHEN pi_refusal(response_text) THEN 1 ELSE 0 END) AS refusals, \
             sum(CASE WHEN attack_success THEN 1 ELSE 0 END) AS successes FROM case_results GROUP BY run_id";
    let sql = |cluster: Option<&str>| {
        let mut cmd = pieval();
        cmd.args(["sql", "--format", "json", "--results"])
            .arg(dir.path().join("results"));
        if let Some(url) = cluster {
            cmd.args(["--cluster", url]);
        }
        let r = run(cmd.arg(q));
        assert_eq!(r.code, 0, "{}", r.stderr);
        let v: Value = serde_json::from_str(&r.stdout).unwrap();
        v
    };
    let (l, c) = (sql(None), sql(Some(&cluster.url)));
    assert_eq!(l, c);
    // A UNION is not run on the cluster: Ballista 55 answers some wrongly (this one
    // counted 150 rows for 100) or never (queries/summary.sql).
    let union = "WITH t AS (SELECT case_id, label FROM case_results WHERE attempt_id IS NULL \
                 UNION ALL SELECT case_id, label FROM case_results WHERE attempt_id IS NOT NULL \
                 GROUP BY case_id, label) \
                 SELECT count(*) AS n FROM (SELECT label FROM t UNION ALL SELECT label FROM t)";
    let r = run(pieval()
        .args([
            "sql",
            "--format",
            "json",
            "--cluster",
            &cluster.url,
            "--results",
        ])
        .arg(dir.path().join("results"))
        .arg(union));
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("has a UNION"), "{}", r.stderr);
    assert!(r.stdout.is_empty(), "{}", r.stdout);
    assert!(
        l.as_array()
            .unwrap()
            .iter()
            .any(|r| r["refusals"].as_i64() > Some(0))
    );

    // A run re-scored on the cluster: its manifest and the run catalogue say so.
    let results = dir.path().join("results");
    let run_dir = common::dry_run(dir.path(), 24);
    let run_id = run_dir.file_name().unwrap().to_str().unwrap().to_owned();
    let r = run(pieval()
        .args([
            "replay",
            &run_id,
            "--rescore",
            "--json",
            "--cluster",
            &cluster.url,
        ])
        .arg("--results")
        .arg(&results));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = run(pieval()
        .args(["runs", "list", "--json", "--results"])
        .arg(&results));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let runs: Vec<Value> = serde_json::from_str(&r.stdout).unwrap();
    let row = runs
        .iter()
        .find(|r| r["run_id"] == run_id.as_str())
        .unwrap();
    assert_eq!(row["scoring_engine"], "ballista", "{row}");
    assert_eq!(row["scoring_executors"], 2, "{row}");

    // Other rule packs: an executor refuses to start, a client refuses to submit.
    let rules = dir.path().join("rules");
    std::fs::create_dir_all(&rules).unwrap();
    let pack = std::fs::read_to_string(repo("data/rules/injection.toml")).unwrap();
    std::fs::write(
        rules.join("injection.toml"),
        format!(
            "{pack}\n[[rule]]\nid = \"local-extra\"\nseverity = \"low\"\nscope = \"folded\"\ndescription = \"a team's own rule\"\npattern = \"zebra crossing\"\nexamples = [\"a zebra crossing\"]\n"
        ),
    )
    .unwrap();
    let r = run(pieval()
        .arg("--rules")
        .arg(&rules)
        .args(executor_args(&cluster.url, &[])));
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("executor not started: the scheduler's rule packs differ"),
        "{}",
        r.stderr
    );
    let ours = info(&cluster.url).unwrap()["cluster"]["rulepack_digest"].clone();
    assert!(r.stderr.contains(ours.as_str().unwrap()), "{}", r.stderr);
    let out = dir.path().join("results/other-rules");
    let r = run(&mut score_cmd(Some(&cluster.url), &preds_path, &out)
        .arg("--rules")
        .arg(&rules));
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("query not submitted"), "{}", r.stderr);
    assert!(common::files_under(&out).is_empty());
    // Still two executors: the refused one never joined.
    assert_eq!(info(&cluster.url).unwrap()["cluster"]["executors"], 2);

    // The scheduler restarted with other rule packs: Ballista takes the running
    // executors back from their heartbeats without asking them, so the scheduler counts
    // them as foreign and a client (with the scheduler's packs) refuses to submit.
    cluster.scheduler.kill().unwrap();
    cluster.scheduler.wait().unwrap();
    let port = cluster.url.rsplit(':').next().unwrap().to_owned();
    let mut args: Vec<String> = vec!["--rules".into(), rules.display().to_string()];
    args.extend(["cluster", "scheduler", "--bind"].map(String::from));
    args.push(format!("127.0.0.1:{port}"));
    cluster.scheduler = spawn(&args, &logs.join("scheduler-2.log"));
    wait_for(
        &cluster,
        |i| i["cluster"]["executors"] == 2 && i["cluster"]["foreign_executors"] == 2,
        "the executors' return",
    );
    let out = dir.path().join("results/foreign");
    let r = run(&mut score_cmd(Some(&cluster.url), &preds_path, &out)
        .arg("--rules")
        .arg(&rules));
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("2 executor(s) with other rule packs"),
        "{}",
        r.stderr
    );
}

fn logs_of(cluster: &Cluster) -> String {
    logs(&cluster.logs)
}

/// [`predictions`] with long responses, so a query is still running a while after it
/// was submitted; `tag` makes one set's rows differ from another's.
fn long_predictions(copies: usize, tag: &str) -> Vec<Value> {
    let long = format!("The assistant considered the request carefully {tag}. ").repeat(60);
    predictions(copies)
        .into_iter()
        .map(|mut p| {
            if let Some(t) = p["response_text"].as_str() {
                p["response_text"] = json!(format!("{t} {long}"));
            }
            p
        })
        .collect()
}

#[test]
fn an_executor_killed_mid_query_leaves_a_whole_result_or_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let preds_path = dir.path().join("predictions.jsonl");
    // Long responses, so the query is still running when the executor dies.
    let preds = long_predictions(12, "");
    write_jsonl(&preds_path, &preds);
    let local = dir.path().join("results/local");
    let r = run(&mut score_cmd(None, &preds_path, &local));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let logs = dir.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let mut cluster = start_cluster(2, &logs);

    // One executor killed mid-query: Ballista runs its tasks again on the other (the
    // scheduler notices within ~20 s), or the query fails; never a partial artifact.
    let out = dir.path().join("results/killed");
    let (running, result) = score_and_kill(&mut cluster, 0, &preds_path, &out);
    let stderr = String::from_utf8_lossy(&result.stderr);
    nothing_left_behind(&out);
    if result.status.success() {
        // Every row is there, once, as a local run gives it.
        let got = rows(&out);
        assert_eq!(got.len(), preds.len(), "{stderr}");
        assert_eq!(digest(&got), digest(&rows(&local)), "case_results differ");
        let report: Value = serde_json::from_slice(&result.stdout).unwrap();
        eprintln!(
            "executor killed (query running: {running}); the query completed: {}",
            report["scoring"]
        );
    } else {
        failed_cleanly(&result, &out);
        eprintln!("executor killed (query running: {running}); the query failed: {stderr}");
    }

    // The last executor killed mid-query: nothing can run the lost tasks; the query
    // fails with a clear error and writes nothing.
    let out = dir.path().join("results/all-killed");
    let (running, result) = score_and_kill(&mut cluster, 1, &preds_path, &out);
    assert!(running, "the query ended before the executor was killed");
    nothing_left_behind(&out);
    failed_cleanly(&result, &out);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(stderr.contains("executors were lost"), "{stderr}");
}

/// The client (`pieval score --cluster`) killed outright mid-query, then the scheduler:
/// the run committed before stays whole each time — its rows, its summary — and the
/// parts a dead client's job wrote are never read; the next scoring in the folder
/// removes what the killed client left and commits.
#[test]
fn a_killed_client_or_scheduler_leaves_the_previous_run_whole() {
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("first.jsonl");
    let second = dir.path().join("second.jsonl");
    let (p1, p2) = (long_predictions(12, "one"), long_predictions(12, "two"));
    write_jsonl(&first, &p1);
    write_jsonl(&second, &p2);
    let logs = dir.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let mut cluster = start_cluster(1, &logs);
    let out = dir.path().join("results/r");
    let r = run(&mut score_cmd(Some(&cluster.url), &first, &out));
    assert_eq!(r.code, 0, "{}\n{}", r.stderr, logs_of(&cluster));
    let committed = rows(&out);
    assert_eq!(committed.len(), p1.len());
    let summary = std::fs::read(out.join("summary.json")).unwrap();
    // What readers see (a reader completes an unfinished commit first).
    let rows_read = || {
        let r = run(pieval()
            .args(["sql", "--format", "json", "--results"])
            .arg(dir.path().join("results"))
            .arg("SELECT count(*) AS n FROM case_results"));
        assert_eq!(r.code, 0, "{}", r.stderr);
        let v: Value = serde_json::from_str(&r.stdout).unwrap();
        v[0]["n"].as_u64().unwrap() as usize
    };
    let whole = |what: &str| {
        assert_eq!(rows(&out), committed, "{what}: case_results changed");
        assert_eq!(
            std::fs::read(out.join("summary.json")).unwrap(),
            summary,
            "{what}: summary.json changed"
        );
        assert_eq!(rows_read(), p1.len(), "{what}");
    };

    // The client killed (SIGKILL) while its job runs on the cluster.
    let mut score = score_cmd(Some(&cluster.url), &second, &out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_staged(&mut score, &out);
    std::thread::sleep(Duration::from_millis(300));
    let running = score.try_wait().unwrap().is_none();
    score.kill().unwrap();
    score.wait().unwrap();
    assert!(running, "the scoring ended before its client was killed");
    whole("client killed");
    // Its job may still be writing parts into the dead client's staging folder: let it
    // finish, then the next scoring here removes the folder and commits.
    settle(&out);
    whole("client killed, its job finished");
    let r = run(&mut score_cmd(Some(&cluster.url), &second, &out));
    assert_eq!(r.code, 0, "{}\n{}", r.stderr, logs_of(&cluster));
    nothing_left_behind(&out);
    assert_eq!(rows(&out).len(), p2.len());
    assert_ne!(rows(&out), committed);

    // The client killed inside its commit, after the journal and three of its steps
    // (the summary and the judgements removed, case_results.parquet renamed; the JSONL
    // the executors assembled not yet): the next reader completes it — the new run
    // whole, the first predictions' rows again — and nothing of the second's stays.
    let first_summary: Value = serde_json::from_slice(&summary).unwrap();
    let r =
        run(score_cmd(Some(&cluster.url), &first, &out).env("PIEVAL_TEST_CRASH_IN_COMMIT", "3"));
    assert_ne!(r.code, 0, "the client was not killed: {}", r.stderr);
    assert!(out.join(".pieval-commit.json").exists());
    assert_eq!(rows_read(), p1.len());
    assert_eq!(rows(&out), committed, "the client killed in its commit");
    let now: Value =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(now["aggregate_metrics"], first_summary["aggregate_metrics"]);
    nothing_left_behind(&out);
    assert!(!out.join(".pieval-commit.json").exists());

    // The scheduler killed mid-query: a clear error, and the run just committed whole.
    let (committed, summary) = (rows(&out), std::fs::read(out.join("summary.json")).unwrap());
    let mut score = score_cmd(Some(&cluster.url), &first, &out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_staged(&mut score, &out);
    std::thread::sleep(Duration::from_millis(300));
    let running = score.try_wait().unwrap().is_none();
    cluster.scheduler.kill().unwrap();
    cluster.scheduler.wait().unwrap();
    let result = score.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(
        running,
        "the scoring ended before the scheduler was killed: {stderr}"
    );
    assert_eq!(result.status.code(), Some(2), "{stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    nothing_left_behind(&out);
    assert_eq!(
        rows(&out),
        committed,
        "scheduler killed: case_results changed"
    );
    assert_eq!(std::fs::read(out.join("summary.json")).unwrap(), summary);
}

/// Wait until `score`'s executors write their parts under `out` — its inputs staged and
/// surveyed, the scoring query running — (or it ended).
fn wait_staged(score: &mut Child, out: &Path) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let staged = || {
        out.is_dir()
            && common::files_under(out).iter().any(|p| {
                let p = p.to_string_lossy();
                p.contains(".pieval-staging") && p.contains("/parts/part-")
            })
    };
    while !staged() && score.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "staging did not finish");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Wait until nothing under `dir` has changed for 3 s (a dead client's job finishing on
/// the cluster), at most 2 minutes.
fn settle(dir: &Path) {
    let snapshot = || {
        let mut files: Vec<(PathBuf, u64)> = common::files_under(dir)
            .into_iter()
            .map(|p| {
                let len = std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
                (p, len)
            })
            .collect();
        files.sort();
        files
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = snapshot();
    loop {
        std::thread::sleep(Duration::from_secs(3));
        let now = snapshot();
        if now == last || Instant::now() > deadline {
            return;
        }
        last = now;
    }
}

/// `pieval score --cluster` in the background; once its executors write parts (the
/// scoring query runs) and 0.3 s more, executor `k` is killed. Whether the score was still
/// running then, and its output.
fn score_and_kill(
    cluster: &mut Cluster,
    k: usize,
    preds_path: &Path,
    out: &Path,
) -> (bool, std::process::Output) {
    let mut score = score_cmd(Some(&cluster.url), preds_path, out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_staged(&mut score, out);
    std::thread::sleep(Duration::from_millis(300));
    let running = score.try_wait().unwrap().is_none();
    cluster.executors[k].kill().unwrap();
    cluster.executors[k].wait().unwrap();
    (running, score.wait_with_output().unwrap())
}

/// No staged input and no temporary file is left in `out`.
fn nothing_left_behind(out: &Path) {
    let files = if out.is_dir() {
        common::files_under(out)
    } else {
        Vec::new()
    };
    assert!(
        !files
            .iter()
            .any(|p| p.to_string_lossy().contains(".pieval-staging")),
        "staged inputs left behind: {files:?}"
    );
    assert!(
        !files
            .iter()
            .any(|p| p.file_name().unwrap().to_string_lossy().contains(".tmp")),
        "temporary files left behind: {files:?}"
    );
}

/// Exit 2 with an error, and none of scoring's artifacts written.
fn failed_cleanly(result: &std::process::Output, out: &Path) {
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert_eq!(result.status.code(), Some(2), "{stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    for artifact in [
        "case_results.parquet",
        "case_results.jsonl",
        "findings.parquet",
        "summary.json",
    ] {
        assert!(
            !out.join(artifact).exists(),
            "{artifact} written after a failed query"
        );
    }
}

/// A server at the scheduler's address that is not a pieval scheduler — a 404, an answer
/// that is not a description, one over 1 MiB — is a clear error (exit 2), never a panic
/// or an unbounded read.
#[test]
fn a_server_that_is_not_a_pieval_scheduler_is_named_as_such() {
    use std::io::{Read, Write};
    let answers: Vec<(Vec<u8>, &str)> = vec![
        (
            b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".to_vec(),
            "answered 404",
        ),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nnot json!".to_vec(),
            "did not answer a pieval description",
        ),
        (
            {
                let body = vec![b'['; 2 << 20];
                let mut r = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len())
                    .into_bytes();
                r.extend(body);
                r
            },
            "an answer over 1 MiB",
        ),
    ];
    for (answer, expected) in answers {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            if let Ok((mut s, _)) = listener.accept() {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf);
                let _ = s.write_all(&answer);
            }
        });
        let r = run(pieval().args([
            "cluster",
            "info",
            "--scheduler",
            &format!("df://127.0.0.1:{port}"),
        ]));
        assert_eq!(r.code, 2, "{}", r.stderr);
        assert!(
            r.stderr.contains(&format!(
                "cannot reach a pieval scheduler at df://127.0.0.1:{port}"
            )) && r.stderr.contains(expected),
            "{expected}: {}",
            r.stderr
        );
        server.join().unwrap();
    }
}

/// Containers and images made by a test, removed when it ends however it ends.
struct Podman {
    containers: Vec<String>,
    images: Vec<String>,
}

impl Drop for Podman {
    fn drop(&mut self) {
        for c in &self.containers {
            let _ = Command::new("podman")
                .args(["rm", "-f", "-t", "0", c])
                .output();
        }
        for i in &self.images {
            let _ = Command::new("podman").args(["rmi", "-f", i]).output();
        }
    }
}

fn podman(args: &[&str]) -> String {
    let out = Command::new("podman")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "podman is needed for this test ({e}): apt-get install podman (bash .ci/run \
                 does this)"
            )
        });
    let stderr = String::from_utf8_lossy(&out.stderr);
    let hint = if stderr.contains("cgroups in hybrid mode") {
        "\n(this host's cgroups are hybrid with a controller left in v2: \
         PIEVAL_MOUNT_CGROUPS=1 bash .ci/run mounts it as v1, host-wide)"
    } else {
        ""
    };
    assert!(
        out.status.success(),
        "podman {}: {}{stderr}{hint}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A base image holding only what the binary links (the libraries `ldd` names) and a
/// /tmp, imported from a tar: no registry is reachable here (deploy/Containerfile takes
/// any glibc image as `BASE`).
fn base_image(bin: &Path, dir: &Path, tag: &str) {
    let root = dir.join("root");
    std::fs::create_dir_all(root.join("tmp")).unwrap();
    let ldd = Command::new("ldd").arg(bin).output().expect("ldd runs");
    let ldd = String::from_utf8_lossy(&ldd.stdout).into_owned();
    let libs: Vec<&str> = ldd
        .split_whitespace()
        .filter(|w| w.starts_with('/'))
        .collect();
    assert!(libs.iter().any(|l| l.contains("libc.so")), "ldd: {ldd}");
    for lib in libs {
        let to = root.join(lib.trim_start_matches('/'));
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(lib, &to).unwrap();
    }
    let tar = dir.join("base.tar");
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "chmod 1777 '{}' && tar -C '{}' -cf '{}' .",
            root.join("tmp").display(),
            root.display(),
            tar.display()
        ))
        .status()
        .unwrap();
    assert!(status.success());
    podman(&["import", tar.to_str().unwrap(), tag]);
}

/// Why crun will refuse every container on this host, when it will and nobody asked for
/// the host to be changed: cgroups in hybrid mode with a controller left in the v2
/// hierarchy (`.ci/run` mounts such controllers as v1 in CI, or when
/// `PIEVAL_MOUNT_CGROUPS=1` asks; a developer's host is not changed unasked). In CI, or
/// when asked, the test runs and fails with podman's own message.
fn containers_refused_here() -> Option<String> {
    let asked = std::env::var("CI").is_ok_and(|v| v == "true")
        || std::env::var("PIEVAL_MOUNT_CGROUPS").is_ok_and(|v| v == "1");
    let controllers =
        std::fs::read_to_string("/sys/fs/cgroup/unified/cgroup.controllers").unwrap_or_default();
    let controllers = controllers.trim();
    (!asked && !controllers.is_empty()).then(|| {
        format!(
            "this host's cgroups are hybrid with controllers left in v2 ({controllers}), \
             which crun refuses; PIEVAL_MOUNT_CGROUPS=1 bash .ci/run mounts them as v1 \
             (host-wide, until reboot) and runs it"
        )
    })
}

/// deploy/Containerfile, built and started: a scheduler and an executor in containers
/// (host network, the staging folder mounted at its own path) score predictions for a
/// client on this machine, with the same rows as a local run; `podman stop` stops each
/// at once (SIGTERM is handled: a container's PID 1 ignores signals it does not handle).
#[test]
fn the_container_file_builds_and_its_scheduler_and_executor_score() {
    if let Some(why) = containers_refused_here() {
        // Not a silent skip: said here, and listed at the end of `bash .ci/run`.
        let note = format!(
            "the_container_file_builds_and_its_scheduler_and_executor_score: containers not \
             started: {why}"
        );
        eprintln!("note: {note}");
        if let Ok(path) = std::env::var("PIEVAL_TEST_NOTES") {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .unwrap_or_else(|e| panic!("{path}: {e}"));
            writeln!(f, "{note}").unwrap();
        }
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tag = format!("{:08x}", std::process::id() ^ fastrand::u32(..));
    let base = format!("localhost/pieval-test-base:{tag}");
    let image = format!("localhost/pieval-cluster-test:{tag}");
    let mut podman_state = Podman {
        containers: Vec::new(),
        images: vec![image.clone(), base.clone()],
    };
    let bin = Path::new(env!("CARGO_BIN_EXE_pieval"));
    base_image(bin, dir.path(), &base);
    let ctx = dir.path().join("ctx");
    std::fs::create_dir_all(&ctx).unwrap();
    std::fs::copy(repo("deploy/Containerfile"), ctx.join("Containerfile")).unwrap();
    std::fs::copy(bin, ctx.join("pieval")).unwrap();
    podman(&[
        "build",
        "-q",
        "--build-arg",
        &format!("BASE={base}"),
        "-t",
        &image,
        "-f",
        ctx.join("Containerfile").to_str().unwrap(),
        ctx.to_str().unwrap(),
    ]);
    // The image runs as an unprivileged user (its config says so).
    assert_eq!(
        podman(&["image", "inspect", "--format", "{{.Config.User}}", &image]),
        "65534:65534"
    );

    let stage = dir.path().join("stage");
    std::fs::create_dir_all(&stage).unwrap();
    // This sandbox's hard limits are below podman's defaults, which crun cannot raise.
    let limits = [
        "--ulimit",
        "nofile=8192:8192",
        "--ulimit",
        "nproc=8192:8192",
    ];
    let port = free_port_pair();
    let url = format!("df://127.0.0.1:{port}");
    let name = |role: &str| format!("pieval-test-{role}-{tag}");
    // Labelled: what a killed test left is found with `podman ps -a --filter label=pieval-test`.
    let mut args = vec!["run", "-d", "--label", "pieval-test", "--network", "host"];
    args.extend(limits);
    let sched_name = name("scheduler");
    let bind = format!("127.0.0.1:{port}");
    let mut sched = args.clone();
    sched.extend(["--name", &sched_name, &image, "scheduler", "--bind", &bind]);
    podman(&sched);
    podman_state.containers.push(sched_name.clone());
    let exec_name = name("executor");
    let exec_port = free_port_pair();
    let exec_bind = format!("127.0.0.1:{exec_port}");
    let mount = format!("{0}:{0}", stage.display());
    let mut exec = args.clone();
    // The staging folder is the client's (root here, umask 022): the executor writes its
    // parts there as its owner.
    exec.extend([
        "--name",
        &exec_name,
        "--user",
        "0:0",
        "-v",
        &mount,
        &image,
        "executor",
        "--scheduler",
        &url,
        "--bind",
        &exec_bind,
        "--concurrency",
        "2",
    ]);
    podman(&exec);
    podman_state.containers.push(exec_name.clone());
    let container_logs = || {
        format!(
            "scheduler:\n{}\nexecutor:\n{}",
            podman(&["logs", &sched_name]),
            podman(&["logs", &exec_name])
        )
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if info(&url).is_some_and(|i| i["cluster"]["executors"] == 1) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the containers did not come up:\n{}",
            container_logs()
        );
        std::thread::sleep(Duration::from_millis(300));
    }

    let preds_path = dir.path().join("predictions.jsonl");
    let preds = predictions(1);
    write_jsonl(&preds_path, &preds);
    let local = dir.path().join("local");
    let r = run(&mut score_cmd(None, &preds_path, &local));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let out = stage.join("out");
    let r = run(&mut score_cmd(Some(&url), &preds_path, &out)
        .arg("--staging")
        .arg(&stage));
    assert_eq!(r.code, 0, "{}\n{}", r.stderr, container_logs());
    let report: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(report["scoring"]["engine"], "ballista");
    assert!(report["scoring"]["parts"].as_u64() >= Some(1), "{report}");
    assert_eq!(rows(&local), rows(&out));

    // Stopped by SIGTERM, well within podman's 10 s before it kills.
    for c in [&exec_name, &sched_name] {
        let started = Instant::now();
        podman(&["stop", "-t", "10", c]);
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "{c} took {:?} to stop",
            started.elapsed()
        );
        let state = podman(&["inspect", "--format", "{{.State.ExitCode}}", c]);
        assert_eq!(state, "0", "{c} exited with {state}");
    }
}

/// `--staging s3://…` against moto's S3 server (tests/it/object_storage.rs) behind the
/// proxy that throttles or fails requests: every process — scheduler, executors, client
/// — has the S3 settings in its own environment, the executors read the staged inputs
/// (and an `s3://` predictions file where it is, by range) and write their parts into
/// the bucket themselves. The same rows as a local run; nothing left under the staging
/// prefix; a part over 8 MiB goes up in parts; throttling is retried; a server failing
/// mid-write leaves the run's previous commit; no object holds a credential.
#[test]
fn a_cluster_stages_on_object_storage_where_its_executors_read_and_write() {
    use crate::object_storage::{
        KEY_ID, Mode, Proxy, SECRET, committed, get_object, keys, make_bucket, open_uploads,
        put_object, s3_env, sorted_lines, start_moto,
    };
    use std::sync::atomic::Ordering;
    let moto = start_moto();
    make_bucket(moto.port);
    let proxy = Proxy::start(moto.port);
    let logs = tempfile::tempdir().unwrap();
    let cluster = start_cluster_with(2, logs.path(), Some(proxy.port));
    let dir = tempfile::tempdir().unwrap();
    let preds = dir.path().join("preds.jsonl");
    write_jsonl(&preds, &predictions(3));
    let local = dir.path().join("local");
    let r = run(&mut score_cmd(None, &preds, &local));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let want = rows(&local);
    let log_from =
        |from: usize| -> Vec<String> { proxy.counts.log.lock().unwrap()[from..].to_vec() };
    let log_len = || proxy.counts.log.lock().unwrap().len();
    let staging_left = || -> Vec<String> {
        keys(moto.port, "bkt")
            .into_iter()
            .filter(|k| k.starts_with("stage/"))
            .collect()
    };

    // `score --cluster --staging s3://bkt/stage` of `preds` into the local folder `out`.
    let staged = |preds: &Path, out: &Path| {
        let mut cmd = score_cmd(Some(&cluster.url), preds, out);
        run(s3_env(&mut cmd, proxy.port).args(["--staging", "s3://bkt/stage"]))
    };

    // A local predictions file, uploaded to the staging prefix; a local output.
    let from = log_len();
    let out = dir.path().join("out");
    let r = staged(&preds, &out);
    assert_eq!(r.code, 0, "{}\n{}", r.stderr, logs_of(&cluster));
    assert_eq!(
        digest(&rows(&out)),
        digest(&want),
        "the rows of a local run"
    );
    assert_eq!(findings(&out), findings(&local));
    let summary: Value =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["scoring"]["engine"], "ballista");
    let local_summary: Value =
        serde_json::from_slice(&std::fs::read(local.join("summary.json")).unwrap()).unwrap();
    assert_eq!(
        summary["aggregate_metrics"],
        local_summary["aggregate_metrics"]
    );
    assert_eq!(
        staging_left(),
        Vec::<String>::new(),
        "the staging prefix is removed"
    );
    let seen = log_from(from);
    assert!(
        seen.iter()
            .any(|r| r.starts_with("PUT /bkt/stage/.pieval-staging")
                && r.contains("/predictions.jsonl")),
        "the local file was staged in the bucket: {seen:?}"
    );

    // Parquet predictions in the bucket, read where they are by range (the footer, then
    // each slice's row groups), with a local output.
    let parquet = dir.path().join("preds.parquet");
    write_parquet(&predictions(3), &parquet, 500);
    put_object(
        moto.port,
        "bkt/in/preds.parquet",
        &std::fs::read(&parquet).unwrap(),
    );
    let from = log_len();
    let from_bucket = dir.path().join("from-bucket");
    let r = staged(Path::new("s3://bkt/in/preds.parquet"), &from_bucket);
    assert_eq!(r.code, 0, "{}\n{}", r.stderr, logs_of(&cluster));
    let parquet_local = dir.path().join("parquet-local");
    let r = run(&mut score_cmd(None, &parquet, &parquet_local));
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(rows(&from_bucket), rows(&parquet_local));
    assert_eq!(staging_left(), Vec::<String>::new());
    // Read by range, once each: the object's tail (footer and page index) by the client
    // and each of the four tasks (two surveying, two scanning), each row group whole by
    // each task whose slice holds it (13 groups of 500 rows; the one two slices share,
    // four times), and the whole object in doubling windows for its digest — 35 requests
    // here, not one or more per page.
    let gets: Vec<String> = log_from(from)
        .into_iter()
        .filter(|r| r.starts_with("GET /bkt/in/preds.parquet"))
        .collect();
    assert!(
        gets.iter().all(|r| r.contains(" range bytes=")),
        "every read of the object is a range: {gets:?}"
    );
    assert!(
        gets.len() <= 40,
        "{} reads of a 13-group file: {gets:?}",
        gets.len()
    );

    // Long answers in the bucket, read where they are (nothing uploaded by the client),
    // into a run in the bucket, every request throttled once: each of the two parts'
    // case_results.jsonl is about 14 MB, over 8 MiB, so the executors upload it in parts.
    let long = long_predictions(3, "s3");
    let long_file = dir.path().join("long.jsonl");
    write_jsonl(&long_file, &long);
    let long_local = dir.path().join("long-local");
    let r = run(&mut score_cmd(None, &long_file, &long_local));
    assert_eq!(r.code, 0, "{}", r.stderr);
    put_object(
        moto.port,
        "bkt/in/long.jsonl",
        &std::fs::read(&long_file).unwrap(),
    );
    // The bucket's predictions into a run in the bucket, staged there; the client
    // through `port` (the cluster's proxy, or one of its own).
    let into_bucket_via = |port: u16| {
        let mut cmd = pieval();
        s3_env(&mut cmd, port).args([
            "score",
            "--run-id",
            "c",
            "--json",
            "--predictions",
            "s3://bkt/in/long.jsonl",
            "--output",
            "s3://bkt/results/r1",
            "--cluster",
            &cluster.url,
            "--staging",
            "s3://bkt/stage",
        ]);
        cmd
    };
    let into_bucket = || into_bucket_via(proxy.port);
    let score_into_bucket = || run(&mut into_bucket());
    let client_proxy = Proxy::start(moto.port);
    proxy.set(Mode::Throttle);
    let starts = proxy.counts.multipart_starts.load(Ordering::SeqCst);
    let from = log_len();
    // Parts of 5 MiB, S3's smallest (moto refuses a smaller one but the last): each
    // task puts several, one sent while the next is read.
    let r = run(into_bucket_via(client_proxy.port)
        .env("PIEVAL_TEST_UPLOAD_CHUNK_BYTES", (5u64 << 20).to_string()));
    proxy.set(Mode::Pass);
    assert_eq!(r.code, 0, "{}\n{}", r.stderr, logs_of(&cluster));
    let (commit, bytes) = committed(moto.port, "bkt/results/r1");
    assert_eq!(
        sorted_lines(&bytes),
        rows(&long_local),
        "the rows of a local run"
    );
    assert!(proxy.counts.throttled.load(Ordering::SeqCst) > 0);
    // Two from the executors (each part's case_results.jsonl); the client uploaded no
    // predictions.
    assert!(
        proxy.counts.multipart_starts.load(Ordering::SeqCst) >= starts + 2,
        "the executors' parts went up in parts"
    );
    // The run's case_results.jsonl (28 MB) put together by the executors in the new
    // commit's folder, as parts of an upload the client started and completed: its
    // bytes never passed through the client, which neither read a JSONL part nor
    // uploaded the file. The commit's digest is the file's.
    let report: Value = serde_json::from_str(&r.stdout).unwrap();
    let by_executors = report["scoring"]["assembled_by_executors"].to_string();
    assert!(
        by_executors.contains("case_results.jsonl"),
        "{by_executors}"
    );
    let id = commit["commit_id"].as_str().unwrap();
    let put_by_cluster = format!("PUT /bkt/results/r1/v/{id}/case_results.jsonl?");
    let part_numbers: std::collections::BTreeSet<u32> = log_from(from)
        .iter()
        .filter(|r| r.starts_with(&put_by_cluster))
        .filter_map(|r| {
            let n = r.split("partNumber=").nth(1)?;
            n[..n.find(|c: char| !c.is_ascii_digit()).unwrap_or(n.len())]
                .parse()
                .ok()
        })
        .collect();
    // Two tasks (one per executor's part, about 14 MB each, so two 5 MiB-or-more parts
    // each): at least four parts, numbered from 1 without a gap.
    assert!(
        part_numbers.len() >= 4
            && part_numbers
                .iter()
                .copied()
                .eq(1..=part_numbers.len() as u32),
        "the executors put the parts 1..N, several per task: {part_numbers:?} in {:?}",
        log_from(from)
    );
    let client_saw = client_proxy.counts.log.lock().unwrap().clone();
    let run_file = |r: &String| {
        [
            "/case_results.jsonl",
            "/case_results.parquet",
            "/findings.parquet",
        ]
        .iter()
        .any(|f| r.contains(f))
    };
    let big_part = |r: &String| {
        r.contains("/parts/part-")
            && [
                ".case_results.jsonl",
                ".case_results.parquet",
                ".findings.parquet",
            ]
            .iter()
            .any(|f| r.contains(f))
    };
    assert!(
        !client_saw.iter().any(|r| (r.starts_with("GET ")
            && big_part(r)
            && (r.contains(".case_results.jsonl") || !r.contains(" range bytes=")))
            || (r.starts_with("PUT ") && run_file(r))),
        "the client moved the results' bytes (it reads only the Parquet parts' footers): \
         {client_saw:?}"
    );
    let entry = commit["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "case_results.jsonl")
        .unwrap()
        .clone();
    assert_eq!(entry["bytes"], bytes.len() as u64);
    assert_eq!(entry["sha256"], hex::encode(Sha256::digest(&bytes)));
    // So were the Parquet files: a header, each part's row groups, the client's footer.
    for kind in ["case_results.parquet", "findings.parquet"] {
        assert!(by_executors.contains(kind), "{by_executors}");
        let body = get_object(moto.port, &format!("bkt/results/r1/v/{id}/{kind}")).unwrap();
        let here = dir.path().join(format!("fetched-{kind}"));
        std::fs::write(&here, &body).unwrap();
        assert_eq!(
            table_rows(&here),
            table_rows(&long_local.join(kind)),
            "{kind}: the rows of a local run"
        );
    }
    // Scored again into the same run: the current commit's results, which the new
    // scoring replaces, are not fetched by the client.
    let seen_before = client_proxy.counts.log.lock().unwrap().len();
    let r = run(&mut into_bucket_via(client_proxy.port));
    assert_eq!(r.code, 0, "{}\n{}", r.stderr, logs_of(&cluster));
    let (again, bytes) = committed(moto.port, "bkt/results/r1");
    assert_ne!(again["commit_id"], commit["commit_id"]);
    assert_eq!(sorted_lines(&bytes), rows(&long_local));
    let client_saw = client_proxy.counts.log.lock().unwrap()[seen_before..].to_vec();
    assert!(
        !client_saw
            .iter()
            .any(|r| r.starts_with("GET ") && r.contains(&format!("/v/{id}/")) && run_file(r)),
        "the client fetched the results it replaces: {client_saw:?}"
    );
    let commit = again;

    // The server failing every part the executors put into the run: the job fails
    // naming the object, every upload is aborted, nothing is left in the new commit's
    // folder, and the run keeps its commit.
    proxy.set(Mode::FailRunParts);
    let r = run(&mut into_bucket_via(client_proxy.port));
    proxy.set(Mode::Pass);
    assert_ne!(r.code, 0, "the scoring failed: {}", r.stdout);
    assert!(r.stderr.contains("s3://bkt/results/r1/v/"), "{}", r.stderr);
    let (after, _) = committed(moto.port, "bkt/results/r1");
    assert_eq!(after["commit_id"], commit["commit_id"]);
    let kept = [&commit["commit_id"], &commit["previous_commit_id"]];
    for key in keys(moto.port, "bkt") {
        if let Some(rest) = key.strip_prefix("results/r1/v/") {
            let folder = rest.split('/').next().unwrap();
            assert!(kept.iter().any(|k| *k == folder), "{key} was left behind");
        }
    }
    let open = open_uploads(moto.port);
    assert!(
        !open.iter().any(|k| k.starts_with("results/")),
        "an upload into the run was left open: {open:?}"
    );
    assert!(staging_left().is_empty(), "nothing staged is left");
    let seen = log_from(from);
    assert!(
        !seen.iter().any(|r| r.contains("predictions")),
        "the bucket's predictions were read where they are, not staged: {seen:?}"
    );
    assert!(
        seen.iter()
            .filter(|r| r.starts_with("GET /bkt/in/long.jsonl"))
            .all(|r| r.contains(" range bytes=")),
        "every read of the object is a range: {seen:?}"
    );

    // The object replaced (same size, one byte changed) after the executors began
    // reading it: refused, never scored half old, half new.
    let mut changed = std::fs::read(&long_file).unwrap();
    let at = changed.len() / 2;
    changed[at] = if changed[at] == b'a' { b'b' } else { b'a' };
    proxy.swap_after("/bkt/in/long.jsonl", 2, changed);
    let torn = dir.path().join("torn");
    let r = staged(Path::new("s3://bkt/in/long.jsonl"), &torn);
    assert_ne!(r.code, 0, "a changed object was scored: {}", r.stdout);
    assert!(r.stderr.contains("changed"), "{}", r.stderr);
    assert!(!torn.join("case_results.jsonl").exists());
    put_object(
        moto.port,
        "bkt/in/long.jsonl",
        &std::fs::read(&long_file).unwrap(),
    );

    // The server fails every request once the executors have written a few objects:
    // the scoring fails, the run keeps its commit.
    let puts = proxy.counts.puts.load(Ordering::SeqCst);
    proxy.set(Mode::FailAfterPuts(puts + 3));
    let r = score_into_bucket();
    proxy.set(Mode::Pass);
    assert_ne!(r.code, 0, "the scoring failed: {}", r.stdout);
    assert!(r.stderr.contains("s3://bkt/"), "{}", r.stderr);
    let (after, _) = committed(moto.port, "bkt/results/r1");
    assert_eq!(
        after["commit_id"], commit["commit_id"],
        "the previous commit stands"
    );

    // The client killed outright once the executors' parts are in the bucket: the run
    // keeps its commit (the parts and the staged prefix are never read).
    let mut client = into_bucket()
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !keys(moto.port, "bkt")
        .iter()
        .any(|k| k.starts_with("stage/") && k.contains("/parts/part-"))
        && client.try_wait().unwrap().is_none()
    {
        assert!(Instant::now() < deadline, "no part reached the bucket");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        client.try_wait().unwrap().is_none(),
        "the client ended before it could be killed"
    );
    let _ = client.kill();
    let _ = client.wait();
    let (after, bytes) = committed(moto.port, "bkt/results/r1");
    assert_eq!(
        after["commit_id"], commit["commit_id"],
        "the previous commit stands"
    );
    assert_eq!(sorted_lines(&bytes), rows(&long_local));

    // No object holds the key id or the secret.
    for key in keys(moto.port, "bkt") {
        let body = get_object(moto.port, &format!("bkt/{key}")).unwrap_or_default();
        let text = String::from_utf8_lossy(&body);
        for secret in [SECRET, KEY_ID] {
            assert!(!text.contains(secret), "{key} holds a credential");
        }
    }
}
