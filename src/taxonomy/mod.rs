//! Taxonomy enrichment: rules in `data/taxonomy/taxonomy.toml` map each case to
//! `attack_category`, `success_definition_id`, `mapping_confidence`, `severity`,
//! `evaluation_mode` and a `mapping_audit` saying which rules decided what, from which
//! inputs, under which taxonomy version. Deterministic: same case, same bytes. It only
//! adds the enriched fields; the normalized fields are never touched.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::contract::{
    ATTACK_CATEGORIES, AttackCase, AttackCategory, CRITERION_TYPES, EVALUATION_MODES,
    EvaluationMode, SEVERITIES, Severity,
};
use crate::error::{Error, Result};

pub const TAXONOMY_FILE: &str = "taxonomy.toml";

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Category {
    pub id: String,
    pub title: String,
    pub description: String,
    pub owasp: Vec<String>,
    pub atlas: Vec<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SuccessDefinition {
    pub id: String,
    pub description: String,
}

/// Conditions of a rule: every present key must hold; within a key any value matches.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct When {
    label: Option<Vec<String>>,
    attack_family: Option<Vec<String>>,
    attack_family_prefix: Option<Vec<String>>,
    attack_subtype: Option<Vec<String>>,
    attack_surface: Option<Vec<String>>,
    source_type: Option<Vec<String>>,
    language: Option<Vec<String>>,
    criteria_type: Option<Vec<String>>,
    criteria_uses: Option<Vec<String>>,
    attack_category: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Set {
    attack_category: Option<String>,
    success_definition_id: Option<String>,
    severity: Option<String>,
    evaluation_mode: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub id: String,
    #[serde(default)]
    when: When,
    set: Set,
    confidence: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TaxonomyFile {
    version: String,
    category: Vec<Category>,
    success_definition: Vec<SuccessDefinition>,
    rule: Vec<Rule>,
}

#[derive(Debug)]
pub struct Taxonomy {
    pub path: PathBuf,
    pub version: String,
    pub categories: Vec<Category>,
    pub success_definitions: Vec<SuccessDefinition>,
    pub rules: Vec<Rule>,
}

/// The case's values that rules look at (recorded in the audit).
#[derive(Debug, Serialize)]
struct Inputs<'a> {
    label: &'a str,
    attack_family: &'a str,
    attack_subtype: Option<&'a str>,
    attack_surface: &'a str,
    source_type: &'a str,
    language: Option<&'a str>,
    criteria_type: &'static str,
    criteria_uses: Vec<&'static str>,
    severity_level: Option<&'a str>,
}

impl Taxonomy {
    /// Load `taxonomy.toml` from a folder (or the file itself) and check that it only
    /// names categories, definitions, severities and modes that exist.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let path = if path.is_dir() {
            path.join(TAXONOMY_FILE)
        } else {
            path.to_path_buf()
        };
        let text = std::fs::read_to_string(&path)
            .map_err(|e| Error::io(&path, "cannot read taxonomy", e))?;
        Self::parse(&text, path)
    }

    /// The taxonomy compiled into pieval (`data/taxonomy/taxonomy.toml` as built), for a
    /// command run where the repository's `data/` is not.
    pub fn shipped() -> Result<Self> {
        Self::parse(
            include_str!("../../data/taxonomy/taxonomy.toml"),
            PathBuf::from("<shipped>/data/taxonomy/taxonomy.toml"),
        )
    }

    fn parse(text: &str, path: PathBuf) -> Result<Self> {
        let file: TaxonomyFile = toml::from_str(text)
            .map_err(|e| Error::config(&path, e.to_string().trim_end().replace('\n', "\n  ")))?;
        let t = Taxonomy {
            path,
            version: file.version,
            categories: file.category,
            success_definitions: file.success_definition,
            rules: file.rule,
        };
        t.check()?;
        Ok(t)
    }

    fn check(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::config(&self.path, msg));
        let categories: BTreeSet<&str> = self.categories.iter().map(|c| c.id.as_str()).collect();
        let contract: BTreeSet<&str> = ATTACK_CATEGORIES.iter().copied().collect();
        if categories != contract {
            return bad(format!(
                "categories {categories:?} differ from the contract's attack_category vocabulary {contract:?}"
            ));
        }
        let definitions: BTreeSet<&str> = self
            .success_definitions
            .iter()
            .map(|d| d.id.as_str())
            .collect();
        let mut rule_ids = BTreeSet::new();
        for r in &self.rules {
            if !rule_ids.insert(r.id.as_str()) {
                return bad(format!("rule {}: id used twice", r.id));
            }
            if !(0.0..=1.0).contains(&r.confidence) {
                return bad(format!(
                    "rule {}: confidence {} is outside [0, 1]",
                    r.id, r.confidence
                ));
            }
            let check = |field: &str,
                         value: &Option<String>,
                         allowed: &dyn Fn(&str) -> bool|
             -> Result<()> {
                match value {
                    Some(v) if !allowed(v) => Err(Error::config(
                        &self.path,
                        format!("rule {}: {field} {v:?} is not defined", r.id),
                    )),
                    _ => Ok(()),
                }
            };
            check("attack_category", &r.set.attack_category, &|v| {
                categories.contains(v)
            })?;
            check(
                "success_definition_id",
                &r.set.success_definition_id,
                &|v| definitions.contains(v),
            )?;
            check("severity", &r.set.severity, &|v| SEVERITIES.contains(&v))?;
            check("evaluation_mode", &r.set.evaluation_mode, &|v| {
                EVALUATION_MODES.contains(&v)
            })?;
            for t in r
                .when
                .criteria_type
                .iter()
                .chain(&r.when.criteria_uses)
                .flatten()
            {
                if !CRITERION_TYPES.contains(&t.as_str()) {
                    return bad(format!(
                        "rule {}: criterion type {t:?} does not exist",
                        r.id
                    ));
                }
            }
        }
        // Every case must get every field: the last rules must cover everything.
        for field in [
            "attack_category",
            "success_definition_id",
            "severity",
            "evaluation_mode",
        ] {
            let covered = self.rules.iter().any(|r| {
                r.when.is_empty()
                    && match field {
                        "attack_category" => r.set.attack_category.is_some(),
                        "success_definition_id" => r.set.success_definition_id.is_some(),
                        "severity" => r.set.severity.is_some(),
                        _ => r.set.evaluation_mode.is_some(),
                    }
            });
            if !covered {
                return bad(format!(
                    "no unconditional rule sets {field}: some cases would get none"
                ));
            }
        }
        Ok(())
    }

    /// The case with its enriched fields (re)computed; normalized fields unchanged.
    pub fn enrich(&self, case: &AttackCase) -> AttackCase {
        let inputs = Inputs {
            label: case.label.map(|v| v.as_str()).unwrap_or("attack"),
            attack_family: &case.attack_family,
            attack_subtype: case.attack_subtype.as_deref(),
            attack_surface: case.attack_surface.as_str(),
            source_type: case.source_type.as_str(),
            language: case.language.as_deref(),
            criteria_type: case.success_criteria.type_name(),
            criteria_uses: {
                let mut v = case.success_criteria.type_names();
                v.sort_unstable();
                v.dedup();
                v
            },
            severity_level: case.severity_level.map(|v| v.as_str()),
        };
        let mut decided: BTreeMap<&str, (&str, String, f64)> = BTreeMap::new();
        let mut fired = Vec::new();
        for rule in &self.rules {
            let category = decided.get("attack_category").map(|d| d.1.as_str());
            if !rule.when.matches(&inputs, category) {
                continue;
            }
            let mut used = false;
            for (field, value) in [
                ("attack_category", &rule.set.attack_category),
                ("success_definition_id", &rule.set.success_definition_id),
                ("severity", &rule.set.severity),
                ("evaluation_mode", &rule.set.evaluation_mode),
            ] {
                if let Some(v) = value
                    && !decided.contains_key(field)
                {
                    decided.insert(field, (rule.id.as_str(), v.clone(), rule.confidence));
                    used = true;
                }
            }
            if used {
                fired.push(rule.id.as_str());
            }
        }
        let take = |field: &str| decided.get(field).map(|d| d.1.clone());
        let confidence = ["attack_category", "success_definition_id"]
            .iter()
            .filter_map(|f| decided.get(f).map(|d| d.2))
            .fold(1.0_f64, f64::min);
        let (severity, severity_rule) = match case.severity_level.map(|v| v.as_str()) {
            Some(declared) => (Some(declared.to_owned()), "declared"),
            None => (
                take("severity"),
                decided.get("severity").map_or("none", |d| d.0),
            ),
        };
        let decided_by: BTreeMap<&str, &str> = decided
            .iter()
            .map(|(field, d)| (*field, d.0))
            .chain(std::iter::once(("severity", severity_rule)))
            .collect();
        let mut out = case.clone();
        // The rules' values were checked against the vocabularies when the taxonomy loaded.
        out.attack_category = take("attack_category")
            .as_deref()
            .and_then(AttackCategory::parse);
        out.success_definition_id = take("success_definition_id");
        out.mapping_confidence = Some((confidence * 100.0).round() / 100.0);
        out.severity = severity.as_deref().and_then(Severity::parse);
        out.evaluation_mode = take("evaluation_mode")
            .as_deref()
            .and_then(EvaluationMode::parse);
        out.mapping_audit = Some(json!({
            "taxonomy_version": self.version,
            "rules_fired": fired,
            "decided_by": decided_by,
            "inputs": inputs,
        }));
        out
    }

    pub fn category(&self, id: &str) -> Option<&Category> {
        self.categories.iter().find(|c| c.id == id)
    }
}

impl When {
    fn is_empty(&self) -> bool {
        self.label.is_none()
            && self.attack_family.is_none()
            && self.attack_family_prefix.is_none()
            && self.attack_subtype.is_none()
            && self.attack_surface.is_none()
            && self.source_type.is_none()
            && self.language.is_none()
            && self.criteria_type.is_none()
            && self.criteria_uses.is_none()
            && self.attack_category.is_none()
    }

    fn matches(&self, i: &Inputs<'_>, category: Option<&str>) -> bool {
        fn any(list: &Option<Vec<String>>, value: Option<&str>) -> bool {
            match list {
                None => true,
                Some(list) => value.is_some_and(|v| list.iter().any(|x| x == v)),
            }
        }
        any(&self.label, Some(i.label))
            && any(&self.attack_family, Some(i.attack_family))
            && self
                .attack_family_prefix
                .as_ref()
                .is_none_or(|ps| ps.iter().any(|p| i.attack_family.starts_with(p.as_str())))
            && any(&self.attack_subtype, i.attack_subtype)
            && any(&self.attack_surface, Some(i.attack_surface))
            && any(&self.source_type, Some(i.source_type))
            && any(&self.language, i.language)
            && any(&self.criteria_type, Some(i.criteria_type))
            && self
                .criteria_uses
                .as_ref()
                .is_none_or(|ts| ts.iter().any(|t| i.criteria_uses.contains(&t.as_str())))
            && any(&self.attack_category, category)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::SuccessCriteria;

    fn taxonomy() -> Taxonomy {
        Taxonomy::load(concat!(env!("CARGO_MANIFEST_DIR"), "/data/taxonomy")).unwrap()
    }

    fn case(
        family: &str,
        surface: &str,
        subtype: Option<&str>,
        criteria: SuccessCriteria,
    ) -> AttackCase {
        serde_json::from_value(json!({
            "case_id": "t-1", "source_name": "t", "source_type": "synthetic",
            "attack_family": family, "attack_surface": surface, "prompt": "p",
            "success_criteria": criteria, "attack_subtype": subtype,
        }))
        .unwrap()
    }

    #[test]
    fn maps_by_technique_surface_and_criteria() {
        let t = taxonomy();
        let e = t.enrich(&case(
            "context_ignoring",
            "email",
            Some("emit_target"),
            SuccessCriteria::Contains { value: "X".into() },
        ));
        assert_eq!(
            e.attack_category.map(|v| v.as_str()),
            Some("indirect_injection")
        );
        assert_eq!(
            e.success_definition_id.as_deref(),
            Some("target_string_emitted")
        );
        assert_eq!(e.severity.map(|v| v.as_str()), Some("high"));
        assert_eq!(e.evaluation_mode.map(|v| v.as_str()), Some("automatic"));
        assert_eq!(e.mapping_confidence, Some(0.9));
        let audit = e.mapping_audit.unwrap();
        assert_eq!(audit["decided_by"]["attack_category"], "indirect-surface");
        assert_eq!(audit["taxonomy_version"], t.version.as_str());

        let e = t.enrich(&case(
            "obfuscation_base64",
            "user_prompt",
            None,
            SuccessCriteria::Judge {
                question: "q".into(),
            },
        ));
        assert_eq!(e.attack_category.map(|v| v.as_str()), Some("obfuscation"));
        assert_eq!(e.evaluation_mode.map(|v| v.as_str()), Some("judge"));
        assert_eq!(e.success_definition_id.as_deref(), Some("judge_decides"));
    }

    #[test]
    fn declared_severity_wins_and_unknown_families_get_low_confidence() {
        let t = taxonomy();
        let mut c = case(
            "something_new",
            "user_prompt",
            None,
            SuccessCriteria::NotRefused,
        );
        c.severity_level = Some(Severity::Critical);
        let e = t.enrich(&c);
        assert_eq!(e.severity.map(|v| v.as_str()), Some("critical"));
        assert_eq!(
            e.mapping_audit.as_ref().unwrap()["decided_by"]["severity"],
            "declared"
        );
        assert_eq!(
            e.attack_category.map(|v| v.as_str()),
            Some("direct_injection")
        );
        assert_eq!(e.mapping_confidence, Some(0.7));
        // Enrichment never touches the normalized fields.
        let mut back = e.clone();
        back.attack_category = None;
        back.success_definition_id = None;
        back.mapping_confidence = None;
        back.severity = None;
        back.evaluation_mode = None;
        back.mapping_audit = None;
        assert_eq!(back, c);
    }

    #[test]
    fn rejects_rules_that_name_undefined_things() {
        let dir = tempfile::tempdir().unwrap();
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/data/taxonomy/taxonomy.toml"
        ))
        .unwrap();
        let broken = text.replacen("severity = \"critical\"", "severity = \"catastrophic\"", 1);
        std::fs::write(dir.path().join(TAXONOMY_FILE), broken).unwrap();
        let err = Taxonomy::load(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("rule markdown-exfiltration: severity \"catastrophic\" is not defined"),
            "{err}"
        );
        std::fs::write(dir.path().join(TAXONOMY_FILE), "version = 1").unwrap();
        let err = Taxonomy::load(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("taxonomy.toml") && err.contains("invalid type"),
            "{err}"
        );
    }
}
