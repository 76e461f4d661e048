//! The experiment runner: select → mitigate → call → checkpoint → score → artifacts.
//! The run folder it writes is described (and owned) by [`crate::rundir`]; the runner
//! never prints: it reports progress through [`RunOptions::progress`].
//!
//! - [`setup`]: the corpus, the selection, the manifest;
//! - [`execute`]: the model calls and the checkpoint;
//! - [`catalog`]: `catalog.sqlite`, every run of a results folder;
//! - [`diff`]: two runs compared.

pub mod diff;
mod execute;
pub mod guard;
pub mod replay;
pub mod run_index;
pub mod setup;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

use crate::contract::case::AttackCase;
use crate::error::{Error, Result};
use crate::experiment::config::{Config, LoadedConfig};
use crate::experiment::selection::select;
use crate::ops::score::{ScoreOptions, ScoreReport, score};
use crate::provider::config::{ExecutionMode, ProviderKind};
use crate::rundir::{
    Manifest, ModelSpeed, RunResults, RunStatus, check_run_id, new_run_id, read_checkpoint,
};

pub use setup::{Corpus, load_cases, selection_from_ids};

/// What a run reports as it goes. The CLI shows it; the runner itself never prints.
#[derive(Debug)]
pub enum RunEvent<'a> {
    /// A line about setup (a model being pulled or loaded).
    Note(&'a str),
    /// The model calls start; this many cases are pending.
    Calling { pending: u64 },
    /// A case finished (live counts; successes are a preview, the scoring decides).
    CaseDone {
        successes: u64,
        errors: u64,
        blocked: u64,
    },
    /// Ctrl-C: the calls stopped.
    Interrupted,
    /// Every pending case finished.
    CallsDone,
}

/// The callback that receives [`RunEvent`]s.
pub type Progress = Arc<dyn Fn(RunEvent<'_>) + Send + Sync>;

/// Setup notes (a judge's model being pulled) forwarded to a run's progress callback.
pub(crate) fn notes(progress: Option<&Progress>) -> crate::judge::Notes {
    match progress {
        Some(p) => {
            let p = Arc::clone(p);
            Arc::new(move |line: &str| p(RunEvent::Note(line)))
        }
        None => Arc::new(|_: &str| {}),
    }
}

#[derive(Clone)]
pub struct RunOptions {
    pub config: PathBuf,
    pub sample_size: Option<usize>,
    pub output_dir: Option<PathBuf>,
    pub resume: Option<String>,
    pub dry_run: bool,
    /// Where progress goes (`None`: nowhere, and no live success count is kept).
    pub progress: Option<Progress>,
    /// Taxonomy used to enrich cases that are not enriched yet.
    pub taxonomy: PathBuf,
}

/// How an invocation of `run`, `replay` or a rescore ended: the run's status, or a
/// rescore of a finished run (its status stays as it was).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    Run(RunStatus),
    Rescored,
}

impl Ended {
    pub fn as_str(self) -> &'static str {
        match self {
            Ended::Run(s) => s.as_str(),
            Ended::Rescored => "rescored",
        }
    }
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Ended {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// What a run did.
#[derive(Debug, Serialize)]
pub struct RunOutcome {
    pub run_id: String,
    pub dir: PathBuf,
    pub status: Ended,
    pub selected: usize,
    /// Cases finished by this invocation (not counting those resumed from the checkpoint).
    pub executed: usize,
    pub resumed: usize,
    pub errors: u64,
    pub blocked: u64,
    /// Tokens and tokens/s of the model calls made now; cases/minute of the call phase.
    pub speed: ModelSpeed,
    pub score: Option<ScoreReport>,
    /// A guardrail run's calls and figures (src/guard).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guardrail: Option<guard::GuardDone>,
    /// The run's HTML report, when the caller wrote one (`pieval run` does).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub report: Option<PathBuf>,
}

/// Run (or resume) an experiment.
pub fn run(opts: &RunOptions) -> Result<RunOutcome> {
    let loaded = Config::load(&opts.config)?;
    run_loaded(loaded, opts)
}

/// A run folder made by this invocation, removed on drop unless disarmed (set to None).
struct NewFolder(Option<PathBuf>);

impl Drop for NewFolder {
    fn drop(&mut self) {
        if let Some(dir) = &self.0 {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
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
    let mut corpus = setup::load_cases_with(&cfg.dataset.path, true)?;
    // A new run folder is removed again if setup fails before its manifest is written
    // (no empty folders); `_lock` is held until the run returns.
    let mut new_folder = NewFolder(None);
    let (run_id, dir, selected, resumed_ids, _lock) = match &opts.resume {
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
            new_folder.0 = Some(dir.clone());
            let lock = crate::rundir::RunLock::take(&dir)?;
            (run_id, dir, selected, HashSet::new(), lock)
        }
        Some(id) => {
            check_run_id(id)?;
            let dir = output_dir.join(id);
            let manifest = Manifest::read(&dir)?;
            // Taken before the checkpoint is read: a second resume is refused.
            let lock = crate::rundir::RunLock::take(&dir)?;
            setup::check_resumable(&manifest, &loaded, &corpus, &dir)?;
            let ids = &manifest.dataset_snapshot.selected_case_ids;
            let selected = selection_from_ids(&corpus.cases, ids, &dir)?;
            let done = read_checkpoint(&dir.join(crate::rundir::PREDICTIONS_FILE))?;
            (id.clone(), dir, selected, done, lock)
        }
    };
    // The selected cases are moved out of the corpus, which is dropped: a run holds one
    // (light) copy of what it runs.
    let taxonomy = setup::needs_enrichment(&corpus.cases)
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
    let cases_path = dir.join(crate::rundir::CASES_FILE);
    if opts.resume.is_none() || !cases_path.exists() {
        setup::write_selected_cases(&cfg.dataset.path, &selected, taxonomy.as_ref(), &cases_path)?;
    }
    let started_at = crate::text::utc_rfc3339(crate::text::unix_now());
    let mut manifest =
        setup::build_manifest(&run_id, &loaded, &corpus, &selected, &cases, &started_at);
    if cfg.guardrail.is_some() {
        manifest
            .extra
            .insert("run_kind".into(), serde_json::json!("guardrail"));
    }
    if opts.resume.is_some() {
        // Keep the original start; record the resumption.
        let old = Manifest::read(&dir)?;
        manifest.timestamp = old.timestamp;
        let mut resumes = old.resumed_at.unwrap_or_default();
        resumes.push(started_at.clone());
        manifest.resumed_at = Some(resumes);
    }
    manifest.write(&dir)?;
    new_folder.0 = None;
    let catalog = run_index::Catalog::open(&output_dir)?;
    catalog.record(&run_index::RunRow::from_manifest(&manifest, &dir))?;

    if let Some(section) = &cfg.guardrail {
        return guardrail_run(
            cfg, section, &run_id, &dir, &cases, manifest, &catalog, opts,
        );
    }
    let pending = match execute::pending_attempts(cfg, &cases, &resumed_ids) {
        Ok(p) => p,
        Err(e) => {
            let mut manifest = manifest;
            manifest.status = Some(RunStatus::Failed);
            manifest.error = Some(e.to_string());
            manifest.write(&dir)?;
            return Err(e);
        }
    };

    // A run stopped by an error is recorded `failed` with it (resumable), never left
    // `running`.
    let fail = |manifest: &mut Manifest, e: Error| -> Result<RunOutcome> {
        manifest.status = Some(RunStatus::Failed);
        manifest.error = Some(e.to_string());
        manifest.write(&dir)?;
        catalog.record(&run_index::RunRow::from_manifest(manifest, &dir))?;
        Err(e)
    };
    let execution = execute::execute_all(cfg, &run_id, &pending, &dir, opts.progress.as_ref());
    let (tally, interrupted) = match execution {
        Ok(v) => v,
        Err(e) => return fail(&mut manifest, e),
    };
    let mut outcome = RunOutcome {
        run_id: run_id.clone(),
        dir: dir.clone(),
        status: Ended::Run(RunStatus::Running),
        selected: cases.len(),
        executed: tally.done as usize,
        resumed: resumed_ids.len(),
        errors: tally.errors,
        blocked: tally.blocked,
        speed: tally.speed.clone(),
        score: None,
        guardrail: None,
        report: None,
    };
    if interrupted {
        manifest.status = Some(RunStatus::Interrupted);
        manifest.finished_at = Some(crate::text::utc_rfc3339(crate::text::unix_now()));
        manifest.write(&dir)?;
        catalog.record(&run_index::RunRow::from_manifest(&manifest, &dir))?;
        outcome.status = Ended::Run(RunStatus::Interrupted);
        return Ok(outcome);
    }
    let report = match score_run(
        &dir,
        &run_id,
        cfg,
        opts.progress.as_ref(),
        None,
        crate::judge::RunVerdicts::Own,
        Vec::new(),
        false,
        None,
    ) {
        Ok(r) => r,
        // The predictions stay: `pieval replay --rescore` scores them once the cause
        // is fixed.
        Err(e) => return fail(&mut manifest, e),
    };
    finish_manifest(&mut manifest, &report);
    if let Some(results) = &mut manifest.results {
        results.model_speed = Some(outcome.speed.clone());
    }
    manifest.write(&dir)?;
    catalog.record(&run_index::RunRow::from_manifest(&manifest, &dir))?;
    outcome.status = Ended::Run(RunStatus::Completed);
    outcome.errors = report.predictions.provider_errors;
    outcome.score = Some(report);
    Ok(outcome)
}

/// A guardrail run's calls, results and summary ([`crate::guard`]), in the run folder
/// set up as for any run; the manifest ends as any run's does.
#[allow(clippy::too_many_arguments)]
fn guardrail_run(
    cfg: &Config,
    section: &crate::guard::GuardSection,
    run_id: &str,
    dir: &Path,
    cases: &[AttackCase],
    mut manifest: Manifest,
    catalog: &run_index::Catalog,
    opts: &RunOptions,
) -> Result<RunOutcome> {
    let done = match guard::execute(cfg, section, run_id, cases, dir, opts.progress.as_ref()) {
        Ok(d) => d,
        Err(e) => {
            manifest.status = Some(RunStatus::Failed);
            manifest.error = Some(e.to_string());
            manifest.write(dir)?;
            catalog.record(&run_index::RunRow::from_manifest(&manifest, dir))?;
            return Err(e);
        }
    };
    let status = if done.interrupted {
        RunStatus::Interrupted
    } else {
        RunStatus::Completed
    };
    manifest.status = Some(status);
    manifest.finished_at = Some(crate::text::utc_rfc3339(crate::text::unix_now()));
    if let Some(m) = &done.aggregate_metrics {
        let rate = |name: &str| m.rate(name).cloned();
        manifest.results = Some(crate::rundir::manifest::RunResults {
            rows: done.items as u64,
            attack_success: rate("attack_success_rate").map_or(0, |r| r.k),
            manual_review: done.errors,
            provider_errors: done.errors,
            attack_success_rate: rate("attack_success_rate"),
            leakage_rate: None,
            over_refusal_rate: rate("over_refusal_rate"),
            predictions_sha256: crate::digest::sha256_file(&dir.join(guard::PREDICTIONS_FILE))
                .unwrap_or_default(),
            judge: None,
            model_speed: None,
            scoring: None,
            extra: [(
                "guardrail".to_owned(),
                done.summary.clone().unwrap_or_default(),
            )]
            .into_iter()
            .collect(),
        });
    }
    manifest.write(dir)?;
    catalog.record(&run_index::RunRow::from_manifest(&manifest, dir))?;
    Ok(RunOutcome {
        run_id: run_id.to_owned(),
        dir: dir.to_path_buf(),
        status: Ended::Run(status),
        selected: cases.len(),
        executed: done.executed,
        resumed: done.resumed,
        errors: done.errors,
        blocked: done.flagged,
        speed: ModelSpeed::default(),
        score: None,
        guardrail: Some(done),
        report: None,
    })
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

/// Score a run folder's predictions against its cases (also `replay --rescore`), then
/// write the attempt tables (`turns.parquet`, `tool_calls.parquet`) from the checkpoint,
/// unless the caller wrote them as the predictions were (`tables_written`: the importer).
/// `case_lives`: each case's last row, when the caller wrote the cases in the order of
/// their first rows ([`crate::ops::score::ScoreOptions::case_lives`]).
#[allow(clippy::too_many_arguments)]
pub fn score_run(
    dir: &Path,
    run_id: &str,
    cfg: &Config,
    progress: Option<&Progress>,
    cluster: Option<(&str, Option<&Path>)>,
    verdicts: crate::judge::RunVerdicts,
    reviews: Vec<crate::rundir::reviews::Review>,
    tables_written: bool,
    case_lives: Option<Arc<crate::engine::case_window::CaseLives>>,
) -> Result<ScoreReport> {
    // The run folder's inputs: regular files, never through a link (a received folder's
    // `predictions.jsonl -> /dev/zero` is an error here, not a read that never ends).
    for name in [crate::rundir::PREDICTIONS_FILE, crate::rundir::CASES_FILE] {
        crate::rundir::artifact(dir, name)?;
    }
    let mut opts = ScoreOptions::new(
        dir.join(crate::rundir::PREDICTIONS_FILE),
        dir.join(crate::rundir::CASES_FILE),
        dir.to_path_buf(),
        run_id.to_owned(),
    );
    opts.mitigation = Some(cfg.mitigation.name.as_str().to_owned());
    opts.leakage_threshold = cfg.evaluation.leakage_threshold;
    opts.experiment_name = Some(cfg.experiment.name.clone());
    opts.reviews = reviews;
    opts.case_lives = case_lives;
    if let Some((url, staging)) = cluster {
        opts.cluster = Some(crate::cluster::scoring(url)?);
        opts.staging = staging.map(Path::to_path_buf);
    }
    opts.judge = cfg
        .evaluation
        .judge
        .as_ref()
        .map(|j| {
            crate::judge::Judge::open_with(j, Some((dir, verdicts)))
                .map(|judge| Arc::new(judge.with_notes(notes(progress))))
        })
        .transpose()?;
    let report = score(&opts)?;
    if !tables_written {
        crate::rundir::checkpoint::write_attempt_tables(dir)?;
    }
    Ok(report)
}

/// Headline results into the manifest.
pub fn finish_manifest(manifest: &mut Manifest, report: &ScoreReport) {
    manifest.status = Some(RunStatus::Completed);
    manifest.finished_at = Some(crate::text::utc_rfc3339(crate::text::unix_now()));
    let m = &report.aggregate_metrics;
    let rate = |name: &str| m.rate(name).cloned();
    manifest.results = Some(RunResults {
        rows: report.rows,
        attack_success: report.attack_success,
        manual_review: report.manual_review,
        provider_errors: report.predictions.provider_errors,
        attack_success_rate: rate("attack_success_rate"),
        leakage_rate: rate("leakage_rate"),
        over_refusal_rate: rate("over_refusal_rate"),
        predictions_sha256: report.predictions.sha256.clone(),
        judge: report
            .judge
            .as_ref()
            .and_then(|j| serde_json::to_value(j).ok()),
        model_speed: None,
        scoring: serde_json::to_value(&report.scoring).ok(),
        extra: Default::default(),
    });
}

/// Remove what the run in `dir` left planted (`pieval cleanup`), with `cfg`'s target:
/// the attempts its journal held open before, and after.
pub fn cleanup(cfg: &Config, dir: &Path, progress: Option<&Progress>) -> Result<(usize, usize)> {
    let journal = dir.join(crate::provider::http::plant::JOURNAL_FILE);
    let before = crate::provider::http::plant::open_plants(&journal)?.len();
    if before == 0 {
        return Ok((0, 0));
    }
    if cfg.model.provider != ProviderKind::Http {
        return Err(Error::State(format!(
            "{}: the run planted through an application target, and this config's provider is {}: give the config the run was made with",
            dir.display(),
            cfg.model.provider.as_str()
        )));
    }
    // not while a run or a resume holds the folder: its attempts in flight are open in
    // the journal
    let _lock = crate::rundir::RunLock::take(dir)?;
    let target = crate::provider::build(&cfg.model, cfg.experiment.seed, &mut |_| {})?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Internal(format!("cannot start the async runtime: {e}")))?;
    rt.block_on(async {
        let r = target.open_run(dir, notes(progress)).await;
        target.close_run().await;
        r
    })?;
    let after = crate::provider::http::plant::open_plants(&journal)?.len();
    Ok((before, after))
}
