//! Object storage (`s3://`, src/objstore.rs) against a real S3-compatible server:
//! moto's server (PyPI `moto[server]`, installed by .ci/run) started on 127.0.0.1, and,
//! in front of it, a proxy that fails or throttles requests on cue. A run scored from
//! and into a bucket is the same run as a local one; its commit is all or nothing when
//! the server fails or the client is killed mid-write; throttling is retried; a large result file goes up in
//! parts; the warehouse export lands in the bucket; no credential is written anywhere;
//! a bad location, a missing object, a malformed input line and a commit received from
//! someone else are clear errors naming the object.

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{pieval, read_jsonl, repo, run, write_jsonl};
use serde_json::{Value, json};

pub(crate) const KEY_ID: &str = "PIEVALTESTKEYID12345";
pub(crate) const SECRET: &str = "pieval-test-secret-Zq93kLw0vXb7";

/// moto's S3 server on a free port of 127.0.0.1, killed when dropped.
pub(crate) struct Moto {
    child: Child,
    pub(crate) port: u16,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub(crate) fn start_moto() -> Moto {
    let ok = Command::new("python3")
        .args(["-c", "import moto.server, flask"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "moto's S3 server is missing: `python3 -m pip install 'moto[server]'` (.ci/run installs it)"
    );
    let port = free_port();
    let child = Command::new("python3")
        .args([
            "-m",
            "moto.server",
            "-H",
            "127.0.0.1",
            "-p",
            &port.to_string(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3 -m moto.server starts");
    let moto = Moto { child, port };
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "moto's server did not start in 30 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    moto
}

/// One plain HTTP/1.1 request to moto (which takes unsigned requests): status, body.
fn http(port: u16, method: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(body).unwrap();
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).unwrap();
    let head_end = find(&resp, b"\r\n\r\n").expect("an HTTP response");
    let head = String::from_utf8_lossy(&resp[..head_end]).into_owned();
    let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
    let mut body = resp[head_end + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body);
    }
    (status, body)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(end) = find(b, b"\r\n") {
        let size =
            usize::from_str_radix(std::str::from_utf8(&b[..end]).unwrap().trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        out.extend_from_slice(&b[end + 2..end + 2 + size]);
        b = &b[end + 4 + size..];
    }
    out
}

/// The bucket `bkt`, with a policy letting the test write inputs and read back (unsigned) what pieval
/// wrote (signed, so private by default).
pub(crate) fn make_bucket(port: u16) {
    assert_eq!(http(port, "PUT", "/bkt", b"").0, 200);
    let policy = json!({"Version": "2012-10-17", "Statement": [{"Effect": "Allow",
        "Principal": "*", "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:ListBucket"],
        "Resource": ["arn:aws:s3:::bkt", "arn:aws:s3:::bkt/*"]}]});
    let (status, body) = http(port, "PUT", "/bkt?policy", policy.to_string().as_bytes());
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
}

/// The keys of the multipart uploads of bucket `bkt` not completed nor aborted.
#[cfg_attr(not(feature = "distributed"), allow(dead_code))]
pub(crate) fn open_uploads(port: u16) -> Vec<String> {
    let (status, body) = http(port, "GET", "/bkt?uploads", b"");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let text = String::from_utf8_lossy(&body);
    text.split("<Key>")
        .skip(1)
        .filter_map(|k| k.split("</Key>").next())
        .map(str::to_owned)
        .collect()
}

pub(crate) fn put_object(port: u16, key: &str, body: &[u8]) {
    let (status, text) = http(port, "PUT", &format!("/{key}"), body);
    assert_eq!(
        status,
        200,
        "PUT /{key}: {}",
        String::from_utf8_lossy(&text)
    );
}

pub(crate) fn get_object(port: u16, key: &str) -> Option<Vec<u8>> {
    let (status, body) = http(port, "GET", &format!("/{key}"), b"");
    (status == 200).then_some(body)
}

/// Every key of the bucket (moto lists up to 1,000: enough here).
pub(crate) fn keys(port: u16, bucket: &str) -> Vec<String> {
    let (status, body) = http(port, "GET", &format!("/{bucket}?list-type=2"), b"");
    assert_eq!(status, 200);
    let text = String::from_utf8(body).unwrap();
    assert!(
        !text.contains("<IsTruncated>true"),
        "more than one page of keys"
    );
    text.split("<Key>")
        .skip(1)
        .map(|s| s.split("</Key>").next().unwrap().to_owned())
        .collect()
}

/// What the proxy does with the requests it is given.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Mode {
    Pass,
    /// Answer 500 to every request once this many PUTs have gone through.
    FailAfterPuts(usize),
    /// Answer 503 SlowDown to the first attempt of every request.
    Throttle,
    /// Hold every request (never answered) once this many PUTs have gone through.
    StallAfterPuts(usize),
    /// Answer 500 to every part put into a run folder (`/results/…?partNumber=…`).
    #[cfg_attr(not(feature = "distributed"), allow(dead_code))]
    FailRunParts,
}

#[derive(Default)]
pub(crate) struct Counts {
    pub(crate) puts: AtomicUsize,
    pub(crate) parts: AtomicUsize,
    pub(crate) multipart_starts: AtomicUsize,
    pub(crate) failed: AtomicUsize,
    pub(crate) throttled: AtomicUsize,
    stalled: AtomicUsize,
    requests: AtomicUsize,
    /// Every request that reached the proxy: `METHOD PATH`, and ` range bytes=A-B` when
    /// it asked for a byte range.
    pub(crate) log: Mutex<Vec<String>>,
}

/// An HTTP proxy in front of moto, one request per connection (it answers with
/// `Connection: close`), that passes, fails or throttles requests.
pub(crate) struct Proxy {
    pub(crate) port: u16,
    mode: Arc<Mutex<Mode>>,
    pub(crate) counts: Arc<Counts>,
    #[cfg_attr(not(feature = "distributed"), allow(dead_code))]
    swap: Arc<Mutex<Option<Swap>>>,
}

/// An object replaced behind the reader's back: when the `after`-th ranged GET of `path`
/// arrives, `body` is PUT there first (straight to moto), then the GET goes on.
struct Swap {
    path: String,
    after: usize,
    body: Vec<u8>,
}

impl Proxy {
    pub(crate) fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let mode = Arc::new(Mutex::new(Mode::Pass));
        let counts = Arc::new(Counts::default());
        let swap: Arc<Mutex<Option<Swap>>> = Arc::default();
        let (m, c, w) = (Arc::clone(&mode), Arc::clone(&counts), Arc::clone(&swap));
        let seen = Arc::new(Mutex::new(std::collections::HashSet::new()));
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let (m, c, w, seen) = (
                    Arc::clone(&m),
                    Arc::clone(&c),
                    Arc::clone(&w),
                    Arc::clone(&seen),
                );
                std::thread::spawn(move || {
                    let _ = serve(conn, upstream, &m, &c, &seen, &w);
                });
            }
        });
        Proxy {
            port,
            mode,
            counts,
            swap,
        }
    }

    /// Replace the object at `path` (`/bucket/key`) with `body` when its `after`-th
    /// ranged GET arrives.
    #[cfg_attr(not(feature = "distributed"), allow(dead_code))]
    pub(crate) fn swap_after(&self, path: &str, after: usize, body: Vec<u8>) {
        *self.swap.lock().unwrap() = Some(Swap {
            path: path.to_owned(),
            after,
            body,
        });
    }

    pub(crate) fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }
}

fn serve(
    mut conn: TcpStream,
    upstream: u16,
    mode: &Mutex<Mode>,
    counts: &Counts,
    seen: &Mutex<std::collections::HashSet<String>>,
    swap: &Mutex<Option<Swap>>,
) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut head = Vec::new();
    let mut length = 0usize;
    let mut ranged: Option<String> = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        if line == "\r\n" {
            break;
        }
        let lower = line.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
        if let Some(r) = lower.strip_prefix("range:") {
            ranged = Some(r.trim().to_owned());
        }
        assert!(
            !lower.starts_with("transfer-encoding"),
            "the proxy takes bodies with a Content-Length"
        );
        if lower.starts_with("connection:") {
            continue;
        }
        head.extend_from_slice(line.as_bytes());
    }
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body)?;
    let request_line =
        String::from_utf8_lossy(&head[..head.iter().position(|&b| b == b'\n').unwrap_or(0)])
            .into_owned();
    counts.requests.fetch_add(1, Ordering::SeqCst);
    let target: String = request_line
        .split(' ')
        .take(2)
        .collect::<Vec<_>>()
        .join(" ");
    counts.log.lock().unwrap().push(match &ranged {
        Some(r) => format!("{target} range {r}"),
        None => target,
    });
    if ranged.is_some() && request_line.starts_with("GET ") {
        let mut swap = swap.lock().unwrap();
        let due = swap.as_mut().is_some_and(|w| {
            let path = request_line.split(' ').nth(1).unwrap_or("");
            if path.split('?').next() == Some(w.path.as_str()) {
                w.after = w.after.saturating_sub(1);
                w.after == 0
            } else {
                false
            }
        });
        if due {
            let w = swap.take().unwrap();
            assert_eq!(http(upstream, "PUT", &w.path, &w.body).0, 200);
        }
    }
    let is_put = request_line.starts_with("PUT ");
    if request_line.starts_with("POST ") && request_line.contains("uploads") {
        counts.multipart_starts.fetch_add(1, Ordering::SeqCst);
    }
    let current = *mode.lock().unwrap();
    match current {
        Mode::FailAfterPuts(k) if counts.puts.load(Ordering::SeqCst) >= k => {
            counts.failed.fetch_add(1, Ordering::SeqCst);
            return refuse(&mut conn, "500 Internal Server Error", "InternalError");
        }
        Mode::StallAfterPuts(k) if counts.puts.load(Ordering::SeqCst) >= k => {
            counts.stalled.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_secs(120));
            return Ok(());
        }
        Mode::FailRunParts
            if request_line.contains("/results/") && request_line.contains("partNumber=") =>
        {
            counts.failed.fetch_add(1, Ordering::SeqCst);
            return refuse(&mut conn, "500 Internal Server Error", "InternalError");
        }
        // Each distinct request is refused once: its retry goes through.
        Mode::Throttle if seen.lock().unwrap().insert(request_line.clone()) => {
            counts.throttled.fetch_add(1, Ordering::SeqCst);
            return refuse(&mut conn, "503 Slow Down", "SlowDown");
        }
        _ => {}
    }
    if is_put {
        counts.puts.fetch_add(1, Ordering::SeqCst);
        if request_line.contains("partNumber=") {
            counts.parts.fetch_add(1, Ordering::SeqCst);
        }
    }
    let mut up = TcpStream::connect(("127.0.0.1", upstream))?;
    up.write_all(&head)?;
    up.write_all(b"Connection: close\r\n\r\n")?;
    up.write_all(&body)?;
    let mut resp = Vec::new();
    up.read_to_end(&mut resp)?;
    conn.write_all(&resp)?;
    Ok(())
}

/// An S3 error answer, the connection closed after it.
fn refuse(conn: &mut TcpStream, status: &str, code: &str) -> std::io::Result<()> {
    let body = format!(
        "<?xml version=\"1.0\"?><Error><Code>{code}</Code><Message>injected by the test proxy</Message></Error>"
    );
    write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// A command that failed with an error saying `what`.
fn fails_naming(r: &common::Output, what: &str) {
    assert_ne!(r.code, 0, "it did not fail: {}", r.stdout);
    assert!(r.stderr.contains(what), "{}", r.stderr);
}

/// pieval with the S3 settings in its environment (and nothing else of AWS's).
pub(crate) fn s3_pieval(port: u16) -> Command {
    let mut cmd = pieval();
    s3_env(&mut cmd, port);
    cmd
}

/// The S3 settings of a server on `port` in a command's environment (and nothing else of
/// AWS's).
pub(crate) fn s3_env(cmd: &mut Command, port: u16) -> &mut Command {
    for (k, _) in std::env::vars() {
        if k.starts_with("AWS_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("AWS_ACCESS_KEY_ID", KEY_ID)
        .env("AWS_SECRET_ACCESS_KEY", SECRET)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{port}"))
        .env("AWS_ALLOW_HTTP", "true")
        .env("PIEVAL_S3_RETRIES", "3")
}

/// Predictions over the shipped corpus; `long` answers make case_results.jsonl larger
/// than one upload part.
fn predictions(copies: usize, long: bool) -> Vec<Value> {
    let cases = read_jsonl(&repo("data/normalized/attack_cases.enriched.jsonl"));
    let mut preds = Vec::new();
    for copy in 0..copies {
        for (i, c) in cases.iter().enumerate() {
            let target = c["expected_target"].as_str().unwrap_or("PWNED");
            let mut response = match (i + copy) % 4 {
                0 => format!("Sure: {target}"),
                1 => "I can't help with that.".to_owned(),
                2 => format!("Here is a summary, copy {copy}."),
                _ => String::new(),
            };
            if long {
                for k in 0..40 {
                    response.push_str(&format!(" Paragraph {k} of answer {i}/{copy} carries on."));
                }
            }
            preds
                .push(json!({"case_id": c["case_id"], "response_text": response, "latency_ms": i}));
        }
    }
    preds
}

pub(crate) fn jsonl_bytes(rows: &[Value]) -> Vec<u8> {
    let mut out = Vec::new();
    for r in rows {
        out.extend_from_slice(r.to_string().as_bytes());
        out.push(b'\n');
    }
    out
}

pub(crate) fn sorted_lines(bytes: &[u8]) -> Vec<String> {
    let mut v: Vec<String> = String::from_utf8_lossy(bytes)
        .lines()
        .map(str::to_owned)
        .collect();
    v.sort();
    v
}

/// The committed case_results.jsonl of a run, through its commit.
pub(crate) fn committed(port: u16, run: &str) -> (Value, Vec<u8>) {
    let commit: Value =
        serde_json::from_slice(&get_object(port, &format!("{run}/_pieval_commit.json")).unwrap())
            .unwrap();
    let id = commit["commit_id"].as_str().unwrap();
    let rows = get_object(port, &format!("{run}/v/{id}/case_results.jsonl")).unwrap();
    (commit, rows)
}

fn score(cmd: &mut Command, preds: &str, out: &str) -> common::Output {
    run(cmd
        .args(["score", "--run-id", "r1", "--json", "--cases"])
        .arg(repo("data/normalized/attack_cases.enriched.jsonl"))
        .args(["--predictions", preds, "--output", out]))
}

fn sql_count(port: u16) -> common::Output {
    run(s3_pieval(port).args([
        "sql",
        "--results",
        "s3://bkt/results",
        "--format",
        "json",
        "SELECT run_id, count(*) AS n FROM case_results GROUP BY run_id",
    ]))
}

#[test]
fn a_run_on_object_storage_is_a_local_runs_twin_and_commits_all_or_nothing() {
    let moto = start_moto();
    let port = moto.port;
    make_bucket(port);
    let dir = tempfile::tempdir().unwrap();

    // The same predictions, scored locally and from and into the bucket.
    let preds = predictions(1, false);
    let local_preds = dir.path().join("preds.jsonl");
    write_jsonl(&local_preds, &preds);
    put_object(port, "bkt/in/preds.jsonl", &jsonl_bytes(&preds));
    let local_out = dir.path().join("local");
    let r = score(
        &mut pieval(),
        local_preds.to_str().unwrap(),
        local_out.to_str().unwrap(),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = score(
        &mut s3_pieval(port),
        "s3://bkt/in/preds.jsonl",
        "s3://bkt/results/r1",
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let report: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(report["output"], "s3://bkt/results/r1");
    assert_eq!(report["rows"], preds.len());
    let paths = report["result_paths"].as_object().unwrap();
    assert!(
        paths
            .values()
            .all(|p| p.as_str().unwrap().starts_with("s3://bkt/results/r1/v/")),
        "{paths:?}"
    );
    let (commit, rows) = committed(port, "bkt/results/r1");
    let local_rows = std::fs::read(local_out.join("case_results.jsonl")).unwrap();
    assert_eq!(
        sorted_lines(&rows),
        sorted_lines(&local_rows),
        "case_results differ"
    );
    assert_eq!(sorted_lines(&rows).len(), preds.len());
    // The commit names every file with its size and digest; the summary points at them.
    let files: Vec<&str> = commit["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    for f in [
        "case_results.parquet",
        "case_results.jsonl",
        "findings.parquet",
        "summary.json",
    ] {
        assert!(files.contains(&f), "{files:?}");
    }
    let id = commit["commit_id"].as_str().unwrap().to_owned();
    let summary: Value = serde_json::from_slice(
        &get_object(port, &format!("bkt/results/r1/v/{id}/summary.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        summary["result_paths"]["case_results_parquet"],
        format!("s3://bkt/results/r1/v/{id}/case_results.parquet")
    );
    let local_summary: Value =
        serde_json::from_slice(&std::fs::read(local_out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(
        summary["aggregate_metrics"],
        local_summary["aggregate_metrics"]
    );

    // SQL over the committed runs in the bucket.
    let r = sql_count(port);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v, json!([{"run_id": "r1", "n": preds.len()}]));

    // The server fails mid-write: the run keeps its commit, nothing new is read.
    let proxy = Proxy::start(port);
    let fewer = predictions(1, false)[..500].to_vec();
    put_object(port, "bkt/in/fewer.jsonl", &jsonl_bytes(&fewer));
    proxy.set(Mode::FailAfterPuts(2));
    let r = score(
        &mut s3_pieval(proxy.port),
        "s3://bkt/in/fewer.jsonl",
        "s3://bkt/results/r1",
    );
    assert_ne!(r.code, 0, "a failing server was not noticed");
    assert!(
        r.stderr.contains("s3://bkt/results/r1/"),
        "the error names the object: {}",
        r.stderr
    );
    assert!(proxy.counts.failed.load(Ordering::SeqCst) > 0);
    let (after, _) = committed(port, "bkt/results/r1");
    assert_eq!(after["commit_id"], commit["commit_id"], "the commit moved");
    let r = sql_count(port);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        serde_json::from_str::<Value>(&r.stdout).unwrap(),
        json!([{"run_id": "r1", "n": preds.len()}])
    );

    // The client killed (SIGKILL) mid-upload: the commit stays, nothing new is read.
    proxy.set(Mode::StallAfterPuts(
        proxy.counts.puts.load(Ordering::SeqCst) + 2,
    ));
    let mut child = s3_pieval(proxy.port)
        .args(["score", "--run-id", "r1", "--cases"])
        .arg(repo("data/normalized/attack_cases.enriched.jsonl"))
        .args([
            "--predictions",
            "s3://bkt/in/fewer.jsonl",
            "--output",
            "s3://bkt/results/r1",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while proxy.counts.stalled.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < deadline,
            "the upload never reached the stall"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "pieval ended before the stall"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let (after, _) = committed(port, "bkt/results/r1");
    assert_eq!(after["commit_id"], commit["commit_id"], "the commit moved");
    let r = sql_count(port);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        serde_json::from_str::<Value>(&r.stdout).unwrap(),
        json!([{"run_id": "r1", "n": preds.len()}])
    );
    // Orphans of the killed upload are there, and never read.
    assert!(
        keys(port, "bkt")
            .iter()
            .any(|k| k.starts_with("results/r1/v/") && !k.contains(&id))
    );

    // Throttled (503 SlowDown on every other request) and large (case_results.jsonl in
    // parts): retried to a whole new commit; the old commit's files are gone.
    let long = predictions(2, true);
    put_object(port, "bkt/in/long.jsonl", &jsonl_bytes(&long));
    let long_local = dir.path().join("long.jsonl");
    write_jsonl(&long_local, &long);
    let long_out = dir.path().join("long-local");
    let r = score(
        &mut pieval(),
        long_local.to_str().unwrap(),
        long_out.to_str().unwrap(),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let big = std::fs::metadata(long_out.join("case_results.jsonl"))
        .unwrap()
        .len();
    assert!(
        big > 9 << 20,
        "case_results.jsonl is {big} bytes: not more than one part"
    );
    proxy.set(Mode::Throttle);
    let r = score(
        &mut s3_pieval(proxy.port),
        "s3://bkt/in/long.jsonl",
        "s3://bkt/results/r1",
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(proxy.counts.throttled.load(Ordering::SeqCst) > 0);
    assert!(proxy.counts.multipart_starts.load(Ordering::SeqCst) >= 1);
    assert!(proxy.counts.parts.load(Ordering::SeqCst) >= 2);
    let (latest, rows) = committed(port, "bkt/results/r1");
    assert_ne!(latest["commit_id"], commit["commit_id"]);
    assert_eq!(
        sorted_lines(&rows),
        sorted_lines(&std::fs::read(long_out.join("case_results.jsonl")).unwrap())
    );
    // The replaced commit's files are kept one generation (a reader of it is not cut off),
    // and go with the next commit.
    assert_eq!(latest["previous_commit_id"], commit["commit_id"]);
    let all = keys(port, "bkt");
    assert!(
        all.iter().any(|k| k.contains(&format!("/v/{id}/"))),
        "the replaced commit's files went at once: {all:?}"
    );
    let r = score(
        &mut s3_pieval(port),
        "s3://bkt/in/long.jsonl",
        "s3://bkt/results/r1",
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let all = keys(port, "bkt");
    assert!(
        !all.iter().any(|k| k.contains(&format!("/v/{id}/"))),
        "the commit before the replaced one is left: {all:?}"
    );
    let latest_id = latest["commit_id"].as_str().unwrap();
    assert!(all.iter().any(|k| k.contains(&format!("/v/{latest_id}/"))));

    // The warehouse export, into the bucket; a run's row in `runs` comes last.
    let r = run(s3_pieval(port).args([
        "export",
        "--results",
        "s3://bkt/results",
        "--to",
        "s3://bkt/warehouse",
        "--json",
    ]));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let all = keys(port, "bkt");
    let part = all
        .iter()
        .find(|k| k.starts_with("warehouse/case_results/") && k.ends_with("part-r1.parquet"))
        .unwrap_or_else(|| panic!("no case_results part: {all:?}"));
    assert!(
        all.iter().any(|k| k.starts_with("warehouse/runs/")),
        "{all:?}"
    );
    let got = dir.path().join("part.parquet");
    std::fs::write(&got, get_object(port, &format!("bkt/{part}")).unwrap()).unwrap();
    let r = run(pieval()
        .args(["sql", "--format", "json", "--table"])
        .arg(format!("t={}", got.display()))
        .arg("SELECT count(*) AS n FROM t"));
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        serde_json::from_str::<Value>(&r.stdout).unwrap(),
        json!([{"n": long.len()}])
    );

    // No credential in any object of the bucket.
    for k in keys(port, "bkt") {
        let body = get_object(port, &format!("bkt/{k}")).unwrap();
        for secret in [SECRET, KEY_ID] {
            assert!(
                find(&body, secret.as_bytes()).is_none(),
                "{k} holds a credential"
            );
        }
    }
}

#[test]
fn bad_locations_missing_objects_bad_lines_and_foreign_commits_are_clear_errors() {
    let moto = start_moto();
    let port = moto.port;
    make_bucket(port);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");

    // Credentials in the URL: refused before anything is read or written.
    let r = score(
        &mut s3_pieval(port),
        "s3://AKIAPIEVALTEST:wJalrPievalTestSecret@bkt/in/p.jsonl",
        out.to_str().unwrap(),
    );
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("credentials come from the environment"),
        "{}",
        r.stderr
    );
    assert!(
        !r.stderr.contains("wJalrPievalTestSecret") && !r.stderr.contains("AKIAPIEVALTEST"),
        "the URL's credentials were repeated: {}",
        r.stderr
    );
    assert!(!out.exists());

    // A missing object.
    let r = score(
        &mut s3_pieval(port),
        "s3://bkt/in/nope.jsonl",
        out.to_str().unwrap(),
    );
    fails_naming(&r, "s3://bkt/in/nope.jsonl: no such object");

    // A malformed line: named by the object's URL and its line.
    let mut bad = jsonl_bytes(&predictions(1, false)[..3]);
    bad.extend_from_slice(b"{\"case_id\": \n");
    put_object(port, "bkt/in/bad.jsonl", &bad);
    let r = score(
        &mut s3_pieval(port),
        "s3://bkt/in/bad.jsonl",
        "s3://bkt/results/bad",
    );
    fails_naming(&r, "s3://bkt/in/bad.jsonl:4");
    assert!(
        !r.stderr.contains(".pieval-objstore"),
        "a scratch path leaked: {}",
        r.stderr
    );
    assert!(
        keys(port, "bkt")
            .iter()
            .all(|k| !k.starts_with("results/bad"))
    );

    // A committed run whose file is damaged (digest and size as committed): the warning
    // names the object, not the private copy it was read from.
    let junk = b"PAR1 not a parquet file PAR1".to_vec();
    let sha = {
        use sha2::{Digest, Sha256};
        hex::encode(Sha256::digest(&junk))
    };
    let damaged = json!({"format": "pieval.run-commit/1", "run_id": "damaged", "commit_id": "c1",
        "committed_at": "2026-01-01T00:00:00Z",
        "files": [{"name": "case_results.parquet", "bytes": junk.len(), "sha256": sha}]});
    put_object(port, "bkt/results/damaged/v/c1/case_results.parquet", &junk);
    put_object(
        port,
        "bkt/results/damaged/_pieval_commit.json",
        damaged.to_string().as_bytes(),
    );
    let r = sql_count(port);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("s3://bkt/results/damaged/case_results.parquet"),
        "{}",
        r.stderr
    );
    assert!(
        !r.stderr.contains(".pieval-objstore"),
        "a scratch path leaked: {}",
        r.stderr
    );
    let (status, _) = http(
        port,
        "DELETE",
        "/bkt/results/damaged/_pieval_commit.json",
        b"",
    );
    assert_eq!(status, 204);

    // A commit received from someone else: not JSON, then naming a file outside the run.
    put_object(port, "bkt/results/evil/_pieval_commit.json", b"{not json");
    let r = sql_count(port);
    fails_naming(
        &r,
        "s3://bkt/results/evil/_pieval_commit.json: not a pieval run commit",
    );
    let forged = json!({"format": "pieval.run-commit/1", "run_id": "evil", "commit_id": "x",
        "committed_at": "2026-01-01T00:00:00Z",
        "files": [{"name": "../../secrets", "bytes": 1, "sha256": "0".repeat(64)}]});
    put_object(
        port,
        "bkt/results/evil/_pieval_commit.json",
        forged.to_string().as_bytes(),
    );
    let r = sql_count(port);
    fails_naming(&r, "not a plain file name");
    // A file that is not the one committed (tampered, or torn): its digest says so.
    let tampered = json!({"format": "pieval.run-commit/1", "run_id": "evil", "commit_id": "x",
        "committed_at": "2026-01-01T00:00:00Z",
        "files": [{"name": "summary.json", "bytes": 2, "sha256": "0".repeat(64)}]});
    put_object(
        port,
        "bkt/results/evil/_pieval_commit.json",
        tampered.to_string().as_bytes(),
    );
    put_object(port, "bkt/results/evil/v/x/summary.json", b"{}");
    let r = sql_count(port);
    fails_naming(
        &r,
        "s3://bkt/results/evil/v/x/summary.json: 2 bytes, sha256",
    );

    // A file longer than its commit says: the download stops there.
    put_object(
        port,
        "bkt/results/evil/v/x/summary.json",
        &vec![b' '; 1 << 20],
    );
    let r = sql_count(port);
    fails_naming(
        &r,
        "summary.json: 1048576 bytes, more than the 2 bytes its commit gives it",
    );

    // SQLite cannot be exported to object storage (it is updated in place).
    let r = run(s3_pieval(port)
        .args([
            "export",
            "--to",
            "s3://bkt/w",
            "--format",
            "sqlite",
            "--results",
        ])
        .arg(dir.path()));
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("object storage cannot"), "{}", r.stderr);

    // Nobody at the endpoint: a clear error naming the object, soon.
    drop(moto);
    let started = Instant::now();
    let r = score(
        s3_pieval(free_port()).env("PIEVAL_S3_RETRIES", "0"),
        "s3://bkt/in/bad.jsonl",
        out.to_str().unwrap(),
    );
    fails_naming(&r, "s3://bkt/in/bad.jsonl: cannot read");
    assert!(started.elapsed() < Duration::from_secs(60));
    for secret in [SECRET, KEY_ID] {
        assert!(!r.stderr.contains(secret) && !r.stdout.contains(secret));
    }
}

#[test]
fn the_object_storage_code_is_not_reached_for_local_paths() {
    // Local paths work as before: no AWS setting needed, none read.
    let dir = tempfile::tempdir().unwrap();
    let preds = dir.path().join("p.jsonl");
    write_jsonl(&preds, &predictions(1, false)[..10]);
    let out = dir.path().join("out");
    let r = run(pieval()
        .env("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
        .args(["score", "--run-id", "r1", "--cases"])
        .arg(repo("data/normalized/attack_cases.enriched.jsonl"))
        .arg("--predictions")
        .arg(&preds)
        .arg("--output")
        .arg(&out));
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(out.join("case_results.parquet").is_file());
    assert!(!out.join("_pieval_commit.json").exists());
}

// ---------------------------------------------------------------------------------------
// Object storage that is slow but alive (issue 52, class 8): a scripted S3 endpoint that
// trickles bytes, stalls, or serves an object too large to fetch. Timeouts measure
// silence, not total time; a stopped download resumes by range on the same object; a
// fetched input has a size cap the user can raise.

/// How the scripted endpoint answers a GET of the object: given the request's first byte
/// (its `Range`), `If-Match` and the request's number, the status and the bytes to send,
/// in pieces with a pause before each (the headers always announce the object's rest).
type Serve = Arc<dyn Fn(u64, Option<&str>, usize) -> (u16, Vec<(Duration, Vec<u8>)>) + Send + Sync>;

/// One object `bkt/in.jsonl` of `body`, served by `serve`; every request's (first byte,
/// If-Match) logged.
struct ScriptedS3 {
    port: u16,
    log: Arc<Mutex<Vec<(u64, Option<String>)>>>,
}

impl ScriptedS3 {
    fn start(len: u64, serve: Serve) -> ScriptedS3 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let log = Arc::new(Mutex::new(Vec::new()));
        let count = Arc::new(AtomicUsize::new(0));
        let l = Arc::clone(&log);
        std::thread::spawn(move || {
            for sock in listener.incoming() {
                let Ok(sock) = sock else { continue };
                let (l, serve, count) = (Arc::clone(&l), Arc::clone(&serve), Arc::clone(&count));
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(sock.try_clone().unwrap());
                    let mut line = String::new();
                    if reader.read_line(&mut line).is_err() {
                        return;
                    }
                    let head = line.trim().to_owned();
                    let (mut from, mut if_match) = (0u64, None);
                    loop {
                        let mut h = String::new();
                        if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
                            break;
                        }
                        let lower = h.to_ascii_lowercase();
                        if let Some(r) = lower.strip_prefix("range: bytes=") {
                            from = r.trim().split('-').next().unwrap().parse().unwrap_or(0);
                        }
                        if lower.starts_with("if-match:") {
                            if_match = Some(h[9..].trim().to_owned());
                        }
                    }
                    let mut sock = sock;
                    if !head.starts_with("GET ") && !head.starts_with("HEAD ") {
                        let _ = sock.write_all(
                            b"HTTP/1.1 405 No\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                        );
                        return;
                    }
                    let n = count.fetch_add(1, Ordering::SeqCst);
                    l.lock().unwrap().push((from, if_match.clone()));
                    let (status, pieces) = serve(from, if_match.as_deref(), n);
                    // The length the object's rest has (what is sent may stop short).
                    let total = if matches!(status, 200 | 206) {
                        len - from
                    } else {
                        0
                    };
                    let range = if from > 0 {
                        format!("Content-Range: bytes {from}-{}/{len}\r\n", len - 1)
                    } else {
                        String::new()
                    };
                    let reason = match status {
                        200 => "OK",
                        206 => "Partial Content",
                        412 => "Precondition Failed",
                        _ => "Error",
                    };
                    let head = format!(
                        "HTTP/1.1 {status} {reason}\r\nContent-Length: {total}\r\nETag: \"v1\"\r\nLast-Modified: Sun, 06 Dec 2026 10:00:00 GMT\r\n{range}Connection: close\r\n\r\n"
                    );
                    if sock.write_all(head.as_bytes()).is_err() {
                        return;
                    }
                    for (pause, bytes) in pieces {
                        std::thread::sleep(pause);
                        if sock.write_all(&bytes).is_err() || sock.flush().is_err() {
                            return;
                        }
                    }
                });
            }
        });
        ScriptedS3 { port, log }
    }
}

/// `pieval score` of `s3://bkt/in.jsonl` through the scripted endpoint, with `env`.
fn score_scripted(port: u16, out: &std::path::Path, env: &[(&str, &str)]) -> common::Output {
    let mut cmd = pieval();
    for (k, _) in std::env::vars() {
        if k.starts_with("AWS_") || k.starts_with("PIEVAL_S3") {
            cmd.env_remove(k);
        }
    }
    cmd.env("AWS_ACCESS_KEY_ID", KEY_ID)
        .env("AWS_SECRET_ACCESS_KEY", SECRET)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{port}"))
        .env("AWS_ALLOW_HTTP", "true")
        .env("PIEVAL_S3_RETRIES", "0");
    for (k, v) in env {
        cmd.env(k, v);
    }
    run(cmd
        .args(["score", "--run-id", "slow", "--cases"])
        .arg(repo("data/normalized/attack_cases.enriched.jsonl"))
        .args(["--predictions", "s3://bkt/in.jsonl", "--output"])
        .arg(out))
}

/// The predictions the scripted endpoint serves, as bytes.
fn scripted_input() -> Vec<u8> {
    predictions(1, true)
        .iter()
        .take(40)
        .map(|p| format!("{p}\n"))
        .collect::<String>()
        .into_bytes()
}

#[test]
fn a_slow_download_that_keeps_moving_is_never_cut_and_a_stalled_one_resumes_by_range() {
    let body = Arc::new(scripted_input());
    let len = body.len() as u64;
    // Trickled over 33 s in 66 pieces, with 1 s of silence allowed: longer than the 30 s
    // a request used to be given in all, and than any bound of the silence on the total.
    let b = Arc::clone(&body);
    let trickle = ScriptedS3::start(
        len,
        Arc::new(move |from, _, _| {
            let rest = &b[from as usize..];
            let step = rest.len().div_ceil(66);
            (
                if from > 0 { 206 } else { 200 },
                rest.chunks(step)
                    .map(|c| (Duration::from_millis(500), c.to_vec()))
                    .collect(),
            )
        }),
    );
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let r = score_scripted(
        trickle.port,
        &dir.path().join("trickled"),
        &[("PIEVAL_S3_SILENCE_SECS", "1")],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        started.elapsed() > Duration::from_secs(30),
        "the trickle was not slow"
    );
    assert_eq!(
        trickle.log.lock().unwrap().len(),
        1,
        "a steady download was cut"
    );
    let local = dir.path().join("local.jsonl");
    std::fs::write(&local, body.as_slice()).unwrap();
    let reference = run(pieval()
        .args(["score", "--run-id", "slow", "--cases"])
        .arg(repo("data/normalized/attack_cases.enriched.jsonl"))
        .arg("--predictions")
        .arg(&local)
        .arg("--output")
        .arg(dir.path().join("reference")));
    assert_eq!(reference.code, 0, "{}", reference.stderr);
    let rows = |d: &str| read_jsonl(&dir.path().join(d).join("case_results.jsonl"));
    assert_eq!(rows("trickled"), rows("reference"));

    // Half the object, then silence past the bound: the download resumes from the byte
    // it reached, on the same object (If-Match its entity tag), and is whole.
    let b = Arc::clone(&body);
    let half = len / 2;
    let stall = ScriptedS3::start(
        len,
        Arc::new(move |from, _, n| {
            if n == 0 {
                (
                    200,
                    vec![
                        (Duration::ZERO, b[..half as usize].to_vec()),
                        (Duration::from_secs(4), b[half as usize..].to_vec()),
                    ],
                )
            } else {
                (206, vec![(Duration::ZERO, b[from as usize..].to_vec())])
            }
        }),
    );
    let r = score_scripted(
        stall.port,
        &dir.path().join("resumed"),
        &[("PIEVAL_S3_SILENCE_SECS", "1")],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(rows("resumed"), rows("reference"));
    let log = stall.log.lock().unwrap().clone();
    assert_eq!(log.len(), 2, "{log:?}");
    assert_eq!(log[0], (0, None));
    assert!(log[1].0 > 0 && log[1].0 <= half, "{log:?}");
    assert_eq!(
        log[1].1.as_deref(),
        Some("\"v1\""),
        "resumed without checking the object: {log:?}"
    );

    // An endpoint that stalls every time: an error saying so, after a bounded number of
    // attempts, and nothing left behind.
    let dead = ScriptedS3::start(
        len,
        Arc::new(move |_, _, _| (200, vec![(Duration::from_secs(30), b"x".to_vec())])),
    );
    let started = Instant::now();
    let r = score_scripted(
        dead.port,
        &dir.path().join("dead"),
        &[("PIEVAL_S3_SILENCE_SECS", "1")],
    );
    assert_ne!(r.code, 0);
    assert!(
        r.stderr.contains("nothing received for 1 s"),
        "{}",
        r.stderr
    );
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "{:?}",
        started.elapsed()
    );
    assert!(!dir.path().join("dead").exists());

    // The object replaced between two attempts: an error, never a file of two objects.
    let b = Arc::clone(&body);
    let replaced = ScriptedS3::start(
        len,
        Arc::new(move |_, if_match, n| {
            if n == 0 {
                (
                    200,
                    vec![
                        (Duration::ZERO, b[..100].to_vec()),
                        (Duration::from_secs(4), Vec::new()),
                    ],
                )
            } else if if_match.is_some() {
                (412, Vec::new())
            } else {
                (200, vec![(Duration::ZERO, b.to_vec())])
            }
        }),
    );
    let r = score_scripted(
        replaced.port,
        &dir.path().join("replaced"),
        &[("PIEVAL_S3_SILENCE_SECS", "1")],
    );
    assert_ne!(r.code, 0);
    assert!(
        r.stderr.contains("replaced while it was read"),
        "{}",
        r.stderr
    );
}

#[test]
fn a_fetched_input_past_its_cap_is_an_error_naming_its_size() {
    let body = Arc::new(scripted_input());
    let len = body.len() as u64;
    let b = Arc::clone(&body);
    let s3 = ScriptedS3::start(
        len,
        Arc::new(move |_, _, _| (200, vec![(Duration::ZERO, b.to_vec())])),
    );
    let dir = tempfile::tempdir().unwrap();
    let r = score_scripted(
        s3.port,
        &dir.path().join("capped"),
        &[("PIEVAL_S3_MAX_FETCH_BYTES", "1K")],
    );
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains(&format!(
            "s3://bkt/in.jsonl: {len} bytes, more than the 1024 bytes"
        )) && r.stderr.contains("PIEVAL_S3_MAX_FETCH_BYTES raises it"),
        "{}",
        r.stderr
    );
    let r = score_scripted(
        s3.port,
        &dir.path().join("raised"),
        &[("PIEVAL_S3_MAX_FETCH_BYTES", "64M")],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = score_scripted(
        s3.port,
        &dir.path().join("bad"),
        &[("PIEVAL_S3_MAX_FETCH_BYTES", "lots")],
    );
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("PIEVAL_S3_MAX_FETCH_BYTES=lots"),
        "{}",
        r.stderr
    );
}
