//! Runner overhead: `pieval run` against a zero-latency OpenAI-compatible endpoint on
//! 127.0.0.1 (the test server of tests/it/common/chat_server.rs, in this process), at
//! concurrency 64, over a corpus of N cases (the committed corpus repeated with suffixed
//! ids). Prints cases per second (end to end: load, select, plan, call, checkpoint,
//! score, artifacts) and the run's peak RSS.
//!
//! Usage: cargo bench --bench runner_throughput [-- --cases 100000 --concurrency 64]
//!        cargo bench --bench runner_throughput -- --serve   (only serve; prints the URL)
//! The endpoint shares the machine's cores with pieval, as a local server would.

// The test server: this bench uses part of it.
#[allow(dead_code)]
#[path = "../tests/it/common/chat_server.rs"]
mod chat_server;

use std::io::Write;
use std::path::Path;

#[path = "support/args.rs"]
mod args;
#[path = "support/child.rs"]
mod child;
#[path = "support/corpus.rs"]
mod corpus;
use args::arg;

fn main() {
    if std::env::args().any(|a| a == "--serve") {
        // Serve only (for peer comparisons): print the base URL, answer until killed.
        let server = chat_server::ChatServer::always(chat_server::Action::Answer);
        println!("{}", server.base_url());
        std::io::stdout().flush().unwrap();
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
    let (n, concurrency) = (arg("--cases", 100_000), arg("--concurrency", 64));
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir().unwrap();
    let corpus = tmp.path().join("cases.jsonl");
    corpus::repeated(root, &corpus, n, |_| true);
    let server = chat_server::ChatServer::always(chat_server::Action::Answer);
    let cfg = tmp.path().join("bench.yaml");
    std::fs::write(
        &cfg,
        format!(
            "experiment: {{name: bench, seed: 1, output_dir: \"{}\"}}\ndataset: {{path: \"{}\"}}\n\
             model: {{provider: openai, name: echo, base_url: \"{}\", concurrency: {concurrency}, timeout_s: 30, max_retries: 2}}\n\
             mitigation: {{name: none}}\n",
            tmp.path().join("results").display(),
            corpus.display(),
            server.base_url()
        ),
    )
    .unwrap();
    let (wall, rss) = child::pieval(root, &["run", cfg.to_str().unwrap(), "--json"]);
    let requests = server.log.lock().unwrap().requests;
    assert_eq!(requests as usize, n, "one request per case");
    println!(
        "pieval run: {n} cases at concurrency {concurrency} against a zero-latency local endpoint: {wall:.2} s, {:.0} cases/s end to end, peak RSS {rss:.0} MiB",
        n as f64 / wall
    );
}
