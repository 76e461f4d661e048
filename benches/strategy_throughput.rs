//! Multi-turn strategy throughput: `pieval run` with `attack.strategy` against a
//! zero-latency OpenAI-compatible endpoint on 127.0.0.1 that plays both the attacker and
//! the target (the scripted attacker of tests/it/common/chat_server.rs, which never lets
//! the target yield here, so every attempt spends its whole budget). Prints turns per
//! second end to end (load, select, every attacker and target call, scoring each answer,
//! checkpoint with the transcripts, scoring, turns.parquet) and the run's peak RSS.
//! Each turn is two HTTP requests (attacker, then target).
//!
//! Usage: cargo bench --bench strategy_throughput [-- --cases 1000 --turns 10 --concurrency 64 --strategy pair]
//! The goal (issue 16): ≥ 1,000 turns/s for 10 turns over 1,000 cases at concurrency 64.

// The test server: this bench uses part of it.
#[allow(dead_code)]
#[path = "../tests/it/common/chat_server.rs"]
mod chat_server;

use std::path::Path;

#[path = "support/args.rs"]
mod args;
#[path = "support/child.rs"]
mod child;
#[path = "support/corpus.rs"]
mod corpus;
use args::arg;

fn main() {
    let (n, turns, concurrency) = (
        arg("--cases", 1_000),
        arg("--turns", 10),
        arg("--concurrency", 64),
    );
    let strategy = std::env::args()
        .skip_while(|a| a != "--strategy")
        .nth(1)
        .unwrap_or_else(|| "pair".into());
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir().unwrap();
    let corpus = tmp.path().join("cases.jsonl");
    // Attacks whose goal is a target string: the gullible target never sees it, as the
    // scripted attacker never yields (its yield step is past the budget).
    corpus::repeated(root, &corpus, n, |c| {
        c["success_criteria"]["type"] == "contains"
    });
    let server = chat_server::ChatServer::start_with_body(chat_server::attacker_script(usize::MAX));
    let model = format!(
        "{{provider: openai, name: echo, base_url: \"{}\", concurrency: {concurrency}, timeout_s: 30, max_retries: 2}}",
        server.base_url()
    );
    let cfg = tmp.path().join("bench.yaml");
    std::fs::write(
        &cfg,
        format!(
            "experiment: {{name: bench, seed: 1, output_dir: \"{}\"}}\ndataset: {{path: \"{}\"}}\n\
             model: {model}\nmitigation: {{name: none}}\n\
             attack: {{original: false, strategy: {strategy}, attacker: {model}, max_turns: {turns}}}\n",
            tmp.path().join("results").display(),
            corpus.display(),
        ),
    )
    .unwrap();
    let (wall, rss) = child::pieval(root, &["run", cfg.to_str().unwrap(), "--json"]);
    let requests = server.log.lock().unwrap().requests;
    // PAIR and Crescendo: an attacker and a target call per turn. TAP also asks the
    // evaluator, and prunes (its second branch of each node is off topic): its turns are
    // the target queries it made.
    let total_turns = if strategy == "tap" {
        count_target_turns(&tmp.path().join("results"))
    } else {
        assert_eq!(
            requests as usize,
            2 * n * turns,
            "an attacker and a target call per turn"
        );
        n * turns
    };
    println!(
        "pieval run, strategy {strategy}: {n} cases × {turns} turns at concurrency {concurrency} against a zero-latency local endpoint: {wall:.2} s, {:.0} turns/s end to end ({:.0} HTTP requests/s), peak RSS {rss:.0} MiB",
        total_turns as f64 / wall,
        requests as f64 / wall
    );
}

/// The target queries of a run (the turns not pruned), from its checkpoint.
fn count_target_turns(results: &Path) -> usize {
    let dir = std::fs::read_dir(results)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.is_dir())
        .unwrap();
    std::fs::read_to_string(dir.join("predictions.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["turns_used"].as_u64().unwrap_or(0) as usize
        })
        .sum()
}
