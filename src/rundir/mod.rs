//! The run folder on disk, owned in one place: its file names, run ids and their checks,
//! the typed [`Manifest`], and the checkpoint (`predictions.jsonl`). Everything above
//! (`runner`, `engine`, `evidence`, `export`, `cli`) reads a run through this module.
//!
//! A run lives in `<output_dir>/<run_id>/`:
//! - `manifest.json` — written (atomically) when the run starts with `status: running`,
//!   rewritten at the end with `completed` (or `interrupted`, `failed`);
//! - `cases.jsonl` — the selected cases, enriched, exactly as scored;
//! - `predictions.jsonl` — the checkpoint: one line per finished case, appended with one
//!   `write` call as each case finishes, so a killed run loses no finished case;
//!   `--resume` repairs a torn last line ([`checkpoint::read_checkpoint`]);
//! - `case_results.{jsonl,parquet}`, `findings.parquet`, `summary.json`,
//!   `judgements.parquet` — from the scoring engine;
//! - `controls/` — controls and their envelopes (`pieval controls`).
//!
//! The folder holding runs also holds `catalog.sqlite` (the run catalogue).

pub mod checkpoint;
pub mod manifest;

use std::path::Path;

pub use checkpoint::{PredictionRecord, read_checkpoint};
pub use manifest::{Manifest, ModelSpeed, Rate, RunResults, RunStatus};

use crate::error::{Error, Result};

pub const MANIFEST_FILE: &str = "manifest.json";
pub const CASES_FILE: &str = "cases.jsonl";
pub const PREDICTIONS_FILE: &str = "predictions.jsonl";
pub const CASE_RESULTS_JSONL: &str = "case_results.jsonl";
pub const CASE_RESULTS_PARQUET: &str = "case_results.parquet";
pub const FINDINGS_FILE: &str = "findings.parquet";
pub const SUMMARY_FILE: &str = "summary.json";
pub const JUDGEMENTS_FILE: &str = "judgements.parquet";
pub const CONTROLS_DIR: &str = "controls";
/// In the folder that holds the runs.
pub const CATALOG_FILE: &str = "catalog.sqlite";

/// A run id usable as a folder name: no separators, no `..`, no hidden names.
pub fn check_run_id(id: &str) -> Result<()> {
    let ok = (1..=128).contains(&id.len())
        && id.as_bytes()[0].is_ascii_alphanumeric()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && !id.contains("..");
    if ok {
        Ok(())
    } else {
        Err(Error::Usage(format!(
            "run id {:?} is not allowed: use letters, digits, '.', '_' and '-' (starting with a letter or digit, no '..', at most 128 characters)",
            crate::text::excerpt(id, 60)
        )))
    }
}

/// `{name}-{UTC time}-{4 hex}`, with the name reduced to run-id characters.
pub fn new_run_id(name: &str) -> Result<String> {
    let mut clean: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .take(64)
        .collect();
    clean = clean
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .replace("..", "-");
    if clean.is_empty() {
        clean = "run".into();
    }
    let id = format!(
        "{clean}-{}-{:04x}",
        crate::text::utc_compact_now(),
        fastrand::u16(..)
    );
    check_run_id(&id)?;
    Ok(id)
}

/// A run folder's manifest, or `None` for a folder without one (made by `pieval score`),
/// and its run id: the manifest's, else the folder name.
pub fn manifest_and_id(dir: &Path) -> Result<(Option<Manifest>, String)> {
    let manifest = if dir.join(MANIFEST_FILE).is_file() {
        Some(Manifest::read(dir)?)
    } else {
        None
    };
    let id = match &manifest {
        Some(m) => m.run_id.clone(),
        None => dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
    };
    Ok((manifest, id))
}
