//! The classifier under test: a calling target (`http`, `exec`, `websocket`, …) whose
//! answer the mapping reads, or one of pieval's own detectors (`provider: builtin`).
//!
//! A calling target is given the text as the user message (`{{prompt}}`, exec's
//! `prompt` and `text`) and its role (`{{role}}`, exec's `role`): `user_prompt`,
//! `retrieved_document` or `tool_output`. Its answer (an http target's `answer: {body:
//! true}`, an exec process's whole answer object) is read by the mapping
//! ([`super::answer`]); a call that fails, times out or answers what the mapping cannot
//! read is an error on that text.
//!
//! Built-ins (`model.name`):
//! - `rules`: the injection rule pack in effect (`data/rules/injection.toml`, or
//!   `--rules`): flagged when a rule fires; the score is the highest severity of the
//!   rules that fire (low 0.25, medium 0.5, high 0.75, critical 1); the category is the
//!   first rule's id;
//! - `rule:<id>`: one rule of that pack alone;
//! - `model`: pieval's injection model (crates/pieval-detect/src/model.rs): the score is
//!   its score, flagged at its threshold (chosen without the test split when it was
//!   trained: data/rules/injection-model.toml).

use std::sync::Arc;
use std::time::Instant;

use crate::detect::rules::RulePack;
use crate::error::Result;
use crate::provider::{AttemptScope, Message, Provider};

use super::answer::{AnswerMap, Verdict};
use super::items::Item;

/// What one call gave: the verdict or why there is none, the time it took and the
/// answer's text (kept, cut, in the checkpoint).
pub struct Answer {
    pub verdict: std::result::Result<Verdict, String>,
    pub latency_ms: f64,
    pub raw: Option<String>,
}

pub enum Classifier {
    Rules {
        pack: &'static RulePack,
        /// Only this rule (its index), or every rule.
        only: Option<usize>,
    },
    /// pieval's injection model (crates/pieval-detect/src/model.rs): flagged at its
    /// threshold; the score is the model's.
    Model {
        model: &'static crate::detect::model::Model,
        pack: &'static RulePack,
    },
    Call {
        provider: Box<dyn Provider>,
        map: AnswerMap,
    },
}

/// A built-in's name checked: `rules` or `rule:<id>` of the pack in effect.
pub fn builtin(name: &str) -> std::result::Result<Classifier, String> {
    let pack = RulePack::default_pack();
    match name {
        "rules" => Ok(Classifier::Rules { pack, only: None }),
        "model" => match crate::detect::packs::injection_model() {
            Some(model) => Ok(Classifier::Model { model, pack }),
            None => Err("this build ships no injection model (data/rules/injection-model.bin is empty): train one with `pieval detectors train-injection`".into()),
        },
        _ => match name.strip_prefix("rule:") {
            Some(id) => match pack.rules.iter().position(|r| r.id == id) {
                Some(i) => Ok(Classifier::Rules {
                    pack,
                    only: Some(i),
                }),
                None => {
                    let ids: Vec<&str> = pack.rules.iter().map(|r| r.id.as_str()).collect();
                    let hint = crate::text::did_you_mean(id, &ids)
                        .map(|s| format!(" (did you mean {s:?}?)"))
                        .unwrap_or_default();
                    Err(format!("{id:?} is not a rule of the injection pack{hint}"))
                }
            },
            None => Err(format!(
                "{name:?} is not a built-in classifier: rules, rule:<id> (a rule of data/rules/injection.toml), or model (pieval's injection model)"
            )),
        },
    }
}

fn severity_score(s: &str) -> f64 {
    match s {
        "critical" => 1.0,
        "high" => 0.75,
        "medium" => 0.5,
        _ => 0.25,
    }
}

impl Classifier {
    /// The provider name recorded (`builtin`, or the target's).
    pub fn provider_name(&self) -> &str {
        match self {
            Classifier::Rules { .. } | Classifier::Model { .. } => "builtin",
            Classifier::Call { provider, .. } => provider.name(),
        }
    }

    pub async fn open(&self, dir: &std::path::Path, note: crate::provider::Notes) -> Result<()> {
        match self {
            Classifier::Rules { .. } | Classifier::Model { .. } => Ok(()),
            Classifier::Call { provider, .. } => provider.open_run(dir, note).await,
        }
    }

    pub async fn close(&self) -> Option<String> {
        match self {
            Classifier::Rules { .. } | Classifier::Model { .. } => None,
            Classifier::Call { provider, .. } => provider.close_run().await,
        }
    }

    /// The built-in's verdict on a text.
    pub fn rules_verdict(pack: &RulePack, only: Option<usize>, text: &str) -> Verdict {
        let folded = crate::detect::fold::fold(text);
        let mut hits = Vec::new();
        pack.hits(text, &folded, &mut hits);
        if let Some(i) = only {
            hits.retain(|h| *h == i);
        }
        let score = hits
            .iter()
            .map(|&i| severity_score(&pack.rules[i].severity))
            .fold(0.0, f64::max);
        Verdict {
            flagged: !hits.is_empty(),
            score: Some(score),
            category: hits.first().map(|&i| pack.rules[i].id.clone()),
        }
    }

    /// The model's verdict on a text in a role.
    pub fn model_verdict(
        model: &crate::detect::model::Model,
        pack: &RulePack,
        text: &str,
        role: super::items::Role,
    ) -> Verdict {
        let folded = crate::detect::fold::fold(text);
        let mut hits = Vec::new();
        pack.hits(text, &folded, &mut hits);
        let role = crate::detect::model::role_index(Some(role.as_str()));
        let score = model.score_folded(&folded, role, &hits);
        let flagged = score as f32 >= model.threshold;
        Verdict {
            flagged,
            score: Some(score),
            category: flagged.then(|| "model".to_owned()),
        }
    }

    /// Classify one item.
    pub async fn classify(&self, item: &Item) -> Answer {
        let start = Instant::now();
        match self {
            Classifier::Rules { pack, only } => {
                let verdict = Self::rules_verdict(pack, *only, &item.text);
                Answer {
                    verdict: Ok(verdict),
                    latency_ms: start.elapsed().as_secs_f64() * 1e3,
                    raw: None,
                }
            }
            Classifier::Model { model, pack } => {
                let verdict = Self::model_verdict(model, pack, &item.text, item.role);
                Answer {
                    verdict: Ok(verdict),
                    latency_ms: start.elapsed().as_secs_f64() * 1e3,
                    raw: None,
                }
            }
            Classifier::Call { provider, map } => {
                let mut scope = AttemptScope::bare_attempt(&item.item_id, &item.item_id);
                scope.payload = Some(item.text.clone());
                scope.role = Some(item.role.as_str());
                let scope = Arc::new(scope);
                if let Err(e) = provider.begin(&scope).await {
                    provider.end(&scope).await;
                    return Answer {
                        verdict: Err(e.message),
                        latency_ms: e.latency_ms,
                        raw: None,
                    };
                }
                let messages = [Message::user(item.text.clone())];
                let called = crate::provider::ATTEMPT
                    .scope(
                        Arc::clone(&scope),
                        provider.complete(&item.item_id, &messages),
                    )
                    .await;
                provider.end(&scope).await;
                match called {
                    Ok(c) => Answer {
                        verdict: map.read(&c.text),
                        latency_ms: c.latency_ms,
                        raw: Some(c.text),
                    },
                    Err(e) => Answer {
                        verdict: Err(e.message),
                        latency_ms: e.latency_ms,
                        raw: None,
                    },
                }
            }
        }
    }
}
