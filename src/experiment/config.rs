//! The experiment config (contract: "Experiment Config Contract"): YAML with the sections
//! `experiment`, `dataset`, `model`, `mitigation` and the optional `selection` and
//! `evaluation`. Parsed with serde (`serde_yaml_ng`, the maintained fork of serde_yaml);
//! unknown keys, wrong types and missing fields are errors naming the file, the line and
//! the key path (`model.max_tokens`), with a "did you mean" for misspelt keys and values.
//!
//! Secrets never live in a config: `model.api_key_env` names the environment variable
//! that holds the key, and the key itself is read only when a request is sent.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

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

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    Local,
    Openai,
    Replay,
}

impl ProviderKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Local => "local",
            ProviderKind::Openai => "openai",
            ProviderKind::Replay => "replay",
        }
    }
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ExecutionMode {
    #[default]
    Live,
    Replay,
    DryRun,
}

impl ExecutionMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ExecutionMode::Live => "live",
            ExecutionMode::Replay => "replay",
            ExecutionMode::DryRun => "dry_run",
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    pub provider: ProviderKind,
    pub name: String,
    /// `openai`: the API root, e.g. `https://api.openai.com/v1` or `http://127.0.0.1:8080/v1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// The environment variable holding the API key (never the key itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u32,
    #[serde(default)]
    pub temperature: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    #[serde(default)]
    pub execution_mode: ExecutionMode,
    /// Requests in flight at once.
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    /// Requests started per minute, at most; unlimited when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<u32>,
    /// Seconds before one request is abandoned (and retried).
    #[serde(default = "default_timeout_s")]
    pub timeout_s: f64,
    /// Retries after the first attempt, on timeouts, connection errors, 429 and 5xx.
    #[serde(default = "default_max_retries")]
    pub max_retries: u32,
    /// `local`: a GGUF file to run instead of the default model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// `replay`: a predictions file (JSONL / Parquet) or a run folder / run id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_from: Option<String>,
}

fn default_max_tokens() -> u32 {
    128
}
fn default_concurrency() -> usize {
    8
}
fn default_timeout_s() -> f64 {
    60.0
}
fn default_max_retries() -> u32 {
    4
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum MitigationName {
    #[default]
    None,
    Instructional,
    Sandwich,
    Delimiters,
    XmlTagging,
    SpotlightDatamark,
    SpotlightBase64,
    KnownAnswer,
    InputFilter,
}

impl MitigationName {
    pub const ALL: [MitigationName; 9] = [
        MitigationName::None,
        MitigationName::Instructional,
        MitigationName::Sandwich,
        MitigationName::Delimiters,
        MitigationName::XmlTagging,
        MitigationName::SpotlightDatamark,
        MitigationName::SpotlightBase64,
        MitigationName::KnownAnswer,
        MitigationName::InputFilter,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            MitigationName::None => "none",
            MitigationName::Instructional => "instructional",
            MitigationName::Sandwich => "sandwich",
            MitigationName::Delimiters => "delimiters",
            MitigationName::XmlTagging => "xml_tagging",
            MitigationName::SpotlightDatamark => "spotlight_datamark",
            MitigationName::SpotlightBase64 => "spotlight_base64",
            MitigationName::KnownAnswer => "known_answer",
            MitigationName::InputFilter => "input_filter",
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MitigationSection {
    pub name: MitigationName,
    /// Mitigation-specific settings (see `src/mitigation/`); unknown ones are errors.
    #[serde(default)]
    pub params: BTreeMap<String, serde_json::Value>,
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

/// What the judge is shown, besides its rubric.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum JudgeInput {
    /// The case's judge question (always shown).
    Question,
    /// The model's response (always shown).
    Response,
    /// The attacker's text: an indirect case's task_input, a direct case's prompt.
    Goal,
    /// The benign task an indirect case's user asked for (its prompt).
    Task,
}

impl JudgeInput {
    pub fn as_str(self) -> &'static str {
        match self {
            JudgeInput::Question => "question",
            JudgeInput::Response => "response",
            JudgeInput::Goal => "goal",
            JudgeInput::Task => "task",
        }
    }
}

/// `evaluation.judge` (or the file given to `--judge`): the model that decides `judge`
/// criteria. Temperature is always 0; the prompt is the rubric rendered with the
/// inputs, so the same config and inputs give the same prompt.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct JudgeSection {
    /// `openai` (any OpenAI-compatible endpoint), `local` (a GGUF in process) or
    /// `replay` (verdicts recorded earlier, from `replay_from`).
    pub provider: ProviderKind,
    /// The judge model's name (sent to the endpoint, recorded with every verdict).
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// The environment variable holding the judge endpoint's key (never the key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// Judge calls in flight at once.
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<u32>,
    #[serde(default = "default_timeout_s")]
    pub timeout_s: f64,
    #[serde(default = "default_max_retries")]
    pub max_retries: u32,
    /// Longest judge answer, in tokens.
    #[serde(default = "default_judge_max_tokens")]
    pub max_tokens: u32,
    /// The rubric template (minijinja); the built-in `data/judge/rubric.md` by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rubric: Option<PathBuf>,
    /// What the judge sees: `question` and `response` always, `goal` and `task` by
    /// default too.
    #[serde(default = "default_judge_inputs")]
    pub inputs: Vec<JudgeInput>,
    /// `local`: a GGUF file instead of the registry model named by `name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// `replay`: a `judgements.parquet`, or a run folder holding one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_from: Option<PathBuf>,
    /// A verdict cache shared across runs (a Parquet file, created when missing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<PathBuf>,
    /// The labelled file this judge was calibrated on (`pieval judge calibrate`); its
    /// sha256 is recorded next to the verdicts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<PathBuf>,
    /// Characters of the judge's rationale kept per verdict.
    #[serde(default = "default_rationale_chars")]
    pub rationale_chars: usize,
}

fn default_judge_max_tokens() -> u32 {
    256
}
fn default_judge_inputs() -> Vec<JudgeInput> {
    vec![
        JudgeInput::Question,
        JudgeInput::Response,
        JudgeInput::Goal,
        JudgeInput::Task,
    ]
}
fn default_rationale_chars() -> usize {
    500
}

impl JudgeSection {
    /// Read a judge file (the keys of `evaluation.judge`, as YAML), checked like a config.
    pub fn load(path: &Path) -> Result<JudgeSection> {
        let bytes =
            std::fs::read(path).map_err(|e| Error::io(path, "cannot read judge config", e))?;
        let text = std::str::from_utf8(&bytes)
            .map_err(|_| Error::input(path, 1, None, "the judge config is not valid UTF-8"))?;
        let de = serde_yaml_ng::Deserializer::from_str(text);
        let judge: JudgeSection = serde_path_to_error::deserialize(de).map_err(|e| {
            let key = e.path().to_string();
            let inner = e.into_inner();
            Error::Input {
                path: path.to_path_buf(),
                line: inner.location().map_or(0, |l| l.line() as u64),
                field: (key != "." && !key.is_empty()).then_some(key),
                message: explain(&inner.to_string()),
            }
        })?;
        judge
            .check()
            .map_err(|(key, message)| Error::Input {
                path: path.to_path_buf(),
                line: line_of_key(text, key),
                field: Some(key.to_owned()),
                message,
            })?;
        Ok(judge)
    }

    /// Rules serde cannot express: `Err((key, message))`.
    pub fn check(&self) -> std::result::Result<(), (&'static str, String)> {
        let e = Endpoint {
            provider: self.provider,
            name: &self.name,
            base_url: self.base_url.as_deref(),
            api_key_env: self.api_key_env.as_deref(),
            concurrency: self.concurrency,
            requests_per_minute: self.requests_per_minute,
            timeout_s: self.timeout_s,
            max_tokens: self.max_tokens,
        };
        e.check()?;
        if self.provider == ProviderKind::Replay && self.replay_from.is_none() {
            return Err((
                "replay_from",
                "the replay judge needs replay_from (a judgements.parquet or a run folder)"
                    .into(),
            ));
        }
        for needed in [JudgeInput::Question, JudgeInput::Response] {
            if !self.inputs.contains(&needed) {
                return Err((
                    "inputs",
                    format!("the judge must see the {}", needed.as_str()),
                ));
            }
        }
        if self.rationale_chars == 0 || self.rationale_chars > 100_000 {
            return Err(("rationale_chars", "must be between 1 and 100000".into()));
        }
        Ok(())
    }

    /// The judge as a model section, for the providers the runner uses (temperature 0).
    pub fn as_model(&self) -> ModelSection {
        ModelSection {
            provider: self.provider,
            name: self.name.clone(),
            base_url: self.base_url.clone(),
            api_key_env: self.api_key_env.clone(),
            max_tokens: self.max_tokens,
            temperature: 0.0,
            top_p: None,
            execution_mode: ExecutionMode::Live,
            concurrency: self.concurrency,
            requests_per_minute: self.requests_per_minute,
            timeout_s: self.timeout_s,
            max_retries: self.max_retries,
            path: self.path.clone(),
            replay_from: None,
        }
    }
}

/// The longest timeout accepted, in seconds (a day).
pub const MAX_TIMEOUT_S: f64 = 86_400.0;

/// The settings a model endpoint and a judge endpoint share, checked one way.
struct Endpoint<'a> {
    provider: ProviderKind,
    name: &'a str,
    base_url: Option<&'a str>,
    api_key_env: Option<&'a str>,
    concurrency: usize,
    requests_per_minute: Option<u32>,
    timeout_s: f64,
    max_tokens: u32,
}

impl Endpoint<'_> {
    fn check(&self) -> std::result::Result<(), (&'static str, String)> {
        if self.name.trim().is_empty() {
            return Err(("name", "must not be empty".into()));
        }
        if self.max_tokens == 0 {
            return Err(("max_tokens", "must be at least 1".into()));
        }
        if self.concurrency == 0 || self.concurrency > 4096 {
            return Err(("concurrency", "must be between 1 and 4096".into()));
        }
        if self.requests_per_minute == Some(0) {
            return Err((
                "requests_per_minute",
                "must be at least 1 (leave it out for no limit)".into(),
            ));
        }
        if !(self.timeout_s.is_finite() && self.timeout_s > 0.0) {
            return Err(("timeout_s", "must be a positive number".into()));
        }
        if self.timeout_s > MAX_TIMEOUT_S {
            return Err((
                "timeout_s",
                format!("{} is more than a day ({MAX_TIMEOUT_S} s)", self.timeout_s),
            ));
        }
        if let Some(env) = self.api_key_env {
            let ok = !env.is_empty()
                && env.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                && !env.as_bytes()[0].is_ascii_digit();
            if !ok {
                return Err((
                    "api_key_env",
                    "must be the NAME of an environment variable (letters, digits, _), not a key"
                        .into(),
                ));
            }
        }
        if self.provider == ProviderKind::Openai {
            let Some(url) = self.base_url else {
                return Err((
                    "base_url",
                    "the openai provider needs base_url (e.g. https://api.openai.com/v1)".into(),
                ));
            };
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(("base_url", format!("{url:?} is not an http(s) URL")));
            }
        }
        Ok(())
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
        let bytes =
            std::fs::read(path).map_err(|e| Error::io(path, "cannot read experiment config", e))?;
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
            sha256: crate::text::sha256_hex(&bytes),
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
        let endpoint = Endpoint {
            provider: m.provider,
            name: &m.name,
            base_url: m.base_url.as_deref(),
            api_key_env: m.api_key_env.as_deref(),
            concurrency: m.concurrency,
            requests_per_minute: m.requests_per_minute,
            timeout_s: m.timeout_s,
            max_tokens: m.max_tokens,
        };
        if let Err((key, message)) = endpoint.check() {
            return bad(&format!("model.{key}"), message);
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
        crate::mitigation::check_params(self.mitigation.name, &self.mitigation.params)
            .or_else(|msg| bad("mitigation.params", msg))?;
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

    /// The config as JSON for the manifest: it holds no secret by construction (keys are
    /// named by `api_key_env`, never given).
    pub fn snapshot(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("a config serializes")
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

/// The line where `a.b.c` appears (best effort, for checks after parsing): each key is
/// looked for from the line of the key before it, so `evaluation.judge.name` is not
/// mistaken for `model.name`; 0 when not found.
fn line_of_key(text: &str, key: &str) -> u64 {
    let lines: Vec<&str> = text.lines().collect();
    let mut from = 0usize;
    let mut found = None;
    for part in key.split('.') {
        let hit = lines.iter().enumerate().skip(from).find(|(_, l)| {
            let t = l.trim_start().trim_start_matches("- ");
            t.starts_with(&format!("{part}:"))
                || t.contains(&format!(" {part}:"))
                || t.contains(&format!("{{{part}:"))
        });
        match hit {
            Some((i, _)) => {
                from = i;
                found = Some(i);
            }
            None => break,
        }
    }
    found.map_or(0, |i| i as u64 + 1)
}

/// serde's message, with a "did you mean" for an unknown key or value.
fn explain(message: &str) -> String {
    // "unknown field `sede`, expected one of `name`, `seed` at line 2 column 3"
    let message = match message.find(" at line ") {
        Some(i) => &message[..i],
        None => message,
    };
    // serde_yaml_ng prefixes the key path ("experiment: unknown field …"); the error
    // already names the key, so drop it.
    let message = match message.split_once(": ") {
        Some((path, rest)) if !path.contains(' ') && !path.is_empty() => rest,
        _ => message,
    };
    let quoted: Vec<&str> = message.split('`').skip(1).step_by(2).collect();
    let unknown = message.starts_with("unknown field") || message.starts_with("unknown variant");
    if unknown
        && quoted.len() >= 2
        && let Some(s) = crate::text::did_you_mean(quoted[0], &quoted[1..])
    {
        return format!("{message} (did you mean `{s}`?)");
    }
    message.to_owned()
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
        assert_eq!(c.mitigation.name, MitigationName::Sandwich);
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
