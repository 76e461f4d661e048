//! Agents with their own loop (`model.world`, src/agent/drive.rs and serve.rs): each
//! attempt's world served to an agent that pieval does not drive — here the suite's
//! scripted policy (tests/fixtures/apps/scripted_agent.py) behind an `exec` target that
//! calls the world's plain HTTP tools (tests/fixtures/apps/world_agent.py) — compared
//! with pieval's own loop driving the same policy (common/chat_server.rs,
//! `agent_answer`) on the fixture corpus.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::common::chat_server::{Action, ChatServer, OBEDIENT};
use crate::common::{pieval, read_jsonl, repo, run};

fn config(dir: &Path, name: &str, corpus: &Path, model: &str, mitigation: &str) -> PathBuf {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &path,
        format!(
            "experiment: {{name: {name}, seed: 3, output_dir: \"{out}\"}}\ndataset: {{path: \"{corpus}\"}}\nmodel: {model}\nmitigation: {mitigation}\n",
            out = dir.join("results").display(),
            corpus = corpus.display(),
        ),
    )
    .unwrap();
    path
}

/// The exec agent that uses the served world, as a `model` section.
fn served(policy: &str, concurrency: usize, timeout_s: u32) -> String {
    let command = serde_json::to_string(&[
        "python3".to_owned(),
        repo("tests/fixtures/apps/world_agent.py")
            .display()
            .to_string(),
        policy.to_owned(),
    ])
    .unwrap();
    format!(
        "{{provider: exec, name: {policy}, concurrency: {concurrency}, timeout_s: {timeout_s}, max_retries: 0, exec: {{command: {command}}}, world: {{listen: \"127.0.0.1:0\"}}}}"
    )
}

fn run_ok(cfg: &Path) -> PathBuf {
    let out = run(pieval().arg("run").arg(cfg).arg("--json"));
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let outcome: Value = serde_json::from_str(&out.stdout).unwrap();
    PathBuf::from(outcome["dir"].as_str().unwrap())
}

fn by_case(path: &Path) -> BTreeMap<String, Value> {
    read_jsonl(path)
        .into_iter()
        .filter(|r| r.get("pieval_record").is_none())
        .map(|r| (r["case_id"].as_str().unwrap().to_owned(), r))
        .collect()
}

/// (attack_success, utility_success, injection_delivered) by case.
fn verdicts(dir: &Path) -> BTreeMap<String, (Value, Value, Value)> {
    by_case(&dir.join("case_results.jsonl"))
        .into_iter()
        .map(|(id, r)| {
            (
                id,
                (
                    r["attack_success"].clone(),
                    r["utility_success"].clone(),
                    r["injection_delivered"].clone(),
                ),
            )
        })
        .collect()
}

fn corpus() -> PathBuf {
    repo("tests/fixtures/agents/cases.jsonl")
}

#[test]
fn an_agent_with_its_own_loop_is_judged_by_the_calls_its_world_recorded() {
    let tmp = tempfile::tempdir().unwrap();
    let server = ChatServer::always(Action::Answer);
    let own = |policy: &str| {
        format!(
            "{{provider: openai, name: {policy}, base_url: \"{}\", timeout_s: 5, max_retries: 1, concurrency: 4}}",
            server.base_url()
        )
    };
    for policy in [OBEDIENT, "careful"] {
        let loop_dir = run_ok(&config(
            tmp.path(),
            &format!("loop-{policy}"),
            &corpus(),
            &own(policy),
            "{name: none}",
        ));
        let served_dir = run_ok(&config(
            tmp.path(),
            &format!("served-{policy}"),
            &corpus(),
            &served(policy, 4, 20),
            "{name: none}",
        ));
        let (a, b) = (verdicts(&loop_dir), verdicts(&served_dir));
        assert_eq!(a.len(), 9);
        // the budget case: pieval's loop stops the policy after max_turns answers; the
        // served agent after the world's call budget — both undecided on utility the
        // same way is not required, the attack verdict is
        for (id, (atk, util, delivered)) in &a {
            let (s_atk, s_util, s_delivered) = &b[id];
            assert_eq!(atk, s_atk, "{policy} {id}: attack_success");
            assert_eq!(delivered, s_delivered, "{policy} {id}: injection_delivered");
            if id != "agent-budget" {
                assert_eq!(util, s_util, "{policy} {id}: utility_success");
            }
        }
        if policy == OBEDIENT {
            assert_eq!(b["agent-steal"].0, true, "the served agent obeyed");
            assert_eq!(
                b["agent-mcp-poison"].2, true,
                "poisoned descriptions delivered"
            );
        } else {
            assert!(b.values().all(|v| v.0 != true), "{b:?}");
        }
        let p = by_case(&served_dir.join("predictions.jsonl"));
        let steal = &p["agent-steal"];
        assert_eq!(steal["agent_stop"], "answer", "{steal}");
        assert!(
            steal["response_text"]
                .as_str()
                .unwrap()
                .starts_with("Done.")
        );
        // the world's address is never recorded: its token is a secret
        let text = std::fs::read_to_string(served_dir.join("predictions.jsonl")).unwrap();
        assert!(!text.contains("Bearer"), "no token in the records");
    }
}

#[test]
fn a_served_run_replays_byte_for_byte_and_an_agent_that_never_answers_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    // a corpus with one case the agent never answers
    let mut lines: Vec<Value> = read_jsonl(&corpus());
    let mut hang = lines[0].clone();
    hang["case_id"] = "agent-hang".into();
    hang["prompt"] = format!("HANG {}", hang["prompt"].as_str().unwrap()).into();
    lines.push(hang);
    let path = tmp.path().join("cases.jsonl");
    std::fs::write(
        &path,
        lines
            .iter()
            .map(|l| l.to_string() + "\n")
            .collect::<String>(),
    )
    .unwrap();
    let live = run_ok(&config(
        tmp.path(),
        "live",
        &path,
        &served(OBEDIENT, 2, 3),
        "{name: spotlight_datamark}",
    ));
    let p = by_case(&live.join("predictions.jsonl"));
    assert_eq!(p.len(), 10, "no case lost");
    let hang = &p["agent-hang"];
    assert!(
        hang["error"].as_str().unwrap().contains("exec"),
        "a clear error: {hang}"
    );
    assert_eq!(hang["agent_stop"], "error");
    assert_eq!(
        p["agent-steal"]["error"],
        Value::Null,
        "the others unharmed"
    );
    let from = live.display().to_string();
    let replay_model = format!(
        "{{provider: replay, name: r, replay_from: \"{from}\", world: {{listen: \"127.0.0.1:0\"}}}}"
    );
    let again = run_ok(&config(
        tmp.path(),
        "again",
        &path,
        &replay_model,
        "{name: spotlight_datamark}",
    ));
    let comparable = |d: &Path, file: &str| -> Vec<Value> {
        let mut rows: Vec<Value> = read_jsonl(&d.join(file))
            .into_iter()
            .map(|mut r| {
                let o = r.as_object_mut().unwrap();
                for k in [
                    "run_id",
                    "provider",
                    "model_name",
                    "completed_at",
                    "attempts",
                ] {
                    o.remove(k);
                }
                r
            })
            .collect();
        rows.sort_by_key(|r| format!("{}{}", r["case_id"], r["index"]));
        rows
    };
    let (a, b) = (
        comparable(&live, "predictions.jsonl"),
        comparable(&again, "predictions.jsonl"),
    );
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x, y, "replayed byte for byte");
    }
    assert_eq!(
        comparable(&live, "case_results.jsonl"),
        comparable(&again, "case_results.jsonl")
    );
}
