//! The experiment config (contract: "Experiment Config Contract"): YAML with the sections
//! `experiment`, `dataset`, `model`, `mitigation` and the optional `selection`,
//! `evaluation` and `attack` (converters and multi-turn strategies, `crate::attack`). Parsed with serde (`serde_yaml_ng`, the maintained fork of serde_yaml);
//! unknown keys, wrong types and missing fields are errors naming the file, the line and
//! the key path (`model.max_tokens`), with a "did you mean" for misspelt keys and values.
//!
//! Secrets never live in a config: `model.api_key_env` names the environment variable
//! that holds the key, and the key itself is read only when a request is sent.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::attack::{AttackPlan, AttackSection};
use crate::config_errors::{explain, line_of_key};
use crate::error::{Error, Result};
use crate::judge::config::JudgeSection;
use crate::mitigation::MitigationSection;

use crate::provider::config::{Endpoint, ExecutionMode, ModelSection, ProviderKind};

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub experiment: ExperimentSection,
    pub dataset: DatasetSection,
    pub model: ModelSection,
    pub mitigation: MitigationSection,
    #[serde(default)]
    pub selection: Selection,
    #[serde(default)]
    pub evaluation: Evaluation,
    /// Adaptive attacks; absent: every case is sent as it is, once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attack: Option<AttackSection>,
    /// A guardrail run (src/guard): the target is a prompt-injection classifier, given
    /// texts with and without injections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guardrail: Option<crate::guard::GuardSection>,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ExperimentSection {
    pub name: String,
    #[serde(default)]
    pub seed: u64,
    /// Cases to draw after filtering; all of them when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_size: Option<usize>,
    #[serde(default = "default_output_dir")]
    pub output_dir: PathBuf,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

fn default_output_dir() -> PathBuf {
    PathBuf::from("results")
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DatasetSection {
    /// The corpus (JSONL or Parquet; enriched or canonical).
    pub path: PathBuf,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Selection {
    /// field → allowed values; a case must match every field.
    #[serde(default)]
    pub include: BTreeMap<String, Vec<String>>,
    /// field → excluded values; a case matching any is dropped.
    #[serde(default)]
    pub exclude: BTreeMap<String, Vec<String>>,
    /// Only these cases (after the filters); each must exist in the corpus.
    #[serde(default)]
    pub case_ids: Vec<String>,
    /// Fields whose value combinations are sampled proportionally.
    #[serde(default)]
    pub stratify_by: Vec<String>,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Evaluation {
    /// Leakage score from which the system prompt counts as leaked.
    #[serde(default = "default_leakage_threshold")]
    pub leakage_threshold: f64,
    /// A model judge for the `judge` criteria; without one they go to manual review.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge: Option<JudgeSection>,
}

impl Default for Evaluation {
    fn default() -> Self {
        Self {
            leakage_threshold: default_leakage_threshold(),
            judge: None,
        }
    }
}

fn default_leakage_threshold() -> f64 {
    0.5
}

/// A loaded config: the parsed value, where it came from and its sha256.
#[derive(Clone, Debug)]
pub struct LoadedConfig {
    pub config: Config,
    pub path: PathBuf,
    pub sha256: String,
}

impl Config {
    /// Read and check a config file.
    pub fn load(path: &Path) -> Result<LoadedConfig> {
        let bytes = crate::files::read_bounded(
            path,
            crate::files::Links::Follow,
            crate::files::bounds::SMALL_TEXT,
        )?;
        let text = std::str::from_utf8(&bytes).map_err(|e| {
            let line = bytes[..e.valid_up_to()]
                .iter()
                .filter(|b| **b == b'\n')
                .count() as u64
                + 1;
            Error::input(path, line, None, "the config is not valid UTF-8")
        })?;
        let config = Self::parse(text, path)?;
        Ok(LoadedConfig {
            config,
            path: path.to_path_buf(),
            sha256: crate::digest::sha256_hex(&bytes),
        })
    }

    /// A config recorded in a run's manifest (`config_snapshot`), checked exactly as a
    /// config file is: a received run folder is untrusted input. Errors name the manifest
    /// and the key (`config_snapshot.model.timeout_s`).
    pub fn from_snapshot(snapshot: &serde_json::Value, manifest: &Path) -> Result<Config> {
        if !snapshot.is_object() {
            return Err(Error::config(manifest, "config_snapshot: not a config"));
        }
        let text = serde_json::to_string_pretty(snapshot)
            .map_err(|e| Error::Internal(format!("cannot encode the config snapshot: {e}")))?;
        Self::parse(&text, manifest).map_err(|e| match e {
            Error::Input { field, message, .. } => Error::config(
                manifest,
                match field {
                    Some(f) => format!("config_snapshot.{f}: {message}"),
                    None => format!("config_snapshot: {message}"),
                },
            ),
            other => other,
        })
    }

    /// Parse config text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &Path) -> Result<Config> {
        let de = serde_yaml_ng::Deserializer::from_str(text);
        let config: Config = serde_path_to_error::deserialize(de).map_err(|e| {
            let key = e.path().to_string();
            let inner = e.into_inner();
            let line = inner.location().map_or(0, |l| l.line() as u64);
            let message = explain(&inner.to_string());
            let field = (key != "." && !key.is_empty()).then_some(key);
            Error::Input {
                path: origin.to_path_buf(),
                line,
                field,
                message,
            }
        })?;
        config.check(text, origin)?;
        Ok(config)
    }

    /// Rules serde cannot express.
    fn check(&self, text: &str, origin: &Path) -> Result<()> {
        let bad = |key: &str, message: String| {
            Err(Error::Input {
                path: origin.to_path_buf(),
                line: line_of_key(text, key),
                field: Some(key.to_owned()),
                message,
            })
        };
        let m = &self.model;
        if self.experiment.name.trim().is_empty() {
            return bad("experiment.name", "must not be empty".into());
        }
        if self.experiment.sample_size == Some(0) {
            return bad(
                "experiment.sample_size",
                "must be at least 1 (leave it out to run every selected case)".into(),
            );
        }
        if m.name.trim().is_empty() {
            return bad("model.name", "must not be empty".into());
        }
        if !(0.0..=2.0).contains(&m.temperature) {
            return bad(
                "model.temperature",
                format!("{} is outside 0..=2", m.temperature),
            );
        }
        if m.top_p.is_some_and(|p| !(p > 0.0 && p <= 1.0)) {
            return bad("model.top_p", "must be in (0, 1]".into());
        }
        if let Err((key, message)) = endpoint_of(m).check() {
            return bad(&format!("model.{key}"), message);
        }
        match (m.provider, &m.http) {
            (ProviderKind::Http, None) => {
                return bad(
                    "model.http",
                    "provider http needs the http section: the request, and where its answer is (docs/applications.md)".into(),
                );
            }
            (ProviderKind::Http, Some(h)) => {
                if let Err((k, message)) = h.compile() {
                    return bad(&format!("model.http.{k}"), message);
                }
                if h.delivery == crate::provider::http::config::Delivery::Planted
                    && self.attack.is_some()
                {
                    return bad(
                        "model.http.delivery",
                        "planted delivery with an attack section is not built yet: setup plants the case's own content, so converters and strategies would not reach the application".into(),
                    );
                }
            }
            (_, Some(_)) => {
                return bad(
                    "model.http",
                    format!(
                        "only provider http reads this section (the provider is {})",
                        m.provider.as_str()
                    ),
                );
            }
            (_, None) => {}
        }
        match (m.provider, &m.websocket) {
            (ProviderKind::Websocket, None) => {
                return bad(
                    "model.websocket",
                    "provider websocket needs the websocket section: url, send, until, answer (docs/applications.md)".into(),
                );
            }
            (ProviderKind::Websocket, Some(w)) => {
                if let Err((k, message)) = w.check() {
                    return bad(&format!("model.websocket.{k}"), message);
                }
            }
            (_, Some(_)) => {
                return bad(
                    "model.websocket",
                    format!(
                        "only provider websocket reads this section (the provider is {})",
                        m.provider.as_str()
                    ),
                );
            }
            (_, None) => {}
        }
        match (m.provider, &m.exec) {
            (ProviderKind::Exec, None) => {
                return bad(
                    "model.exec",
                    "provider exec needs the exec section: the command to start (docs/applications.md)".into(),
                );
            }
            (ProviderKind::Exec, Some(x)) => {
                if let Err((k, message)) = x.check(m.concurrency) {
                    return bad(&format!("model.exec.{k}"), message);
                }
            }
            (_, Some(_)) => {
                return bad(
                    "model.exec",
                    format!(
                        "only provider exec reads this section (the provider is {})",
                        m.provider.as_str()
                    ),
                );
            }
            (_, None) => {}
        }
        if let Some(t) = &m.traces {
            if let Err(message) = t.addr() {
                return bad("model.traces.listen", message);
            }
            if !(t.wait_s.is_finite() && t.wait_s >= 0.0 && t.wait_s <= 600.0) {
                return bad(
                    "model.traces.wait_s",
                    format!("{} is not between 0 and 600 seconds", t.wait_s),
                );
            }
            if m.world.is_some() {
                return bad(
                    "model.traces",
                    "an agent served its world is judged by the calls the world recorded; traces are for an agent whose tools are real (set one of world, traces)".into(),
                );
            }
            if matches!(m.provider, ProviderKind::Local | ProviderKind::Replay) {
                return bad(
                    "model.traces",
                    "traces are read from an agent with its own loop (provider http, exec, websocket, openai, anthropic); a traced run's predictions are rescored with `pieval replay --rescore`".into(),
                );
            }
        }
        if let Some(w) = &m.world {
            if let Err(message) = w.addr() {
                return bad("model.world.listen", message);
            }
            if m.provider == ProviderKind::Local {
                return bad(
                    "model.world",
                    "a served world is for an agent with its own loop (provider http, exec, websocket, openai, anthropic, or replay of such a run); the local model runs in pieval's own loop".into(),
                );
            }
        } else if m.http.as_ref().is_some_and(|h| h.uses_world())
            || m.websocket.as_ref().is_some_and(|w| w.uses_world())
        {
            return bad(
                "model.world",
                "a template names {{world.*}}: set model.world ({listen: \"127.0.0.1:0\"}) to serve each agentic case's world".into(),
            );
        }
        if m.provider == ProviderKind::Replay && m.replay_from.is_none() {
            return bad(
                "model.replay_from",
                "the replay provider needs replay_from (a predictions file, a run folder or a run id)"
                    .into(),
            );
        }
        if m.execution_mode == ExecutionMode::Replay && m.provider != ProviderKind::Replay {
            return bad(
                "model.execution_mode",
                "execution_mode replay needs provider: replay".into(),
            );
        }
        let t = self.evaluation.leakage_threshold;
        if !(t > 0.0 && t <= 1.0) {
            return bad("evaluation.leakage_threshold", "must be in (0, 1]".into());
        }
        if let Some(judge) = &self.evaluation.judge
            && let Err((key, message)) = judge.check()
        {
            return bad(&format!("evaluation.judge.{key}"), message);
        }
        let mitigation = match crate::mitigation::Mitigation::from_section(&self.mitigation) {
            Ok(m) => m,
            Err(msg) => return bad("mitigation.params", msg),
        };
        if let Some(attack) = &self.attack {
            let plan = match AttackPlan::from_section(attack) {
                Ok(p) => p,
                Err((key, msg)) => return bad(&format!("attack.{key}"), msg),
            };
            for (key, model) in [
                ("attacker", &attack.attacker),
                ("translator", &attack.translator),
            ] {
                let Some(model) = model else { continue };
                if model.name.trim().is_empty() {
                    return bad(&format!("attack.{key}.name"), "must not be empty".into());
                }
                if let Err((k, message)) = endpoint_of(model).check() {
                    return bad(&format!("attack.{key}.{k}"), message);
                }
                if matches!(
                    model.provider,
                    ProviderKind::Http | ProviderKind::Exec | ProviderKind::Websocket
                ) || model.http.is_some()
                    || model.exec.is_some()
                    || model.websocket.is_some()
                {
                    return bad(
                        &format!("attack.{key}.provider"),
                        format!(
                            "the {key} is a model (openai, local or replay), not an application"
                        ),
                    );
                }
            }
            if plan.strategy.is_some()
                && matches!(mitigation, crate::mitigation::Mitigation::KnownAnswer(_))
            {
                return bad(
                    "attack.strategy",
                    "multi-turn strategies cannot run against known_answer yet (its detection call is per request, not per turn): pick another mitigation".into(),
                );
            }
        }
        match &self.guardrail {
            None if m.provider == ProviderKind::Builtin => {
                return bad(
                    "model.provider",
                    "provider builtin is a guardrail run's classifier: add a guardrail section (docs/guardrails.md)".into(),
                );
            }
            None => {}
            Some(g) => {
                if !matches!(mitigation, crate::mitigation::Mitigation::None(_)) {
                    return bad(
                        "mitigation.name",
                        "a guardrail run measures the guardrail alone: mitigation none".into(),
                    );
                }
                if self.attack.as_ref().is_some_and(|a| a.strategy.is_some()) {
                    return bad(
                        "attack.strategy",
                        "a guardrail run's evasions are converters; a multi-turn strategy needs a model that answers".into(),
                    );
                }
                if g.forms.is_empty() && g.labels.is_empty() {
                    return bad(
                        "guardrail.forms",
                        "no texts: give forms (payload, carried, benign) or labels".into(),
                    );
                }
                match m.provider {
                    ProviderKind::Builtin => {
                        if let Err(message) = crate::guard::target::builtin(&m.name) {
                            return bad("model.name", message);
                        }
                        if g.answer.is_some() {
                            return bad(
                                "guardrail.answer",
                                "a built-in classifier's verdicts are its own: no answer mapping"
                                    .into(),
                            );
                        }
                    }
                    ProviderKind::Http | ProviderKind::Exec | ProviderKind::Websocket => {
                        let Some(a) = &g.answer else {
                            return bad(
                                "guardrail.answer",
                                "say how the guardrail's answer is read: a preset (lakera, azure_prompt_shields, llm_guard_api, nemo_guardrails) or flagged/score paths".into(),
                            );
                        };
                        if let Err((k, message)) = crate::guard::AnswerMap::compile(a) {
                            return bad(&format!("guardrail.answer.{k}"), message);
                        }
                    }
                    other => {
                        return bad(
                            "model.provider",
                            format!(
                                "a guardrail run's classifier is builtin, or an application (http, exec, websocket), not {}",
                                other.as_str()
                            ),
                        );
                    }
                }
            }
        }
        for (section, map) in [
            ("selection.include", &self.selection.include),
            ("selection.exclude", &self.selection.exclude),
        ] {
            for field in map.keys() {
                check_selection_field(field)
                    .or_else(|msg| bad(&format!("{section}.{field}"), msg))?;
            }
        }
        for field in &self.selection.stratify_by {
            check_selection_field(field).or_else(|msg| bad("selection.stratify_by", msg))?;
        }
        Ok(())
    }

    /// Every local file or folder the config names, as (key, path): what a config received
    /// in a run folder would make pieval read or write outside that folder.
    pub fn local_paths(&self) -> Vec<(String, PathBuf)> {
        let mut out: Vec<(String, PathBuf)> = Vec::new();
        let mut add = |key: String, p: Option<&Path>| {
            if let Some(p) = p {
                out.push((key, p.to_path_buf()));
            }
        };
        add("dataset.path".into(), Some(&self.dataset.path));
        let mut model = |prefix: &str, m: &ModelSection| {
            add(format!("{prefix}.path"), m.path.as_deref());
            add(
                format!("{prefix}.replay_from"),
                m.replay_from.as_deref().map(Path::new),
            );
        };
        model("model", &self.model);
        if let Some(a) = &self.attack {
            if let Some(m) = &a.attacker {
                model("attack.attacker", m);
            }
            if let Some(m) = &a.translator {
                model("attack.translator", m);
            }
        }
        if let Some(h) = &self.model.http {
            for (k, p) in h.local_paths() {
                add(format!("model.http.{k}"), Some(&p));
            }
        }
        if let Some(x) = &self.model.exec {
            add(
                "model.exec.command".into(),
                x.command
                    .first()
                    .map(Path::new)
                    .filter(|p| p.components().count() > 1),
            );
            for a in x.command.iter().skip(1).filter(|a| Path::new(a).exists()) {
                add("model.exec.command".into(), Some(Path::new(a)));
            }
            add("model.exec.cwd".into(), x.cwd.as_deref());
        }
        if let Some(g) = &self.guardrail {
            for (i, l) in g.labels.iter().enumerate() {
                add(format!("guardrail.labels[{i}]"), Some(l));
            }
        }
        if let Some(j) = &self.evaluation.judge {
            add("evaluation.judge.rubric".into(), j.rubric.as_deref());
            add("evaluation.judge.path".into(), j.path.as_deref());
            add(
                "evaluation.judge.replay_from".into(),
                j.replay_from.as_deref(),
            );
            add("evaluation.judge.cache".into(), j.cache.as_deref());
            add(
                "evaluation.judge.calibration".into(),
                j.calibration.as_deref(),
            );
        }
        out
    }

    /// The config as JSON for the manifest: it holds no secret by construction (keys are
    /// named by `api_key_env`, never given).
    pub fn snapshot(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("a config serializes")
    }
}

/// The endpoint settings of a model section, for their checks.
fn endpoint_of(m: &ModelSection) -> Endpoint<'_> {
    Endpoint {
        provider: m.provider,
        name: &m.name,
        base_url: m.base_url.as_deref(),
        api_key_env: m.api_key_env.as_deref(),
        concurrency: m.concurrency,
        requests_per_minute: m.requests_per_minute,
        timeout_s: m.timeout_s,
        max_retries: m.max_retries,
        max_tokens: m.max_tokens,
    }
}

/// Fields a selection may filter or stratify on: the corpus's categorical fields.
pub const SELECTION_FIELDS: &[&str] = &[
    "source_name",
    "source_type",
    "attack_family",
    "attack_surface",
    "attack_subtype",
    "attack_category",
    "label",
    "severity",
    "severity_level",
    "benchmark_split",
    "language",
    "evaluation_mode",
    "success_definition_id",
];

fn check_selection_field(field: &str) -> std::result::Result<(), String> {
    if SELECTION_FIELDS.contains(&field) {
        return Ok(());
    }
    let hint = crate::text::did_you_mean(field, SELECTION_FIELDS)
        .map(|s| format!(" (did you mean {s:?}?)"))
        .unwrap_or_default();
    Err(format!(
        "{field:?} is not a categorical case field{hint}; one of: {}",
        SELECTION_FIELDS.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
experiment: {name: quickstart, seed: 7, sample_size: 50, output_dir: results}
dataset:    {path: data/normalized/attack_cases.jsonl}
selection:  {include: {attack_family: [context_ignoring, fake_completion]}, exclude: {language: [de]},
             case_ids: [], stratify_by: [attack_family]}
model:      {provider: openai, name: gpt-4o-mini, base_url: "http://127.0.0.1:8080/v1",
             api_key_env: OPENAI_API_KEY, max_tokens: 128, temperature: 0, execution_mode: live,
             concurrency: 16, requests_per_minute: 600, timeout_s: 30, max_retries: 4}
mitigation: {name: sandwich, params: {}}
evaluation: {leakage_threshold: 0.5}
"#;

    fn parse(text: &str) -> Result<Config> {
        Config::parse(text, Path::new("exp.yaml"))
    }

    fn err(text: &str) -> String {
        parse(text).unwrap_err().to_string()
    }

    #[test]
    fn the_architecture_example_parses() {
        let c = parse(GOOD).unwrap();
        assert_eq!(c.experiment.seed, 7);
        assert_eq!(c.model.provider, ProviderKind::Openai);
        assert_eq!(c.mitigation.name.as_str(), "sandwich");
        assert_eq!(c.selection.stratify_by, ["attack_family"]);
        assert_eq!(c.model.requests_per_minute, Some(600));
    }

    #[test]
    fn unknown_keys_name_file_line_key_and_suggest() {
        let e = err(
            "experiment:\n  name: x\n  sede: 7\ndataset: {path: a.jsonl}\nmodel: {provider: local, name: m}\n",
        );
        assert!(e.starts_with("exp.yaml:3: experiment"), "{e}");
        assert!(e.contains("unknown field `sede`"), "{e}");
        assert!(e.contains("did you mean `seed`"), "{e}");
        let e = err(
            "experiment: {name: x}\ndataset: {path: a.jsonl}\nmodel: {provider: opena, name: m}\n",
        );
        assert!(e.contains("model.provider"), "{e}");
        assert!(e.contains("did you mean `openai`"), "{e}");
    }

    #[test]
    fn wrong_types_and_missing_fields_are_located() {
        let e = err(
            "experiment: {name: x, seed: seven}\ndataset: {path: a.jsonl}\nmodel: {provider: local, name: m}\n",
        );
        assert!(e.starts_with("exp.yaml:1: experiment.seed"), "{e}");
        let e = err(
            "experiment: {name: x}\nmodel: {provider: local, name: m}\nmitigation: {name: none}\n",
        );
        assert!(e.contains("missing field `dataset`"), "{e}");
        let e = err(
            "experiment: {name: x}\ndataset: {path: a.jsonl}\nmodel:\n  provider: local\n  name: m\n  max_tokens: -3\n",
        );
        assert!(e.contains("exp.yaml:6: model.max_tokens"), "{e}");
        let e = err("experiment: [unclosed\n");
        assert!(e.starts_with("exp.yaml:"), "{e}");
    }

    #[test]
    fn attack_sections_are_located() {
        let base = "experiment: {name: x}\ndataset: {path: a.jsonl}\nmitigation: {name: none}\nmodel: {provider: local, name: m}\n";
        let e = err(&format!("{base}attack:\n  converters: [base46]\n"));
        assert!(e.starts_with("exp.yaml:5: attack.converters[0]"), "{e}");
        assert!(e.contains("did you mean \"base64\""), "{e}");
        let e = err(&format!("{base}attack: {{strategy: pear}}\n"));
        assert!(e.contains("attack.strategy"), "{e}");
        assert!(e.contains("did you mean `pair`"), "{e}");
        let e = err(&format!(
            "{base}attack: {{strategy: pair, attacker: {{provider: openai, name: a}}}}\n"
        ));
        assert!(e.contains("attack.attacker.base_url"), "{e}");
        let e = err(&format!(
            "{base}attack: {{converters: [{{best_of_n: {{n: many}}}}]}}\n"
        ));
        assert!(e.contains("best_of_n.n must be an integer"), "{e}");
        let e = err(&format!(
            "{}attack: {{strategy: crescendo, attacker: {{provider: local, name: a}}}}\n",
            base.replace("{name: none}", "{name: known_answer}")
        ));
        assert!(
            e.contains("attack.strategy") && e.contains("known_answer"),
            "{e}"
        );
    }

    #[test]
    fn semantic_checks() {
        let base = "experiment: {name: x}\ndataset: {path: a.jsonl}\nmitigation: {name: none}\n";
        let e = err(&format!("{base}model: {{provider: openai, name: m}}\n"));
        assert!(e.contains("model.base_url"), "{e}");
        let e = err(&format!(
            "{base}model: {{provider: openai, name: m, base_url: 'http://h/v1', api_key_env: 'sk-abc123'}}\n"
        ));
        assert!(e.contains("model.api_key_env"), "{e}");
        assert!(!e.contains("abc123") || e.contains("NAME"), "{e}");
        let e = err(&format!(
            "{base}model: {{provider: local, name: m}}\nselection: {{include: {{atack_family: [a]}}}}\n"
        ));
        assert!(e.contains("did you mean \"attack_family\""), "{e}");
        let e = err(&format!(
            "{base}model: {{provider: local, name: m, temperature: 3}}\n"
        ));
        assert!(e.contains("exp.yaml:4: model.temperature"), "{e}");
    }
}
