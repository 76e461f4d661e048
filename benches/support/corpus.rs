//! A corpus of `n` cases for the runner benches: the committed corpus (the cases `keep`
//! accepts) repeated, each copy with a fresh id suffix (`-r<k>`).

use std::io::Write;
use std::path::Path;

#[allow(dead_code)]
pub fn repeated(root: &Path, out: &Path, n: usize, keep: impl Fn(&serde_json::Value) -> bool) {
    let source =
        std::fs::read_to_string(root.join("data/normalized/attack_cases.enriched.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = source
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|c| keep(c))
        .collect();
    let mut w = std::io::BufWriter::new(std::fs::File::create(out).unwrap());
    for i in 0..n {
        let mut case = lines[i % lines.len()].clone();
        let id = format!("{}-r{}", case["case_id"].as_str().unwrap(), i / lines.len());
        case["case_id"] = id.into();
        writeln!(w, "{case}").unwrap();
    }
}

/// The agent fixture's case `id` (tests/fixtures/agents/cases.jsonl), `n` times, as
/// `<id>-<i>`.
#[allow(dead_code)]
pub fn agent_cases(root: &Path, out: &Path, id: &str, n: usize) {
    let fixture = std::fs::read_to_string(root.join("tests/fixtures/agents/cases.jsonl")).unwrap();
    let case: serde_json::Value = fixture
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|c| c["case_id"] == id)
        .unwrap();
    let mut w = std::io::BufWriter::new(std::fs::File::create(out).unwrap());
    for i in 0..n {
        let mut c = case.clone();
        c["case_id"] = format!("{id}-{i}").into();
        writeln!(w, "{c}").unwrap();
    }
}
