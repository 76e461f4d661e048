//! `manifest.json`, typed: what a run was (config, corpus, selection, model, mitigation),
//! where it stands ([`RunStatus`]) and its headline results. It mirrors
//! `schemas/manifest.schema.json`; field order is the file's key order, so a manifest
//! read and written again is byte for byte the same (tests/it/rundir.rs).
//!
//! Reading is lenient where older pieval versions wrote less (a missing optional block
//! reads as `None` and is not written back); keys this version does not know are kept in
//! [`Manifest::extra`] and written back after the known ones.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// Where a run stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Started (or resumed) and not finished: killed runs stay here.
    Running,
    Completed,
    /// Stopped by Ctrl-C; resumable.
    Interrupted,
    /// Stopped by an error (recorded in `error`); resumable.
    Failed,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Completed => "completed",
            RunStatus::Interrupted => "interrupted",
            RunStatus::Failed => "failed",
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub run_id: String,
    /// The run's first start (RFC 3339, UTC); kept across resumptions.
    pub timestamp: String,
    /// The commit pieval was built from.
    pub git_commit: Option<String>,
    pub config_source_path: Option<String>,
    /// The config as run (`experiment::config::Config::snapshot`), read back by `replay`.
    pub config_snapshot: Value,
    pub dataset_snapshot: DatasetSnapshot,
    pub model_snapshot: ModelSnapshot,
    pub mitigation_snapshot: MitigationSnapshot,
    pub replay_hints: ReplayHints,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<RunStatus>,
    /// This invocation's start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pieval_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_at: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub results: Option<RunResults>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rescored_at: Option<String>,
    /// Keys written by another pieval version, kept as they were.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DatasetSnapshot {
    pub path: String,
    pub sha256: String,
    /// The digest of the shared environment files the cases include (absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub includes_sha256: Option<String>,
    pub selected_case_ids: Vec<String>,
    pub total_available_cases: u64,
    pub total_filtered_cases: u64,
    pub selection_snapshot: SelectionSnapshot,
    /// Counts of the selected cases per taxonomy field and value.
    pub taxonomy_summary: BTreeMap<String, BTreeMap<String, u64>>,
    /// The commit of the checkout holding the corpus, if any.
    #[serde(default)]
    pub git_commit: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SelectionSnapshot {
    pub algorithm: String,
    pub seed: u64,
    pub sample_size: Option<u64>,
    pub include: BTreeMap<String, Vec<String>>,
    pub exclude: BTreeMap<String, Vec<String>>,
    pub case_ids: Vec<String>,
    pub stratify_by: Vec<String>,
    /// Per stratum: how many cases were available and taken (`experiment::selection`).
    pub strata: Value,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelSnapshot {
    pub provider: String,
    pub name: String,
    pub base_url: Option<String>,
    pub api_key_env: Option<String>,
    pub max_tokens: u64,
    pub temperature: f64,
    pub top_p: Option<f64>,
    pub seed: u64,
    pub execution_mode: String,
    pub path: Option<String>,
    pub replay_from: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MitigationSnapshot {
    pub name: String,
    pub params: BTreeMap<String, Value>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ReplayHints {
    pub command: String,
    pub config_sha256: String,
    pub corpus_sha256: String,
    pub seed: u64,
    pub selected: u64,
    pub pieval_version: String,
}

/// Headline results, written when a run is scored (and again by `replay --rescore`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunResults {
    pub rows: u64,
    pub attack_success: u64,
    pub manual_review: u64,
    pub provider_errors: u64,
    pub attack_success_rate: Option<Rate>,
    pub leakage_rate: Option<Rate>,
    pub over_refusal_rate: Option<Rate>,
    pub predictions_sha256: String,
    /// The judge block of `summary.json` (`judge::JudgeReport`), when a judge ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_speed: Option<ModelSpeed>,
    /// Where the scoring ran (`summary.json`'s `scoring`: engine, scheduler, executors).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scoring: Option<Value>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A rate with its Wilson 95% interval, as `queries/summary.sql` computes it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Rate {
    pub n: u64,
    pub k: u64,
    pub rate: Option<f64>,
    pub ci_low: Option<f64>,
    pub ci_high: Option<f64>,
}

/// Model speed over the cases a run called (local models report their own timings).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelSpeed {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub prompt_secs: f64,
    pub generation_secs: f64,
    pub prompt_tokens_per_s: Option<f64>,
    pub generation_tokens_per_s: Option<f64>,
    pub cases_per_minute: Option<f64>,
    /// The decoder behind a local model (outputs are deterministic per backend).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// Model instances answering side by side; the tokens/s above are per instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instances: Option<usize>,
}

impl Manifest {
    /// Read `<dir>/manifest.json`.
    pub fn read(dir: &Path) -> Result<Manifest> {
        let path = super::artifact(dir, super::MANIFEST_FILE)?.ok_or_else(|| {
            Error::NotFound(format!(
                "{}: no {} (not a run folder)",
                dir.display(),
                super::MANIFEST_FILE
            ))
        })?;
        let bytes = crate::files::read_bounded(
            &path,
            crate::files::Links::Refuse,
            crate::files::bounds::MANIFEST,
        )?;
        let text = String::from_utf8(bytes)
            .map_err(|_| Error::input(&path, 0, None, "the run manifest is not valid UTF-8"))?;
        Self::parse(&text, &path)
    }

    /// Parse a manifest's text (`path` names it in errors).
    pub fn parse(text: &str, path: &Path) -> Result<Manifest> {
        let de = &mut serde_json::Deserializer::from_str(text);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let field = e.path().to_string();
            let inner = e.into_inner();
            Error::input(
                path,
                inner.line() as u64,
                (field != ".").then_some(field.as_str()),
                format!("not a valid manifest: {inner}"),
            )
        })
    }

    /// The manifest's bytes: pretty JSON, no trailing newline (`write` adds it).
    pub fn to_text(&self) -> Result<String> {
        serde_json::to_string_pretty(self)
            .map_err(|e| Error::Internal(format!("cannot encode the manifest: {e}")))
    }

    /// Write `<dir>/manifest.json` atomically.
    pub fn write(&self, dir: &Path) -> Result<()> {
        let text = self.to_text()?;
        crate::atomic::write_lines(&dir.join(super::MANIFEST_FILE), std::iter::once(text))
    }

    /// The experiment's name, from the config snapshot.
    pub fn experiment_name(&self) -> Option<&str> {
        self.config_snapshot.pointer("/experiment/name")?.as_str()
    }

    /// The experiment's seed, from the config snapshot (as recorded: a number).
    pub fn experiment_seed(&self) -> Option<&Value> {
        self.config_snapshot.pointer("/experiment/seed")
    }
}
