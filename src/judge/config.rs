//! `evaluation.judge` (or the file given to `--judge`): the judge's YAML section and its
//! checks.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config_errors::{explain, line_of_key};
use crate::error::{Error, Result};
use crate::provider::config::{
    Endpoint, ExecutionMode, ModelSection, ProviderKind, default_concurrency, default_max_retries,
    default_timeout_s,
};

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
        let bytes = crate::files::read_bounded(
            path,
            crate::files::Links::Follow,
            crate::files::bounds::SMALL_TEXT,
        )?;
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
        judge.check().map_err(|(key, message)| Error::Input {
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
            max_retries: self.max_retries,
            max_tokens: self.max_tokens,
        };
        e.check()?;
        if matches!(
            self.provider,
            ProviderKind::Http | ProviderKind::Exec | ProviderKind::Websocket
        ) {
            return Err((
                "provider",
                "a judge is a model: openai (any OpenAI-compatible endpoint), local or replay"
                    .into(),
            ));
        }
        if self.provider == ProviderKind::Replay && self.replay_from.is_none() {
            return Err((
                "replay_from",
                "the replay judge needs replay_from (a judgements.parquet or a run folder)".into(),
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
            http: None,
            exec: None,
            websocket: None,
            world: None,
            traces: None,
        }
    }
}
