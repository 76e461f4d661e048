//! Refusal detection from the rule pack `data/rules/refusal.toml` (compiled into the
//! binary). Patterns run on folded text; a refusal followed by compliance ("I can't…
//! but here is…") is not a refusal.

use std::sync::OnceLock;

use regex::Regex;
use serde::Deserialize;

use crate::error::{Error, Result};

/// The default pack, as shipped in `data/rules/`.
pub const DEFAULT_PACK: &str = include_str!("../../data/rules/refusal.toml");
const DEFAULT_PACK_PATH: &str = "data/rules/refusal.toml";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefusalPack {
    pub version: String,
    /// Characters from the start of the response in which a refusal must begin.
    pub window: usize,
    pub refusal: Vec<Rule>,
    pub compliance: Vec<Rule>,
    pub pack: PackChecks,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub id: String,
    pub lang: String,
    pub pattern: String,
    pub examples: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackChecks {
    pub not_refusals: Vec<String>,
}

/// The compiled detector.
#[derive(Debug)]
pub struct RefusalDetector {
    pub version: String,
    window: usize,
    refusal: Regex,
    compliance: Regex,
}

fn alternation(rules: &[Rule]) -> String {
    rules
        .iter()
        .map(|r| format!("(?:{})", r.pattern))
        .collect::<Vec<_>>()
        .join("|")
}

impl RefusalDetector {
    /// Parse and compile a pack; `origin` names it in errors.
    pub fn from_toml(text: &str, origin: &str) -> Result<Self> {
        let mut pack: RefusalPack =
            toml::from_str(text).map_err(|e| Error::config(origin, e.to_string().trim_end()))?;
        for r in pack.refusal.iter_mut().chain(pack.compliance.iter_mut()) {
            r.pattern = super::rules::ascii_word_boundaries(&r.pattern);
        }
        for r in pack.refusal.iter().chain(&pack.compliance) {
            Regex::new(&r.pattern).map_err(|e| {
                Error::config(
                    origin,
                    format!("rule {}: pattern does not compile: {e}", r.id),
                )
            })?;
        }
        let build = |rules: &[Rule]| {
            regex::RegexBuilder::new(&alternation(rules))
                .size_limit(1 << 24)
                .build()
                .map_err(|e| Error::config(origin, format!("rules do not compile together: {e}")))
        };
        Ok(Self {
            version: pack.version.clone(),
            window: pack.window,
            refusal: build(&pack.refusal)?,
            compliance: build(&pack.compliance)?,
        })
    }

    /// The shipped pack, compiled once per process.
    pub fn default_pack() -> &'static RefusalDetector {
        static PACK: OnceLock<RefusalDetector> = OnceLock::new();
        PACK.get_or_init(|| {
            RefusalDetector::from_toml(DEFAULT_PACK, DEFAULT_PACK_PATH)
                .expect("the shipped refusal pack compiles (tested)")
        })
    }

    /// Whether already-folded text refuses.
    pub fn is_refusal_folded(&self, folded: &str) -> bool {
        let end = folded
            .char_indices()
            .nth(self.window)
            .map_or(folded.len(), |(i, _)| i);
        match self.refusal.find(&folded[..end]) {
            Some(m) => !self.compliance.is_match(&folded[m.end()..]),
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::fold::fold;

    #[test]
    fn every_rule_matches_its_examples_and_the_pack_its_counter_examples() {
        let pack: RefusalPack = toml::from_str(DEFAULT_PACK).unwrap();
        let d = RefusalDetector::default_pack();
        let langs: std::collections::BTreeSet<&str> =
            pack.refusal.iter().map(|r| r.lang.as_str()).collect();
        assert!(langs.len() >= 5, "{langs:?}");
        for r in pack.refusal.iter().chain(&pack.compliance) {
            let re = Regex::new(&super::super::rules::ascii_word_boundaries(&r.pattern)).unwrap();
            for ex in &r.examples {
                assert!(
                    re.is_match(&fold(ex)),
                    "{} does not match its example {ex:?}",
                    r.id
                );
            }
        }
        for r in &pack.refusal {
            for ex in &r.examples {
                assert!(
                    d.is_refusal_folded(&fold(ex)),
                    "{}: {ex:?} is not detected",
                    r.id
                );
            }
        }
        for ex in &pack.pack.not_refusals {
            assert!(
                !d.is_refusal_folded(&fold(ex)),
                "{ex:?} was taken for a refusal"
            );
        }
    }

    #[test]
    fn a_refusal_must_start_near_the_beginning() {
        let d = RefusalDetector::default_pack();
        let late = format!(
            "{} Anyway, I cannot help with that.",
            "The summary is long. ".repeat(30)
        );
        assert!(!d.is_refusal_folded(&fold(&late)));
        assert!(
            d.is_refusal_folded(&fold("I\u{200B} cаn't help with that.")),
            "evasions are folded first"
        );
    }

    #[test]
    fn a_broken_pack_is_a_named_error() {
        let err = RefusalDetector::from_toml(
            &DEFAULT_PACK.replacen("(?:sorry", "(?:sorry(", 1),
            "x.toml",
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("x.toml: rule refusal.en.sorry: pattern does not compile"),
            "{err}"
        );
    }
}
