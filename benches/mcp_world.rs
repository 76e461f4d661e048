//! The served world's speed (issue 54): MCP `tools/call` requests per second at
//! concurrency 64, against pieval's world (`pieval::agent::serve`, streamable HTTP,
//! stateless, JSON answers: one POST per call) and, in the same run with the same client,
//! a FastMCP server (Python) answering the same tool (benches/support/fastmcp_world.py);
//! the ratio printed. Goal: ≥ 20,000 calls/s.
//!
//! The client: `--concurrency` tasks on this process's runtime, each as one agent
//! attempt after another — its own world (pieval's: opened, `--calls` calls, taken back
//! with its records, as a run does), the fixture case's `get_balance` tool (fixed output,
//! tests/fixtures/agents/cases.jsonl `agent-steal`), keep-alive connections. Client and
//! servers share the machine's cores.
//!
//! Usage: cargo bench --bench mcp_world [-- --concurrency 64 --seconds 5 --calls 100]
//! FastMCP: PIEVAL_AGENTS_PYTHON (set by .ci/run) or python3 with fastmcp installed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pieval::agent::serve::{Hub, Live};
use pieval::contract::case::AttackCase;
use pieval::mitigation::{Mitigation, MitigationSection};
use serde_json::json;

#[path = "support/args.rs"]
mod args;
use args::arg;

fn call_body(id: u64) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": "get_balance", "arguments": {}}})
    .to_string()
}

async fn post(http: &reqwest::Client, url: &str, token: Option<&str>, body: String) -> bool {
    let mut req = http
        .post(url)
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .header("mcp-protocol-version", "2025-06-18")
        .body(body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    match req.send().await {
        Ok(r) if r.status().is_success() => r
            .bytes()
            .await
            .is_ok_and(|b| memchr_find(&b, b"1200.00 EUR")),
        _ => false,
    }
}

fn memchr_find(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Calls per second against pieval's world.
async fn pieval_world(concurrency: usize, seconds: f64, calls: usize) -> (f64, u64) {
    let fixture = include_str!("../tests/fixtures/agents/cases.jsonl");
    let case: Arc<AttackCase> = Arc::new(
        fixture
            .lines()
            .map(|l| serde_json::from_str::<AttackCase>(l).unwrap())
            .find(|c| c.case_id == "agent-steal")
            .unwrap(),
    );
    let section: MitigationSection = serde_yaml_ng::from_str("name: none").unwrap();
    let none = Arc::new(Mitigation::from_section(&section).unwrap());
    let hub = Arc::new(Hub::start("127.0.0.1:0".parse().unwrap()).await.unwrap());
    let http = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(concurrency)
        .build()
        .unwrap();
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (hub, http, case, none) = (
                Arc::clone(&hub),
                http.clone(),
                Arc::clone(&case),
                Arc::clone(&none),
            );
            let (done, failed) = (Arc::clone(&done), Arc::clone(&failed));
            tokio::spawn(async move {
                let payload = case.task_input.clone();
                while Instant::now() < end {
                    let live =
                        Live::new(Arc::clone(&case), payload.as_deref(), Arc::clone(&none), 7)
                            .unwrap();
                    let (id, at) = hub.open(live).unwrap();
                    for i in 0..calls as u64 {
                        if post(&http, &at.mcp_url, Some(&at.token), call_body(i)).await {
                            done.fetch_add(1, Ordering::Relaxed);
                        } else {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                        if Instant::now() >= end {
                            break;
                        }
                    }
                    let live = hub.take(&id).expect("the world was served");
                    assert!(live.turns.len() <= calls + 1);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let secs = start.elapsed().as_secs_f64();
    hub.stop().await;
    (
        done.load(Ordering::Relaxed) as f64 / secs,
        failed.load(Ordering::Relaxed),
    )
}

/// Calls per second against the FastMCP server at `url`.
async fn peer(url: String, concurrency: usize, seconds: f64) -> (f64, u64) {
    let http = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(concurrency)
        .build()
        .unwrap();
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (http, url) = (http.clone(), url.clone());
            let (done, failed) = (Arc::clone(&done), Arc::clone(&failed));
            tokio::spawn(async move {
                let mut i = 0;
                while Instant::now() < end {
                    i += 1;
                    if post(&http, &url, None, call_body(i)).await {
                        done.fetch_add(1, Ordering::Relaxed);
                    } else {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let secs = start.elapsed().as_secs_f64();
    (
        done.load(Ordering::Relaxed) as f64 / secs,
        failed.load(Ordering::Relaxed),
    )
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn main() {
    let concurrency = arg("--concurrency", 64);
    let seconds = arg("--seconds", 5) as f64;
    let calls = arg("--calls", 100);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    // warm up, then measure
    rt.block_on(pieval_world(concurrency, 1.0, calls));
    let (ours, ours_failed) = rt.block_on(pieval_world(concurrency, seconds, calls));
    println!(
        "pieval world (rmcp, streamable HTTP): {ours:.0} tools/call per s at concurrency {concurrency} ({ours_failed} failed; goal >= 20,000)"
    );
    let python = std::env::var("PIEVAL_AGENTS_PYTHON").unwrap_or_else(|_| "python3".into());
    let port = free_port();
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/benches/support/fastmcp_world.py"
    );
    let mut child = std::process::Command::new(&python)
        .args([script, &port.to_string()])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("python starts (FastMCP: PIEVAL_AGENTS_PYTHON)");
    let url = format!("http://127.0.0.1:{port}/mcp");
    // ready when it answers a call
    let ready = rt.block_on(async {
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        for _ in 0..300 {
            if post(&http, &url, None, call_body(0)).await {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    });
    if !ready {
        let _ = child.kill();
        panic!("the FastMCP server did not answer (is fastmcp installed in {python}?)");
    }
    rt.block_on(peer(url.clone(), concurrency, 1.0));
    let (theirs, theirs_failed) = rt.block_on(peer(url, concurrency, seconds));
    let _ = child.kill();
    let _ = child.wait();
    println!(
        "FastMCP (Python, stateless HTTP): {theirs:.0} tools/call per s at concurrency {concurrency} ({theirs_failed} failed)"
    );
    println!(
        "ratio: pieval's world answers {:.1}x FastMCP's calls per second",
        ours / theirs.max(1e-9)
    );
}
