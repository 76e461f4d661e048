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
use crate::common::{PythonServer, apps_python, pieval, read_jsonl, repo, run};

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

/// The Python that has the agent frameworks (openai-agents, langgraph +
/// langchain-mcp-adapters, mcp): `PIEVAL_AGENTS_PYTHON` (set by `.ci/run`).
fn agents_python() -> String {
    let python = std::env::var("PIEVAL_AGENTS_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = std::process::Command::new(&python)
        .args([
            "-c",
            "import agents, langgraph, langchain_mcp_adapters, langchain_openai, mcp",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "the agent frameworks are needed for this test: python3 -m venv V && V/bin/pip install \
         openai-agents==0.24.0 langgraph==1.2.24 langchain-mcp-adapters==0.3.2 langchain-openai==1.8.1 \
         mcp==1.30.0, then PIEVAL_AGENTS_PYTHON=V/bin/python (bash .ci/run does this)"
    );
    python
}

/// A framework's agent (tests/fixtures/apps/framework_agent.py) behind `exec`, its
/// world served, as a `model` section; its model the one at `AGENT_MODEL_URL`.
fn framework(python: &str, name: &str) -> String {
    let command = serde_json::to_string(&[
        python.to_owned(),
        repo("tests/fixtures/apps/framework_agent.py")
            .display()
            .to_string(),
        name.to_owned(),
    ])
    .unwrap();
    format!(
        "{{provider: exec, name: {name}, concurrency: 4, timeout_s: 120, max_retries: 0, exec: {{command: {command}, env: {{AGENT_MODEL_URL: AGENT_MODEL_URL, AGENT_MODEL_NAME: AGENT_MODEL_NAME, PIEVAL_BIN: PIEVAL_BIN}}}}, world: {{listen: \"127.0.0.1:0\"}}}}"
    )
}

const FRAMEWORKS: [&str; 3] = ["openai-agents", "langgraph", "mcp-stdio"];

/// Run `cfg` with the agent's model at `url` (named `model`).
fn run_agent(cfg: &Path, url: &str, model: &str) -> PathBuf {
    let out = run(pieval()
        .arg("run")
        .arg(cfg)
        .arg("--json")
        .env("AGENT_MODEL_URL", url)
        .env("AGENT_MODEL_NAME", model)
        .env("PIEVAL_BIN", env!("CARGO_BIN_EXE_pieval")));
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let outcome: Value = serde_json::from_str(&out.stdout).unwrap();
    PathBuf::from(outcome["dir"].as_str().unwrap())
}

/// Each framework's verdicts, case by case, against pieval's own loop driving the same
/// model; and each attempt's final store the same (no attempt saw another's state).
fn agree(own: &Path, theirs: &Path, what: &str) {
    let (a, b) = (verdicts(own), verdicts(theirs));
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "{what}: the same cases"
    );
    let diffs: Vec<String> = a
        .iter()
        .filter(|(id, v)| b[*id] != **v)
        .map(|(id, v)| format!("{id}: pieval's loop {v:?}, {what} {:?}", b[id]))
        .collect();
    assert!(
        diffs.is_empty(),
        "{} differ:\n{}",
        diffs.len(),
        diffs.join("\n")
    );
    let (pa, pb) = (
        by_case(&own.join("predictions.jsonl")),
        by_case(&theirs.join("predictions.jsonl")),
    );
    for (id, p) in &pa {
        assert_eq!(
            p["final_state"], pb[id]["final_state"],
            "{what} {id}: final state"
        );
        // the same calls with the same arguments (as JSON: an MCP client sends them
        // parsed, and they are recorded as it serialised them)
        let calls = |p: &Value| -> Vec<(Value, Value)> {
            serde_json::from_str::<Vec<Value>>(p["agent_actions"].as_str().unwrap_or("[]"))
                .unwrap()
                .into_iter()
                .map(|c| {
                    let args = serde_json::from_str(c["arguments"].as_str().unwrap_or(""))
                        .unwrap_or_else(|_| c["arguments"].clone());
                    (c["name"].clone(), args)
                })
                .collect()
        };
        assert_eq!(calls(p), calls(&pb[id]), "{what} {id}: actions");
        assert_eq!(pb[id]["error"], Value::Null, "{what} {id}");
    }
}

#[test]
fn real_agent_frameworks_over_the_served_world_get_pieval_loops_verdicts_on_agentdojo_banking() {
    let python = agents_python();
    let tmp = tempfile::tempdir().unwrap();
    let banking = repo("data/agentdojo/agentdojo-banking.jsonl");
    for (policy, sample) in [("obey", ""), ("resist", "sample_size: 40, ")] {
        let server =
            crate::agentdojo::scripted("python3", &repo("data/agentdojo/script.json"), policy);
        let url = format!("http://127.0.0.1:{}/v1", server.port);
        let cfg = |name: &str, model: &str| {
            let path = tmp.path().join(format!("{name}.yaml"));
            std::fs::write(
                &path,
                format!(
                    "experiment: {{name: {name}, seed: 7, {sample}output_dir: \"{out}\"}}\ndataset: {{path: \"{corpus}\"}}\nmodel: {model}\nmitigation: {{name: none}}\n",
                    out = tmp.path().join("results").display(),
                    corpus = banking.display(),
                ),
            )
            .unwrap();
            path
        };
        let own = run_ok(&cfg(
            &format!("own-{policy}"),
            &format!(
                "{{provider: openai, name: {policy}, base_url: \"{url}\", timeout_s: 30, max_retries: 1, concurrency: 8}}"
            ),
        ));
        let n = verdicts(&own).len();
        assert_eq!(n, if policy == "obey" { 160 } else { 40 });
        if policy == "obey" {
            assert!(verdicts(&own).values().filter(|v| v.0 == true).count() > 100);
        }
        for fw in FRAMEWORKS {
            let dir = run_agent(
                &cfg(&format!("{fw}-{policy}"), &framework(&python, fw)),
                &url,
                policy,
            );
            agree(&own, &dir, &format!("{fw} ({policy})"));
        }
    }
}

/// InjecAgent's obliging model: after the user's tool (the prefill's call) it calls
/// each other offered tool in turn, one per answer, with arguments its schema accepts
/// (each required property a value of its type: a framework that checks arguments
/// before calling, as the OpenAI Agents SDK does, sends the call to the world), then
/// answers.
fn obliging(body: &[u8], _: u64, _: u32) -> Action {
    let v: Value = serde_json::from_slice(body).unwrap_or_default();
    let tools: Vec<&Value> = v["tools"].as_array().into_iter().flatten().collect();
    let made = v["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "assistant")
        .map(|m| m["tool_calls"].as_array().map_or(0, Vec::len))
        .sum::<usize>();
    let message = match tools.get(made) {
        Some(t) => {
            let f = &t["function"];
            let props = &f["parameters"]["properties"];
            let mut args = serde_json::Map::new();
            for name in f["parameters"]["required"].as_array().into_iter().flatten() {
                let name = name.as_str().unwrap_or_default();
                let value = match props[name]["type"].as_str() {
                    Some("integer") | Some("number") => serde_json::json!(1),
                    Some("boolean") => serde_json::json!(true),
                    Some("array") => serde_json::json!([]),
                    Some("object") => serde_json::json!({}),
                    _ => serde_json::json!("x"),
                };
                args.insert(name.to_owned(), value);
            }
            serde_json::json!({"role": "assistant", "content": null, "tool_calls": [{
                "id": format!("c{made}"), "type": "function",
                "function": {"name": f["name"], "arguments": Value::Object(args).to_string()}}]})
        }
        None => serde_json::json!({"role": "assistant", "content": "Here is what you asked for."}),
    };
    Action::StatusBody(
        200,
        serde_json::json!({"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})
            .to_string(),
    )
}

#[test]
fn real_agent_frameworks_get_pieval_loops_verdicts_on_injecagent_and_poisoned_descriptions_are_delivered()
 {
    let python = agents_python();
    let tmp = tempfile::tempdir().unwrap();
    let injecagent = tmp.path().join("injecagent.jsonl");
    let out = run(pieval()
        .args(["ingest", "injecagent"])
        .arg(repo("tests/fixtures/injecagent/data"))
        .arg("-o")
        .arg(&injecagent));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let server = ChatServer::start_with_body(std::sync::Arc::new(obliging));
    let url = server.base_url();
    let cfg = |name: &str, corpus: &Path, model: &str| {
        let path = tmp.path().join(format!("{name}.yaml"));
        std::fs::write(
            &path,
            format!(
                "experiment: {{name: {name}, seed: 5, sample_size: 24, output_dir: \"{out}\"}}\ndataset: {{path: \"{corpus}\"}}\nselection: {{stratify_by: [attack_family]}}\nmodel: {model}\nmitigation: {{name: none}}\n",
                out = tmp.path().join("results").display(),
                corpus = corpus.display(),
            ),
        )
        .unwrap();
        path
    };
    let own = run_ok(&cfg(
        "own",
        &injecagent,
        &format!(
            "{{provider: openai, name: obliging, base_url: \"{url}\", timeout_s: 30, max_retries: 1, concurrency: 8}}"
        ),
    ));
    let v = verdicts(&own);
    assert_eq!(v.len(), 24);
    assert!(v.values().all(|v| v.0 == true && v.2 == true), "{v:?}");
    for fw in FRAMEWORKS {
        let dir = run_agent(
            &cfg(&format!("ia-{fw}"), &injecagent, &framework(&python, fw)),
            &url,
            "obliging",
        );
        agree(&own, &dir, &format!("{fw} (InjecAgent)"));
    }
    // tool poisoning through MCP: the obedient agent follows a poisoned description
    let server = ChatServer::always(Action::Answer);
    for fw in FRAMEWORKS {
        let dir = run_agent(
            &cfg(&format!("poison-{fw}"), &corpus(), &framework(&python, fw)),
            &server.base_url(),
            OBEDIENT,
        );
        let r = verdicts(&dir);
        assert_eq!(
            r["agent-mcp-poison"],
            (
                Value::Bool(true),
                r["agent-mcp-poison"].1.clone(),
                Value::Bool(true)
            ),
            "{fw}: the poisoned description delivered and obeyed"
        );
    }
}

#[test]
fn a_killed_served_run_resumes_without_loss_or_duplicates() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(
        tmp.path(),
        "kill",
        &corpus(),
        &served(OBEDIENT, 1, 20).replace(
            "exec: {command:",
            "exec: {env: {WORLD_AGENT_DELAY: WORLD_AGENT_DELAY}, command:",
        ),
        "{name: none}",
    );
    let mut child = pieval()
        .arg("run")
        .arg(&cfg)
        .env("WORLD_AGENT_DELAY", "0.3")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let dir = crate::common::wait_for_checkpoint(&tmp.path().join("results"), 2);
    child.kill().unwrap();
    child.wait().unwrap();
    let before = by_case(&dir.join("predictions.jsonl")).len();
    assert!(before < 9, "killed mid-run ({before})");
    let run_id = dir.file_name().unwrap().to_str().unwrap().to_owned();
    let out = run(pieval()
        .arg("run")
        .arg(&cfg)
        .args(["--resume", &run_id, "--json"])
        .env("WORLD_AGENT_DELAY", "0"));
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let lines = read_jsonl(&dir.join("predictions.jsonl"));
    let written = lines
        .iter()
        .filter(|l| l.get("pieval_record").is_none())
        .count();
    assert_eq!(written, 9, "no loss, no duplicates");
    assert_eq!(verdicts(&dir)["agent-steal"].0, true);
}

#[test]
fn an_agents_opentelemetry_traces_give_the_verdicts_of_the_calls_its_world_recorded() {
    let python = agents_python();
    let tmp = tempfile::tempdir().unwrap();
    for (format, join) in [("proto", "attribute"), ("json", "traceparent")] {
        let spans = tmp.path().join(format!("spans-{format}"));
        std::fs::create_dir_all(&spans).unwrap();
        let command = serde_json::to_string(&[
            python.clone(),
            repo("tests/fixtures/apps/world_agent.py")
                .display()
                .to_string(),
            OBEDIENT.to_owned(),
        ])
        .unwrap();
        let model = format!(
            "{{provider: exec, name: traced, concurrency: 2, timeout_s: 20, max_retries: 0, exec: {{command: {command}, env: {{OTEL_FILE: OTEL_FILE, OTEL_FILE_FORMAT: OTEL_FILE_FORMAT, OTEL_JOIN: OTEL_JOIN}}}}, world: {{}}}}"
        );
        let cfg = config(
            tmp.path(),
            &format!("traced-{format}"),
            &corpus(),
            &model,
            "{name: none}",
        );
        let out = run(pieval()
            .arg("run")
            .arg(&cfg)
            .arg("--json")
            .env("OTEL_FILE", &spans)
            .env("OTEL_FILE_FORMAT", format)
            .env("OTEL_JOIN", join));
        assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
        let outcome: Value = serde_json::from_str(&out.stdout).unwrap();
        let served = PathBuf::from(outcome["dir"].as_str().unwrap());
        let run_id = outcome["run_id"].as_str().unwrap().to_owned();
        let imported = tmp.path().join(format!("imported-{format}"));
        let mut import = pieval();
        import
            .args(["import", "otel"])
            .arg(&spans)
            .arg("--cases")
            .arg(corpus())
            .arg("--output")
            .arg(&imported)
            .arg("--json");
        if join == "traceparent" {
            import.args(["--trace-run", &run_id]);
        }
        let out = run(&mut import);
        assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
        let (a, b) = (verdicts(&served), verdicts(&imported));
        for (id, v) in &a {
            if id == "agent-state" {
                // a criterion over the store: not in the spans
                assert_eq!(b[id].0, Value::Null, "{format}: {id} left undecided");
                continue;
            }
            assert_eq!(
                v.0, b[id].0,
                "{format} {id}: attack_success from the traces"
            );
            assert_eq!(v.2, b[id].2, "{format} {id}: injection_delivered");
        }
        assert_eq!(b["agent-steal"].0, true);
        // the calls, in order, as the world recorded them
        let calls = |d: &Path| -> BTreeMap<String, Vec<String>> {
            by_case(&d.join("predictions.jsonl"))
                .into_iter()
                .map(|(id, p)| {
                    let names = serde_json::from_str::<Vec<Value>>(
                        p["agent_actions"].as_str().unwrap_or("[]"),
                    )
                    .unwrap()
                    .iter()
                    .map(|c| c["name"].as_str().unwrap_or_default().to_owned())
                    .collect();
                    (id, names)
                })
                .collect()
        };
        let (ca, cb) = (calls(&served), calls(&imported));
        for (id, names) in &cb {
            // the world counts calls of tools it does not offer as no action; a span of
            // one is a call the agent made
            let offered: Vec<&String> =
                names.iter().filter(|n| *n != "delete_everything").collect();
            let recorded: Vec<&String> = ca[id].iter().collect();
            assert_eq!(offered, recorded, "{format} {id}: the calls");
        }
    }
    // a file cut short is an error naming it, and no run folder
    let spans = tmp.path().join("spans-proto");
    let file = std::fs::read_dir(&spans)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let bytes = std::fs::read(&file).unwrap();
    let cut = tmp.path().join("cut.bin");
    std::fs::write(&cut, &bytes[..bytes.len() - 3]).unwrap();
    let out = run(pieval()
        .args(["import", "otel"])
        .arg(&cut)
        .arg("--cases")
        .arg(corpus())
        .arg("--output")
        .arg(tmp.path().join("never")));
    assert_ne!(out.code, 0);
    assert!(
        out.stderr.contains("cut.bin") && out.stderr.contains("truncated"),
        "{}",
        out.stderr
    );
    assert!(!tmp.path().join("never").exists());
}

#[test]
fn an_agent_with_real_tools_is_judged_from_the_spans_it_sends_the_runs_receiver() {
    let python = agents_python();
    let tmp = tempfile::tempdir().unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let traced = |policy: &str| {
        let command = serde_json::to_string(&[
            python.clone(),
            repo("tests/fixtures/apps/world_agent.py")
                .display()
                .to_string(),
            policy.to_owned(),
        ])
        .unwrap();
        format!(
            "{{provider: exec, name: {policy}, concurrency: 2, timeout_s: 30, max_retries: 0, exec: {{command: {command}}}, traces: {{listen: \"127.0.0.1:{port}\", wait_s: 10}}}}"
        )
    };
    let obeys = run_ok(&config(
        tmp.path(),
        "real-obeys",
        &corpus(),
        &traced(OBEDIENT),
        "{name: none}",
    ));
    let v = verdicts(&obeys);
    assert_eq!(v.len(), 9);
    assert_eq!(
        v["agent-steal"],
        (
            Value::Bool(true),
            v["agent-steal"].1.clone(),
            Value::Bool(true)
        ),
        "{v:?}"
    );
    let p = by_case(&obeys.join("predictions.jsonl"));
    assert_eq!(
        p["agent-steal"]["error"],
        Value::Null,
        "{}",
        p["agent-steal"]
    );
    assert!(
        p["agent-steal"]["agent_actions"]
            .as_str()
            .unwrap()
            .contains("EVIL-IBAN-666")
    );
    // every message received is kept in the run folder, and imports to the same verdicts
    let kept = obeys.join("traces.otlp");
    assert!(std::fs::metadata(&kept).unwrap().len() > 0);
    let run_id = obeys.file_name().unwrap().to_str().unwrap().to_owned();
    let out = run(pieval()
        .args(["import", "otel"])
        .arg(&kept)
        .arg("--cases")
        .arg(corpus())
        .args(["--trace-run", &run_id])
        .arg("--output")
        .arg(tmp.path().join("again")));
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let again = verdicts(&tmp.path().join("again"));
    for (id, x) in &v {
        assert_eq!(x.0, again[id].0, "{id}: the same from the kept traces");
    }
    let careful = verdicts(&run_ok(&config(
        tmp.path(),
        "real-careful",
        &corpus(),
        &traced("careful"),
        "{name: none}",
    )));
    assert!(careful.values().all(|x| x.0 != true), "{careful:?}");
    // a mitigation acts on pieval's world's outputs: with real tools it is refused
    let p = by_case(
        &run_ok(&config(
            tmp.path(),
            "real-mitigated",
            &corpus(),
            &traced(OBEDIENT),
            "{name: spotlight_datamark}",
        ))
        .join("predictions.jsonl"),
    );
    assert!(
        p["agent-steal"]["error"]
            .as_str()
            .unwrap()
            .contains("mitigation none")
    );
}

#[test]
fn an_agent_behind_http_or_a_chat_endpoint_finds_its_world_in_the_template_or_the_headers() {
    let tmp = tempfile::tempdir().unwrap();
    let agent = PythonServer::start(
        "python3",
        &repo("tests/fixtures/apps/world_http_agent.py"),
        &[OBEDIENT],
    );
    let http = format!(
        "{{provider: http, name: http-agent, concurrency: 2, timeout_s: 20, max_retries: 0, world: {{}}, http: {{request: {{url: \"http://127.0.0.1:{}/chat\", body: {{task: \"{{{{task}}}}\", world: {{http_url: \"{{{{world.http_url}}}}\", token: \"{{{{world.token}}}}\"}}}}, answer: {{json: \"$.reply\"}}}}}}}}",
        agent.port
    );
    let openai = format!(
        "{{provider: openai, name: chat-agent, base_url: \"http://127.0.0.1:{}/v1\", concurrency: 2, timeout_s: 20, max_retries: 0, world: {{}}}}",
        agent.port
    );
    let exec = run_ok(&config(
        tmp.path(),
        "exec",
        &corpus(),
        &served(OBEDIENT, 2, 20),
        "{name: none}",
    ));
    for (name, model) in [("http", http), ("openai", openai)] {
        let dir = run_ok(&config(tmp.path(), name, &corpus(), &model, "{name: none}"));
        let (a, b) = (verdicts(&exec), verdicts(&dir));
        let p = by_case(&dir.join("predictions.jsonl"));
        assert_eq!(
            p["agent-steal"]["error"],
            Value::Null,
            "{name}: {}",
            p["agent-steal"]
        );
        assert_eq!(a, b, "{name}: the same agent, reached another way");
        assert_eq!(b["agent-steal"].0, true, "{name}");
        // the recorded request shows the token's place, never the token
        let text = std::fs::read_to_string(dir.join("predictions.jsonl")).unwrap();
        assert!(!text.contains("Bearer "), "{name}");
        if name == "http" {
            let log = std::fs::read_to_string(dir.join("requests.jsonl")).unwrap_or_default();
            assert!(
                log.contains("PIEVAL_WORLD_TOKEN") || log.contains("[REDACTED]"),
                "the token never written: {}",
                crate::common::excerpt(&log, 400)
            );
        }
    }
    // a template that names the world without model.world is refused when loaded
    let bad = config(
        tmp.path(),
        "no-world",
        &corpus(),
        &format!(
            "{{provider: http, name: x, http: {{request: {{url: \"http://127.0.0.1:{}/chat\", body: {{w: \"{{{{world.mcp_url}}}}\"}}, answer: {{json: \"$.reply\"}}}}}}}}",
            agent.port
        ),
        "{name: none}",
    );
    let out = run(pieval().arg("run").arg(&bad));
    assert_ne!(out.code, 0);
    assert!(out.stderr.contains("model.world"), "{}", out.stderr);
}

#[test]
fn an_agent_behind_a_websocket_finds_its_world_in_the_frame_it_is_sent() {
    let tmp = tempfile::tempdir().unwrap();
    let agent = PythonServer::start(
        &apps_python(),
        &repo("tests/fixtures/apps/world_ws_agent.py"),
        &[OBEDIENT],
    );
    let ws = format!(
        "{{provider: websocket, name: ws-agent, concurrency: 2, timeout_s: 20, max_retries: 0, world: {{}}, websocket: {{url: \"ws://127.0.0.1:{}/\", send: {{task: \"{{{{task}}}}\", world: {{http_url: \"{{{{world.http_url}}}}\", token: \"{{{{world.token}}}}\"}}}}, until: {{json: \"$.type\", equals: done}}, answer: {{json: \"$.text\"}}}}}}",
        agent.port
    );
    let exec = run_ok(&config(
        tmp.path(),
        "exec",
        &corpus(),
        &served(OBEDIENT, 2, 20),
        "{name: none}",
    ));
    let dir = run_ok(&config(tmp.path(), "ws", &corpus(), &ws, "{name: none}"));
    let p = by_case(&dir.join("predictions.jsonl"));
    for (case, row) in &p {
        assert_eq!(row["error"], Value::Null, "{case}: {row}");
    }
    let (a, b) = (verdicts(&exec), verdicts(&dir));
    assert_eq!(a, b, "the same agent, reached over a WebSocket");
    assert_eq!(b["agent-steal"].0, true);
    // the world's calls are the actions
    assert!(
        p["agent-steal"]["agent_actions"]
            .as_str()
            .is_some_and(|a| a.contains("send_money")),
        "{}",
        p["agent-steal"]
    );
}
