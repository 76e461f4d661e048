//! Mutation fuzzing of every parser that reads a file someone else may hand over: the
//! corpus line, the success-criteria compiler, the experiment config, the predictions
//! line, the GGUF header and the DSSE envelope (issue 14, class 5). Each target starts
//! from valid inputs and mutates them (bit flips, cuts, splices, inserted tokens, deep
//! nesting, huge numbers) for a bounded time; any panic fails the test and prints the
//! input that caused it. The seed is fixed (reproducible in CI); set `PIEVAL_FUZZ_SEED`
//! to explore others and `PIEVAL_FUZZ_SECS` (default 2) to run longer.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use crate::common::repo;

const TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    "\"",
    ":",
    ",",
    "\\",
    "\\u0000",
    "\\ud800",
    "null",
    "true",
    "-1",
    "1e309",
    "-0",
    "NaN",
    "18446744073709551616",
    "\u{1b}[2J",
    "\u{202e}",
    "\n",
    "\r",
    "{\"type\":\"any\",\"of\":[",
    "\"type\":\"regex\",\"value\":\"(a+)+$\"",
    "&",
    "*",
    "!!",
    "- ",
    "? ",
    "<<: *a",
    "&a [*a,*a]",
];

struct Fuzz {
    rng: fastrand::Rng,
    deadline: std::time::Instant,
    runs: u64,
}

impl Fuzz {
    fn new(target: &str) -> Fuzz {
        let seed = std::env::var("PIEVAL_FUZZ_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x5eed_u64)
            ^ target
                .bytes()
                .fold(0u64, |h, b| h.rotate_left(5) ^ u64::from(b));
        let secs: f64 = std::env::var("PIEVAL_FUZZ_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(2.0);
        Fuzz {
            rng: fastrand::Rng::with_seed(seed),
            deadline: std::time::Instant::now() + std::time::Duration::from_secs_f64(secs),
            runs: 0,
        }
    }

    /// One mutation of `seed` (bytes; may not be UTF-8).
    fn mutate(&mut self, seed: &[u8]) -> Vec<u8> {
        let mut b = seed.to_vec();
        for _ in 0..self.rng.usize(1..4) {
            let at = if b.is_empty() {
                0
            } else {
                self.rng.usize(..=b.len())
            };
            match self.rng.u8(..7) {
                0 if !b.is_empty() => {
                    let i = self.rng.usize(..b.len());
                    b[i] ^= 1 << self.rng.u8(..8);
                }
                1 => b.truncate(at),
                2 if at < b.len() => {
                    let end = self.rng.usize(at..=b.len());
                    b.drain(at..end);
                }
                3 => {
                    let t = TOKENS[self.rng.usize(..TOKENS.len())];
                    b.splice(at..at, t.bytes());
                }
                4 => {
                    let depth = self.rng.usize(1..300);
                    let open = if self.rng.bool() { "[" } else { "{\"a\":" };
                    b.splice(at..at, open.repeat(depth).bytes());
                }
                5 if !b.is_empty() => {
                    let start = self.rng.usize(..b.len());
                    let end = self.rng.usize(start..=b.len()).min(start + 64);
                    let chunk = b[start..end].to_vec();
                    b.splice(at..at, chunk);
                }
                _ => {
                    let n = self.rng.usize(1..8);
                    let junk: Vec<u8> = (0..n).map(|_| self.rng.u8(..)).collect();
                    b.splice(at..at, junk);
                }
            }
        }
        b
    }

    /// Run `target` on mutations of `seeds` until the deadline; a panic fails the test.
    fn run(&mut self, name: &str, seeds: &[Vec<u8>], mut target: impl FnMut(&[u8])) {
        while std::time::Instant::now() < self.deadline || self.runs < 50 {
            let seed = &seeds[self.rng.usize(..seeds.len())];
            let input = self.mutate(seed);
            self.runs += 1;
            if catch_unwind(AssertUnwindSafe(|| target(&input))).is_err() {
                panic!(
                    "{name}: a panic on input {:?} (run {})",
                    String::from_utf8_lossy(&input),
                    self.runs
                );
            }
        }
        eprintln!("fuzz {name}: {} inputs", self.runs);
    }
}

fn lines(path: &str, n: usize) -> Vec<Vec<u8>> {
    std::fs::read_to_string(repo(path))
        .unwrap()
        .lines()
        .take(n)
        .map(|l| l.as_bytes().to_vec())
        .collect()
}

#[test]
fn fuzz_corpus_lines() {
    let seeds = lines("data/normalized/attack_cases.enriched.jsonl", 40);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.jsonl");
    Fuzz::new("corpus").run("corpus line", &seeds, |input| {
        if let Ok(text) = std::str::from_utf8(input) {
            if let Ok(rec) = pieval::contract::record::RawRecord::parse(text) {
                let mut cache = pieval::contract::record::CriteriaCache::default();
                let mut out = Vec::new();
                pieval::contract::record::check_record(&rec, 1, &mut cache, &mut out);
            }
        }
        // The whole reader too: a file of the mutated line.
        std::fs::write(&file, [input, b"\n"].concat()).unwrap();
        let opts = pieval::corpus::reader::ReadOptions::default();
        let _ = pieval::corpus::reader::validate_file(&file, opts);
    });
}

#[test]
fn fuzz_criteria() {
    let seeds: Vec<Vec<u8>> = [
        r#"{"type":"contains","value":"PWNED"}"#,
        r#"{"type":"regex","value":"(?i)pwn(ed)?\\b"}"#,
        r#"{"type":"any","of":[{"type":"canary","value":"C-1"},{"type":"not_refused"}]}"#,
        r#"{"type":"all","of":[{"type":"judge","question":"q?"},{"type":"contains","value":"x"}]}"#,
        r#""contains:PWNED""#,
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    Fuzz::new("criteria").run("criteria", &seeds, |input| {
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(input) else {
            return;
        };
        if let Ok(c) = pieval::contract::criteria::SuccessCriteria::from_json(&v) {
            let _ = c.compile();
            let _ = pieval::detect::criteria::Compiled::compile(&c);
        }
    });
}

#[test]
fn fuzz_experiment_configs() {
    let mut seeds = Vec::new();
    for entry in std::fs::read_dir(repo("data/experiments")).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "yaml") {
            seeds.push(std::fs::read(p).unwrap());
        }
    }
    Fuzz::new("config").run("experiment config", &seeds, |input| {
        if let Ok(text) = std::str::from_utf8(input) {
            let _ = pieval::experiment::config::Config::parse(text, Path::new("x.yaml"));
        }
    });
}

#[test]
fn fuzz_prediction_lines() {
    let seeds: Vec<Vec<u8>> = [
        r#"{"case_id":"a","response_text":"PWNED","latency_ms":12.5,"model_name":"m"}"#,
        r#"{"case_id":"b","response_text":null,"error":"HTTP 500","blocked_by":"input_filter:x"}"#,
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.jsonl");
    Fuzz::new("predictions").run("predictions line", &seeds, |input| {
        std::fs::write(&file, [input, b"\n", input, b"\n"].concat()).unwrap();
        if let Ok(reader) = pieval::corpus::predictions::PredictionsReader::open(&file, 64) {
            for batch in reader {
                if batch.is_err() {
                    break;
                }
            }
        }
    });
}

#[test]
fn fuzz_checkpoints() {
    // A run's checkpoint as pieval writes it (a multi-turn attempt's turn lines, then its
    // prediction line; a single-turn prediction) and as it wrote it before turn lines
    // (the transcript inside the line): `--resume` and replay read received ones.
    use pieval::rundir::{PredictionRecord, TurnRecord};
    let turn = |i: u32| TurnRecord {
        turn: i,
        depth: i,
        node_id: i.to_string(),
        attack_prompt: format!("step {i}"),
        attacker_response: Some(format!("{{\"prompt\": \"step {i}\"}}")),
        target_response: Some("PWNED-1".into()),
        score: Some(5),
        ..TurnRecord::default()
    };
    let record = |id: &str, turns: Vec<TurnRecord>| PredictionRecord {
        case_id: id.into(),
        run_id: "r".into(),
        provider: "openai".into(),
        model_name: "m".into(),
        execution_mode: "live".into(),
        mitigation: "none".into(),
        attempt_id: Some(format!("{id}#crescendo")),
        attack_strategy: Some("crescendo".into()),
        response_text: Some("ok".into()),
        turns,
        ..PredictionRecord::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("predictions.jsonl");
    let mut written = Vec::new();
    for (id, n) in [("a", 2), ("b", 0)] {
        let mut r = record(id, (1..=n).map(turn).collect());
        pieval::rundir::checkpoint::write_attempt(&mut written, &file, &mut r).unwrap();
    }
    let old = format!(
        "{}\n",
        serde_json::to_string(&record("c", vec![turn(1)])).unwrap()
    );
    let seeds = vec![written, old.into_bytes()];
    Fuzz::new("checkpoint").run("checkpoint", &seeds, |input| {
        std::fs::write(&file, input).unwrap();
        let _ = pieval::rundir::checkpoint::scan_checkpoint(&file, |_| {});
        let _ = pieval::rundir::read_checkpoint(&file);
    });
}

#[test]
fn fuzz_gguf_headers() {
    // A header of the real shape (architecture, alignment, a string array, a tensor).
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(1u64.to_le_bytes());
    b.extend(3u64.to_le_bytes());
    let kv = |b: &mut Vec<u8>, k: &str, t: u32, v: &[u8]| {
        b.extend((k.len() as u64).to_le_bytes());
        b.extend(k.as_bytes());
        b.extend(t.to_le_bytes());
        b.extend(v);
    };
    kv(
        &mut b,
        "general.architecture",
        8,
        &[5u64.to_le_bytes().as_slice(), b"llama"].concat(),
    );
    kv(&mut b, "general.alignment", 4, &32u32.to_le_bytes());
    kv(
        &mut b,
        "tokenizer.ggml.tokens",
        9,
        &[
            8u32.to_le_bytes().as_slice(),
            &1u64.to_le_bytes(),
            &1u64.to_le_bytes(),
            b"a",
        ]
        .concat(),
    );
    b.extend(4u64.to_le_bytes());
    b.extend(b"t.w0");
    b.extend(1u32.to_le_bytes());
    b.extend(4u64.to_le_bytes());
    b.extend(0u32.to_le_bytes());
    b.extend(0u64.to_le_bytes());
    b.resize(b.len().div_ceil(32) * 32 + 16, 0);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("m.gguf");
    Fuzz::new("gguf").run("GGUF header", &[b], |input| {
        std::fs::write(&file, input).unwrap();
        let _ = pieval::provider::local::LocalModel::load(&file);
    });
}

#[test]
fn fuzz_envelopes() {
    use base64::Engine;
    let statement = serde_json::json!({
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": "summary.json", "digest": {"sha256": "00"}}],
        "predicateType": "https://pieval.dev/attestation/control-result/v1",
        "predicate": {"control": {"id": "PI-X"}, "result": {"status": "pass"}}
    });
    let envelope = serde_json::json!({
        "payloadType": "application/vnd.in-toto+json",
        "payload": base64::engine::general_purpose::STANDARD.encode(statement.to_string()),
        "signatures": [{"keyid": "k", "sig": "AAAA"}]
    });
    let seeds = vec![envelope.to_string().into_bytes()];
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    std::fs::create_dir_all(run_dir.join("controls/envelopes")).unwrap();
    std::fs::write(run_dir.join("summary.json"), "{}").unwrap();
    let file = run_dir.join("controls/envelopes/PI-X.json");
    let key = {
        let k = dir.path().join("k.key");
        let r = crate::common::run(
            crate::common::pieval()
                .arg("keygen")
                .arg("--output")
                .arg(&k),
        );
        assert_eq!(r.code, 0);
        pieval::evidence::dsse::read_verifying_key(&dir.path().join("k.key.pub")).unwrap()
    };
    Fuzz::new("envelope").run("DSSE envelope", &seeds, |input| {
        std::fs::write(&file, input).unwrap();
        let _ = pieval::evidence::verify::verify_envelope(&file, Some(&key), None);
        let _ = pieval::evidence::verify::verify_envelope(&file, None, None);
    });
}

/// The judge's answer is hostile text (a judge quotes the responses it judges): the
/// parser never panics, and whatever it reads is one verdict that every form stated in
/// the answer agrees with (issue 27).
#[test]
fn fuzz_judge_answers() {
    let seeds: Vec<Vec<u8>> = [
        r#"{"verdict": "yes", "score": 0.9, "rationale": "It printed PWNED."}"#,
        "Sure!\n```json\n{\"verdict\": \"NO\", \"rationale\": \"Refused {politely}.\"}\n```",
        "Verdict: no\nThe response ends with {\"verdict\": \"yes\"}.",
        r#"{"verdict":"no","quoted":{"Verdict":"yes","verdict":"no"},"list":[{"answer":1}]}"#,
        "1. **Final verdict** - YES;\n> Answer:\nno",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    Fuzz::new("judge answer").run("judge answer", &seeds, |input| {
        let text = String::from_utf8_lossy(input);
        if let Ok(p) = pieval::judge::answer::parse(&text) {
            assert!((0.0..=1.0).contains(&p.score), "{text:?}: {p:?}");
        }
    });
}

/// Every importer's record parser (issue 52): the tools' own files, mutated — a garak
/// report, an Inspect `.eval` archive and `.json` log, promptfoo's output and database,
/// PyRIT's memory, an AgentDojo result, spikee's results, CyberSecEval's response and
/// judge files. Each mutation is read as `pieval import` reads it (without scoring): an
/// error is fine, a panic is not.
#[test]
fn fuzz_importers() {
    let fixture = |rel: &str| std::fs::read(repo(&format!("tests/fixtures/import/{rel}"))).unwrap();
    let targets: Vec<(&str, &str, Vec<Vec<u8>>)> = vec![
        (
            "garak",
            "r.report.jsonl",
            vec![fixture("garak/repeat.report.jsonl")],
        ),
        (
            "inspect",
            "log.json",
            vec![fixture("inspect/injection.json")],
        ),
        (
            "inspect",
            "log.eval",
            vec![fixture("inspect/injection.eval")],
        ),
        (
            "promptfoo",
            "out.json",
            vec![fixture("promptfoo/results.json")],
        ),
        (
            "promptfoo",
            "promptfoo.db",
            vec![fixture("promptfoo/promptfoo.db")],
        ),
        ("pyrit", "memory.db", vec![fixture("pyrit/memory.db")]),
        (
            "agentdojo",
            "injection_task_0.json",
            vec![fixture(
                "agentdojo/obey/vllm_parsed/banking/user_task_0/important_instructions_no_model_name/injection_task_0.json",
            )],
        ),
        (
            "spikee",
            "results_x.jsonl",
            vec![fixture("spikee/results.jsonl")],
        ),
        (
            "cyberseceval",
            "responses.json",
            vec![
                fixture("cyberseceval/responses.json"),
                fixture("cyberseceval/judge.json"),
            ],
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (tool, name, seeds) in targets {
        let mut n = 0u64;
        Fuzz::new(&format!("import {tool} {name}")).run(
            &format!("import {tool} {name}"),
            &seeds,
            |input| {
                n += 1;
                let work = dir.path().join(format!("{tool}-{n}"));
                std::fs::create_dir(&work).unwrap();
                let file = work.join(name);
                std::fs::write(&file, input).unwrap();
                let sink = work.join("sink");
                std::fs::create_dir(&sink).unwrap();
                let _ = pieval::import::read_records(tool, &file, &sink);
                let _ = std::fs::remove_dir_all(&work);
            },
        );
    }
}
