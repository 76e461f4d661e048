//! Before any model call: the corpus loaded and checked, the cases selected (or, on
//! `--resume`, the recorded selection rebuilt), the manifest built.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use crate::contract::case::AttackCase;
use crate::error::{Error, Result};
use crate::experiment::config::LoadedConfig;
use crate::experiment::selection::Selected;
use crate::rundir::manifest::{
    DatasetSnapshot, MitigationSnapshot, ModelSnapshot, ReplayHints, SelectionSnapshot,
};
use crate::rundir::{Manifest, RunStatus};

pub struct Corpus {
    pub path: PathBuf,
    pub sha256: String,
    /// The digest of the shared environment files its cases include (None: none).
    pub includes_sha256: Option<String>,
    pub cases: Vec<AttackCase>,
}

/// Load and validate a corpus (fails on any contract violation).
pub fn load_cases(path: &Path) -> Result<Corpus> {
    load_cases_with(path, false)
}

/// Columns a run needs in memory: all but the provenance, the audit trail and the notes,
/// which are most of a case's size and are copied to `cases.jsonl` by a second pass.
fn light_projection() -> Vec<usize> {
    let schema = crate::contract::arrow::enriched_case_schema();
    (0..schema.fields().len())
        .filter(|&i| {
            !matches!(
                schema.field(i).name().as_str(),
                "provenance" | "mapping_audit" | "notes"
            )
        })
        .collect()
}

pub(super) fn load_cases_with(path: &Path, light: bool) -> Result<Corpus> {
    use crate::corpus::reader::{CorpusReader, ReadOptions};
    // Batch by batch: only one Arrow batch is alive next to the cases.
    let opts = ReadOptions {
        projection: light.then(light_projection),
        ..ReadOptions::default()
    };
    let mut reader = CorpusReader::open(path, opts)?;
    let mut cases = Vec::new();
    for batch in reader.by_ref() {
        cases.extend(AttackCase::from_batch(&batch?)?);
    }
    let report = reader.finish()?.into_result()?;
    Ok(Corpus {
        path: path.to_path_buf(),
        sha256: report.sha256,
        includes_sha256: report.includes_sha256,
        cases,
    })
}

/// Second pass over the corpus, batch by batch with every column: the selected cases,
/// enriched when the corpus is not, in corpus order.
pub(super) fn write_selected_cases(
    source: &Path,
    selected: &Selected,
    taxonomy: Option<&crate::taxonomy::Taxonomy>,
    out: &Path,
) -> Result<()> {
    use crate::corpus::reader::{CorpusReader, ReadOptions};
    let ids: HashSet<&str> = selected
        .selected_case_ids
        .iter()
        .map(String::as_str)
        .collect();
    let mut reader = CorpusReader::open(source, ReadOptions::default())?;
    crate::atomic::write_with(out, |push| {
        for batch in reader.by_ref() {
            for case in AttackCase::from_batch(&batch?)? {
                if ids.contains(case.case_id.as_str()) {
                    let case = match taxonomy {
                        Some(t) => t.enrich(&case),
                        None => case,
                    };
                    push(&case.to_json_line())?;
                }
            }
        }
        Ok(())
    })
}

pub(super) fn needs_enrichment(cases: &[AttackCase]) -> bool {
    cases
        .iter()
        .any(|c| c.attack_category.is_none() || c.success_definition_id.is_none())
}

pub(super) fn check_resumable(
    manifest: &Manifest,
    loaded: &LoadedConfig,
    corpus: &Corpus,
    dir: &Path,
) -> Result<()> {
    let corpus_sha = corpus.sha256.as_str();
    if manifest.status == Some(RunStatus::Completed) {
        return Err(Error::State(format!(
            "run {} is already completed: nothing to resume (use pieval replay to run it again)",
            dir.display()
        )));
    }
    let want = manifest.replay_hints.config_sha256.as_str();
    if want != loaded.sha256 {
        return Err(Error::State(format!(
            "{} is not the config run {} started with (sha256 {} ≠ {}): resume with the same config",
            loaded.path.display(),
            dir.display(),
            short(&loaded.sha256),
            short(want)
        )));
    }
    let recorded = manifest.dataset_snapshot.sha256.as_str();
    if recorded != corpus_sha {
        return Err(Error::State(format!(
            "the corpus changed since run {} started (sha256 {} ≠ {}): it cannot be resumed",
            dir.display(),
            short(corpus_sha),
            short(recorded)
        )));
    }
    if manifest.dataset_snapshot.includes_sha256 != corpus.includes_sha256 {
        return Err(Error::State(format!(
            "the shared environment files the corpus includes changed since run {} started: \
             it cannot be resumed",
            dir.display()
        )));
    }
    Ok(())
}

fn short(sha: &str) -> &str {
    &sha[..sha.len().min(12)]
}

/// Rebuild a selection from recorded ids; every id must still be in the corpus.
pub fn selection_from_ids(cases: &[AttackCase], ids: &[String], dir: &Path) -> Result<Selected> {
    let index: std::collections::HashMap<&str, usize> = cases
        .iter()
        .enumerate()
        .map(|(i, c)| (c.case_id.as_str(), i))
        .collect();
    let mut indexes = Vec::with_capacity(ids.len());
    for id in ids {
        match index.get(id.as_str()) {
            Some(&i) => indexes.push(i),
            None => {
                return Err(Error::State(format!(
                    "run {}: selected case {:?} is no longer in the corpus",
                    dir.display(),
                    crate::text::excerpt(id, 60)
                )));
            }
        }
    }
    Ok(Selected {
        indexes,
        selected_case_ids: ids.to_vec(),
        total_available_cases: cases.len(),
        total_filtered_cases: ids.len(),
        strata: BTreeMap::new(),
    })
}

pub(super) fn build_manifest(
    run_id: &str,
    loaded: &LoadedConfig,
    corpus: &Corpus,
    selected: &Selected,
    cases: &[AttackCase],
    started_at: &str,
) -> Manifest {
    let cfg = &loaded.config;
    let mut taxonomy: BTreeMap<&str, BTreeMap<String, u64>> = BTreeMap::new();
    for c in cases {
        for (field, value) in [
            ("attack_family", Some(c.attack_family.as_str())),
            ("attack_surface", Some(c.attack_surface.as_str())),
            ("attack_category", c.attack_category.map(|v| v.as_str())),
            ("severity", c.severity.map(|v| v.as_str())),
            (
                "label",
                Some(c.label.map(|v| v.as_str()).unwrap_or("attack")),
            ),
            ("language", c.language.as_deref()),
        ] {
            *taxonomy
                .entry(field)
                .or_default()
                .entry(value.unwrap_or("unknown").to_owned())
                .or_default() += 1;
        }
    }
    let m = &cfg.model;
    let seed = cfg.experiment.seed;
    Manifest {
        run_id: run_id.to_owned(),
        timestamp: started_at.to_owned(),
        git_commit: (!crate::GIT_COMMIT.is_empty()).then(|| crate::GIT_COMMIT.to_owned()),
        config_source_path: Some(loaded.path.display().to_string()),
        config_snapshot: cfg.snapshot(),
        dataset_snapshot: DatasetSnapshot {
            path: corpus.path.display().to_string(),
            sha256: corpus.sha256.clone(),
            includes_sha256: corpus.includes_sha256.clone(),
            selected_case_ids: selected.selected_case_ids.clone(),
            total_available_cases: selected.total_available_cases as u64,
            total_filtered_cases: selected.total_filtered_cases as u64,
            selection_snapshot: SelectionSnapshot {
                algorithm: "filter, then rank by sha256(\"{seed}:{case_id}\"), stratified largest-remainder sample (src/experiment/selection.rs)".into(),
                seed,
                sample_size: cfg.experiment.sample_size.map(|n| n as u64),
                include: cfg.selection.include.clone(),
                exclude: cfg.selection.exclude.clone(),
                case_ids: cfg.selection.case_ids.clone(),
                stratify_by: cfg.selection.stratify_by.clone(),
                strata: serde_json::to_value(&selected.strata).unwrap_or_default(),
                extra: Default::default(),
            },
            taxonomy_summary: taxonomy
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
            git_commit: corpus_git_commit(&corpus.path),
            extra: Default::default(),
        },
        model_snapshot: ModelSnapshot {
            provider: m.provider.as_str().to_owned(),
            name: m.name.clone(),
            base_url: m.base_url.clone(),
            api_key_env: m.api_key_env.clone(),
            max_tokens: u64::from(m.max_tokens),
            temperature: m.temperature,
            top_p: m.top_p,
            seed,
            execution_mode: m.execution_mode.as_str().to_owned(),
            path: m.path.as_ref().map(|p| p.display().to_string()),
            replay_from: m.replay_from.clone(),
            extra: Default::default(),
        },
        mitigation_snapshot: MitigationSnapshot {
            name: cfg.mitigation.name.as_str().to_owned(),
            params: cfg.mitigation.params.clone(),
        },
        replay_hints: ReplayHints {
            command: format!("pieval replay {run_id}"),
            config_sha256: loaded.sha256.clone(),
            corpus_sha256: corpus.sha256.clone(),
            seed,
            selected: selected.selected_case_ids.len() as u64,
            pieval_version: env!("CARGO_PKG_VERSION").into(),
        },
        status: Some(RunStatus::Running),
        started_at: Some(started_at.to_owned()),
        pieval_version: Some(env!("CARGO_PKG_VERSION").into()),
        ..Manifest::default()
    }
}

/// The commit of the git checkout holding the corpus, if any (best effort).
fn corpus_git_commit(path: &Path) -> Option<String> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["rev-parse", "HEAD"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .filter(|s| s.len() == 40)
}
