//! The `attack` section of an experiment config (YAML shape) and its typed, checked form
//! [`AttackPlan`].
//!
//! ```yaml
//! attack:
//!   original: true                 # also run every case as it is (default true)
//!   converters:                    # each entry is one pipeline (one attempt per case)
//!     - base64                     #   a step
//!     - [leetspeak, zero_width]    #   steps applied in order
//!     - {best_of_n: {n: 8}}        #   a step with parameters
//!   translator: {provider: openai, name: …, base_url: …}   # for `translate`
//!   strategy: crescendo            # or pair, tap (multi-turn, with an attacker model)
//!   attacker: {provider: openai, name: …, base_url: …}
//!   max_turns: 5                   # target queries per attempt (TAP: in all)
//!   max_backtracks: 3              # crescendo: refused turns taken back
//!   branching: 3                   # tap: children per node
//!   width: 4                       # tap: leaves kept per level
//!   depth: 5                       # tap: levels
//! ```

use serde::{Deserialize, Serialize};

use super::convert::{Pipeline, Step};
use super::strategy::{StrategyName, StrategySpec};
use crate::provider::config::{ModelSection, ProviderKind};

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AttackSection {
    #[serde(default = "yes")]
    pub original: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub converters: Vec<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub translator: Option<ModelSection>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<StrategyName>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attacker: Option<ModelSection>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_turns: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_backtracks: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branching: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub width: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<u32>,
}

fn yes() -> bool {
    true
}

/// The attack plan of a run: the pipelines (each one attempt per case, `best_of_n`
/// more) and the strategy.
#[derive(Clone, Debug, PartialEq)]
pub struct AttackPlan {
    pub original: bool,
    pub pipelines: Vec<Pipeline>,
    pub strategy: Option<StrategySpec>,
}

/// The largest number of attempts one case may make (a guard against `best_of_n: {n:
/// 10000}` composed with itself).
pub const MAX_ATTEMPTS_PER_CASE: usize = 10_000;

impl AttackPlan {
    /// Check and type a section; `Err((key under attack, message))`.
    pub fn from_section(s: &AttackSection) -> Result<AttackPlan, (String, String)> {
        let mut pipelines = Vec::new();
        for (i, entry) in s.converters.iter().enumerate() {
            let key = format!("converters[{i}]");
            let steps_json: Vec<&serde_json::Value> = match entry {
                serde_json::Value::Array(a) => a.iter().collect(),
                other => vec![other],
            };
            if steps_json.is_empty() {
                return Err((key, "an empty pipeline".into()));
            }
            let mut steps = Vec::new();
            for v in steps_json {
                let step = match v {
                    serde_json::Value::String(name) => Step::parse(name, &serde_json::Value::Null),
                    serde_json::Value::Object(m) if m.len() == 1 => {
                        let (name, params) = m.iter().next().expect("one entry");
                        Step::parse(name, params)
                    }
                    _ => Err(
                        "a step is a converter name or {name: {parameters}} (one key)".to_owned(),
                    ),
                }
                .map_err(|m| (key.clone(), m))?;
                steps.push(step);
            }
            let p = Pipeline { steps };
            if p.steps.iter().filter(|s| s.translation().is_some()).count() > 1 {
                return Err((key, "a pipeline translates at most once".into()));
            }
            if p.translation().is_some() && s.translator.is_none() {
                return Err((
                    "translator".into(),
                    "translate needs a translator model section (shaped like model)".into(),
                ));
            }
            if p.variants() > MAX_ATTEMPTS_PER_CASE {
                return Err((
                    key,
                    format!(
                        "{} attempts per case, over the limit of {MAX_ATTEMPTS_PER_CASE}",
                        p.variants()
                    ),
                ));
            }
            if pipelines.contains(&p) {
                return Err((key, format!("pipeline {} is listed twice", p.label())));
            }
            pipelines.push(p);
        }
        let total: usize = pipelines
            .iter()
            .map(Pipeline::variants)
            .fold(0usize, |a, b| a.saturating_add(b));
        if total > MAX_ATTEMPTS_PER_CASE {
            return Err((
                "converters".into(),
                format!(
                    "{total} attempts per case in all, over the limit of {MAX_ATTEMPTS_PER_CASE}"
                ),
            ));
        }
        let strategy = match s.strategy {
            None => {
                for (key, set) in [
                    ("attacker", s.attacker.is_some()),
                    ("max_turns", s.max_turns.is_some()),
                    ("max_backtracks", s.max_backtracks.is_some()),
                    ("branching", s.branching.is_some()),
                    ("width", s.width.is_some()),
                    ("depth", s.depth.is_some()),
                ] {
                    if set {
                        return Err((key.into(), "only used with a strategy".into()));
                    }
                }
                None
            }
            Some(name) => {
                if s.attacker.is_none() {
                    return Err((
                        "attacker".into(),
                        format!(
                            "strategy {} needs an attacker model section (shaped like model)",
                            name.as_str()
                        ),
                    ));
                }
                if !pipelines.is_empty() {
                    return Err((
                        "strategy".into(),
                        "a strategy and converters cannot be combined in one run: run them as two experiments".into(),
                    ));
                }
                let strategy = name.strategy();
                for (key, set) in [
                    ("branching", s.branching.is_some()),
                    ("width", s.width.is_some()),
                    ("depth", s.depth.is_some()),
                    ("max_backtracks", s.max_backtracks.is_some()),
                ] {
                    if set && !strategy.keys().contains(&key) {
                        let takers: Vec<&str> = super::strategy::STRATEGIES
                            .iter()
                            .filter(|s| s.keys().contains(&key))
                            .map(|s| s.name())
                            .collect();
                        return Err((
                            key.into(),
                            format!("only used with strategy: {}", takers.join(" or ")),
                        ));
                    }
                }
                let bound = |key: &str, v: Option<u32>, default: u32, max: u32| match v {
                    None => Ok(default),
                    Some(n) if (1..=max).contains(&n) => Ok(n),
                    Some(_) => Err((key.to_owned(), format!("must be from 1 to {max}"))),
                };
                let (branching, width, depth) = (
                    bound("branching", s.branching, 3, 16)?,
                    bound("width", s.width, 4, 64)?,
                    bound("depth", s.depth, 5, 32)?,
                );
                let default_turns = strategy.default_turns(branching, width, depth);
                Some(StrategySpec {
                    name,
                    max_turns: bound("max_turns", s.max_turns, default_turns, 1000)?,
                    max_backtracks: match s.max_backtracks {
                        None => 3,
                        Some(n) if n <= 100 => n,
                        Some(_) => {
                            return Err(("max_backtracks".into(), "must be at most 100".into()));
                        }
                    },
                    branching,
                    width,
                    depth,
                })
            }
        };
        if pipelines.is_empty() && strategy.is_none() {
            return Err((
                "converters".into(),
                "an attack section needs converters or a strategy".into(),
            ));
        }
        for (key, model) in [("translator", &s.translator), ("attacker", &s.attacker)] {
            if let Some(m) = model
                && m.provider == ProviderKind::Replay
                && m.replay_from.is_none()
            {
                return Err((
                    format!("{key}.replay_from"),
                    "the replay provider needs replay_from (a run folder or a run id)".into(),
                ));
            }
        }
        Ok(AttackPlan {
            original: s.original,
            pipelines,
            strategy,
        })
    }
}
