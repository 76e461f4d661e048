//! Application targets (`provider: http`, issue 53) against a real application started
//! here: the RAG service of `tests/fixtures/apps/rag_app.py` (FastAPI + uvicorn, a
//! knowledge base in SQLite FTS5, its answers from the suite's scripted chat server),
//! with log-in, document upload and delete, and a nested JSON answer. Each case's payload
//! is planted as a document, the case's task asked, the document removed; the service's
//! own log (whether the planted document was retrieved and obeyed) is compared with
//! pieval's verdicts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::chat_server::{Action, ChatServer, attacker_script};
use crate::common::webdriver::free_port;
use crate::common::{apps_python, holds_secret, pieval, read_jsonl, readable_files, repo, run};

const PASSWORD: &str = "rag-app-password-7f3a9c";

struct App {
    child: Child,
    port: u16,
    log: PathBuf,
    _chat: ChatServer,
}

impl Drop for App {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl App {
    fn start(dir: &Path, extra: &[&str]) -> App {
        Self::start_with(dir, extra, ChatServer::always(Action::Answer))
    }

    /// The app, its model the given chat server.
    fn start_with(dir: &Path, extra: &[&str], chat: ChatServer) -> App {
        let port = free_port();
        let log = dir.join("app-log.jsonl");
        let child = Command::new(apps_python())
            .arg(repo("tests/fixtures/apps/rag_app.py"))
            .args(["--port", &port.to_string(), "--chat-url", &chat.base_url()])
            .arg("--log")
            .arg(&log)
            .arg("--db")
            .arg(dir.join("kb.sqlite"))
            .args(extra)
            .env("RAG_APP_PASSWORD", PASSWORD)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the RAG app starts");
        let app = App {
            child,
            port,
            log,
            _chat: chat,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while app.documents().is_none() {
            assert!(Instant::now() < deadline, "the RAG app never answered");
            std::thread::sleep(Duration::from_millis(100));
        }
        app
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Documents in the knowledge base (every user's).
    fn documents(&self) -> Option<u64> {
        let out = Command::new("curl")
            .args(["-sf", &format!("{}/stats", self.url())])
            .output()
            .ok()?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        v["documents"].as_u64()
    }

    fn log(&self) -> Vec<serde_json::Value> {
        if self.log.exists() {
            read_jsonl(&self.log)
        } else {
            Vec::new()
        }
    }
}

/// An experiment against the app: indirect cases whose document is planted.
fn config(
    dir: &Path,
    app: &App,
    name: &str,
    n: usize,
    concurrency: usize,
    answer: &str,
) -> PathBuf {
    config_with(dir, app, name, n, concurrency, answer, "{{vars.doc_id}}")
}

/// The same, its teardown deleting at `teardown` (a path under /documents/).
fn config_with(
    dir: &Path,
    app: &App,
    name: &str,
    n: usize,
    concurrency: usize,
    answer: &str,
    teardown: &str,
) -> PathBuf {
    let url = app.url();
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &path,
        format!(
            r#"experiment: {{name: {name}, seed: 7, sample_size: {n}, output_dir: "{out}"}}
dataset: {{path: "{data}"}}
selection: {{include: {{attack_surface: [retrieved_document], success_definition_id: [target_string_emitted]}}}}
mitigation: {{name: none}}
model:
  provider: http
  name: rag-app
  concurrency: {concurrency}
  max_retries: 1
  timeout_s: 20
  http:
    delivery: planted
    secrets: {{password: RAG_APP_PASSWORD}}
    session:
      - name: login
        url: "{url}/login"
        body: {{user: "red-team-{{{{attempt_id}}}}", password: "{{{{secret.password}}}}"}}
        extract: {{token: {{json: "$.token", secret: true}}}}
    setup:
      - name: upload
        url: "{url}/documents"
        headers: {{Authorization: "Bearer {{{{vars.token}}}}"}}
        body: {{title: "{{{{case_id}}}}", text: "{{{{payload}}}}"}}
        extract: {{doc_id: {{json: "$.document.id"}}}}
    request:
      url: "{url}/chat"
      headers: {{Authorization: "Bearer {{{{vars.token}}}}"}}
      body: {{question: "{{{{prompt}}}}", conversation_id: "{{{{vars.conversation}}}}"}}
      answer: {{json: "{answer}"}}
      extract: {{conversation: {{json: "$.data.conversation_id"}}}}
    teardown:
      - name: delete
        method: DELETE
        url: "{url}/documents/{teardown}"
        headers: {{Authorization: "Bearer {{{{vars.token}}}}"}}
"#,
            teardown = teardown,
            out = dir.join("results").display(),
            data = repo("data/normalized/attack_cases.enriched.jsonl").display(),
        ),
    )
    .unwrap();
    path
}

fn run_folder(results: &Path) -> PathBuf {
    std::fs::read_dir(results)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.is_dir())
        .expect("a run folder")
}

#[test]
fn a_rag_service_attacked_through_planted_documents_agrees_with_its_own_log() {
    let dir = tempfile::tempdir().unwrap();
    let app = App::start(dir.path(), &[]);
    let cfg = config(dir.path(), &app, "rag", 12, 4, "$.data.answer");
    let r = run(pieval()
        .args(["run", "--json"])
        .arg(&cfg)
        .env("RAG_APP_PASSWORD", PASSWORD));
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("planted 12, removed 12"), "{}", r.stderr);
    assert_eq!(app.documents(), Some(0), "every plant is removed");
    let run_dir = run_folder(&dir.path().join("results"));
    let preds = read_jsonl(&run_dir.join("predictions.jsonl"));
    assert_eq!(preds.len(), 12);
    for p in &preds {
        assert!(p["error"].is_null(), "{p}");
        assert_eq!(p["removed"], true, "{p}");
        let planted: serde_json::Value =
            serde_json::from_str(p["planted"].as_str().unwrap()).unwrap();
        assert!(planted["doc_id"].is_string(), "{p}");
        // planted delivery: the document is not in the message, only the task
        assert!(
            !p["request_prompt"].as_str().unwrap().contains("PWNED"),
            "{p}"
        );
    }
    // the application's log, case by case, against pieval's verdicts
    let log = app.log();
    assert_eq!(log.len(), 12, "one question per case");
    let results = read_jsonl(&run_dir.join("case_results.jsonl"));
    let mut obeyed = 0;
    for l in &log {
        let titles = l["titles"].as_array().unwrap();
        assert_eq!(
            titles.len(),
            1,
            "each user sees only their own document: {l}"
        );
        let case = titles[0].as_str().unwrap();
        let verdict = results
            .iter()
            .find(|r| r["case_id"] == case)
            .unwrap_or_else(|| panic!("no result for {case}"));
        // the app knows pieval's PWNED-… targets; an answer that obeyed no planted
        // instruction is no success for pieval either (undecided when it echoes)
        assert_eq!(
            verdict["attack_success"] == true,
            l["obeyed"] == true,
            "{case}: pieval {verdict} / app {l}"
        );
        obeyed += usize::from(l["obeyed"] == true);
    }
    assert!(obeyed > 0, "the gullible model obeys planted documents");
    // every request recorded as sent, credentials as their variable, replayable by curl
    let requests = read_jsonl(&run_dir.join("requests.jsonl"));
    assert_eq!(
        requests.len(),
        12 * 4,
        "login, upload, chat, delete per case"
    );
    let login = requests.iter().find(|q| q["step"] == "login").unwrap();
    assert!(
        login["body"]
            .as_str()
            .unwrap()
            .contains("${RAG_APP_PASSWORD}"),
        "{login}"
    );
    assert!(
        login["curl"]
            .as_str()
            .unwrap()
            .contains("\"${RAG_APP_PASSWORD}\""),
        "{login}"
    );
    let chat = requests.iter().find(|q| q["phase"] == "request").unwrap();
    assert!(
        chat["headers"].to_string().contains("Bearer ${TOKEN}"),
        "a session token is a credential: {chat}"
    );
    assert!(
        chat["curl"]
            .as_str()
            .unwrap()
            .contains("cookie: session='\"${COOKIE_SESSION}\""),
        "the jar's cookie is recorded as a variable: {chat}"
    );
    // the recorded curl command repeats the request, the password read from the
    // environment by the shell
    let again = Command::new("sh")
        .args(["-c", login["curl"].as_str().unwrap()])
        .env("RAG_APP_PASSWORD", PASSWORD)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&again.stdout).into_owned();
    assert!(text.contains("\"token\""), "{text}");
    // nothing holds the password
    for (path, text) in readable_files(&run_dir) {
        assert!(
            !holds_secret(&text, PASSWORD),
            "{} holds the password",
            path.display()
        );
    }
    assert!(!holds_secret(&r.stdout, PASSWORD) && !holds_secret(&r.stderr, PASSWORD));
}

/// Multi-turn attacks on an application with its own conversation memory: Crescendo's
/// turns are one conversation (the id the app returned is sent back on every turn); each
/// PAIR query is a fresh conversation, as the strategy sends it to a model.
#[test]
fn multi_turn_attacks_keep_or_start_the_applications_conversation_as_the_strategy_does() {
    let dir = tempfile::tempdir().unwrap();
    // the app's model and the attacker: the suite's scripted server (the attacker's third
    // prompt carries the objective's token; the gullible model yields to it)
    let chat = ChatServer::start_with_body(attacker_script(3));
    let attacker = format!(
        "{{provider: openai, name: attacker, base_url: \"{}\", api_key_env: ATTACKER_KEY, max_tokens: 512, timeout_s: 10, max_retries: 1, concurrency: 4}}",
        chat.base_url()
    );
    let app = App::start_with(dir.path(), &[], chat);
    let url = app.url();
    for strategy in ["crescendo", "pair"] {
        let before = app.log().len();
        let cfg = dir.path().join(format!("{strategy}.yaml"));
        std::fs::write(
            &cfg,
            format!(
                r#"experiment: {{name: {strategy}, seed: 7, output_dir: "{out}"}}
dataset: {{path: "{data}"}}
selection: {{case_ids: [syn-en-naive-emit_target-user_prompt-0, syn-en-naive-emit_target-email-0]}}
mitigation: {{name: none}}
attack: {{original: false, strategy: {strategy}, attacker: {attacker}, max_turns: 5}}
model:
  provider: http
  name: rag-app
  concurrency: 2
  timeout_s: 20
  http:
    secrets: {{password: RAG_APP_PASSWORD}}
    session:
      - name: login
        url: "{url}/login"
        body: {{user: "red-team-{{{{attempt_id}}}}", password: "{{{{secret.password}}}}"}}
        extract: {{token: {{json: "$.token", secret: true}}}}
    request:
      url: "{url}/chat"
      headers: {{Authorization: "Bearer {{{{vars.token}}}}"}}
      body: {{question: "{{{{prompt}}}}", conversation_id: "{{{{vars.conversation}}}}"}}
      answer: {{json: "$.data.answer"}}
      extract: {{conversation: {{json: "$.data.conversation_id"}}}}
"#,
                out = dir.path().join("results").display(),
                data = repo("data/normalized/attack_cases.enriched.jsonl").display(),
            ),
        )
        .unwrap();
        let r = run(pieval()
            .args(["run", "--json"])
            .arg(&cfg)
            .env("RAG_APP_PASSWORD", PASSWORD)
            .env("ATTACKER_KEY", "sk-attacker"));
        assert_eq!(r.code, 0, "{strategy}: {}\n{}", r.stdout, r.stderr);
        let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
        let run_dir = dir
            .path()
            .join("results")
            .join(v["run_id"].as_str().unwrap());
        let results = read_jsonl(&run_dir.join("case_results.jsonl"));
        assert_eq!(results.len(), 2, "{strategy}");
        for res in &results {
            assert_eq!(res["attack_success"], true, "{strategy}: {res}");
            assert_eq!(res["turns_used"], 3, "{strategy}: {res}");
        }
        // the app's log: three questions per attempt (one user each)
        let log: Vec<serde_json::Value> = app.log().split_off(before);
        assert_eq!(log.len(), 6, "{strategy}: {log:?}");
        let mut users: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
        for l in &log {
            users
                .entry(l["user"].as_str().unwrap().to_owned())
                .or_default()
                .push((
                    l["conversation"].as_str().unwrap().to_owned(),
                    l["question"].as_str().unwrap().to_owned(),
                ));
        }
        assert_eq!(users.len(), 2, "one user per attempt: {log:?}");
        for (user, turns) in &users {
            assert_eq!(turns.len(), 3, "{strategy} {user}: {turns:?}");
            assert!(
                turns[2].1.contains("PWNED"),
                "{strategy} {user}: the third question yields: {turns:?}"
            );
            let distinct: std::collections::BTreeSet<&String> =
                turns.iter().map(|(c, _)| c).collect();
            if strategy == "crescendo" {
                assert_eq!(distinct.len(), 1, "one conversation: {turns:?}");
            } else {
                assert_eq!(distinct.len(), 3, "a fresh conversation a query: {turns:?}");
            }
        }
    }
}

#[test]
fn failures_of_the_application_are_said_on_the_case_and_plants_still_removed() {
    let dir = tempfile::tempdir().unwrap();
    let app = App::start(dir.path(), &["--fail-every", "3"]);
    // a 500 every third question, and the answer looked for where it is not
    let cfg = config(dir.path(), &app, "faults", 9, 3, "$.data.nope");
    let r = run(pieval()
        .args(["run", "--json"])
        .arg(&cfg)
        .env("RAG_APP_PASSWORD", PASSWORD));
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    assert_eq!(app.documents(), Some(0), "every plant is removed");
    let run_dir = run_folder(&dir.path().join("results"));
    let preds = read_jsonl(&run_dir.join("predictions.jsonl"));
    assert_eq!(preds.len(), 9, "no case lost");
    let errors: Vec<&str> = preds.iter().map(|p| p["error"].as_str().unwrap()).collect();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("HTTP 500") && e.contains("request")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("$.data.nope matches nothing")),
        "{errors:?}"
    );
    assert!(preds.iter().all(|p| p["removed"] == true));
    // the password missing from the environment: refused before anything is sent
    let r = run(pieval()
        .args(["run"])
        .arg(&cfg)
        .env_remove("RAG_APP_PASSWORD"));
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("RAG_APP_PASSWORD"), "{}", r.stderr);
}

#[test]
fn a_killed_run_leaves_a_journal_that_cleanup_and_resume_complete() {
    let dir = tempfile::tempdir().unwrap();
    let app = App::start(dir.path(), &["--delay", "0.4"]);
    // removed by title: a plant whose setup the kill cut short (its id never said) is
    // removed too
    let cfg = config_with(
        dir.path(),
        &app,
        "killed",
        20,
        2,
        "$.data.answer",
        "by-title/{{case_id}}",
    );
    let results = dir.path().join("results");
    let mut child = pieval()
        .args(["run", "--json"])
        .arg(&cfg)
        .env("RAG_APP_PASSWORD", PASSWORD)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let run_dir = crate::common::wait_for_checkpoint(&results, 2);
    // kill -9 while attempts are planted
    let deadline = Instant::now() + Duration::from_secs(30);
    while app.documents().unwrap_or(0) == 0 {
        assert!(Instant::now() < deadline, "nothing was ever planted");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let left = app.documents().unwrap();
    let run_id = run_dir.file_name().unwrap().to_str().unwrap().to_owned();
    // `pieval cleanup` removes them, with the user's config and a fresh session
    let r = run(pieval()
        .arg("cleanup")
        .arg(&cfg)
        .args(["--run", &run_id])
        .env("RAG_APP_PASSWORD", PASSWORD));
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains(" 0 still planted"),
        "{left}: {}",
        r.stdout
    );
    assert_eq!(app.documents(), Some(0));
    // the run resumed: no case lost, none asked twice, nothing left
    let r = run(pieval()
        .args(["run", "--json", "--resume", &run_id])
        .arg(&cfg)
        .env("RAG_APP_PASSWORD", PASSWORD));
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    assert_eq!(app.documents(), Some(0));
    let preds = read_jsonl(&run_dir.join("predictions.jsonl"));
    let mut ids: Vec<&str> = preds
        .iter()
        .map(|p| p["case_id"].as_str().unwrap())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 20);
    assert_eq!(preds.len(), 20, "no case paid twice");
    let open = crate::common::read_jsonl(&run_dir.join("plants.jsonl"));
    let planting = open.iter().filter(|l| l["event"] == "planting").count();
    let removed = open.iter().filter(|l| l["event"] == "removed").count();
    assert_eq!(planting, removed, "every planting has its removal");
}

#[test]
fn bad_http_sections_are_refused_before_anything_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    let bad = |name: &str, http: &str| {
        let path = dir.path().join(format!("{name}.yaml"));
        std::fs::write(
            &path,
            format!(
                "experiment: {{name: {name}}}\ndataset: {{path: \"{}\"}}\nmitigation: {{name: none}}\nmodel:\n  provider: http\n  name: app\n  http:\n{http}",
                repo("data/normalized/attack_cases.enriched.jsonl").display()
            ),
        )
        .unwrap();
        let r = run(pieval().args(["run"]).arg(&path));
        assert_eq!(r.code, 2, "{}", r.stderr);
        r.stderr
    };
    let e = bad(
        "t",
        "    request: {url: \"http://127.0.0.1:9/x\", body: {q: \"{{promt}}\"}, answer: {body: true}}\n",
    );
    assert!(
        e.contains("model.http.request.body.q") && e.contains("did you mean `prompt`"),
        "{e}"
    );
    assert!(e.contains("t.yaml:"), "the file and line: {e}");
    let e = bad(
        "u",
        "    request: {url: \"http://127.0.0.1:9/x\", answer: {json: \"$[\"}}\n",
    );
    assert!(e.contains("model.http.request.answer.json"), "{e}");
    let e = bad(
        "v",
        "    secrets: {k: APP_KEY}\n    session: [{url: \"http://other.example/login\", body: {k: \"{{secret.k}}\"}}]\n    request: {url: \"http://127.0.0.1:9/x\", answer: {body: true}}\n",
    );
    assert!(e.contains("only to the request's origin"), "{e}");
    let e = bad(
        "w",
        "    delivery: planted\n    request: {url: \"http://127.0.0.1:9/x\", answer: {body: true}}\n",
    );
    assert!(e.contains("model.http.delivery"), "{e}");
}

/// An `exec` target: a Python function behind JSON lines, one process per slot.
/// `layout`: the model's concurrency and `exec.processes` (None: one per slot).
fn exec_config(
    dir: &Path,
    name: &str,
    n: usize,
    args: &[&str],
    layout: (usize, Option<usize>),
) -> PathBuf {
    let path = dir.join(format!("{name}.yaml"));
    let python = apps_python();
    let mut command = vec![
        python,
        repo("tests/fixtures/apps/exec_target.py")
            .display()
            .to_string(),
    ];
    // `LAUNCHER` first: started by a shell that stays its parent (as `uv run` or a
    // script without `exec` does)
    let (launcher, args) = match args.split_first() {
        Some((&LAUNCHER, rest)) => (true, rest),
        _ => (false, args),
    };
    if launcher {
        let sh = ["sh", "-c", "\"$0\" \"$@\"; exit $?"];
        command.splice(0..0, sh.iter().map(|s| s.to_string()));
    }
    command.extend(args.iter().map(|s| s.to_string()));
    std::fs::write(
        &path,
        format!(
            "experiment: {{name: {name}, seed: 7, sample_size: {n}, output_dir: \"{}\"}}\ndataset: {{path: \"{}\"}}\nselection: {{include: {{success_definition_id: [target_string_emitted]}}}}\nmitigation: {{name: none}}\nmodel:\n  provider: exec\n  name: chain\n  concurrency: {}\n  timeout_s: 5\n  exec:\n    command: {}\n    env: {{CHAIN_KEY: EXEC_TEST_KEY}}\n{}",
            dir.join("results").display(),
            repo("data/normalized/attack_cases.enriched.jsonl").display(),
            layout.0,
            serde_json::to_string(&command).unwrap(),
            layout
                .1
                .map_or(String::new(), |p| format!("    processes: {p}\n")),
        ),
    )
    .unwrap();
    path
}

const EXEC_KEY: &str = "chain-key-5d1e88b2a7";
/// An `exec_config` argument: the target started behind a shell that stays its parent.
const LAUNCHER: &str = "--behind-a-launcher";

/// Whether a process still runs (a zombie waiting for its parent does not).
fn running(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z'))
    })
}

#[test]
fn an_exec_target_wraps_a_python_function_and_survives_its_faults() {
    let dir = tempfile::tempdir().unwrap();
    // more processes than requests in flight: refused before anything starts
    let cfg = exec_config(dir.path(), "too-many", 8, &[], (2, Some(3)));
    let r = run(pieval().args(["run"]).arg(&cfg));
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("model.exec.processes") && r.stderr.contains("too-many.yaml:"),
        "{}",
        r.stderr
    );
    // a first run to learn which cases are drawn
    let cfg = exec_config(dir.path(), "plain", 8, &[], (2, None));
    let r = run(pieval()
        .args(["run", "--json"])
        .arg(&cfg)
        .env("EXEC_TEST_KEY", EXEC_KEY)
        .env("EXEC_TEST_LEAK", "must-not-pass"));
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let run_dir = run_folder(&dir.path().join("results"));
    let preds = read_jsonl(&run_dir.join("predictions.jsonl"));
    assert_eq!(preds.len(), 8);
    let ids: Vec<String> = preds
        .iter()
        .map(|p| p["case_id"].as_str().unwrap().to_owned())
        .collect();
    for p in &preds {
        let text = p["response_text"].as_str().unwrap();
        assert!(p["error"].is_null(), "{p}");
        assert!(
            !text.contains("ENV-LEAK"),
            "only the variables named are passed: {text}"
        );
        assert!(
            text.contains("KEY=[REDACTED]"),
            "the named variable reaches the child, and is redacted: {text}"
        );
    }
    for (path, text) in readable_files(&run_dir) {
        assert!(
            !holds_secret(&text, EXEC_KEY),
            "{} holds the key",
            path.display()
        );
    }
    // one process per slot, no more
    let started = exec_pids(&run_dir);
    assert!((1..=2).contains(&started.len()), "two slots, {started:?}");
    // a program that keeps running after its input ends does not hold the run, nor
    // outlives it behind its launcher
    std::fs::remove_dir_all(dir.path().join("results")).unwrap();
    let cfg = exec_config(dir.path(), "linger", 4, &[LAUNCHER, "--linger"], (2, None));
    let started = Instant::now();
    let r = run(pieval()
        .args(["run", "--json"])
        .arg(&cfg)
        .env("EXEC_TEST_KEY", EXEC_KEY));
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the run waited for its lingering processes: {:?}",
        started.elapsed()
    );
    let lingering = exec_pids(&run_folder(&dir.path().join("results")));
    assert!(!lingering.is_empty());
    for pid in &lingering {
        assert!(!running(pid), "{pid} outlived the run behind its launcher");
    }
    // the same cases, each fault on one of them: the case is an error, the rest answered
    // (their own answers); with a process per slot, and with one process given four
    // requests at once (pipelined: the requests queued behind a fault go to a new one)
    // (pipelined: the requests queued behind a fault go to a new one; the answers name
    // their requests, as pipelining requires). One process per slot, the answers need
    // not name their requests; then a line printed twice is caught when both come in
    // one write, and in two writes only when the answers carry request_id.
    for (layout, label) in [
        ((2, None), "per-slot"),
        ((2, None), "per-slot-named"),
        ((4, Some(1)), "pipelined"),
    ] {
        std::fs::remove_dir_all(dir.path().join("results")).unwrap();
        let named = label != "per-slot";
        let mut args = vec![
            "--die-on",
            &ids[0],
            "--hang-on",
            &ids[1],
            "--garbage-on",
            &ids[2],
            "--error-on",
            &ids[3],
            if named {
                "--two-lines-on"
            } else {
                "--two-lines-together-on"
            },
            &ids[4],
        ];
        if named {
            args.push("--name");
        }
        if label == "pipelined" {
            // behind a launcher: the hung program is killed with it
            args.insert(0, LAUNCHER);
        }
        let cfg = exec_config(dir.path(), &format!("faults-{label}"), 8, &args, layout);
        let r = run(pieval()
            .args(["run", "--json"])
            .arg(&cfg)
            .env("EXEC_TEST_KEY", EXEC_KEY));
        assert_eq!(r.code, 0, "{label}: {}\n{}", r.stdout, r.stderr);
        let run_dir = run_folder(&dir.path().join("results"));
        let preds = read_jsonl(&run_dir.join("predictions.jsonl"));
        assert_eq!(preds.len(), 8, "{label}: no case lost");
        let pred = |id: &str| preds.iter().find(|p| p["case_id"] == id).unwrap().clone();
        let error_of = |id: &str| pred(id)["error"].as_str().unwrap_or("").to_owned();
        let died = error_of(&ids[0]);
        assert!(
            died.contains("exited before it answered") && died.contains("the chain crashed"),
            "{label}: {died}"
        );
        assert!(
            error_of(&ids[1]).contains("no answer within 5 s"),
            "{label}: {}",
            error_of(&ids[1])
        );
        assert!(
            error_of(&ids[2]).contains("not a JSON line"),
            "{label}: {}",
            error_of(&ids[2])
        );
        assert!(
            error_of(&ids[3]).contains("the chain refused the input"),
            "{label}: {}",
            error_of(&ids[3])
        );
        // two lines for one request: the process is out of step and replaced; that case
        // is answered with its own first line or is the error, never another's answer
        let two = error_of(&ids[4]);
        assert!(
            two.is_empty() || two.contains("more than one line"),
            "{label}: {two}"
        );
        for id in &ids[4..] {
            let p = pred(id);
            if p["error"].is_null() {
                let text = p["response_text"].as_str().unwrap();
                assert!(
                    text.ends_with(&format!("CASE={id}")),
                    "{label}: {id} was given another request's answer: {text}"
                );
            } else {
                assert_eq!(
                    id, &ids[4],
                    "{label}: {id}: the restarted process answers the rest: {p}"
                );
            }
        }
        let log = std::fs::read_to_string(run_dir.join("exec-stderr.log")).unwrap();
        assert!(log.contains("the chain crashed"), "{label}: {log}");
        for pid in exec_pids(&run_dir) {
            assert!(!running(&pid), "{label}: {pid} outlived the run");
        }
    }
    // pipelined, the answers not naming their requests: none is believed
    std::fs::remove_dir_all(dir.path().join("results")).unwrap();
    let cfg = exec_config(dir.path(), "unnamed", 4, &[], (4, Some(1)));
    let r = run(pieval()
        .args(["run", "--json"])
        .arg(&cfg)
        .env("EXEC_TEST_KEY", EXEC_KEY));
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let preds = read_jsonl(&run_folder(&dir.path().join("results")).join("predictions.jsonl"));
    assert_eq!(preds.len(), 4);
    for p in &preds {
        assert!(
            p["error"]
                .as_str()
                .is_some_and(|e| e.contains("request_id")),
            "an unnamed pipelined answer is not believed: {p}"
        );
    }
    // pipelined on one process, each request taking 2 s of the 5 s timeout: the fourth
    // waits 6 s from when it was given, but the clock runs from when the process came to
    // it, so all are answered, by that one process
    std::fs::remove_dir_all(dir.path().join("results")).unwrap();
    let cfg = exec_config(
        dir.path(),
        "slow",
        4,
        &["--slow-on", "all", "--slow-s", "2", "--name"],
        (4, Some(1)),
    );
    let r = run(pieval()
        .args(["run", "--json"])
        .arg(&cfg)
        .env("EXEC_TEST_KEY", EXEC_KEY));
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let run_dir = run_folder(&dir.path().join("results"));
    let preds = read_jsonl(&run_dir.join("predictions.jsonl"));
    assert_eq!(preds.len(), 4);
    for p in &preds {
        let id = p["case_id"].as_str().unwrap();
        assert!(
            p["error"].is_null(),
            "timed from when the process came to it: {p}"
        );
        assert!(
            p["response_text"]
                .as_str()
                .unwrap()
                .ends_with(&format!("CASE={id}")),
            "{p}"
        );
    }
    assert_eq!(exec_pids(&run_dir).len(), 1, "processes: 1");
}

/// The processes that handled a run's requests (the pids the test target writes to
/// stderr, kept in the run's `exec-stderr.log`).
fn exec_pids(run_dir: &Path) -> std::collections::BTreeSet<String> {
    std::fs::read_to_string(run_dir.join("exec-stderr.log"))
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("handling ")?.split(" pid=").nth(1))
        .map(str::to_owned)
        .collect()
}

/// The scripted Messages server of `tests/fixtures/apps/messages_server.py`.
struct Messages {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Drop for Messages {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const ANTHROPIC_KEY: &str = "sk-ant-test-0d5c3b9e7a";

impl Messages {
    fn start(dir: &Path, extra: &[&str]) -> Messages {
        let port = free_port();
        let log = dir.join("messages-log.jsonl");
        let child = Command::new(apps_python())
            .arg(repo("tests/fixtures/apps/messages_server.py"))
            .args(["--port", &port.to_string(), "--key", ANTHROPIC_KEY])
            .arg("--log")
            .arg(&log)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the Messages server starts");
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "the Messages server never listened"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Messages { child, port, log }
    }

    fn log(&self) -> Vec<serde_json::Value> {
        read_jsonl(&self.log)
    }
}

fn anthropic_config(dir: &Path, name: &str, dataset: &str, model: &str, extra: &str) -> PathBuf {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &path,
        format!(
            "experiment: {{name: {name}, seed: 3, output_dir: \"{}\"{extra}}}\ndataset: {{path: \"{}\"}}\nmitigation: {{name: none}}\nmodel: {model}\n",
            dir.join(format!("results-{name}")).display(),
            repo(dataset).display(),
        ),
    )
    .unwrap();
    path
}

fn run_dir_of(out: &crate::common::Output) -> PathBuf {
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    PathBuf::from(v["dir"].as_str().unwrap())
}

#[test]
fn claude_messages_requests_pass_the_official_sdks_types_and_agents_decide_alike_on_every_target() {
    let dir = tempfile::tempdir().unwrap();
    let server = Messages::start(dir.path(), &["--rate-limit-first", "1"]);
    let url = format!("http://127.0.0.1:{}", server.port);
    // single-turn cases: the key in x-api-key, retry-after honoured, answers kept
    let cfg = anthropic_config(
        dir.path(),
        "claude",
        "data/normalized/attack_cases.enriched.jsonl",
        &format!(
            "{{provider: anthropic, name: claude-test, base_url: \"{url}\", api_key_env: ANTHROPIC_TEST_KEY, concurrency: 1, max_retries: 2, timeout_s: 10}}"
        ),
        ", sample_size: 6",
    );
    let r = run(pieval()
        .args(["run", "--json"])
        .arg(&cfg)
        .env("ANTHROPIC_TEST_KEY", ANTHROPIC_KEY));
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let single = run_dir_of(&r);
    let preds = read_jsonl(&single.join("predictions.jsonl"));
    assert_eq!(preds.len(), 6);
    assert!(
        preds
            .iter()
            .all(|p| p["error"].is_null() && p["provider"] == "anthropic"),
        "{preds:?}"
    );
    assert!(
        preds.iter().any(|p| p["attempts"] == 2),
        "the first request was told to wait (429, retry-after) and tried again"
    );
    for (path, text) in readable_files(&single) {
        assert!(
            !holds_secret(&text, ANTHROPIC_KEY),
            "{} holds the key",
            path.display()
        );
    }
    // the agent fixture corpus: over the Messages API (tool_use / tool_result) and over
    // chat completions, the same scripted agent: the same verdicts
    let cfg = anthropic_config(
        dir.path(),
        "claude-agent",
        "tests/fixtures/agents/cases.jsonl",
        &format!(
            "{{provider: anthropic, name: obedient-agent, base_url: \"{url}\", api_key_env: ANTHROPIC_TEST_KEY, concurrency: 2, timeout_s: 10}}"
        ),
        "",
    );
    let r = run(pieval()
        .args(["run", "--json"])
        .arg(&cfg)
        .env("ANTHROPIC_TEST_KEY", ANTHROPIC_KEY));
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let claude = run_dir_of(&r);
    let chat = ChatServer::always(Action::Answer);
    let cfg = anthropic_config(
        dir.path(),
        "openai-agent",
        "tests/fixtures/agents/cases.jsonl",
        &format!(
            "{{provider: openai, name: {}, base_url: \"{}\", api_key_env: ANTHROPIC_TEST_KEY, concurrency: 2, timeout_s: 10}}",
            crate::common::chat_server::OBEDIENT,
            chat.base_url()
        ),
        "",
    );
    let r = run(pieval()
        .args(["run", "--json"])
        .arg(&cfg)
        .env("ANTHROPIC_TEST_KEY", ANTHROPIC_KEY));
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let openai = run_dir_of(&r);
    let verdicts = |d: &Path| -> Vec<(String, String, String, String)> {
        let mut v: Vec<_> = read_jsonl(&d.join("case_results.jsonl"))
            .iter()
            .map(|r| {
                (
                    r["case_id"].to_string(),
                    r["attack_success"].to_string(),
                    r["utility_success"].to_string(),
                    r["agent_stop"].to_string(),
                )
            })
            .collect();
        v.sort();
        v
    };
    // the same agent behind an application's HTTP API (its tool calls read from the
    // answer) and behind an exec process (the calls in its answer line)
    let cfg = anthropic_config(
        dir.path(),
        "http-agent",
        "tests/fixtures/agents/cases.jsonl",
        &format!(
            "{{provider: http, name: agent-app, concurrency: 2, timeout_s: 10, http: {{request: {{url: \"{}/chat/completions\", body: {{model: {}, messages: \"{{{{messages}}}}\", tools: \"{{{{tools}}}}\"}}, answer: {{json: \"$.choices[0].message.content\"}}, tool_calls: {{json: \"$.choices[0].message.tool_calls\"}}}}}}}}",
            chat.base_url(),
            crate::common::chat_server::OBEDIENT,
        ),
        "",
    );
    let r = run(pieval().args(["run", "--json"]).arg(&cfg));
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let http = run_dir_of(&r);
    let command = serde_json::to_string(&[
        apps_python(),
        repo("tests/fixtures/apps/exec_target.py")
            .display()
            .to_string(),
    ])
    .unwrap();
    let cfg = anthropic_config(
        dir.path(),
        "exec-agent",
        "tests/fixtures/agents/cases.jsonl",
        &format!(
            "{{provider: exec, name: agent-chain, concurrency: 2, timeout_s: 10, exec: {{command: {command}, env: {{EXEC_AGENT_MODEL: EXEC_AGENT_MODEL}}}}}}"
        ),
        "",
    );
    let r = run(pieval()
        .args(["run", "--json"])
        .arg(&cfg)
        .env("EXEC_AGENT_MODEL", crate::common::chat_server::OBEDIENT));
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let exec = run_dir_of(&r);
    let (a, b) = (verdicts(&claude), verdicts(&openai));
    assert_eq!(a.len(), 9);
    assert_eq!(a, b, "the same agent over two protocols decides the same");
    assert_eq!(
        verdicts(&http),
        b,
        "an application's tool calls, read from its answer"
    );
    assert_eq!(verdicts(&exec), b, "an exec process's tool calls");
    assert!(
        a.iter().any(|v| v.1 == "true"),
        "some injection obeyed: {a:?}"
    );
    let calls = read_jsonl(&claude.join("predictions.jsonl"));
    assert!(
        calls.iter().any(|p| p["agent_actions"]
            .as_str()
            .is_some_and(|s| s.contains("send_money"))),
        "tool_use blocks became the agent's actions"
    );
    // every request pieval sent was valid for the SDK's types
    let log = server.log();
    assert!(log.len() > 20, "{}", log.len());
    let invalid: Vec<_> = log.iter().filter(|l| l["valid"] != true).collect();
    assert!(invalid.is_empty(), "{invalid:?}");
}

#[test]
fn a_websocket_chat_streams_answers_that_agree_with_its_log_and_a_close_mid_answer_is_said() {
    let dir = tempfile::tempdir().unwrap();
    let token = "ws-chat-token-93b1f0c2";
    let port = free_port();
    let log = dir.path().join("ws-log.jsonl");
    // a first pass to learn the cases, then one closed mid-answer
    let write_config = |name: &str| {
        let path = dir.path().join(format!("{name}.yaml"));
        std::fs::write(
            &path,
            format!(
                r#"experiment: {{name: {name}, seed: 5, sample_size: 8, output_dir: "{out}"}}
dataset: {{path: "{data}"}}
selection: {{include: {{success_definition_id: [target_string_emitted]}}}}
mitigation: {{name: none}}
model:
  provider: websocket
  name: ws-chat
  concurrency: 3
  timeout_s: 10
  websocket:
    secrets: {{token: WS_CHAT_TOKEN}}
    url: "ws://127.0.0.1:{port}/chat"
    headers: {{Authorization: "Bearer {{{{secret.token}}}}"}}
    subprotocol: chat.v1
    send: {{type: message, text: "{{{{prompt}}}}", case: "{{{{case_id}}}}"}}
    until: {{json: "$.type", equals: done}}
    answer: {{json: "$.text"}}
"#,
                out = dir.path().join(format!("results-{name}")).display(),
                data = repo("data/normalized/attack_cases.enriched.jsonl").display(),
            ),
        )
        .unwrap();
        path
    };
    let start = |close_on: &str| -> Child {
        let child = Command::new(apps_python())
            .arg(repo("tests/fixtures/apps/ws_chat.py"))
            .args(["--port", &port.to_string(), "--close-on", close_on])
            .arg("--log")
            .arg(&log)
            .env("WS_CHAT_TOKEN", token)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "the WebSocket chat never listened"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        child
    };
    let mut server = start("");
    let cfg = write_config("ws");
    let r = run(pieval()
        .args(["run", "--json"])
        .arg(&cfg)
        .env("WS_CHAT_TOKEN", token));
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let run_dir = run_dir_of(&r);
    let results = read_jsonl(&run_dir.join("case_results.jsonl"));
    let entries = read_jsonl(&log);
    assert_eq!(entries.len(), 8);
    for e in &entries {
        let case = e["case"].as_str().unwrap();
        let verdict = results.iter().find(|r| r["case_id"] == case).unwrap();
        assert_eq!(
            verdict["attack_success"] == true,
            e["obeyed"] == true,
            "{case}: pieval {verdict} / chat {e}"
        );
        assert_eq!(
            verdict["response_text"].as_str().unwrap(),
            e["answer"].as_str().unwrap(),
            "the deltas joined"
        );
    }
    for (path, text) in readable_files(&run_dir) {
        assert!(
            !holds_secret(&text, token),
            "{} holds the token",
            path.display()
        );
    }
    let recorded = read_jsonl(&run_dir.join("requests.jsonl"));
    assert!(
        recorded
            .iter()
            .all(|l| l["frame"].is_string() && l["url"].is_string())
    );
    // the same cases, the chat closing the connection in the middle of one answer
    let _ = server.kill();
    let _ = server.wait();
    let victim = entries[0]["case"].as_str().unwrap().to_owned();
    let mut server = start(&victim);
    let cfg = write_config("ws-closed");
    let r = run(pieval()
        .args(["run", "--json"])
        .arg(&cfg)
        .env("WS_CHAT_TOKEN", token));
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let preds = read_jsonl(&run_dir_of(&r).join("predictions.jsonl"));
    assert_eq!(preds.len(), 8, "no case lost");
    for p in &preds {
        let error = p["error"].as_str().unwrap_or("");
        if p["case_id"] == victim.as_str() {
            assert!(
                error.contains("closed the connection mid-answer") && error.contains("1011"),
                "{p}"
            );
        } else {
            assert_eq!(error, "", "{p}");
        }
    }
    // a wrong token: refused at the handshake, said on every case
    let r = run(pieval()
        .args(["run", "--json"])
        .arg(&cfg)
        .env("WS_CHAT_TOKEN", "wrong-token-123456"));
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let preds = read_jsonl(&run_dir_of(&r).join("predictions.jsonl"));
    assert!(
        preds
            .iter()
            .all(|p| p["error"].as_str().is_some_and(|e| e.contains("401"))),
        "{preds:?}"
    );
    // multi-turn attacks: Crescendo's turns on one connection (one conversation), each
    // PAIR query on a connection of its own (a fresh conversation)
    let _ = server.kill();
    let _ = server.wait();
    let mut server = start("");
    let chat = ChatServer::start_with_body(attacker_script(3));
    for strategy in ["crescendo", "pair"] {
        let before = read_jsonl(&log).len();
        let path = dir.path().join(format!("ws-{strategy}.yaml"));
        std::fs::write(
            &path,
            format!(
                r#"experiment: {{name: ws-{strategy}, seed: 5, output_dir: "{out}"}}
dataset: {{path: "{data}"}}
selection: {{case_ids: [syn-en-naive-emit_target-user_prompt-0]}}
mitigation: {{name: none}}
attack: {{original: false, strategy: {strategy}, max_turns: 5, attacker: {{provider: openai, name: attacker, base_url: "{attacker}", api_key_env: WS_CHAT_TOKEN, max_tokens: 512, timeout_s: 10}}}}
model:
  provider: websocket
  name: ws-chat
  timeout_s: 10
  websocket:
    secrets: {{token: WS_CHAT_TOKEN}}
    url: "ws://127.0.0.1:{port}/chat"
    headers: {{Authorization: "Bearer {{{{secret.token}}}}"}}
    subprotocol: chat.v1
    send: {{type: message, text: "{{{{prompt}}}}", case: "{{{{case_id}}}}"}}
    until: {{json: "$.type", equals: done}}
    answer: {{json: "$.text"}}
"#,
                out = dir.path().join(format!("results-ws-{strategy}")).display(),
                data = repo("data/normalized/attack_cases.enriched.jsonl").display(),
                attacker = chat.base_url(),
            ),
        )
        .unwrap();
        let r = run(pieval()
            .args(["run", "--json"])
            .arg(&path)
            .env("WS_CHAT_TOKEN", token));
        assert_eq!(r.code, 0, "{strategy}: {}\n{}", r.stdout, r.stderr);
        let results = read_jsonl(&run_dir_of(&r).join("case_results.jsonl"));
        assert_eq!(results[0]["turns_used"], 3, "{strategy}: {results:?}");
        let counts: Vec<u64> = read_jsonl(&log)[before..]
            .iter()
            .map(|e| e["messages_on_connection"].as_u64().unwrap())
            .collect();
        let expected = if strategy == "crescendo" {
            vec![1, 2, 3]
        } else {
            vec![1, 1, 1]
        };
        assert_eq!(counts, expected, "{strategy}");
    }
    let _ = server.kill();
    let _ = server.wait();
}

#[test]
fn a_raw_request_a_stream_a_redirect_and_a_replay() {
    let dir = tempfile::tempdir().unwrap();
    let app = App::start(dir.path(), &[]);
    let url = app.url();
    // the chat request as a browser's devtools save it, the prompt marked in its body
    let raw = dir.path().join("chat.txt");
    std::fs::write(
        &raw,
        "POST /chat-stream HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAuthorization: Bearer {{vars.token}}\r\nContent-Length: 999\r\n\r\n{\"question\": \"{{prompt}}\"}\r\n",
    )
    .unwrap();
    let write = |name: &str, request: &str, extra_model: &str| {
        let path = dir.path().join(format!("{name}.yaml"));
        std::fs::write(
            &path,
            format!(
                r#"experiment: {{name: {name}, seed: 11, sample_size: 6, output_dir: "{out}"}}
dataset: {{path: "{data}"}}
selection: {{include: {{success_definition_id: [target_string_emitted]}}}}
mitigation: {{name: none}}
model:
  provider: http
  name: rag-app
  concurrency: 2
  max_retries: 0
  {extra_model}
  http:
    secrets: {{password: RAG_APP_PASSWORD}}
    session:
      - name: login
        url: "{url}/login"
        body: {{user: "raw-{{{{attempt_id}}}}", password: "{{{{secret.password}}}}"}}
        extract: {{token: {{json: "$.token", secret: true}}}}
    request: {request}
"#,
                out = dir.path().join(format!("results-{name}")).display(),
                data = repo("data/normalized/attack_cases.enriched.jsonl").display(),
            ),
        )
        .unwrap();
        path
    };
    let cfg = write(
        "raw",
        &format!(
            "{{raw: \"{}\", url: \"{url}\", stream: sse, answer: {{json: \"$.delta\"}}}}",
            raw.display()
        ),
        "",
    );
    let r = run(pieval()
        .args(["run", "--json"])
        .arg(&cfg)
        .env("RAG_APP_PASSWORD", PASSWORD));
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let streamed = run_dir_of(&r);
    let preds = read_jsonl(&streamed.join("predictions.jsonl"));
    assert_eq!(preds.len(), 6);
    let log = app.log();
    for p in &preds {
        assert!(p["error"].is_null(), "{p}");
        // the answer assembled from its events is the one the app sent; the prompt went
        // into the raw body JSON-escaped (quotes and line breaks intact)
        let text = p["response_text"].as_str().unwrap();
        assert!(log.iter().any(|l| l["answer"] == text), "{text}");
    }
    // every answer replayed from the records: byte for byte
    let replay = dir.path().join("replay.yaml");
    std::fs::write(
        &replay,
        format!(
            "experiment: {{name: replay, seed: 11, sample_size: 6, output_dir: \"{}\"}}\ndataset: {{path: \"{}\"}}\nselection: {{include: {{success_definition_id: [target_string_emitted]}}}}\nmitigation: {{name: none}}\nmodel: {{provider: replay, name: rag-app, replay_from: \"{}\"}}\n",
            dir.path().join("results-replay").display(),
            repo("data/normalized/attack_cases.enriched.jsonl").display(),
            streamed.display()
        ),
    )
    .unwrap();
    let r = run(pieval().args(["run", "--json"]).arg(&replay));
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let again = read_jsonl(&run_dir_of(&r).join("predictions.jsonl"));
    let texts = |v: &[serde_json::Value]| {
        let mut t: Vec<(String, String)> = v
            .iter()
            .map(|p| (p["case_id"].to_string(), p["response_text"].to_string()))
            .collect();
        t.sort();
        t
    };
    assert_eq!(texts(&preds), texts(&again));
    // an answer that redirects elsewhere: never followed, said on every case
    let cfg = write(
        "moved",
        &format!(
            "{{url: \"{url}/moved\", headers: {{Authorization: \"Bearer {{{{vars.token}}}}\"}}, body: {{q: \"{{{{prompt}}}}\"}}, answer: {{body: true}}}}"
        ),
        "",
    );
    let r = run(pieval()
        .args(["run", "--json"])
        .arg(&cfg)
        .env("RAG_APP_PASSWORD", PASSWORD));
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let preds = read_jsonl(&run_dir_of(&r).join("predictions.jsonl"));
    assert_eq!(preds.len(), 6);
    for p in &preds {
        let e = p["error"].as_str().unwrap_or("");
        assert!(
            e.contains("HTTP 307 redirect to http://attacker.invalid/collect")
                && e.contains("does not follow"),
            "{p}"
        );
    }
}
