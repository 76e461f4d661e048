//! The experiment runner: select → mitigate → call → checkpoint → score → artifacts.
//!
//! A run lives in `<output_dir>/<run_id>/`:
//! - `manifest.json` — written (atomically) when the run starts with `status: running`,
//!   rewritten at the end with `completed` (or `interrupted`, `failed`);
//! - `cases.jsonl` — the selected cases, enriched, exactly as scored;
//! - `predictions.jsonl` — the checkpoint: one line per finished case, appended and
//!   written with one `write` call as each case finishes, so a killed run loses no
//!   finished case; `--resume` repairs a torn last line, skips the cases it holds and
//!   runs the rest;
//! - `case_results.{jsonl,parquet}`, `findings.parquet`, `summary.json` — from the scoring
//!   engine (the runner never scores by itself).
//!
//! Every run is recorded in `<output_dir>/catalog.sqlite` (see [`catalog`]).

pub mod catalog;
pub mod diff;

use std::collections::{BTreeMap, HashSet};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::contract::case::AttackCase;
use crate::detect::criteria::{Compiled, Response};
use crate::detect::leak::Prepared;
use crate::detect::refusal::RefusalDetector;
use crate::engine::score::{ScoreOptions, ScoreReport, check_run_id, score};
use crate::error::{Error, Result};
use crate::experiment::config::{Config, ExecutionMode, LoadedConfig, ProviderKind};
use crate::experiment::selection::{Selected, select};
use crate::mitigation::{Plan, plan, probe_passes};
use crate::provider::replay::{ReplayProvider, resolve_source};
use crate::provider::{CallError, Provider};

/// The build's git commit (empty when built outside a checkout).
pub const GIT_COMMIT: &str = env!("PIEVAL_GIT_COMMIT");

#[derive(Clone, Debug)]
pub struct RunOptions {
    pub config: PathBuf,
    pub sample_size: Option<usize>,
    pub output_dir: Option<PathBuf>,
    pub resume: Option<String>,
    pub dry_run: bool,
    /// Show a progress bar (on a terminal only).
    pub progress: bool,
    /// Taxonomy used to enrich cases that are not enriched yet.
    pub taxonomy: PathBuf,
}

/// One line of `predictions.jsonl`: the contract's prediction fields plus run details.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct PredictionRecord {
    pub case_id: String,
    pub response_text: Option<String>,
    pub run_id: String,
    pub provider: String,
    pub model_name: String,
    pub latency_ms: Option<f64>,
    pub error: Option<String>,
    pub request_prompt: Option<String>,
    pub request_context: Option<String>,
    pub request_task_input: Option<String>,
    pub execution_mode: String,
    pub mitigation: String,
    pub blocked_by: Option<String>,
    #[serde(default)]
    pub attempts: u32,
    #[serde(default)]
    pub prompt_tokens: Option<u64>,
    #[serde(default)]
    pub completion_tokens: Option<u64>,
    /// `known_answer`: the detection call's answer.
    #[serde(default)]
    pub probe_response: Option<String>,
    /// Local models: seconds on the prompt and on generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_secs: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation_secs: Option<f64>,
    #[serde(default)]
    pub completed_at: String,
}

/// What a run did.
#[derive(Debug, Serialize)]
pub struct RunOutcome {
    pub run_id: String,
    pub dir: PathBuf,
    pub status: String,
    pub selected: usize,
    /// Cases finished by this invocation (not counting those resumed from the checkpoint).
    pub executed: usize,
    pub resumed: usize,
    pub errors: u64,
    pub blocked: u64,
    /// Tokens and tokens/s of the model calls made now; cases/minute of the call phase.
    pub speed: Speed,
    pub score: Option<ScoreReport>,
}

/// Counters shown while running.
#[derive(Default)]
struct Tally {
    done: u64,
    errors: u64,
    blocked: u64,
    successes: u64,
    speed: Speed,
}

/// Model speed over the cases run now (local models report their own timings).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Speed {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub prompt_secs: f64,
    pub generation_secs: f64,
    pub prompt_tokens_per_s: Option<f64>,
    pub generation_tokens_per_s: Option<f64>,
    pub cases_per_minute: Option<f64>,
    /// The decoder behind a local model (outputs are deterministic per backend).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// Model instances answering side by side; the tokens/s above are per instance.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instances: Option<usize>,
}

/// Run (or resume) an experiment.
pub fn run(opts: &RunOptions) -> Result<RunOutcome> {
    let loaded = Config::load(&opts.config)?;
    run_loaded(loaded, opts)
}

/// Run a config already loaded (from a file, or from a manifest by `pieval replay`).
pub fn run_loaded(mut loaded: LoadedConfig, opts: &RunOptions) -> Result<RunOutcome> {
    apply_overrides(&mut loaded.config, opts);
    let cfg = &loaded.config;
    if cfg.model.provider == ProviderKind::Local
        && cfg.model.execution_mode != ExecutionMode::DryRun
        && crate::provider::local::LocalProvider::pool_size(cfg.model.concurrency) > 1
    {
        // First thing, before any thread starts.
        crate::provider::single_threaded_models();
    }
    let output_dir = cfg.experiment.output_dir.clone();
    let mut corpus = load_cases_with(&cfg.dataset.path, true)?;
    let (run_id, dir, selected, resumed_ids) = match &opts.resume {
        None => {
            let selected = select(
                &corpus.cases,
                &cfg.selection,
                cfg.experiment.seed,
                cfg.experiment.sample_size,
            )?;
            let run_id = new_run_id(&cfg.experiment.name)?;
            let dir = output_dir.join(&run_id);
            std::fs::create_dir_all(&output_dir)
                .map_err(|e| Error::io(&output_dir, "cannot create folder", e))?;
            std::fs::create_dir(&dir)
                .map_err(|e| Error::io(&dir, "cannot create run folder", e))?;
            (run_id, dir, selected, HashSet::new())
        }
        Some(id) => {
            check_run_id(id)?;
            let dir = output_dir.join(id);
            let manifest = read_manifest(&dir)?;
            check_resumable(&manifest, &loaded, &corpus.sha256, &dir)?;
            let ids = recorded_case_ids(&manifest);
            let selected = selection_from_ids(&corpus.cases, &ids, &dir)?;
            let done = read_checkpoint(&dir.join("predictions.jsonl"))?;
            (id.clone(), dir, selected, done)
        }
    };
    // The selected cases are moved out of the corpus, which is dropped: a run holds one
    // (light) copy of what it runs.
    let taxonomy = needs_enrichment(&corpus.cases)
        .then(|| crate::taxonomy::Taxonomy::load(&opts.taxonomy))
        .transpose()?;
    let cases: Vec<AttackCase> = {
        let mut slots: Vec<Option<AttackCase>> = std::mem::take(&mut corpus.cases)
            .into_iter()
            .map(Some)
            .collect();
        selected
            .indexes
            .iter()
            .filter_map(|&i| slots[i].take())
            .map(|c| match &taxonomy {
                Some(t) => t.enrich(&c),
                None => c,
            })
            .collect()
    };
    let cases_path = dir.join("cases.jsonl");
    if opts.resume.is_none() || !cases_path.exists() {
        write_selected_cases(&cfg.dataset.path, &selected, taxonomy.as_ref(), &cases_path)?;
    }
    let started_at = crate::text::utc_rfc3339(crate::text::unix_now());
    let mut manifest = build_manifest(&run_id, &loaded, &corpus, &selected, &cases, &started_at);
    if opts.resume.is_some() {
        // Keep the original start; record the resumption.
        let old = read_manifest(&dir)?;
        if let Some(t) = old.get("timestamp") {
            manifest["timestamp"] = t.clone();
        }
        let mut resumes = old
            .get("resumed_at")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        resumes.push(json!(started_at));
        manifest["resumed_at"] = json!(resumes);
    }
    write_manifest(&dir, &manifest)?;
    let catalog = catalog::Catalog::open(&output_dir)?;
    catalog.record(&catalog::RunRow::from_manifest(&manifest, &dir))?;

    let pending: Vec<&AttackCase> = cases
        .iter()
        .filter(|c| !resumed_ids.contains(&c.case_id))
        .collect();

    let execution = execute_all(cfg, &run_id, &pending, &dir, opts.progress);
    let (tally, interrupted) = match execution {
        Ok(v) => v,
        Err(e) => {
            manifest["status"] = json!("failed");
            manifest["error"] = json!(e.to_string());
            write_manifest(&dir, &manifest)?;
            catalog.record(&catalog::RunRow::from_manifest(&manifest, &dir))?;
            return Err(e);
        }
    };
    let mut outcome = RunOutcome {
        run_id: run_id.clone(),
        dir: dir.clone(),
        status: String::new(),
        selected: cases.len(),
        executed: tally.done as usize,
        resumed: resumed_ids.len(),
        errors: tally.errors,
        blocked: tally.blocked,
        speed: tally.speed.clone(),
        score: None,
    };
    if interrupted {
        manifest["status"] = json!("interrupted");
        manifest["finished_at"] = json!(crate::text::utc_rfc3339(crate::text::unix_now()));
        write_manifest(&dir, &manifest)?;
        catalog.record(&catalog::RunRow::from_manifest(&manifest, &dir))?;
        outcome.status = "interrupted".into();
        return Ok(outcome);
    }
    let report = score_run(&dir, &run_id, cfg)?;
    finish_manifest(&mut manifest, &report);
    manifest["results"]["model_speed"] = json!(outcome.speed);
    write_manifest(&dir, &manifest)?;
    catalog.record(&catalog::RunRow::from_manifest(&manifest, &dir))?;
    outcome.status = "completed".into();
    outcome.errors = report.predictions.provider_errors;
    outcome.score = Some(report);
    Ok(outcome)
}

fn apply_overrides(cfg: &mut Config, opts: &RunOptions) {
    if let Some(n) = opts.sample_size {
        cfg.experiment.sample_size = Some(n);
    }
    if let Some(d) = &opts.output_dir {
        cfg.experiment.output_dir = d.clone();
    }
    if opts.dry_run {
        cfg.model.execution_mode = ExecutionMode::DryRun;
    }
}

/// Score a run folder's predictions against its cases (also `replay --rescore`).
pub fn score_run(dir: &Path, run_id: &str, cfg: &Config) -> Result<ScoreReport> {
    let mut opts = ScoreOptions::new(
        dir.join("predictions.jsonl"),
        dir.join("cases.jsonl"),
        dir.to_path_buf(),
        run_id.to_owned(),
    );
    opts.mitigation = Some(cfg.mitigation.name.as_str().to_owned());
    opts.leakage_threshold = cfg.evaluation.leakage_threshold;
    opts.experiment_name = Some(cfg.experiment.name.clone());
    opts.judge = cfg
        .evaluation
        .judge
        .as_ref()
        .map(|j| crate::judge::Judge::open(j, Some(dir)).map(Arc::new))
        .transpose()?;
    score(&opts)
}

/// Headline results into the manifest.
pub fn finish_manifest(manifest: &mut Value, report: &ScoreReport) {
    manifest["status"] = json!("completed");
    manifest["finished_at"] = json!(crate::text::utc_rfc3339(crate::text::unix_now()));
    let m = &report.aggregate_metrics;
    manifest["results"] = json!({
        "rows": report.rows,
        "attack_success": report.attack_success,
        "manual_review": report.manual_review,
        "provider_errors": report.predictions.provider_errors,
        "attack_success_rate": m.get("attack_success_rate"),
        "leakage_rate": m.get("leakage_rate"),
        "over_refusal_rate": m.get("over_refusal_rate"),
        "predictions_sha256": report.predictions.sha256,
    });
    if let Some(j) = &report.judge {
        manifest["results"]["judge"] = json!(j);
    }
}

pub struct Corpus {
    pub path: PathBuf,
    pub sha256: String,
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

fn load_cases_with(path: &Path, light: bool) -> Result<Corpus> {
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
        cases,
    })
}

/// Second pass over the corpus, batch by batch with every column: the selected cases,
/// enriched when the corpus is not, in corpus order.
fn write_selected_cases(
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

fn needs_enrichment(cases: &[AttackCase]) -> bool {
    cases
        .iter()
        .any(|c| c.attack_category.is_none() || c.success_definition_id.is_none())
}

/// `{name}-{UTC time}-{4 hex}`, with the name reduced to run-id characters.
fn new_run_id(name: &str) -> Result<String> {
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

/// A run folder's manifest, or `Value::Null` for a folder without one (made by
/// `pieval score`), and its run id: the manifest's, else the folder name.
pub fn manifest_and_id(dir: &Path) -> Result<(Value, String)> {
    let manifest = if dir.join("manifest.json").is_file() {
        read_manifest(dir)?
    } else {
        Value::Null
    };
    let id = manifest["run_id"]
        .as_str()
        .map(str::to_owned)
        .or_else(|| dir.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default();
    Ok((manifest, id))
}

pub fn read_manifest(dir: &Path) -> Result<Value> {
    let path = dir.join("manifest.json");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| Error::io(&path, "cannot read run manifest", e))?;
    serde_json::from_str(&text).map_err(|e| {
        Error::input(
            &path,
            e.line() as u64,
            None,
            format!("not a valid manifest: {e}"),
        )
    })
}

/// The selected case ids a manifest records.
pub fn recorded_case_ids(manifest: &Value) -> Vec<String> {
    manifest
        .pointer("/dataset_snapshot/selected_case_ids")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

pub fn write_manifest(dir: &Path, manifest: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(manifest)
        .map_err(|e| Error::Usage(format!("cannot encode the manifest: {e}")))?;
    crate::atomic::write_lines(&dir.join("manifest.json"), std::iter::once(text))
}

fn check_resumable(
    manifest: &Value,
    loaded: &LoadedConfig,
    corpus_sha: &str,
    dir: &Path,
) -> Result<()> {
    let status = manifest.get("status").and_then(Value::as_str).unwrap_or("");
    if status == "completed" {
        return Err(Error::Usage(format!(
            "run {} is already completed: nothing to resume (use pieval replay to run it again)",
            dir.display()
        )));
    }
    let want = manifest
        .pointer("/replay_hints/config_sha256")
        .and_then(Value::as_str)
        .unwrap_or("");
    if want != loaded.sha256 {
        return Err(Error::Usage(format!(
            "{} is not the config run {} started with (sha256 {} ≠ {}): resume with the same config",
            loaded.path.display(),
            dir.display(),
            short(&loaded.sha256),
            short(want)
        )));
    }
    let corpus = manifest
        .pointer("/dataset_snapshot/sha256")
        .and_then(Value::as_str)
        .unwrap_or("");
    if corpus != corpus_sha {
        return Err(Error::Usage(format!(
            "the corpus changed since run {} started (sha256 {} ≠ {}): it cannot be resumed",
            dir.display(),
            short(corpus_sha),
            short(corpus)
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
                return Err(Error::Usage(format!(
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

/// The case ids already in a checkpoint. A torn last line (a kill mid-write) is cut off
/// so appending continues on a line boundary.
pub fn read_checkpoint(path: &Path) -> Result<HashSet<String>> {
    let mut done = HashSet::new();
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(done),
        Err(e) => return Err(Error::io(path, "cannot read checkpoint", e)),
    };
    let mut good_end = 0usize;
    let mut start = 0usize;
    let mut line_no = 0u64;
    while start < bytes.len() {
        let Some(nl) = bytes[start..].iter().position(|b| *b == b'\n') else {
            break; // torn tail: no newline
        };
        line_no += 1;
        let line = &bytes[start..start + nl];
        match serde_json::from_slice::<PredictionRecord>(line) {
            Ok(r) => {
                done.insert(r.case_id);
                good_end = start + nl + 1;
            }
            Err(e) if start + nl + 1 == bytes.len() => {
                let _ = e; // a torn final line that happens to end in a newline
                break;
            }
            Err(e) => {
                return Err(Error::input(
                    path,
                    line_no,
                    None,
                    format!("corrupt checkpoint line: {e}"),
                ));
            }
        }
        start += nl + 1;
    }
    if good_end < bytes.len() {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(|e| Error::io(path, "cannot repair checkpoint", e))?;
        f.set_len(good_end as u64)
            .map_err(|e| Error::io(path, "cannot repair checkpoint", e))?;
    }
    Ok(done)
}

fn build_manifest(
    run_id: &str,
    loaded: &LoadedConfig,
    corpus: &Corpus,
    selected: &Selected,
    cases: &[AttackCase],
    started_at: &str,
) -> Value {
    let cfg = &loaded.config;
    let mut taxonomy: BTreeMap<&str, BTreeMap<String, u64>> = BTreeMap::new();
    for c in cases {
        for (field, value) in [
            ("attack_family", Some(c.attack_family.as_str())),
            ("attack_surface", Some(c.attack_surface.as_str())),
            ("attack_category", c.attack_category.as_deref()),
            ("severity", c.severity.as_deref()),
            ("label", Some(c.label.as_deref().unwrap_or("attack"))),
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
    json!({
        "run_id": run_id,
        "timestamp": started_at,
        "git_commit": (!GIT_COMMIT.is_empty()).then_some(GIT_COMMIT),
        "config_source_path": loaded.path.display().to_string(),
        "config_snapshot": cfg.snapshot(),
        "dataset_snapshot": {
            "path": corpus.path.display().to_string(),
            "sha256": corpus.sha256,
            "selected_case_ids": selected.selected_case_ids,
            "total_available_cases": selected.total_available_cases,
            "total_filtered_cases": selected.total_filtered_cases,
            "selection_snapshot": {
                "algorithm": "filter, then rank by sha256(\"{seed}:{case_id}\"), stratified largest-remainder sample (src/experiment/selection.rs)",
                "seed": cfg.experiment.seed,
                "sample_size": cfg.experiment.sample_size,
                "include": cfg.selection.include,
                "exclude": cfg.selection.exclude,
                "case_ids": cfg.selection.case_ids,
                "stratify_by": cfg.selection.stratify_by,
                "strata": selected.strata,
            },
            "taxonomy_summary": taxonomy,
            "git_commit": corpus_git_commit(&corpus.path),
        },
        "model_snapshot": {
            "provider": m.provider.as_str(),
            "name": m.name,
            "base_url": m.base_url,
            "api_key_env": m.api_key_env,
            "max_tokens": m.max_tokens,
            "temperature": m.temperature,
            "top_p": m.top_p,
            "seed": cfg.experiment.seed,
            "execution_mode": m.execution_mode.as_str(),
            "path": m.path,
            "replay_from": m.replay_from,
        },
        "mitigation_snapshot": {
            "name": cfg.mitigation.name.as_str(),
            "params": cfg.mitigation.params,
        },
        "replay_hints": {
            "command": format!("pieval replay {run_id}"),
            "config_sha256": loaded.sha256,
            "corpus_sha256": corpus.sha256,
            "seed": cfg.experiment.seed,
            "selected": selected.selected_case_ids.len(),
            "pieval_version": env!("CARGO_PKG_VERSION"),
        },
        "status": "running",
        "started_at": started_at,
        "pieval_version": env!("CARGO_PKG_VERSION"),
    })
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

enum Backend {
    Call(Box<dyn Provider>),
    Replay(ReplayProvider),
    DryRun,
}

fn backend(cfg: &Config) -> Result<Backend> {
    if cfg.model.execution_mode == ExecutionMode::DryRun {
        return Ok(Backend::DryRun);
    }
    match cfg.model.provider {
        ProviderKind::Replay => {
            let spec = cfg.model.replay_from.as_deref().unwrap_or_default();
            let source = resolve_source(spec, &cfg.experiment.output_dir)?;
            Ok(Backend::Replay(ReplayProvider::open(&source)?))
        }
        ProviderKind::Openai | ProviderKind::Local => {
            Ok(Backend::Call(crate::provider::build(
                &cfg.model,
                cfg.experiment.seed,
                &mut |line| eprintln!("{line}"),
            )?))
        }
    }
}

/// Run every pending case; returns the tally and whether the run was interrupted.
fn execute_all(
    cfg: &Config,
    run_id: &str,
    pending: &[&AttackCase],
    dir: &Path,
    progress: bool,
) -> Result<(Tally, bool)> {
    let backend = Arc::new(backend(cfg)?);
    let path = dir.join("predictions.jsonl");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| Error::io(&path, "cannot open checkpoint", e))?;
    let bar = (progress && std::io::stderr().is_terminal()).then(|| {
        let pb = indicatif::ProgressBar::new(pending.len() as u64);
        pb.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} {per_sec} ETA {eta} {msg}",
            )
            .expect("a valid template"),
        );
        pb
    });
    let refusals = RefusalDetector::default_pack();
    // For the live success count: criteria compiled once per distinct criteria.
    let by_id: std::collections::HashMap<&str, &AttackCase> =
        pending.iter().map(|c| (c.case_id.as_str(), *c)).collect();
    let mut compiled: std::collections::HashMap<
        crate::contract::criteria::SuccessCriteria,
        Option<Compiled>,
    > = std::collections::HashMap::new();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Usage(format!("cannot start the async runtime: {e}")))?;
    if let Some(j) = &cfg.evaluation.judge
        && cfg.model.execution_mode != ExecutionMode::DryRun
    {
        // A judge that cannot work (no key, no model) fails the run before the model is
        // paid for.
        let judge = crate::judge::Judge::open(j, Some(dir))?;
        rt.block_on(judge.preflight())?;
    }
    let concurrency = cfg.model.concurrency.max(1);
    let call_start = std::time::Instant::now();
    rt.block_on(async {
        let mut tally = Tally::default();
        if let Backend::Call(provider) = backend.as_ref() {
            tally.speed.backend = provider.backend();
            tally.speed.instances = tally.speed.backend.as_ref().map(|_| provider.instances());
        }
        let mut stream = futures::stream::iter(pending.iter().map(|case| {
            let backend = Arc::clone(&backend);
            let p = plan(
                case,
                cfg.mitigation.name,
                &cfg.mitigation.params,
                cfg.experiment.seed,
            );
            execute_one(case, p, backend, cfg, run_id)
        }))
        .buffer_unordered(concurrency);
        let mut ctrl_c = std::pin::pin!(tokio::signal::ctrl_c());
        let mut prepared = Prepared::default();
        loop {
            let next = tokio::select! {
                r = stream.next() => r,
                _ = &mut ctrl_c => {
                    if let Some(b) = &bar { b.abandon_with_message("interrupted"); }
                    return Ok((tally, true));
                }
            };
            let Some(record) = next else { break };
            let mut line = serde_json::to_string(&record)
                .map_err(|e| Error::Usage(format!("cannot encode a prediction: {e}")))?;
            line.push('\n');
            file.write_all(line.as_bytes())
                .map_err(|e| Error::io(&path, "cannot append to checkpoint", e))?;
            tally.done += 1;
            tally.errors += u64::from(record.error.is_some());
            let sp = &mut tally.speed;
            sp.prompt_tokens += record.prompt_tokens.unwrap_or(0);
            sp.completion_tokens += record.completion_tokens.unwrap_or(0);
            sp.prompt_secs += record.prompt_secs.unwrap_or(0.0);
            sp.generation_secs += record.generation_secs.unwrap_or(0.0);
            tally.blocked += u64::from(record.blocked_by.is_some());
            if let (Some(_), Some(text), Some(case)) = (
                &bar,
                record
                    .response_text
                    .as_deref()
                    .filter(|_| record.blocked_by.is_none()),
                by_id.get(record.case_id.as_str()),
            ) {
                let matcher = compiled
                    .entry(case.success_criteria.clone())
                    .or_insert_with(|| Compiled::compile(&case.success_criteria).ok());
                if let Some(m) = matcher {
                    prepared.load(text);
                    if m.eval(&Response::new(text, &prepared, refusals)).0 == Some(true) {
                        tally.successes += 1;
                    }
                }
            }
            if let Some(b) = &bar {
                b.inc(1);
                b.set_message(format!(
                    "successes {} errors {} blocked {}",
                    tally.successes, tally.errors, tally.blocked
                ));
            }
        }
        file.sync_data()
            .map_err(|e| Error::io(&path, "cannot flush checkpoint", e))?;
        if let Some(b) = &bar {
            b.finish_and_clear();
        }
        let sp = &mut tally.speed;
        let rate = |n: u64, secs: f64| (secs > 0.0).then(|| n as f64 / secs);
        sp.prompt_tokens_per_s = rate(sp.prompt_tokens, sp.prompt_secs);
        sp.generation_tokens_per_s = rate(sp.completion_tokens, sp.generation_secs);
        sp.cases_per_minute = rate(tally.done * 60, call_start.elapsed().as_secs_f64());
        Ok((tally, false))
    })
}

async fn execute_one(
    case: &AttackCase,
    plan: Plan,
    backend: Arc<Backend>,
    cfg: &Config,
    run_id: &str,
) -> PredictionRecord {
    let mut rec = PredictionRecord {
        case_id: case.case_id.clone(),
        run_id: run_id.to_owned(),
        provider: cfg.model.provider.as_str().to_owned(),
        model_name: cfg.model.name.clone(),
        request_prompt: Some(plan.request_prompt.clone()),
        request_context: plan.request_context.clone(),
        request_task_input: plan.request_task_input.clone(),
        execution_mode: cfg.model.execution_mode.as_str().to_owned(),
        mitigation: cfg.mitigation.name.as_str().to_owned(),
        blocked_by: plan.blocked_by.clone(),
        ..PredictionRecord::default()
    };
    let fail = |rec: &mut PredictionRecord, e: CallError, what: &str| {
        rec.error = Some(format!("{what}{}", e.message));
        rec.latency_ms = Some(e.latency_ms);
        rec.attempts += e.attempts;
    };
    match backend.as_ref() {
        _ if plan.blocked_by.is_some() => {}
        Backend::DryRun => {}
        Backend::Replay(r) => match r.recorded(&case.case_id) {
            Some(recorded) => {
                rec.response_text = recorded.response_text.clone();
                rec.error = recorded.error.clone();
                rec.blocked_by = recorded.blocked_by.clone();
                rec.latency_ms = recorded.latency_ms;
                rec.attempts = 1;
            }
            None => match r.complete(&case.case_id, &plan.messages).await {
                Ok(_) => {}
                Err(e) => fail(&mut rec, e, ""),
            },
        },
        Backend::Call(p) => {
            let mut go = true;
            if let Some((probe, key)) = &plan.probe {
                match p.complete(&case.case_id, probe).await {
                    Ok(answer) => {
                        rec.attempts += answer.attempts;
                        if !probe_passes(&answer.text, key) {
                            rec.blocked_by = Some("known_answer".into());
                            go = false;
                        }
                        rec.probe_response = Some(answer.text);
                    }
                    Err(e) => {
                        fail(&mut rec, e, "known_answer probe: ");
                        go = false;
                    }
                }
            }
            if go {
                match p.complete(&case.case_id, &plan.messages).await {
                    Ok(c) => {
                        rec.response_text = Some(c.text);
                        rec.latency_ms = Some(c.latency_ms);
                        rec.attempts += c.attempts;
                        rec.prompt_tokens = c.prompt_tokens;
                        rec.completion_tokens = c.completion_tokens;
                        rec.prompt_secs = c.prompt_secs;
                        rec.generation_secs = c.generation_secs;
                    }
                    Err(e) => fail(&mut rec, e, ""),
                }
            }
        }
    }
    rec.completed_at = crate::text::utc_rfc3339(crate::text::unix_now());
    rec
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(id: &str) -> String {
        let r = PredictionRecord {
            case_id: id.into(),
            ..PredictionRecord::default()
        };
        format!("{}\n", serde_json::to_string(&r).unwrap())
    }

    #[test]
    fn a_torn_tail_is_cut_and_a_corrupt_line_is_located() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("predictions.jsonl");
        std::fs::write(&p, format!("{}{}{{\"case_id\":\"to", line("a"), line("b"))).unwrap();
        let done = read_checkpoint(&p).unwrap();
        assert_eq!(done.len(), 2);
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            format!("{}{}", line("a"), line("b"))
        );
        std::fs::write(&p, format!("{}not json\n{}", line("a"), line("b"))).unwrap();
        let e = read_checkpoint(&p).unwrap_err().to_string();
        assert!(
            e.contains("predictions.jsonl:2") && e.contains("corrupt checkpoint"),
            "{e}"
        );
        assert!(
            read_checkpoint(&dir.path().join("none.jsonl"))
                .unwrap()
                .is_empty()
        );
    }
}
