//! The Rust contract and the JSON Schemas in `schemas/` agree, and the committed corpus
//! files validate against those schemas (an independent validator: the jsonschema crate).

use crate::common;

use std::collections::BTreeSet;

use pieval::contract::fields::{
    CASE_FIELDS, CASE_RESULT_FIELDS, CONFIG_SECTIONS, DATASET_SNAPSHOT_FIELDS, FieldKind,
    MANIFEST_FIELDS, SUMMARY_FIELDS, required_case_fields,
};
use pieval::contract::{CRITERION_TYPES, record};
use serde_json::Value;

fn schema(name: &str) -> Value {
    let path = common::repo(&format!("schemas/{name}.schema.json"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object().unwrap().keys().cloned().collect()
}

fn strings(v: &Value) -> BTreeSet<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

fn set(items: impl IntoIterator<Item = impl ToString>) -> BTreeSet<String> {
    items.into_iter().map(|s| s.to_string()).collect()
}

/// The non-null branch of an optional property (`anyOf: [X, {type: null}]`).
fn unwrap_nullable(v: &Value) -> &Value {
    match v.get("anyOf") {
        Some(Value::Array(a)) if a.len() == 2 && a[1] == serde_json::json!({"type": "null"}) => {
            &a[0]
        }
        _ => v,
    }
}

fn check_case_schema(s: &Value, enriched: bool) {
    let fields: Vec<_> = CASE_FIELDS
        .iter()
        .filter(|f| enriched || !f.enriched)
        .collect();
    assert_eq!(
        keys(&s["properties"]),
        set(fields.iter().map(|f| f.name)),
        "properties"
    );
    let mut required = set(required_case_fields());
    if enriched {
        // The framework tags are additive: a corpus enriched before them is valid.
        required.extend(
            CASE_FIELDS
                .iter()
                .filter(|f| f.enriched && f.kind != FieldKind::Tags)
                .map(|f| f.name.to_owned()),
        );
    }
    assert_eq!(strings(&s["required"]), required, "required");
    for f in fields {
        let prop = unwrap_nullable(&s["properties"][f.name]);
        if let FieldKind::Enum(values) = f.kind {
            assert_eq!(
                strings(&prop["enum"]),
                set(values.iter()),
                "enum of {}",
                f.name
            );
        }
    }
    let consts: BTreeSet<String> = s["$defs"]["criterion"]["oneOf"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            b["properties"]["type"]["const"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(consts, set(CRITERION_TYPES.iter()), "criterion types");
}

#[test]
fn attack_case_schemas_agree_with_the_contract() {
    check_case_schema(&schema("attack_case"), false);
    check_case_schema(&schema("enriched_case"), true);
}

#[test]
fn artifact_schemas_agree_with_the_contract() {
    assert_eq!(
        keys(&schema("case_result")["properties"]),
        set(CASE_RESULT_FIELDS.iter())
    );
    let m = schema("manifest");
    assert_eq!(strings(&m["required"]), set(MANIFEST_FIELDS.iter()));
    assert_eq!(
        strings(&m["properties"]["dataset_snapshot"]["required"]),
        set(DATASET_SNAPSHOT_FIELDS.iter())
    );
    assert_eq!(
        strings(&schema("summary")["required"]),
        set(SUMMARY_FIELDS.iter())
    );
    let c = schema("experiment_config");
    assert_eq!(
        keys(&c["properties"]),
        set(CONFIG_SECTIONS.iter().map(|s| s.0))
    );
    assert_eq!(
        strings(&c["required"]),
        set(CONFIG_SECTIONS.iter().filter(|s| s.1).map(|s| s.0))
    );
}

fn validate_lines(schema_name: &str, rel: &str) -> usize {
    let validator = jsonschema::validator_for(&schema(schema_name)).unwrap();
    let text = std::fs::read_to_string(common::repo(rel)).unwrap();
    let mut n = 0;
    for (i, line) in text.lines().enumerate() {
        let v: Value = serde_json::from_str(line).unwrap();
        let errors: Vec<String> = validator
            .iter_errors(&v)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        assert!(errors.is_empty(), "{rel}:{}: {}", i + 1, errors.join("; "));
        n += 1;
    }
    n
}

#[test]
fn committed_corpora_validate_against_the_schemas() {
    let canonical = validate_lines("attack_case", "data/normalized/attack_cases.jsonl");
    let enriched = validate_lines(
        "enriched_case",
        "data/normalized/attack_cases.enriched.jsonl",
    );
    let handwritten = validate_lines("attack_case", "data/templates/handwritten.jsonl");
    // agentic cases: environments, criteria over actions and state
    assert_eq!(
        validate_lines("attack_case", "data/agents/mcp_tool_poisoning.jsonl"),
        6
    );
    assert_eq!(
        validate_lines("attack_case", "tests/fixtures/agents/cases.jsonl"),
        9
    );
    // AgentDojo's suites (scripts/agentdojo/export.py): environments by include.
    for (suite, n) in [
        ("banking", 160),
        ("slack", 126),
        ("travel", 160),
        ("workspace", 280),
    ] {
        let rel = format!("data/agentdojo/agentdojo-{suite}.jsonl");
        assert_eq!(validate_lines("attack_case", &rel), n, "{rel}");
    }
    assert!(canonical >= 2000);
    assert_eq!(canonical, enriched);
    assert!(handwritten >= 50);
}

#[test]
fn the_validator_and_the_schema_reject_the_same_bad_records() {
    let validator = jsonschema::validator_for(&schema("attack_case")).unwrap();
    let ok = r#"{"case_id":"c-1","source_name":"t","source_type":"synthetic","attack_family":"naive","attack_surface":"email","prompt":"p","success_criteria":{"type":"contains","value":"X"}}"#;
    let bad = [
        ok.replace(r#""case_id":"c-1","#, ""),
        ok.replace(r#""prompt":"p""#, r#""prompt":"  ""#),
        ok.replace(r#""prompt":"p""#, r#""prompt":3"#),
        ok.replace("synthetic", "synthetik"),
        ok.replace("email", "e-mail"),
        ok.replace(r#""naive""#, r#""Naive Family""#),
        ok.replace(r#""case_id":"c-1""#, r#""case_id":"../etc/passwd""#),
        ok.replace(
            r#"{"type":"contains","value":"X"}"#,
            r#"{"type":"contians","value":"X"}"#,
        ),
        ok.replace(
            r#"{"type":"contains","value":"X"}"#,
            r#"{"type":"contains","value":""}"#,
        ),
        ok.replace(
            r#"{"type":"contains","value":"X"}"#,
            r#"{"type":"any","of":[]}"#,
        ),
        ok.replace(r#"{"type":"contains","value":"X"}"#, "7"),
        ok.replace(r#""prompt":"p""#, r#""prompt":"p","language":"english""#),
        ok.replace(
            r#""prompt":"p""#,
            r#""prompt":"p","created_at":"yesterday""#,
        ),
    ];
    assert!(validator.is_valid(&serde_json::from_str(ok).unwrap()));
    for line in bad {
        let v: Value = serde_json::from_str(&line).unwrap();
        let rec = record::RawRecord::parse(&line).unwrap();
        let mut problems = Vec::new();
        record::check_record(
            &rec,
            1,
            &mut record::CriteriaCache::default(),
            &mut problems,
        );
        let rust_rejects = problems
            .iter()
            .any(|p| p.level == pieval::contract::Level::Error);
        let schema_rejects = !validator.is_valid(&v);
        assert!(
            rust_rejects && schema_rejects,
            "rust {rust_rejects} schema {schema_rejects}: {line}"
        );
    }
}

/// The config JSON Schema and the serde config agree: every key of every section, and
/// the shipped configs and a run's config_snapshot validate; a run's manifest validates
/// against the manifest schema.
#[test]
fn experiment_config_schema_agrees_with_the_parser() {
    use pieval::experiment::config::Config;
    let schema_v = schema("experiment_config");
    let validator = jsonschema::validator_for(&schema_v).unwrap();
    let dir = common::repo("data/experiments");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let loaded = Config::load(&path).unwrap();
            let snap = loaded.config.snapshot();
            let errors: Vec<String> = validator
                .iter_errors(&snap)
                .map(|e| e.to_string())
                .collect();
            assert!(errors.is_empty(), "{}: {errors:?}", path.display());
            // Every serialized key is declared by the schema, section by section.
            for (section, value) in snap.as_object().unwrap() {
                let declared = keys(&schema_v["properties"][section]["properties"]);
                assert!(keys(value).is_subset(&declared), "section {section}");
            }
            seen += 1;
        }
    }
    assert!(seen >= 1);
    // A config that sets every key: the parser accepts exactly the schema's keys.
    let full = "experiment: {name: x, seed: 1, sample_size: 5, output_dir: r, description: d}
dataset: {path: a.jsonl}
selection: {include: {language: [en]}, exclude: {label: [benign]}, case_ids: [a], stratify_by: [attack_family]}
model: {provider: openai, name: m, base_url: 'http://h/v1', api_key_env: K, max_tokens: 9, temperature: 0.5,
        top_p: 0.9, execution_mode: live, concurrency: 2, requests_per_minute: 60, timeout_s: 5,
        max_retries: 1, path: m.gguf, replay_from: r1}
mitigation: {name: delimiters, params: {length: 8}}
evaluation: {leakage_threshold: 0.6, judge: {provider: openai, name: j, base_url: 'http://h/v1',
        api_key_env: J, concurrency: 3, requests_per_minute: 30, timeout_s: 9, max_retries: 2,
        max_tokens: 64, rubric: r.md, inputs: [question, response, goal], path: j.gguf,
        replay_from: runs/x, cache: c.parquet, calibration: l.jsonl, rationale_chars: 80}}
";
    let snap = Config::parse(full, std::path::Path::new("full.yaml"))
        .unwrap()
        .snapshot();
    assert!(validator.iter_errors(&snap).next().is_none());
    for (section, value) in snap.as_object().unwrap() {
        let mut declared = keys(&schema_v["properties"][section]["properties"]);
        // provider http's and exec's own sections (data/experiments/http-app.yaml and
        // exec-chain.yaml set them)
        if section == "model" {
            declared.remove("http");
            declared.remove("exec");
            declared.remove("websocket");
            // one of the two, checked below
            declared.remove("world");
            declared.remove("traces");
        }
        assert_eq!(keys(value), declared, "section {section}");
    }
    // a served world, or a trace receiver: each key the schema declares is parsed
    for (extra, section) in [
        ("world: {listen: '127.0.0.1:0'}", "world"),
        ("traces: {listen: '127.0.0.1:4318', wait_s: 5}", "traces"),
    ] {
        let text = format!(
            "experiment: {{name: x}}\ndataset: {{path: a.jsonl}}\nmodel: {{provider: openai, name: m, base_url: 'http://h/v1', {extra}}}\nmitigation: {{name: none}}\n"
        );
        let snap = Config::parse(&text, std::path::Path::new("x.yaml"))
            .unwrap()
            .snapshot();
        assert!(validator.iter_errors(&snap).next().is_none(), "{extra}");
        assert_eq!(
            keys(&snap["model"][section]),
            keys(&schema_v["properties"]["model"]["properties"][section]["properties"]),
            "{section}"
        );
    }
    // The attack section: no one valid config sets every key (a strategy excludes
    // converters, max_backtracks is Crescendo's, branching TAP's), so two together do.
    let base = "experiment: {name: x}\ndataset: {path: a.jsonl}\nmodel: {provider: local, name: m}\nmitigation: {name: none}\n";
    let model = "{provider: openai, name: a, base_url: 'http://h/v1'}";
    let mut attack_keys = std::collections::BTreeSet::new();
    for attack in [
        format!(
            "attack: {{original: false, converters: [base64, [rot13, {{translate: {{language: French}}}}], {{best_of_n: {{n: 2}}}}], translator: {model}}}\n"
        ),
        format!(
            "attack: {{strategy: tap, attacker: {model}, max_turns: 9, branching: 2, width: 2, depth: 3}}\n"
        ),
        format!(
            "attack: {{strategy: crescendo, attacker: {model}, max_turns: 4, max_backtracks: 2}}\n"
        ),
    ] {
        let snap = Config::parse(&format!("{base}{attack}"), std::path::Path::new("a.yaml"))
            .unwrap()
            .snapshot();
        let errors: Vec<String> = validator
            .iter_errors(&snap)
            .map(|e| e.to_string())
            .collect();
        assert!(errors.is_empty(), "{attack}: {errors:?}");
        attack_keys.extend(keys(&snap["attack"]));
    }
    assert_eq!(
        attack_keys,
        keys(&schema_v["properties"]["attack"]["properties"]),
        "attack"
    );
    let judge_declared =
        keys(&schema_v["properties"]["evaluation"]["properties"]["judge"]["properties"]);
    assert_eq!(
        keys(&snap["evaluation"]["judge"]),
        judge_declared,
        "evaluation.judge"
    );
    // Required keys: the parser rejects a config without each required section.
    for (section, required) in CONFIG_SECTIONS {
        let mut text = String::new();
        for (s, body) in [
            ("experiment", "{name: x}"),
            ("dataset", "{path: a.jsonl}"),
            ("model", "{provider: local, name: m}"),
            ("mitigation", "{name: none}"),
        ] {
            if s != *section {
                text.push_str(&format!("{s}: {body}\n"));
            }
        }
        let parsed = Config::parse(&text, std::path::Path::new("t.yaml"));
        assert_eq!(parsed.is_err(), *required, "section {section}: {parsed:?}");
    }
}
