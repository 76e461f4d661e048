//! The controls in the formats CI systems read: JUnit XML (`pieval controls … --junit
//! FILE`: one test case per control and group; the statuses `--fail-on` names are
//! failures with the measured value and the threshold, insufficient data is skipped) and
//! SARIF 2.1.0 (`--sarif FILE`, OASIS Static Analysis Results Interchange Format: one
//! result per successful attack, its rule the attack family, the taxonomy's framework
//! tags — OWASP Top 10 for LLM Applications, MITRE ATLAS — as properties). Both are
//! checked in the tests against their schemas (the Jenkins JUnit XSD, the SARIF 2.1.0
//! JSON Schema; tests/fixtures/schemas/).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};

use super::controls::{ControlsReport, GroupResult, Status};
use super::definitions::{Control, Statistic};
use crate::error::{Error, Result};

/// Text safe in XML 1.0 character data and attribute values: the five entities escaped,
/// characters XML 1.0 does not allow (most C0 controls) written as U+FFFD.
pub fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || matches!(c, '\u{FFFE}' | '\u{FFFF}') => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

fn shown(v: Option<f64>, control: &Control) -> String {
    match v {
        None => "none".into(),
        Some(x) if control.statistic == Statistic::Count => format!("{x:.0}"),
        Some(x) => format!("{:.2}%", x * 100.0),
    }
}

/// One line saying what a group measured against what it had to.
fn verdict_line(control: &Control, g: &GroupResult) -> String {
    let ci = match (g.ci_low, g.ci_high) {
        (Some(lo), Some(hi)) => format!(", Wilson 95% {:.2}–{:.2}%", lo * 100.0, hi * 100.0),
        _ => String::new(),
    };
    format!(
        "{}: measured {} ({}/{}{ci}, {} undecided) against {} {}",
        g.status.as_str(),
        shown(g.measured, control),
        g.k,
        g.n,
        g.undecided,
        control.comparator.as_str(),
        shown(Some(control.threshold), control),
    )
}

/// JUnit XML of a controls report: a `testsuite` for the run, a `testcase` per control
/// (and per group of a grouped control). A status in `failing` is a `<failure>` with the
/// measured value and the threshold; `insufficient_data` (and a status not failing but
/// not passing) is `<skipped>` with why (as text, as Jenkins' schema has it); `pass` is a test
/// case with the line in its `system-out`.
pub fn junit(report: &ControlsReport, failing: &[Status]) -> String {
    let mut cases = Vec::new();
    let (mut failures, mut skipped) = (0usize, 0usize);
    for c in &report.controls {
        let groups: Vec<&GroupResult> = if c.groups.len() > 1 {
            c.groups.iter().collect()
        } else {
            vec![&c.result]
        };
        for g in groups {
            let name = match &g.group_key {
                Some(k) if c.groups.len() > 1 => format!("{} [{k}]", c.control.id),
                _ => c.control.id.clone(),
            };
            let line = match g.framework_tags.label() {
                l if l.is_empty() => verdict_line(&c.control, g),
                l => format!("{} [{l}]", verdict_line(&c.control, g)),
            };
            let body = if failing.contains(&g.status) {
                failures += 1;
                format!(
                    "      <failure message=\"{}\" type=\"{}\">{}</failure>\n",
                    xml_escape(&line),
                    g.status.as_str(),
                    xml_escape(&format!("{}\n{}", c.control.title, c.control.description))
                )
            } else if g.status != Status::Pass {
                skipped += 1;
                // Jenkins' schema: `skipped` holds its reason as text.
                format!("      <skipped>{}</skipped>\n", xml_escape(&line))
            } else {
                format!("      <system-out>{}</system-out>\n", xml_escape(&line))
            };
            cases.push(format!(
                "    <testcase name=\"{}\" classname=\"pieval.controls.{}\" status=\"{}\" time=\"0\">\n{body}    </testcase>\n",
                xml_escape(&name),
                xml_escape(&report.run_id),
                g.status.as_str(),
            ));
        }
    }
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites>\n  <testsuite name=\"pieval controls {}\" tests=\"{}\" failures=\"{failures}\" errors=\"0\" skipped=\"{skipped}\" timestamp=\"{}\">\n{}  </testsuite>\n</testsuites>\n",
        xml_escape(&report.run_id),
        cases.len(),
        xml_escape(report.evaluated_at.trim_end_matches('Z')),
        cases.concat(),
    )
}

/// A successful attack, as SARIF reports it.
struct Hit {
    case_id: String,
    attempt_id: Option<String>,
    family: String,
    category: Option<String>,
    severity: Option<String>,
    decided_by: Option<String>,
    matched_rule: Option<String>,
    source_tool: Option<String>,
    source_ref: Option<String>,
    surface: Option<String>,
    /// The case's framework tags (NULL in case_results of a case enriched before they
    /// existed: then the taxonomy's category tags).
    tags: Option<crate::taxonomy::Tags>,
}

fn hits(run: &Path) -> Result<Vec<Hit>> {
    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::parquet::arrow::ProjectionMask;
    use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let Some(path) = crate::rundir::artifact(run, crate::rundir::CASE_RESULTS_PARQUET)? else {
        return Err(Error::NotFound(format!(
            "{}: no {} (score the run first)",
            run.display(),
            crate::rundir::CASE_RESULTS_PARQUET
        )));
    };
    let file = crate::files::open_regular(&path, crate::files::Links::Refuse)?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file)?;
    let wanted = [
        "owasp_llm",
        "owasp_agentic",
        "mitre_atlas",
        "nist_ai_600_1",
        "case_id",
        "attempt_id",
        "attack_family",
        "attack_category",
        "severity",
        "decided_by",
        "matched_rule",
        "source_tool",
        "source_ref",
        "attack_surface",
        "attack_success",
        "label",
    ];
    let schema = builder.parquet_schema().clone();
    let roots: Vec<usize> = builder
        .schema()
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| wanted.contains(&f.name().as_str()))
        .map(|(i, _)| i)
        .collect();
    let reader = builder
        .with_projection(ProjectionMask::roots(&schema, roots))
        .build()?;
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch?;
        let text = |name: &str, i: usize| -> Option<String> {
            let c = batch.column_by_name(name)?;
            let c = c.as_string_opt::<i32>()?;
            c.is_valid(i).then(|| c.value(i).to_owned())
        };
        let list = |name: &str, i: usize| -> Option<Vec<String>> {
            let c = batch.column_by_name(name)?.as_list_opt::<i32>()?;
            c.is_valid(i).then(|| {
                c.value(i)
                    .as_string::<i32>()
                    .iter()
                    .flatten()
                    .map(str::to_owned)
                    .collect()
            })
        };
        let Some(success) = batch.column_by_name("attack_success") else {
            continue;
        };
        let success = success.as_boolean();
        for i in 0..batch.num_rows() {
            if !(success.is_valid(i) && success.value(i)) {
                continue;
            }
            out.push(Hit {
                case_id: text("case_id", i).unwrap_or_default(),
                attempt_id: text("attempt_id", i),
                family: text("attack_family", i).unwrap_or_else(|| "unknown".into()),
                category: text("attack_category", i),
                severity: text("severity", i),
                decided_by: text("decided_by", i),
                matched_rule: text("matched_rule", i),
                source_tool: text("source_tool", i),
                source_ref: text("source_ref", i),
                surface: text("attack_surface", i),
                tags: list("owasp_llm", i).map(|owasp_llm| crate::taxonomy::Tags {
                    owasp_llm,
                    owasp_agentic: list("owasp_agentic", i).unwrap_or_default(),
                    mitre_atlas: list("mitre_atlas", i).unwrap_or_default(),
                    nist_ai_600_1: list("nist_ai_600_1", i).unwrap_or_default(),
                }),
            });
        }
    }
    Ok(out)
}

/// SARIF 2.1.0 of a run: one result per successful attack (`attack_success = true`),
/// its rule the attack family (rule ids are families), its level from the case's
/// severity (critical, high → error; medium → warning; low → note), the taxonomy's
/// framework tags (the case's `owasp_llm`, `owasp_agentic`, `mitre_atlas`,
/// `nist_ai_600_1`) as the rule's tags and the result's properties, the
/// controls' statuses as the run's properties. The location is the corpus the run
/// read (the manifest's dataset path, or for an imported run its first source file); the
/// case is the logical location.
pub fn sarif(
    run: &Path,
    report: &ControlsReport,
    taxonomy: Option<&crate::taxonomy::Taxonomy>,
) -> Result<Value> {
    let hits = hits(run)?;
    let manifest = crate::rundir::Manifest::read(run).ok();
    let artifact = manifest
        .as_ref()
        .and_then(|m| {
            m.extra
                .get("import")
                .and_then(|i| i.pointer("/sources/0/path"))
                .and_then(Value::as_str)
                .map(str::to_owned)
                .or_else(|| Some(m.dataset_snapshot.path.clone()))
        })
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| crate::rundir::CASES_FILE.to_owned());
    let uri = artifact.replace('\\', "/");
    // A hit's tags: the case's own, else its category's in the taxonomy.
    let tags = |h: &Hit| -> crate::taxonomy::Tags {
        h.tags.clone().unwrap_or_else(|| {
            h.category
                .as_deref()
                .and_then(|c| taxonomy?.category(c))
                .map(|c| c.tags.clone())
                .unwrap_or_default()
        })
    };
    let tag_properties = |t: &crate::taxonomy::Tags| -> serde_json::Map<String, Value> {
        t.by_field()
            .into_iter()
            .map(|(field, list)| (field.to_owned(), json!(list)))
            .collect()
    };
    // The rules: one per family, in order of first appearance; a rule's tags are the
    // union of its results' (in order of first appearance).
    let mut rules: BTreeMap<String, (usize, Option<String>, crate::taxonomy::Tags)> =
        BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    for h in &hits {
        let t = tags(h);
        match rules.get_mut(&h.family) {
            Some((_, _, union)) => union.merge(&t),
            None => {
                rules.insert(h.family.clone(), (order.len(), h.category.clone(), t));
                order.push(h.family.clone());
            }
        }
    }
    let rule_json: Vec<Value> = order
        .iter()
        .map(|f| {
            let category = rules[f].1.as_deref();
            let rule_tags = &rules[f].2;
            let mut all: Vec<String> = vec!["security".into(), "prompt-injection".into()];
            all.extend(rule_tags.all().cloned());
            let mut properties = tag_properties(rule_tags);
            properties.insert("tags".into(), json!(all));
            properties.insert("attack_category".into(), json!(category));
            json!({
                "id": f,
                "name": f,
                "shortDescription": {"text": format!("Prompt-injection attack family {f} succeeded")},
                "fullDescription": {"text": category
                    .and_then(|c| taxonomy?.category(c))
                    .map(|c| format!("{}: {}", c.title, c.description))
                    .unwrap_or_else(|| format!("Attacks of the family {f} made the model do what the attacker wanted."))},
                "properties": properties,
            })
        })
        .collect();
    let results: Vec<Value> = hits
        .iter()
        .map(|h| {
            let hit_tags = tags(h);
            let level = match h.severity.as_deref() {
                Some("critical" | "high") => "error",
                Some("low") => "note",
                _ => "warning",
            };
            let key = format!("{}\u{1f}{}", h.case_id, h.attempt_id.as_deref().unwrap_or(""));
            let mut properties = tag_properties(&hit_tags);
            for (k, v) in [
                ("run_id", json!(report.run_id)),
                ("case_id", json!(h.case_id)),
                ("attempt_id", json!(h.attempt_id)),
                ("attack_category", json!(h.category)),
                ("attack_surface", json!(h.surface)),
                ("severity", json!(h.severity)),
                ("decided_by", json!(h.decided_by)),
                ("source_tool", json!(h.source_tool)),
                ("source_ref", json!(h.source_ref)),
            ] {
                properties.insert(k.into(), v);
            }
            json!({
                "ruleId": h.family,
                "ruleIndex": rules[&h.family].0,
                "level": level,
                "message": {"text": format!(
                    "Prompt injection succeeded: case {}{} ({}, {} severity) — the model did what the attack wanted{}.",
                    h.case_id,
                    h.attempt_id.as_deref().map(|a| format!(", attempt {a}")).unwrap_or_default(),
                    h.category.as_deref().unwrap_or("uncategorised"),
                    h.severity.as_deref().unwrap_or("unknown"),
                    h.matched_rule.as_deref().map(|r| format!(" (matched {r})")).unwrap_or_default(),
                )},
                "locations": [{
                    "physicalLocation": {"artifactLocation": {"uri": uri}},
                    "logicalLocations": [{"name": h.case_id, "kind": "object"}],
                }],
                "partialFingerprints": {"pievalCase/v1": crate::digest::sha256_hex(key.as_bytes())},
                "properties": properties,
            })
        })
        .collect();
    let controls: Vec<Value> = report
        .controls
        .iter()
        .map(|c| {
            json!({
                "id": c.control.id,
                "status": c.result.status.as_str(),
                "measured": c.result.measured,
                "comparator": c.control.comparator.as_str(),
                "threshold": c.control.threshold,
                "n": c.result.n,
                "k": c.result.k,
            })
        })
        .collect();
    Ok(json!({
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "pieval",
                "version": env!("CARGO_PKG_VERSION"),
                "semanticVersion": env!("CARGO_PKG_VERSION"),
                "rules": rule_json,
            }},
            "automationDetails": {"id": format!("pieval/{}", report.run_id)},
            "results": results,
            "properties": {
                "run_id": report.run_id,
                "evaluated_at": report.evaluated_at,
                "controls": controls,
            },
        }],
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xml_escape_leaves_nothing_that_parses() {
        assert_eq!(
            xml_escape("a<b>&\"c'\u{1}\u{7}"),
            "a&lt;b&gt;&amp;&quot;c&apos;\u{FFFD}\u{FFFD}"
        );
    }
}
