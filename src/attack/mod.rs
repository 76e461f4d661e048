//! Attacks that adapt: converters applied to a case's payload at run time, and
//! multi-turn attacker strategies (Crescendo, PAIR, TAP).
//!
//! - [`config`]: the `attack` section and its typed [`AttackPlan`];
//! - [`convert`]: the converters, pure seeded functions, and pipelines of them;
//! - [`payload`]: where a case's injected payload is (converters change it only);
//! - [`strategy`]: the multi-turn loop with an attacker model;
//! - [`transcript`]: recorded attacker, target and translator answers, for replay.
//!
//! **Attempts.** Without an `attack` section a run makes one request per case, as it
//! always did (no attempt id). With one, every case makes one attempt per pipeline
//! (`best_of_n` makes `n`), one per strategy, and, with `original: true`, one as it is.
//! An attempt's id is stable: `<case_id>#<pipeline label>` (`#<k>` appended for the
//! k-th best-of-n variant), `<case_id>#<strategy>`, `<case_id>#none`. It keys the
//! checkpoint, `--resume` and replay, and is recorded in predictions and case_results
//! with `attack_pipeline` (a converter attempt's) or `attack_strategy` (a strategy
//! attempt's); the original attempt has both `none`. Benign controls are sent as they
//! are, once (`#none`).

pub mod config;
pub mod convert;
pub mod payload;
pub mod strategy;
pub mod transcript;

pub use config::{AttackPlan, AttackSection};
pub use strategy::{StrategyName, StrategySpec};

/// One attempt of a case, before it runs.
#[derive(Clone, Debug, PartialEq)]
pub enum Attempt {
    /// No attack section: the case as it is, keyed by its case id.
    Plain,
    /// The original payload under an attack section (`<case>#none`).
    Original { id: String },
    /// A converter pipeline's variant: an index into [`AttackPlan::pipelines`], the
    /// best-of-n variant, and the pipeline's label.
    Converted {
        id: String,
        pipeline: usize,
        variant: u64,
        label: String,
    },
    /// The strategy's attempt.
    Strategy { id: String, name: &'static str },
}

impl Attempt {
    /// The attempt's id (`None` without an attack section).
    pub fn id(&self) -> Option<&str> {
        match self {
            Attempt::Plain => None,
            Attempt::Original { id }
            | Attempt::Converted { id, .. }
            | Attempt::Strategy { id, .. } => Some(id),
        }
    }

    /// Recorded as `attack_pipeline` (`None` without a section, and for a strategy).
    pub fn pipeline_label(&self) -> Option<String> {
        match self {
            Attempt::Original { .. } => Some("none".to_owned()),
            Attempt::Converted { label, .. } => Some(label.clone()),
            Attempt::Plain | Attempt::Strategy { .. } => None,
        }
    }

    /// Recorded as `attack_strategy` (`None` without a section, and for a pipeline).
    pub fn strategy_label(&self) -> Option<String> {
        match self {
            Attempt::Original { .. } => Some("none".to_owned()),
            Attempt::Strategy { name, .. } => Some((*name).to_owned()),
            Attempt::Plain | Attempt::Converted { .. } => None,
        }
    }
}

/// The attempts of one case, in a fixed order: the original, each pipeline (its
/// variants in order), the strategy. A benign control (`benign`) is not attacked: it
/// makes the original attempt only (whatever `original` says), so over-refusal is
/// measured on the request as users send it.
pub fn attempts(plan: Option<&AttackPlan>, case_id: &str, benign: bool) -> Vec<Attempt> {
    let Some(plan) = plan else {
        return vec![Attempt::Plain];
    };
    let mut out = Vec::new();
    if plan.original || benign {
        out.push(Attempt::Original {
            id: format!("{case_id}#none"),
        });
    }
    if benign {
        return out;
    }
    for (i, p) in plan.pipelines.iter().enumerate() {
        let label = p.label();
        let n = p.variants();
        for k in 0..n {
            out.push(Attempt::Converted {
                id: if n > 1 {
                    format!("{case_id}#{label}#{k}")
                } else {
                    format!("{case_id}#{label}")
                },
                pipeline: i,
                variant: k as u64,
                label: label.clone(),
            });
        }
    }
    if let Some(s) = &plan.strategy {
        out.push(Attempt::Strategy {
            id: format!("{case_id}#{}", s.name.as_str()),
            name: s.name.as_str(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempt_ids_are_stable_and_cover_every_variant() {
        let section: AttackSection = serde_yaml_ng::from_str(
            "converters: [base64, [leetspeak, zero_width], {best_of_n: {n: 2}}]",
        )
        .unwrap();
        let plan = AttackPlan::from_section(&section).unwrap();
        let ids: Vec<String> = attempts(Some(&plan), "c1", false)
            .into_iter()
            .map(|a| a.id().unwrap().to_owned())
            .collect();
        assert_eq!(
            ids,
            [
                "c1#none",
                "c1#base64",
                "c1#leetspeak+zero_width",
                "c1#best_of_n(n=2)#0",
                "c1#best_of_n(n=2)#1"
            ]
        );
        assert_eq!(attempts(None, "c1", false)[0].id(), None);
        let benign = attempts(Some(&plan), "b1", true);
        assert_eq!(benign.len(), 1);
        assert_eq!(benign[0].id(), Some("b1#none"));
    }

    #[test]
    fn bad_sections_name_the_key() {
        let err = |yaml: &str| {
            let s: AttackSection = serde_yaml_ng::from_str(yaml).unwrap();
            AttackPlan::from_section(&s).unwrap_err()
        };
        assert_eq!(err("converters: [rot31]").0, "converters[0]");
        assert_eq!(err("strategy: pair").0, "attacker");
        assert_eq!(
            err("converters: [{translate: {language: fr}}]").0,
            "translator"
        );
        assert_eq!(err("converters: [base64, base64]").0, "converters[1]");
        assert_eq!(err("original: true").0, "converters");
        assert_eq!(
            err("strategy: pair\nattacker: {provider: local, name: m}\nwidth: 3").0,
            "width"
        );
    }
}
