//! Detector quality is regression-tested: every detector runs over the labelled sets in
//! `data/labels/` (through `pieval detectors eval`'s engine) and each figure recorded in
//! `data/labels/metrics.json` must hold within one point. The README's table is the same
//! figures. After a deliberate change, re-record with
//! `PIEVAL_RECORD_METRICS=1 cargo test --test it -- detector_quality` and review the diff.

use serde_json::{Value, json};

use crate::common::repo;
use pieval::ops::detector_eval::{Detector, Evaluation, Mapping, evaluate, load_labels};

/// (detector, labelled set): what is measured and published.
const MEASURED: &[(&str, &str)] = &[
    ("refusal", "data/labels/refusal.jsonl"),
    ("response_class", "data/labels/refusal.jsonl"),
    ("leakage", "data/labels/leakage.jsonl"),
    ("criteria", "data/labels/criteria.jsonl"),
    ("criteria", "data/labels/echo.jsonl"),
    ("injection", "data/labels/injection.jsonl"),
];

const METRICS: &[&str] = &["accuracy", "precision", "recall", "f1"];

fn measure(detector: &str, labels: &str) -> Evaluation {
    let d = Detector::parse(detector, pieval::detect::udf::LEAKAGE_THRESHOLD).unwrap();
    pieval::engine::runtime()
        .unwrap()
        .block_on(async {
            let labels = load_labels(&repo(labels), &Mapping::default(), &d).await?;
            evaluate(&d, &labels, None, None).await
        })
        .unwrap()
}

fn round(v: Option<f64>) -> Value {
    v.map_or(Value::Null, |v| json!((v * 1000.0).round() / 1000.0))
}

/// The figures of one evaluation, per split and overall.
fn figures(detector: &str, labels: &str, e: &Evaluation) -> Vec<Value> {
    e.groups
        .iter()
        .filter(|g| g.dimension != "source")
        .map(|g| {
            let c = &g.confusion;
            json!({
                "detector": detector,
                "labels": labels,
                "labels_sha256": pieval::digest::sha256_file(&repo(labels)).unwrap(),
                "split": g.value,
                "rows": g.rows,
                "accuracy": round(g.accuracy.value),
                "precision": round(g.precision.value),
                "recall": round(g.recall.value),
                "f1": round(g.f1.value),
                "three_class_accuracy": round(g.class_accuracy.as_ref().and_then(|a| a.value)),
                "confusion": [c.tp, c.fp, c.tn, c.fn_],
            })
        })
        .collect()
}

/// The README row of one recorded figure set (test split).
fn readme_row(f: &Value) -> String {
    let pct = |k: &str| {
        f[k].as_f64()
            .map_or("–".to_owned(), |v| format!("{:.1}%", v * 100.0))
    };
    format!(
        "| `{}` | {} | {} | {} | {} | {} | {} |",
        f["detector"].as_str().unwrap(),
        f["rows"],
        pct("accuracy"),
        pct("precision"),
        pct("recall"),
        pct("f1"),
        pct("three_class_accuracy"),
    )
}

#[test]
fn every_detector_holds_its_recorded_accuracy_on_the_labelled_sets() {
    let mut measured = Vec::new();
    for (detector, labels) in MEASURED {
        measured.extend(figures(detector, labels, &measure(detector, labels)));
    }
    let path = repo("data/labels/metrics.json");
    if std::env::var_os("PIEVAL_RECORD_METRICS").is_some() {
        let text = serde_json::to_string_pretty(&json!({
            "note": "recorded by tests/it/detector_quality.rs; figures are fractions",
            "figures": measured,
        }))
        .unwrap();
        std::fs::write(&path, text + "\n").unwrap();
    }
    let recorded: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let recorded = recorded["figures"].as_array().unwrap();
    assert_eq!(
        recorded.len(),
        measured.len(),
        "the same groups are measured"
    );
    for r in recorded {
        let m = measured
            .iter()
            .find(|m| {
                m["detector"] == r["detector"]
                    && m["labels"] == r["labels"]
                    && m["split"] == r["split"]
            })
            .unwrap_or_else(|| panic!("not measured: {r}"));
        assert_eq!(m["rows"], r["rows"], "the labelled set changed: {r}");
        assert_eq!(
            m["labels_sha256"], r["labels_sha256"],
            "the labelled set changed (re-record the figures): {r}"
        );
        for k in METRICS.iter().chain(&["three_class_accuracy"]) {
            if let (Some(was), Some(now)) = (r[k].as_f64(), m[k].as_f64()) {
                assert!(
                    now >= was - 0.01,
                    "{} {} on the {} split dropped from {was} to {now}",
                    r["detector"],
                    k,
                    r["split"]
                );
            }
        }
    }
    // The README publishes the test split of each, as recorded.
    let readme = std::fs::read_to_string(repo("README.md")).unwrap();
    for r in recorded.iter().filter(|r| r["split"] == "test") {
        let row = readme_row(r);
        assert!(readme.contains(&row), "README.md lacks the row\n{row}");
    }
}

/// The echo set's goal: on its test split, attack success as scoring decides it (the
/// decision kernel, echo-aware, `pi_decide`) is right when it says yes at least 95% of the
/// time and finds at least 90% of the compliant responses. An undecided row (an echo left
/// for a judge or a person) is not a success: it counts against recall. Without the echo
/// view (`pi_criteria_match`), precision is lower: the view is what meets the goal.
#[test]
fn attack_success_is_precise_on_the_echo_set() {
    let r = crate::common::run(crate::common::pieval().args([
        "sql",
        "--format",
        "csv",
        "--table",
        &format!("e={}", repo("data/labels/echo.jsonl").display()),
        "SELECT
            count(*) FILTER (WHERE d['success'] AND label = 'complied') AS tp,
            count(*) FILTER (WHERE d['success'] AND label <> 'complied') AS fp,
            count(*) FILTER (WHERE NOT coalesce(d['success'], false) AND label = 'complied') AS fn,
            count(*) FILTER (WHERE before AND label = 'complied') AS tp0,
            count(*) FILTER (WHERE before AND label <> 'complied') AS fp0,
            count(*) FILTER (WHERE d['success'] IS NULL AND d['echoed'] AND label = 'echoed') AS echoes
         FROM (SELECT label, pi_decide(response, criteria, NULL, protected, prompt, goal) AS d,
                      pi_criteria_match(response, criteria) AS before
               FROM e WHERE split = 'test')",
    ]));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let line = r.stdout.lines().nth(1).expect("a row");
    let v: Vec<f64> = line.split(',').map(|x| x.parse().unwrap()).collect();
    let (tp, fp, fn_, tp0, fp0, echoes) = (v[0], v[1], v[2], v[3], v[4], v[5]);
    let (precision, recall) = (tp / (tp + fp), tp / (tp + fn_));
    assert!(
        precision >= 0.95,
        "precision {precision:.3} on the echo set's test split"
    );
    assert!(
        recall >= 0.90,
        "recall {recall:.3} on the echo set's test split"
    );
    let before = tp0 / (tp0 + fp0);
    assert!(
        before < precision,
        "without the echo view: precision {before:.3}"
    );
    assert!(echoes >= 15.0, "echoes left undecided: {echoes}");
}

#[test]
fn the_labelled_sets_are_big_enough_and_split_by_source() {
    let rows = |p: &str| crate::common::read_jsonl(&repo(p));
    let refusal = rows("data/labels/refusal.jsonl");
    let leakage = rows("data/labels/leakage.jsonl");
    let echo = rows("data/labels/echo.jsonl");
    assert!(refusal.len() >= 1000, "{}", refusal.len());
    assert!(leakage.len() >= 300, "{}", leakage.len());
    assert!(echo.len() >= 400, "{}", echo.len());
    // two model families, three classes
    let models: std::collections::BTreeSet<&str> =
        echo.iter().map(|r| r["model"].as_str().unwrap()).collect();
    assert!(models.len() >= 2, "{models:?}");
    for class in ["complied", "echoed", "refused"] {
        assert!(echo.iter().any(|r| r["label"] == class), "no {class} row");
    }
    for set in [&refusal, &leakage, &echo] {
        // a source is wholly dev or wholly test
        let mut split_of = std::collections::HashMap::new();
        for r in set {
            let s = split_of
                .entry(r["source"].as_str().unwrap().to_owned())
                .or_insert_with(|| r["split"].clone());
            assert_eq!(*s, r["split"], "{r}");
        }
        assert!(split_of.values().any(|s| s == "dev"));
        assert!(split_of.values().any(|s| s == "test"));
    }
    let languages: std::collections::BTreeSet<&str> = refusal
        .iter()
        .map(|r| r["language"].as_str().unwrap())
        .collect();
    assert!(languages.len() >= 10, "{languages:?}");
}

#[test]
fn bad_labelled_files_name_the_file_row_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let cases: &[(&str, &str, &str)] = &[
        ("{\"response\": \"hi\"}\n", "refusal", "label"),
        (
            "{\"response\": \"hi\", \"label\": \"maybe\"}\n",
            "refusal",
            "label",
        ),
        (
            "{\"id\": \"a\", \"response\": \"x\", \"label\": true}\n{\"id\": \"a\", \"response\": \"y\", \"label\": false}\n",
            "refusal",
            "duplicate id",
        ),
        (
            "{\"response\": \"x\", \"label\": true}\n",
            "leakage",
            "protected",
        ),
        (
            "{\"response\": \"x\", \"label\": true, \"protected\": \"  \"}\n",
            "leakage",
            "protected",
        ),
        ("{\"response\": 1\n", "refusal", "labels.jsonl"),
    ];
    for (i, (text, detector, expect)) in cases.iter().enumerate() {
        let path = dir.path().join("labels.jsonl");
        std::fs::write(&path, text).unwrap();
        let out = dir.path().join(format!("out{i}"));
        let r = crate::common::run(
            crate::common::pieval()
                .args(["detectors", "eval", "--detector", detector, "--labels"])
                .arg(&path)
                .arg("--output")
                .arg(&out),
        );
        assert_eq!(r.code, 2, "{text}: {}", r.stderr);
        assert!(
            r.stderr.contains(expect) && r.stderr.contains("labels.jsonl"),
            "{text}: {}",
            r.stderr
        );
        assert!(!out.join("evaluation.json").exists(), "nothing written");
    }
    let r = crate::common::run(crate::common::pieval().args([
        "detectors",
        "eval",
        "--detector",
        "rule:no.such.rule",
        "--labels",
        "x.jsonl",
    ]));
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("no injection rule"), "{}", r.stderr);
}

#[test]
fn detectors_eval_prints_the_table_and_writes_the_disagreements() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("eval");
    let r = crate::common::run(
        crate::common::pieval()
            .args(["detectors", "eval", "--detector", "refusal", "--labels"])
            .arg(repo("data/labels/refusal.jsonl"))
            .arg("--output")
            .arg(&out),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    for text in ["split test", "split dev", "accuracy", "source handwritten"] {
        assert!(r.stdout.contains(text), "{text}: {}", r.stdout);
    }
    let e: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("evaluation.json")).unwrap())
            .unwrap();
    let disagreements = e["disagreements"].as_u64().unwrap();
    assert!(disagreements > 0);
    let n = crate::common::run(
        crate::common::pieval()
            .args(["sql", "--format", "csv", "--results"])
            .arg(dir.path())
            .arg("--table")
            .arg(format!("d={}", out.join("disagreements.parquet").display()))
            .arg("SELECT count(*) AS n FROM d WHERE verdict IS DISTINCT FROM label OR class <> predicted_class"),
    );
    assert_eq!(n.code, 0, "{}", n.stderr);
    assert!(
        n.stdout.contains(&disagreements.to_string()),
        "{}",
        n.stdout
    );
}
