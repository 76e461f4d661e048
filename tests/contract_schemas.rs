//! The Rust contract and the JSON Schemas in `schemas/` agree, and the committed corpus
//! files validate against those schemas (an independent validator: the jsonschema crate).

mod common;

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
        required.extend(
            CASE_FIELDS
                .iter()
                .filter(|f| f.enriched)
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
