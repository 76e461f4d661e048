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
