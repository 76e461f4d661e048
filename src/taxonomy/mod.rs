//! Taxonomy enrichment: rules in `data/taxonomy/taxonomy.toml` map each case to
//! `attack_category`, `success_definition_id`, `mapping_confidence`, `severity`,
//! `evaluation_mode` and a `mapping_audit` saying which rules decided what, from which
//! inputs, under which taxonomy version. Deterministic: same case, same bytes. It only
//! adds the enriched fields; the normalized fields are never touched.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::contract::fields::FRAMEWORK_TAG_FIELDS;
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
    /// The category's framework tags (every case of the category carries them).
    pub tags: Tags,
}

/// Framework tags, one list per framework (the fields of [`FRAMEWORK_TAG_FIELDS`]).
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Tags {
    #[serde(default)]
    pub owasp_llm: Vec<String>,
    #[serde(default)]
    pub owasp_agentic: Vec<String>,
    #[serde(default)]
    pub mitre_atlas: Vec<String>,
    #[serde(default)]
    pub nist_ai_600_1: Vec<String>,
}

impl Tags {
    /// Each framework's field name with its tags, in [`FRAMEWORK_TAG_FIELDS`] order.
    pub fn by_field(&self) -> [(&'static str, &Vec<String>); 4] {
        [
            (FRAMEWORK_TAG_FIELDS[0], &self.owasp_llm),
            (FRAMEWORK_TAG_FIELDS[1], &self.owasp_agentic),
            (FRAMEWORK_TAG_FIELDS[2], &self.mitre_atlas),
            (FRAMEWORK_TAG_FIELDS[3], &self.nist_ai_600_1),
        ]
    }

    fn by_field_mut(&mut self) -> [&mut Vec<String>; 4] {
        [
            &mut self.owasp_llm,
            &mut self.owasp_agentic,
            &mut self.mitre_atlas,
            &mut self.nist_ai_600_1,
        ]
    }

    /// Add `other`'s tags not yet here (each list keeps its order, new ones at its end).
    pub fn merge(&mut self, other: &Tags) {
        for (list, (_, add)) in self.by_field_mut().into_iter().zip(other.by_field()) {
            for t in add {
                if !list.contains(t) {
                    list.push(t.clone());
                }
            }
        }
    }

    /// The OWASP and ATLAS tags in one short label (`LLM01:2025 / AML.T0051.000`), for
    /// tables and CI lines; NIST AI 600-1 risk names are left to the full lists.
    pub fn label(&self) -> String {
        self.owasp_llm
            .iter()
            .chain(&self.owasp_agentic)
            .chain(&self.mitre_atlas)
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(" / ")
    }

    /// Every tag of every framework, in order.
    pub fn all(&self) -> impl Iterator<Item = &String> {
        self.by_field().into_iter().flat_map(|(_, v)| v.iter())
    }
}

/// A framework the tags come from: its catalog of identifiers, cited.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Framework {
    /// The case field its tags go in (`owasp_llm` …).
    pub field: String,
    pub title: String,
    pub version: String,
    /// Where the identifiers and names were taken from.
    pub source: String,
    pub entries: Vec<FrameworkEntry>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FrameworkEntry {
    pub id: String,
    pub name: String,
}

/// A rule that adds framework tags to the cases it matches (on top of their category's).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TagRule {
    pub id: String,
    #[serde(default)]
    when: When,
    add: Tags,
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
    /// The case is agentic (has an `environment`).
    agentic: Option<bool>,
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
    framework: Vec<Framework>,
    category: Vec<Category>,
    success_definition: Vec<SuccessDefinition>,
    rule: Vec<Rule>,
    #[serde(default)]
    tag_rule: Vec<TagRule>,
}

#[derive(Debug)]
pub struct Taxonomy {
    pub path: PathBuf,
    pub version: String,
    pub frameworks: Vec<Framework>,
    pub categories: Vec<Category>,
    pub success_definitions: Vec<SuccessDefinition>,
    pub rules: Vec<Rule>,
    pub tag_rules: Vec<TagRule>,
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
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    agentic: bool,
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
            Self::shipped_text(),
            PathBuf::from("<shipped>/data/taxonomy/taxonomy.toml"),
        )
    }

    /// The text of the compiled-in taxonomy.
    pub fn shipped_text() -> &'static str {
        include_str!("../../data/taxonomy/taxonomy.toml")
    }

    fn parse(text: &str, path: PathBuf) -> Result<Self> {
        let file: TaxonomyFile = toml::from_str(text)
            .map_err(|e| Error::config(&path, e.to_string().trim_end().replace('\n', "\n  ")))?;
        let t = Taxonomy {
            path,
            version: file.version,
            frameworks: file.framework,
            categories: file.category,
            success_definitions: file.success_definition,
            rules: file.rule,
            tag_rules: file.tag_rule,
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
        self.check_tags()?;
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

    /// The framework catalog: one framework per tag field, ids unique, and every tag a
    /// category or tag rule names is in its framework's catalog.
    fn check_tags(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::config(&self.path, msg));
        let fields: Vec<&str> = self.frameworks.iter().map(|f| f.field.as_str()).collect();
        if fields != FRAMEWORK_TAG_FIELDS {
            return bad(format!(
                "frameworks {fields:?} differ from the contract's tag fields {FRAMEWORK_TAG_FIELDS:?} (in that order)"
            ));
        }
        for f in &self.frameworks {
            let mut seen = BTreeSet::new();
            for e in &f.entries {
                if let Err(problem) = crate::contract::record::parse_tags(
                    &serde_json::to_string(&[&e.id]).unwrap_or_default(),
                ) {
                    return bad(format!(
                        "framework {}: entry {:?}: {problem}",
                        f.field, e.id
                    ));
                }
                if !seen.insert(e.id.as_str()) {
                    return bad(format!("framework {}: entry {:?} twice", f.field, e.id));
                }
            }
        }
        let known = |field: &str, tag: &str| {
            self.frameworks
                .iter()
                .find(|f| f.field == field)
                .is_some_and(|f| f.entries.iter().any(|e| e.id == tag))
        };
        let named = self
            .categories
            .iter()
            .map(|c| (format!("category {}", c.id), &c.tags))
            .chain(
                self.tag_rules
                    .iter()
                    .map(|r| (format!("tag_rule {}", r.id), &r.add)),
            );
        for (who, tags) in named {
            for (field, list) in tags.by_field() {
                for t in list {
                    if !known(field, t) {
                        return bad(format!(
                            "{who}: {field} tag {t:?} is not in the {field} framework's entries"
                        ));
                    }
                }
            }
        }
        let mut ids = BTreeSet::new();
        for r in &self.tag_rules {
            if !ids.insert(r.id.as_str()) {
                return bad(format!("tag_rule {}: id used twice", r.id));
            }
        }
        Ok(())
    }

    /// A tag's position in its framework's catalog (tags are listed in catalog order).
    fn tag_rank(&self, field: &str, tag: &str) -> usize {
        self.frameworks
            .iter()
            .find(|f| f.field == field)
            .and_then(|f| f.entries.iter().position(|e| e.id == tag))
            .unwrap_or(usize::MAX)
    }

    /// The framework tags of a case of `category` with these inputs: the category's, then
    /// those of every tag rule that matches; each list in catalog order. Also the ids of
    /// the tag rules that added any.
    fn tags_for(&self, inputs: &Inputs<'_>, category: Option<&str>) -> (Tags, Vec<&str>) {
        let mut tags = category
            .and_then(|c| self.category(c))
            .map(|c| c.tags.clone())
            .unwrap_or_default();
        let mut fired = Vec::new();
        for r in &self.tag_rules {
            if r.when.matches(inputs, category) {
                for (list, (_, add)) in tags.by_field_mut().into_iter().zip(r.add.by_field()) {
                    list.extend(add.iter().cloned());
                }
                fired.push(r.id.as_str());
            }
        }
        for (field, list) in FRAMEWORK_TAG_FIELDS.iter().zip(tags.by_field_mut()) {
            list.sort_by_key(|t| self.tag_rank(field, t));
            list.dedup();
        }
        (tags, fired)
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
            agentic: case.environment.is_some(),
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
        let (tags, tag_rules_fired) = self.tags_for(&inputs, take("attack_category").as_deref());
        out.owasp_llm = Some(tags.owasp_llm);
        out.owasp_agentic = Some(tags.owasp_agentic);
        out.mitre_atlas = Some(tags.mitre_atlas);
        out.nist_ai_600_1 = Some(tags.nist_ai_600_1);
        out.mapping_audit = Some(json!({
            "taxonomy_version": self.version,
            "rules_fired": fired,
            "tag_rules_fired": tag_rules_fired,
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
            && self.agentic.is_none()
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
            && self.agentic.is_none_or(|a| a == i.agentic)
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
        back.owasp_llm = None;
        back.owasp_agentic = None;
        back.mitre_atlas = None;
        back.nist_ai_600_1 = None;
        assert_eq!(back, c);
    }

    #[test]
    fn framework_tags_come_from_the_category_and_the_tag_rules_in_catalog_order() {
        let t = taxonomy();
        // A system-prompt extraction: prompt_leakage's tags, plus canary-leak's.
        let leak = t.enrich(&case(
            "system_prompt_extraction",
            "user_prompt",
            None,
            SuccessCriteria::Canary {
                value: "PIEVAL-CANARY-1".into(),
            },
        ));
        assert_eq!(
            leak.owasp_llm.as_deref(),
            Some(
                &[
                    "LLM01:2025".to_string(),
                    "LLM02:2025".into(),
                    "LLM07:2025".into()
                ][..]
            )
        );
        assert_eq!(
            leak.mitre_atlas.as_deref(),
            Some(
                &[
                    "AML.T0051.000".to_string(),
                    "AML.T0056".into(),
                    "AML.T0057".into()
                ][..]
            )
        );
        assert_eq!(
            leak.nist_ai_600_1.as_deref(),
            Some(&["Data Privacy".to_string(), "Information Security".into()][..])
        );
        assert_eq!(leak.owasp_agentic.as_deref(), Some(&[][..]));
        assert_eq!(
            leak.mapping_audit.as_ref().unwrap()["tag_rules_fired"],
            json!(["canary-leak"])
        );
        // The same attack as an agent's tool output: the agentic rules add theirs.
        let mut agentic = case(
            "important_instructions",
            "tool_output",
            None,
            SuccessCriteria::Contains { value: "x".into() },
        );
        agentic.environment = Some(
            crate::contract::environment::Environment::from_json(&json!({
                "tools": [{"schema": {"type": "function", "function": {"name": "echo"}},
                           "behaviour": {"kind": "template", "output": "{{vector:body}}"}}],
                "vectors": {"body": "x"},
                "injected": ["body"]
            }))
            .unwrap(),
        );
        let e = t.enrich(&agentic);
        assert_eq!(
            e.owasp_agentic.as_deref(),
            Some(&["T2".to_string(), "T6".into()][..])
        );
        assert_eq!(
            e.mitre_atlas.as_deref(),
            Some(
                &[
                    "AML.T0051.001".to_string(),
                    "AML.T0053".into(),
                    "AML.T0080".into()
                ][..]
            )
        );
        assert_eq!(
            e.owasp_llm.as_deref(),
            Some(&["LLM01:2025".to_string(), "LLM06:2025".into()][..])
        );
        assert_eq!(e.mapping_audit.as_ref().unwrap()["inputs"]["agentic"], true);
        // A benign control carries none.
        let mut benign = case(
            "summarize",
            "user_prompt",
            None,
            SuccessCriteria::NotRefused,
        );
        benign.label = Some(crate::contract::Label::Benign);
        let b = t.enrich(&benign);
        assert!(b.owasp_llm.unwrap().is_empty() && b.mitre_atlas.unwrap().is_empty());
    }

    #[test]
    fn rejects_tags_outside_the_framework_catalog() {
        let dir = tempfile::tempdir().unwrap();
        let text = Taxonomy::shipped_text();
        let broken = text.replacen("\"AML.T0056\"]", "\"AML.T9999\"]", 1);
        assert_ne!(broken, text);
        std::fs::write(dir.path().join(TAXONOMY_FILE), broken).unwrap();
        let err = Taxonomy::load(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("category prompt_leakage: mitre_atlas tag \"AML.T9999\" is not in the mitre_atlas framework's entries"),
            "{err}"
        );
        let broken = text.replacen("field = \"owasp_agentic\"", "field = \"owasp_agents\"", 1);
        std::fs::write(dir.path().join(TAXONOMY_FILE), broken).unwrap();
        let err = Taxonomy::load(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("differ from the contract's tag fields"),
            "{err}"
        );
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
