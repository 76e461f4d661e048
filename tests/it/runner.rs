//! The experiment runner end to end against a real HTTP server on 127.0.0.1:0 that speaks
//! chat completions, with fault modes; resume after a kill; replay; runs list/show/diff.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::chat_server::{Action, ChatServer};
use common::{pieval, read_jsonl as jsonl, repo, run};
use serde_json::Value;

const KEY_ENV: &str = "PIEVAL_TEST_API_KEY";
const SECRET: &str = "sk-test-DO-NOT-LEAK-7f3a9c21e5";

fn config(dir: &Path, url: &str, extra_model: &str, rest: &str) -> PathBuf {
    let path = dir.join("exp.yaml");
    let text = format!(
        r#"experiment: {{name: t, seed: 11, sample_size: 40, output_dir: "{out}"}}
dataset: {{path: "{corpus}"}}
selection: {{stratify_by: [attack_surface]}}
model:
  provider: openai
  name: echo-model
  base_url: "{url}"
  api_key_env: {KEY_ENV}
  max_tokens: 64
  timeout_s: 1
  max_retries: 2
  concurrency: 8
{extra_model}
{rest}
"#,
        rest = if rest.contains("mitigation:") {
            rest.to_owned()
        } else {
            format!("mitigation: {{name: none}}\n{rest}")
        },
        out = dir.join("results").display(),
        corpus = repo("data/normalized/attack_cases.enriched.jsonl").display(),
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn only_run(results: &Path) -> PathBuf {
    let runs: Vec<PathBuf> = std::fs::read_dir(results)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    runs[0].clone()
}

/// No byte sequence of the key in any file of the folder (recursively).
fn assert_no_secret(dir: &Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            assert_no_secret(&p);
        } else {
            let bytes = std::fs::read(&p).unwrap();
            assert!(
                !bytes.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()),
                "the API key is in {}",
                p.display()
            );
        }
    }
}

#[test]
fn every_case_gets_exactly_one_row_through_every_fault_mode() {
    // By request-body hash: 429 + Retry-After, 500, a hang past the timeout, garbage,
    // a reset connection, a slow answer — each once, then a normal answer; and a few
    // requests that always fail with 500.
    let server = ChatServer::start(Arc::new(|key, attempt| {
        if key % 13 == 0 {
            return Action::Status(500, None);
        }
        if attempt > 1 {
            return Action::Answer;
        }
        match key % 7 {
            0 => Action::Status(429, Some("1".into())),
            1 => Action::Status(503, None),
            2 => Action::Hang,
            3 => Action::Garbage,
            4 => Action::Reset,
            5 => Action::Slow(Duration::from_millis(300)),
            _ => Action::Answer,
        }
    }));
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), &server.base_url(), "", "");
    let out = run(pieval()
        .arg("run")
        .arg(&cfg)
        .arg("--json")
        .env(KEY_ENV, SECRET));
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let dir = only_run(&tmp.path().join("results"));
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["status"], "completed");
    let selected: Vec<&str> = manifest["dataset_snapshot"]["selected_case_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(selected.len(), 40);
    for file in ["predictions.jsonl", "case_results.jsonl"] {
        let rows = jsonl(&dir.join(file));
        let ids: Vec<&str> = rows
            .iter()
            .map(|r| r["case_id"].as_str().unwrap())
            .collect();
        let unique: HashSet<&str> = ids.iter().copied().collect();
        assert_eq!(ids.len(), 40, "{file}: one row per case");
        assert_eq!(unique, selected.iter().copied().collect(), "{file}");
    }
    let preds = jsonl(&dir.join("predictions.jsonl"));
    let errors: Vec<&Value> = preds.iter().filter(|p| !p["error"].is_null()).collect();
    let log = server.log.lock().unwrap();
    let failing = log.attempts.keys().filter(|k| *k % 13 == 0).count();
    assert_eq!(
        errors.len(),
        failing,
        "exactly the always-failing cases have errors"
    );
    for e in &errors {
        let msg = e["error"].as_str().unwrap();
        assert!(
            msg.contains("HTTP 500") && msg.contains("after 3 attempts"),
            "{msg}"
        );
    }
    let retried = preds
        .iter()
        .filter(|p| p["attempts"].as_u64().unwrap() > 1)
        .count();
    assert!(retried >= 10, "fault modes were retried ({retried})");
    assert!(
        preds
            .iter()
            .all(|p| p["error"].is_null() == p["response_text"].is_string())
    );
    // The key went to the server, and nowhere else.
    assert!(
        log.authorization
            .iter()
            .all(|a| a == &format!("Bearer {SECRET}"))
    );
    assert!(!log.authorization.is_empty());
    drop(log);
    assert_no_secret(tmp.path());
    // Scored: errors flagged for review, the echo model "succeeds" on most attacks.
    let results = jsonl(&dir.join("case_results.jsonl"));
    for r in &results {
        if !r["error"].is_null() {
            assert_eq!(r["manual_review"], true);
            assert!(
                r["review_reason"]
                    .as_str()
                    .unwrap()
                    .contains("provider_error")
            );
        }
    }
    assert!(
        results
            .iter()
            .filter(|r| r["attack_success"] == true)
            .count()
            >= 10
    );
}

#[test]
fn a_missing_key_or_bad_endpoint_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), "http://127.0.0.1:9/v1", "", "");
    let out = run(pieval().arg("run").arg(&cfg).env_remove(KEY_ENV));
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr.contains(KEY_ENV) && out.stderr.contains("not set"),
        "{}",
        out.stderr
    );
    // Nothing listens on port 9: every case is recorded with a connection error.
    let out = run(pieval().arg("run").arg(&cfg).env(KEY_ENV, SECRET));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let dir = tmp.path().join("results");
    let runs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("predictions.jsonl").exists())
        .collect();
    let preds = jsonl(&runs[0].join("predictions.jsonl"));
    assert_eq!(preds.len(), 40);
    assert!(
        preds
            .iter()
            .all(|p| p["error"].as_str().unwrap().contains("connection"))
    );
}

#[test]
fn a_killed_run_resumes_without_loss_or_duplicates() {
    let server = ChatServer::always(Action::Slow(Duration::from_millis(150)));
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), &server.base_url(), "", "");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("concurrency: 8", "concurrency: 2");
    std::fs::write(&cfg, text).unwrap();
    let mut child = pieval()
        .arg("run")
        .arg(&cfg)
        .env(KEY_ENV, SECRET)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let results = tmp.path().join("results");
    let dir = common::wait_for_checkpoint(&results, 6);
    child.kill().unwrap();
    child.wait().unwrap();
    let before = jsonl(&dir.join("predictions.jsonl")).len();
    assert!(before < 40, "killed mid-run ({before})");
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(
        manifest["status"], "running",
        "a killed run is left running"
    );
    // Simulate a torn last line too.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join("predictions.jsonl"))
        .unwrap();
    std::io::Write::write_all(&mut f, b"{\"case_id\":\"torn").unwrap();
    drop(f);
    let run_id = dir.file_name().unwrap().to_str().unwrap().to_owned();
    let out = run(pieval()
        .arg("run")
        .arg(&cfg)
        .args(["--resume", &run_id, "--json"])
        .env(KEY_ENV, SECRET));
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let outcome: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(outcome["resumed"].as_u64().unwrap() as usize, before);
    assert_eq!(outcome["executed"].as_u64().unwrap() as usize, 40 - before);
    let preds = jsonl(&dir.join("predictions.jsonl"));
    let ids: HashSet<&str> = preds
        .iter()
        .map(|p| p["case_id"].as_str().unwrap())
        .collect();
    assert_eq!(preds.len(), 40, "no duplicates");
    assert_eq!(ids.len(), 40, "no loss");
    assert_eq!(jsonl(&dir.join("case_results.jsonl")).len(), 40);
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["status"], "completed");
    assert_eq!(manifest["resumed_at"].as_array().unwrap().len(), 1);
    // A completed run cannot be resumed; a changed config cannot resume either.
    let out = run(pieval()
        .arg("run")
        .arg(&cfg)
        .args(["--resume", &run_id])
        .env(KEY_ENV, SECRET));
    assert_eq!(out.code, 2);
    assert!(out.stderr.contains("already completed"), "{}", out.stderr);
    let out = run(pieval()
        .arg("run")
        .arg(&cfg)
        .args(["--resume", "../escape"])
        .env(KEY_ENV, SECRET));
    assert_eq!(out.code, 2);
    assert!(out.stderr.contains("not allowed"), "{}", out.stderr);
}

#[test]
fn mitigations_input_filter_and_known_answer_block_and_are_recorded() {
    let server = ChatServer::always(Action::Answer);
    let tmp = tempfile::tempdir().unwrap();
    for (i, name) in ["input_filter", "known_answer"].iter().enumerate() {
        let sub = tmp.path().join(format!("m{i}"));
        std::fs::create_dir_all(&sub).unwrap();
        let cfg = config(
            &sub,
            &server.base_url(),
            "",
            &format!("mitigation: {{name: {name}}}"),
        );
        let out = run(pieval()
            .arg("run")
            .arg(&cfg)
            .arg("--json")
            .env(KEY_ENV, SECRET));
        assert_eq!(out.code, 0, "{}", out.stderr);
        let dir = only_run(&sub.join("results"));
        let results = jsonl(&dir.join("case_results.jsonl"));
        assert_eq!(results.len(), 40);
        let blocked: Vec<&Value> = results
            .iter()
            .filter(|r| r["blocked_by"].is_string())
            .collect();
        assert!(!blocked.is_empty(), "{name} blocked nothing");
        for r in &blocked {
            assert_eq!(r["attack_success"], false, "{name}");
            assert_eq!(r["refusal"], true, "{name}");
            assert!(r["blocked_by"].as_str().unwrap().starts_with(name));
        }
        // The echo model repeats the key on the probe unless the text hijacks it, so
        // known_answer blocks cases, and input_filter sends nothing for blocked ones.
        if *name == "input_filter" {
            let preds = jsonl(&dir.join("predictions.jsonl"));
            let blocked_ids: HashSet<&str> = blocked
                .iter()
                .map(|r| r["case_id"].as_str().unwrap())
                .collect();
            for p in preds
                .iter()
                .filter(|p| blocked_ids.contains(p["case_id"].as_str().unwrap()))
            {
                assert!(p["response_text"].is_null() && p["attempts"] == 0);
            }
        }
    }
}

#[test]
fn replay_runs_dry_run_and_the_catalogue() {
    let server = ChatServer::always(Action::Answer);
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), &server.base_url(), "", "");
    let out = run(pieval().arg("run").arg(&cfg).env(KEY_ENV, SECRET));
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("attack success"), "{}", out.stdout);
    let results = tmp.path().join("results");
    let first = only_run(&results);
    let first_id = first.file_name().unwrap().to_str().unwrap().to_owned();

    // A replay-provider run from the first run's predictions: same responses.
    let replay_cfg = tmp.path().join("replay.yaml");
    std::fs::write(
        &replay_cfg,
        std::fs::read_to_string(&cfg).unwrap().replace(
            "  provider: openai",
            &format!("  provider: replay\n  replay_from: {first_id}\n  execution_mode: replay"),
        ),
    )
    .unwrap();
    let out = run(pieval().arg("run").arg(&replay_cfg).arg("--json"));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let second: Value = serde_json::from_str(&out.stdout).unwrap();
    let second_id = second["run_id"].as_str().unwrap().to_owned();
    let responses = |id: &str| -> HashMap<String, Value> {
        jsonl(&results.join(id).join("case_results.jsonl"))
            .into_iter()
            .map(|r| {
                (
                    r["case_id"].as_str().unwrap().to_owned(),
                    r["response_text"].clone(),
                )
            })
            .collect()
    };
    assert_eq!(responses(&first_id), responses(&second_id));

    // diff: identical outcomes, no regression.
    let out = run(pieval()
        .args([
            "runs",
            "diff",
            &first_id,
            &second_id,
            "--fail-on-regression",
            "--json",
            "--results",
        ])
        .arg(&results));
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let d: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(d["became_successful"], 0);
    assert_eq!(d["regression"], false);

    // A defended run (input_filter) against the undefended one: flips listed.
    let defended = tmp.path().join("defended.yaml");
    std::fs::write(
        &defended,
        std::fs::read_to_string(&cfg).unwrap().replace(
            "mitigation: {name: none}",
            "mitigation: {name: input_filter}",
        ),
    )
    .unwrap();
    let out = run(pieval()
        .arg("run")
        .arg(&defended)
        .arg("--json")
        .env(KEY_ENV, SECRET));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let third: Value = serde_json::from_str(&out.stdout).unwrap();
    let third_id = third["run_id"].as_str().unwrap();
    let out = run(pieval()
        .args(["runs", "diff", &first_id, third_id, "--results"])
        .arg(&results));
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("stopped succeeding"), "{}", out.stdout);
    let d: Value = serde_json::from_str(
        &run(pieval()
            .args(["runs", "diff", &first_id, third_id, "--json", "--results"])
            .arg(&results))
        .stdout,
    )
    .unwrap();
    assert!(d["became_unsuccessful"].as_u64().unwrap() > 0);
    // The other direction is a regression when significant; the exit code says so.
    let back = run(pieval()
        .args([
            "runs",
            "diff",
            third_id,
            &first_id,
            "--fail-on-regression",
            "--json",
            "--results",
        ])
        .arg(&results));
    let d: Value = serde_json::from_str(&back.stdout).unwrap();
    assert_eq!(back.code, if d["regression"] == true { 1 } else { 0 });

    // list / show
    let out = run(pieval()
        .args(["runs", "list", "--json", "--results"])
        .arg(&results));
    let runs: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(runs.as_array().unwrap().len(), 3);
    assert!(
        runs.as_array()
            .unwrap()
            .iter()
            .all(|r| r["status"] == "completed")
    );
    let out = run(pieval()
        .args(["runs", "show", &first_id, "--results"])
        .arg(&results));
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("attack_success_rate"), "{}", out.stdout);

    // pieval replay: same selection, new run; --rescore in place.
    // The run's endpoint came with the run folder: replay refuses it until confirmed.
    let refused = run(pieval()
        .args(["replay", &first_id, "--json", "--results"])
        .arg(&results)
        .env(KEY_ENV, SECRET));
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("--trust-endpoint") && refused.stderr.contains(KEY_ENV),
        "{}",
        refused.stderr
    );
    let out = run(pieval()
        .args(["replay", &first_id, "--json", "--trust-paths", "--results"])
        .arg(&results)
        .args(["--trust-endpoint", &server.base_url()])
        .env(KEY_ENV, SECRET));
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let replayed: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_ne!(replayed["run_id"], first_id);
    let ids = |id: &str| -> Value {
        let m: Value = serde_json::from_str(
            &std::fs::read_to_string(results.join(id).join("manifest.json")).unwrap(),
        )
        .unwrap();
        m["dataset_snapshot"]["selected_case_ids"].clone()
    };
    assert_eq!(ids(&first_id), ids(replayed["run_id"].as_str().unwrap()));
    let out = run(pieval()
        .args(["replay", &first_id, "--rescore", "--json", "--results"])
        .arg(&results));
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(responses(&first_id).len(), 40);
    assert_no_secret(tmp.path());

    // Dry run: requests rendered, nothing called.
    let before = server.log.lock().unwrap().requests;
    let out = run(pieval().arg("run").arg(&cfg).args(["--dry-run", "--json"]));
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(server.log.lock().unwrap().requests, before);
    let d: Value = serde_json::from_str(&out.stdout).unwrap();
    let preds = jsonl(
        &results
            .join(d["run_id"].as_str().unwrap())
            .join("predictions.jsonl"),
    );
    assert_eq!(preds.len(), 40);
    assert!(
        preds
            .iter()
            .all(|p| p["execution_mode"] == "dry_run" && p["request_prompt"].is_string())
    );
}

#[test]
fn selection_is_seeded_and_pinned() {
    use pieval::experiment::config::Selection;
    use pieval::experiment::selection::select;
    let corpus =
        pieval::runner::load_cases(&repo("data/normalized/attack_cases.enriched.jsonl")).unwrap();
    let sel = Selection {
        stratify_by: vec!["attack_surface".into()],
        ..Selection::default()
    };
    let a = select(&corpus.cases, &sel, 7, Some(12)).unwrap();
    let b = select(&corpus.cases, &sel, 7, Some(12)).unwrap();
    let c = select(&corpus.cases, &sel, 8, Some(12)).unwrap();
    assert_eq!(a.selected_case_ids, b.selected_case_ids);
    assert_ne!(a.selected_case_ids, c.selected_case_ids);
    // Every surface is represented (9 surfaces, 12 cases).
    assert_eq!(a.strata.len(), 9);
    assert!(a.strata.values().all(|s| s.selected >= 1));
    // Pinned: the algorithm must not drift (docs/config.md documents it).
    insta::assert_json_snapshot!("selection_seed7_n12", a.selected_case_ids);
    // Filters.
    let mut f = Selection::default();
    f.include
        .insert("attack_surface".into(), vec!["email".into()]);
    f.exclude.insert("label".into(), vec!["benign".into()]);
    let s = select(&corpus.cases, &f, 1, None).unwrap();
    assert!(s.total_filtered_cases > 0);
    for i in &s.indexes {
        assert_eq!(corpus.cases[*i].attack_surface.as_str(), "email");
        assert!(!corpus.cases[*i].is_benign());
    }
    let bad = Selection {
        case_ids: vec!["no-such-case".into()],
        ..Selection::default()
    };
    let e = select(&corpus.cases, &bad, 1, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no-such-case"), "{e}");
}

#[test]
fn bad_configs_are_located() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("bad.yaml");
    std::fs::write(
        &p,
        "experiment: {name: x}\ndataset: {path: a.jsonl}\nmodel:\n  provider: openai\n  nme: m\n",
    )
    .unwrap();
    let out = run(pieval().arg("run").arg(&p));
    assert_eq!(out.code, 2);
    assert!(out.stderr.contains("bad.yaml:5: model"), "{}", out.stderr);
    assert!(out.stderr.contains("did you mean `name`"), "{}", out.stderr);
    std::fs::write(&p, "experiment: {name: x\n").unwrap();
    let out = run(pieval().arg("run").arg(&p));
    assert_eq!(out.code, 2);
    assert!(out.stderr.contains("bad.yaml:"), "{}", out.stderr);
    std::fs::write(&p, [0xffu8, 0xfe, b'\n']).unwrap();
    let out = run(pieval().arg("run").arg(&p));
    assert_eq!(out.code, 2);
    assert!(out.stderr.contains("not valid UTF-8"), "{}", out.stderr);
}
