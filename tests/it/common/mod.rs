//! Shared helpers for the integration tests: the repository root, a temp dir per test,
//! and the `pieval` binary as a command.

use std::path::{Path, PathBuf};
use std::process::Command;

pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

pub fn repo(rel: &str) -> PathBuf {
    root().join(rel)
}

/// `pieval` run from the repository root (commands default to its layout).
pub fn pieval() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pieval"));
    cmd.current_dir(root());
    cmd
}

pub struct Output {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

pub fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("pieval runs");
    Output {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The JSON values of a JSONL file, one per line.
pub fn read_jsonl(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Write values as JSONL.
pub fn write_jsonl(path: &Path, rows: &[serde_json::Value]) {
    let text: String = rows.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(path, text).unwrap();
}

/// Replace a temp folder in output with `<tmp>` so snapshots are stable.
pub fn scrub(text: &str, dir: &Path) -> String {
    text.replace(&dir.display().to_string(), "<tmp>")
}
pub mod chat_server;
pub mod webdriver;

/// At most `n` characters of `s`.
pub fn excerpt(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

/// An experiment config in `dir` (name, model section, dataset under the repository,
/// sample size); its path.
pub fn experiment_config(
    dir: &Path,
    name: &str,
    dataset: &str,
    model: &str,
    extra: &str,
) -> PathBuf {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &path,
        format!(
            "experiment: {{name: {name}{extra}}}\ndataset: {{path: \"{}\"}}\nmodel: {{{model}}}\nmitigation: {{name: none}}\n",
            repo(dataset).display()
        ),
    )
    .unwrap();
    path
}

/// A completed dry run of the quickstart (`n` cases) under `dir/results`; its folder.
pub fn dry_run(dir: &Path, n: usize) -> PathBuf {
    let results = dir.join("results");
    let r = run(pieval()
        .args(["run", "--dry-run", "--json", "--sample-size"])
        .arg(n.to_string())
        .arg("--output-dir")
        .arg(&results)
        .arg(repo("data/experiments/quickstart.yaml")));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    results.join(v["run_id"].as_str().unwrap())
}

/// The run folder under `results` once its checkpoint holds `lines` lines (a run started
/// as a child process, to be killed mid-way); fails after a minute.
pub fn wait_for_checkpoint(results: &Path, lines: usize) -> PathBuf {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "the run never checkpointed"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
        let Some(d) = std::fs::read_dir(results)
            .ok()
            .and_then(|mut e| e.find_map(|e| e.ok().map(|e| e.path()).filter(|p| p.is_dir())))
        else {
            continue;
        };
        let n = std::fs::read_to_string(d.join("predictions.jsonl"))
            .map(|t| t.lines().count())
            .unwrap_or(0);
        if n >= lines {
            return d;
        }
    }
}

/// Every file under `dir`, recursively, sorted.
pub fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// [`run`], but a command still running after `secs` seconds is killed and the test
/// fails: for inputs that once made pieval hang (a FIFO, `/dev/zero`).
pub fn run_within(cmd: &mut Command, secs: u64) -> Output {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("pieval runs");
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let t_out = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        s
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("pieval still ran after {secs} s (a hang): {cmd:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    Output {
        code: status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&t_out.join().unwrap()).into_owned(),
        stderr: String::from_utf8_lossy(&t_err.join().unwrap()).into_owned(),
    }
}

/// The spellings of `key` a hostile endpoint may echo, as raw text to put inside a JSON
/// string (so `\u0073` is a JSON escape there): JSON `\u` escapes (all, some, twice),
/// percent-encoding (all, some, twice, inside JSON escapes), HTML references, zero-width
/// characters between its letters, `\x` escapes, base64 (both alphabets, at the three
/// alignments, inside Basic auth), hex.
pub fn spellings(key: &str) -> Vec<(&'static str, String)> {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let b64url = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    let each = |f: &dyn Fn(usize, u8) -> String| -> String {
        key.bytes().enumerate().map(|(i, c)| f(i, c)).collect()
    };
    vec![
        ("plain", key.to_owned()),
        (
            "json u-escapes every character",
            each(&|_, c| format!("\\u{c:04x}")),
        ),
        (
            "json u-escapes some characters",
            each(&|i, c| {
                if i % 3 == 1 {
                    format!("\\u{c:04X}")
                } else {
                    (c as char).to_string()
                }
            }),
        ),
        ("json escaped twice", each(&|_, c| format!("\\\\u{c:04x}"))),
        ("percent-encoded", each(&|_, c| format!("%{c:02X}"))),
        (
            "percent-encoded some",
            each(&|i, c| {
                if i % 2 == 0 {
                    format!("%{c:02x}")
                } else {
                    (c as char).to_string()
                }
            }),
        ),
        ("percent-encoded twice", each(&|_, c| format!("%25{c:02X}"))),
        (
            "percent inside json escapes",
            each(&|_, c| format!("\\u0025{c:02x}")),
        ),
        ("html references", each(&|_, c| format!("&#{c};"))),
        ("html hex references", each(&|_, c| format!("&#x{c:x};"))),
        (
            "zero-width between",
            each(&|_, c| format!("{}\u{200b}", c as char)),
        ),
        ("x escapes", each(&|_, c| format!("\\\\x{c:02x}"))),
        ("base64", b64(key)),
        ("base64 url-safe", b64url(key)),
        ("base64 after a byte", b64(&format!("x{key}"))),
        ("base64 after two bytes", b64(&format!("xy{key}"))),
        ("basic auth", b64(&format!("user:{key}"))),
        ("hex", hex::encode(key)),
        ("HEX", hex::encode_upper(key)),
    ]
}

/// Every spelling of [`spellings`], one after another (what one hostile answer echoes).
pub fn all_spellings(key: &str) -> String {
    spellings(key)
        .into_iter()
        .map(|(what, s)| format!("{what}: {s}; "))
        .collect()
}

/// Whether `text` still holds `key` in a spelling a reader could undo, decoded every way
/// this oracle knows (independently of pieval's redactor): JSON and `\x` escapes,
/// percent-encoding and HTML references undone three times over, zero-width characters
/// dropped, base64 of every run of its alphabet at every offset, hex.
pub fn holds_secret(text: &str, key: &str) -> bool {
    use base64::Engine;
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    let unescape = regex::Regex::new(
        r"\\u([0-9a-fA-F]{4})|\\x([0-9a-fA-F]{2})|&#x([0-9a-fA-F]+);|&#([0-9]+);|%([0-9a-fA-F]{2})",
    )
    .unwrap();
    let mut views = vec![text.to_owned()];
    for _ in 0..3 {
        let mut next = Vec::new();
        for v in &views {
            let decoded = unescape.replace_all(v, |c: &regex::Captures| {
                let (digits, radix) =
                    match (c.get(1).or(c.get(2)).or(c.get(3)).or(c.get(5)), c.get(4)) {
                        (Some(h), _) => (h.as_str(), 16),
                        (None, Some(d)) => (d.as_str(), 10),
                        _ => unreachable!(),
                    };
                u32::from_str_radix(digits, radix)
                    .ok()
                    .and_then(char::from_u32)
                    .map(String::from)
                    .unwrap_or_default()
            });
            next.push(decoded.replace("\\\\", "\\").replace('\u{200b}', ""));
            next.push(v.replace("\\\\", "\\"));
        }
        views.extend(next);
    }
    let lenient = GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true);
    let engines = [
        GeneralPurpose::new(&base64::alphabet::STANDARD, lenient),
        GeneralPurpose::new(&base64::alphabet::URL_SAFE, lenient),
    ];
    for v in &views {
        if v.contains(key) || v.contains(&hex::encode(key)) || v.contains(&hex::encode_upper(key)) {
            return true;
        }
        for run in v.split(|c: char| !(c.is_ascii_alphanumeric() || "+/-_".contains(c))) {
            for off in 0..4.min(run.len()) {
                let r = &run[off..];
                let r = if r.len() % 4 == 1 {
                    &r[..r.len() - 1]
                } else {
                    r
                };
                for e in &engines {
                    if let Ok(d) = e.decode(r)
                        && d.windows(key.len()).any(|w| w == key.as_bytes())
                    {
                        return true;
                    }
                }
            }
        }
    }
    false
}

/// Every file under `dir` as text a reader sees: JSON and text files as they are, Parquet
/// files as `pieval sql` gives their rows (JSON), (path, text).
pub fn readable_files(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    for f in files_under(dir) {
        let name = f.to_string_lossy().into_owned();
        if name.ends_with(".parquet") {
            let r = run(pieval()
                .args(["sql", "--format", "json", "--table"])
                .arg(format!("t={name}"))
                .arg("SELECT * FROM t"));
            assert_eq!(r.code, 0, "{name}: {}", r.stderr);
            out.push((f, r.stdout));
        } else if let Ok(text) = std::fs::read_to_string(&f) {
            out.push((f, text));
        }
    }
    out
}

/// A Python server of the suite's fixtures on 127.0.0.1 that prints `listening on PORT`
/// first; killed when dropped.
pub struct PythonServer {
    child: std::process::Child,
    pub port: u16,
}

impl PythonServer {
    pub fn start(python: &str, script: &Path, args: &[&str]) -> Self {
        use std::io::BufRead;
        let mut child = Command::new(python)
            .arg(script)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{python} runs {}: {e}", script.display()));
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.as_mut().expect("piped"))
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .strip_prefix("listening on ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("{} did not start: {line:?}", script.display()));
        PythonServer { child, port }
    }
}

impl Drop for PythonServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Python that can import `modules`: the one in the environment variable `var` (set by
/// `.ci/run`), else `python3` if it can; a test that needs it fails with how to get it
/// (`pins`: what to install).
pub fn python_with(var: &str, modules: &str, pins: &str) -> String {
    let python = std::env::var(var).unwrap_or_else(|_| "python3".into());
    let ok = Command::new(&python)
        .args(["-c", &format!("import {modules}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "{modules} are needed for this test: python3 -m venv V && V/bin/pip install {pins}, \
         then {var}=V/bin/python (bash .ci/run does this)"
    );
    python
}

/// The Python that has the applications' packages (FastAPI, uvicorn, websockets,
/// anthropic): `PIEVAL_APPS_PYTHON` (set by `.ci/run`), else `python3` if it can import
/// them.
pub fn apps_python() -> String {
    python_with(
        "PIEVAL_APPS_PYTHON",
        "fastapi, uvicorn, websockets, anthropic",
        "fastapi==0.165.0 uvicorn==0.55.0 websockets==17.4 anthropic==2.17.0",
    )
}
