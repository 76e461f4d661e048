//! `pieval controls … --junit FILE --sarif FILE`: the controls as JUnit XML, validated
//! against Jenkins' JUnit XSD (`xmllint --schema`), and the successful attacks as SARIF
//! 2.1.0, validated against the OASIS JSON Schema (tests/fixtures/schemas/, with their
//! provenance), on a run imported from spikee's real results.

use crate::common;

use std::path::Path;

use common::{pieval, repo, run};
use serde_json::Value;

fn xmllint_validates(xsd: &Path, xml: &Path) -> Result<(), String> {
    let out = std::process::Command::new("xmllint")
        .arg("--noout")
        .arg("--schema")
        .arg(xsd)
        .arg(xml)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "xmllint is needed for the JUnit test: apt-get install libxml2-utils (.ci/run does): {e}"
            )
        });
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[test]
fn controls_write_junit_and_sarif_that_their_schemas_accept() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("spikee-run");
    let r = run(pieval()
        .args(["import", "spikee"])
        .arg(repo("tests/fixtures/import/spikee/results.jsonl"))
        .arg("--output")
        .arg(&out));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let (junit, sarif) = (
        dir.path().join("ci/controls.xml"),
        dir.path().join("ci/pieval.sarif"),
    );
    let r = run(pieval()
        .arg("controls")
        .arg(&out)
        .arg("--junit")
        .arg(&junit)
        .arg("--sarif")
        .arg(&sarif)
        .args(["--fail-on", "fail"]));
    assert!(r.code == 0 || r.code == 1, "{}", r.stderr);

    // JUnit: valid against the XSD; a test case per control (and group); the failing
    // controls are failures naming the measured value and the threshold.
    let xsd = repo("tests/fixtures/schemas/jenkins-junit.xsd");
    xmllint_validates(&xsd, &junit).unwrap_or_else(|e| panic!("JUnit not valid: {e}"));
    let xml = std::fs::read_to_string(&junit).unwrap();
    let report: Value = {
        let r = run(pieval().arg("controls").arg(&out).arg("--json"));
        serde_json::from_str(&r.stdout).unwrap()
    };
    let controls = report["controls"].as_array().unwrap();
    let failed = controls
        .iter()
        .filter(|c| c["result"]["status"] == "fail")
        .count();
    assert!(failed > 0, "the fixture run should fail a control");
    assert!(xml.matches("<testcase ").count() >= controls.len());
    assert!(xml.matches("<failure ").count() >= failed, "{xml}");
    assert!(xml.contains("measured") && xml.contains("against"), "{xml}");
    // Invalid XML is caught by the validator (the check can fail).
    let bad = dir.path().join("bad.xml");
    std::fs::write(&bad, xml.replace("<testsuite ", "<testsuite bogus=\"1\" ")).unwrap();
    assert!(xmllint_validates(&xsd, &bad).is_err());

    // SARIF: valid against the 2.1.0 schema; one result per successful attack, rule ids
    // the families, the framework references as properties.
    let schema: Value = serde_json::from_slice(
        &std::fs::read(repo("tests/fixtures/schemas/sarif-2.1.0.json")).unwrap(),
    )
    .unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let doc: Value = serde_json::from_slice(&std::fs::read(&sarif).unwrap()).unwrap();
    let errors: Vec<String> = validator.iter_errors(&doc).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "SARIF not valid: {errors:?}");
    let rows = common::read_jsonl(&out.join("case_results.jsonl"));
    let successes: Vec<&Value> = rows
        .iter()
        .filter(|r| r["attack_success"] == true)
        .collect();
    let results = doc["runs"][0]["results"].as_array().unwrap();
    assert_eq!(results.len(), successes.len());
    assert!(!results.is_empty());
    let rules: Vec<&str> = doc["runs"][0]["tool"]["driver"]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    for res in results {
        assert!(rules.contains(&res["ruleId"].as_str().unwrap()));
        assert!(
            res["properties"]["owasp_llm"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| t == "LLM01:2025"),
            "{res}"
        );
        assert_eq!(res["properties"]["source_tool"], "spikee");
    }
    // A broken document is caught by the schema (the check can fail).
    let mut broken = doc.clone();
    broken["runs"][0]["results"][0]["level"] = Value::from("catastrophic");
    assert!(!validator.is_valid(&broken));
}
