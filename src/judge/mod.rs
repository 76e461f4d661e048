//! The model judge: decides `judge` criteria where rules cannot.
//!
//! A [`Judge`] is built from a judge section (`evaluation.judge` of an experiment config,
//! or the file given to `--judge`): a provider (`openai`, any OpenAI-compatible endpoint,
//! through the runner's client with its retries, `Retry-After`, pacing and key handling;
//! `local`, a GGUF in process; `replay`, verdicts recorded earlier), a rubric
//! ([`rubric`]), and a verdict store ([`store`]) that serves every input judged before.
//!
//! In SQL the judge is `pi_judge(question, response [, goal [, task]])` ([`udf`]), an
//! async UDF: a batch's distinct inputs are looked up in the store, and the rest are sent
//! with bounded concurrency. Every judgement carries its verdict (true / false / null),
//! score, rationale, the judge model and an error; a timeout, a provider error or an
//! answer that cannot be read gives a null verdict and the error, never "not
//! successful".

pub mod answer;
pub mod config;
pub mod rubric;
pub mod store;
pub mod udf;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::StreamExt;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::provider::Message;
use crate::provider::Provider;
use crate::provider::config::ProviderKind;
pub use config::{JudgeInput, JudgeSection};
pub use rubric::{Inputs, Rubric};
use store::{Key, Origin, Record, Store};

/// The judge's file in a run folder: every judgement the scoring used.
pub const JUDGEMENTS_FILE: &str = crate::rundir::JUDGEMENTS_FILE;
/// Characters of the judge's raw answer kept with each judgement.
const ANSWER_CHARS: usize = 2000;

enum Verdicts {
    /// A model, built when the first input needs a call (a rescore answered from the
    /// cache needs neither the key nor the model); a build error is every call's error.
    Call(tokio::sync::OnceCell<std::result::Result<Box<dyn Provider>, String>>),
    /// Verdicts recorded earlier, from this file; an input without one is an error.
    Replay(PathBuf),
}

/// Bumped when what decides a verdict changes outside the config (the answer parser):
/// verdicts cached under another version are asked again.
const KEY_VERSION: &str = "pieval-judge/2";

#[derive(Default)]
struct Stats {
    calls: AtomicU64,
}

pub struct Judge {
    pub section: JudgeSection,
    pub rubric: Rubric,
    /// Which model answers: `openai:NAME@BASE_URL`, `local:NAME@sha256:GGUF`, or the
    /// recorded identity a replay answers as. Part of every cache key.
    pub identity: String,
    /// The run folder whose judgements were loaded first.
    run_dir: Option<PathBuf>,
    backend: Verdicts,
    store: Store,
    permits: Arc<tokio::sync::Semaphore>,
    /// Inputs being judged now: concurrent batches asking for the same input share one
    /// call.
    inflight: std::sync::Mutex<ahash::AHashMap<Key, Arc<tokio::sync::OnceCell<Arc<Record>>>>>,
    stats: Stats,
    /// Whether verdicts served from a received run's file may join the shared cache.
    merge_received: bool,
    /// Verdicts of a received run's file left unused (not confirmed).
    run_verdicts_unused: u64,
    pub calibration_sha256: Option<String>,
    /// Where lines about the model (pulled, loaded) go; the judge never prints.
    notes: Notes,
}

/// Whose run folder's verdicts a judge starts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunVerdicts {
    /// The user's own run (`pieval run`, `--resume`, `score` into its output folder):
    /// its verdicts are served when every input matches, and join the shared cache.
    Own,
    /// A run folder that may come from someone else (`replay --rescore`). `serve`: its
    /// verdicts may be served (still only when every input matches); `merge`: they may
    /// join the shared cache. Both follow `--trust-judgements`.
    Received { serve: bool, merge: bool },
}

/// A sink for progress lines (the CLI prints them to stderr).
pub type Notes = crate::provider::Notes;

/// The calibration file named by the judge config, with its digest.
#[derive(Clone, Debug, Serialize)]
pub struct CalibrationRef {
    pub path: PathBuf,
    pub sha256: String,
}

/// What a judge did, for `summary.json`, the manifest and the CLI.
#[derive(Clone, Debug, Serialize)]
pub struct JudgeReport {
    pub provider: &'static str,
    pub model: String,
    /// Which model answered: `openai:NAME@BASE_URL`, `local:NAME@sha256:GGUF`.
    pub identity: String,
    /// The rubric file, or `built-in` (data/judge/rubric.md).
    pub rubric: String,
    pub rubric_sha256: String,
    pub inputs: Vec<&'static str>,
    pub max_tokens: u32,
    /// Calls made to the judge model (after deduplication and the cache).
    pub calls: u64,
    /// Distinct inputs answered from the cache (the run's earlier verdicts, the shared
    /// cache, or a replay file).
    pub cache_hits: u64,
    /// Distinct inputs without a verdict (timeouts, provider errors, unreadable answers).
    pub errors: u64,
    /// Recorded verdicts not used because an input they were computed from (judge,
    /// rubric, question, response, prompt) differs from this judge's: asked again.
    #[serde(skip_serializing_if = "is_zero")]
    pub cache_rejected: u64,
    /// Verdicts in a received run's `judgements.parquet` not used because the user did
    /// not confirm them (`replay --rescore --judge FILE` without `--trust-judgements`).
    #[serde(skip_serializing_if = "is_zero")]
    pub run_verdicts_unused: u64,
    /// Distinct inputs judged, with or without a verdict.
    pub judgements: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calibration: Option<CalibrationRef>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Judge {
    /// Build the judge of a section. `run_dir`: the run folder whose earlier verdicts
    /// (its `judgements.parquet`) are served before any call. Nothing is called and no
    /// model is loaded until an input needs it ([`Judge::preflight`] checks the model
    /// up front).
    pub fn open(section: &JudgeSection, run_dir: Option<&Path>) -> Result<Judge> {
        Self::open_with(section, run_dir.map(|d| (d, RunVerdicts::Own)))
    }

    /// [`Judge::open`] for a run folder of the given provenance: a received run's
    /// verdicts are served only when `serve`, and join the shared cache only when `merge`.
    pub fn open_with(section: &JudgeSection, run: Option<(&Path, RunVerdicts)>) -> Result<Judge> {
        let run_dir = run.map(|(d, _)| d);
        let trust = run.map_or(RunVerdicts::Own, |(_, t)| t);
        section
            .check()
            .map_err(|(key, message)| Error::State(format!("judge {key}: {message}")))?;
        let rubric = Rubric::load(section.rubric.as_deref())?;
        let calibration_sha256 = section
            .calibration
            .as_deref()
            .map(crate::digest::sha256_file)
            .transpose()?;
        let mut files: Vec<(PathBuf, Origin)> = Vec::new();
        let mut run_verdicts_unused = 0;
        if let Some(dir) = run_dir
            // A regular file in the run folder, never through a link.
            && let Some(file) = crate::rundir::artifact(dir, JUDGEMENTS_FILE)?
        {
            match trust {
                RunVerdicts::Own => files.push((file, Origin::OwnRun)),
                RunVerdicts::Received { serve: true, .. } => {
                    files.push((file, Origin::ReceivedRun))
                }
                RunVerdicts::Received { serve: false, .. } => {
                    // Counted for the note only: a damaged file that is not used does
                    // not stop the rescore.
                    run_verdicts_unused = store::read(&file, crate::files::Links::Refuse)
                        .map_or(0, |v| v.iter().filter(|r| r.is_verdict()).count() as u64);
                }
            }
        }
        if let Some(shared) = &section.cache {
            files.push((shared.clone(), Origin::Shared));
        }
        let (backend, identity) = match section.provider {
            ProviderKind::Replay => {
                let spec = section.replay_from.clone().unwrap_or_default();
                let file = if spec.is_dir() {
                    // A scoring killed inside its commit there is completed first.
                    crate::atomic::finish_commit(&spec)?;
                    spec.join(JUDGEMENTS_FILE)
                } else {
                    spec
                };
                if !file.is_file() {
                    return Err(Error::NotFound(format!(
                        "judge replay_from {}: no judgements file there (a judgements.parquet, or a run folder holding one)",
                        file.display()
                    )));
                }
                let identity = replay_identity(&file, section)?;
                files.push((file.clone(), Origin::Replay));
                (Verdicts::Replay(file), identity)
            }
            ProviderKind::Anthropic => (
                Verdicts::Call(tokio::sync::OnceCell::new()),
                format!(
                    "anthropic:{}@{}",
                    section.name,
                    section
                        .base_url
                        .as_deref()
                        .unwrap_or(crate::provider::anthropic::DEFAULT_BASE_URL)
                        .trim_end_matches('/')
                ),
            ),
            ProviderKind::Openai => (
                Verdicts::Call(tokio::sync::OnceCell::new()),
                format!(
                    "openai:{}@{}",
                    section.name,
                    section
                        .base_url
                        .as_deref()
                        .unwrap_or_default()
                        .trim_end_matches('/')
                ),
            ),
            ProviderKind::Http
            | ProviderKind::Exec
            | ProviderKind::Websocket
            | ProviderKind::Builtin => {
                return Err(Error::State(
                    "a judge is a model: openai, local or replay (not an application)".into(),
                ));
            }
            ProviderKind::Local => {
                let sha = match &section.path {
                    Some(p) => crate::digest::sha256_file(p)?,
                    None => crate::model::spec(&section.name)?.sha256.to_owned(),
                };
                (
                    Verdicts::Call(tokio::sync::OnceCell::new()),
                    format!("local:{}@sha256:{sha}", section.name),
                )
            }
        };
        Ok(Judge {
            store: Store::load(&files)?,
            permits: Arc::new(tokio::sync::Semaphore::new(section.concurrency)),
            inflight: std::sync::Mutex::new(ahash::AHashMap::new()),
            section: section.clone(),
            rubric,
            identity,
            run_dir: run_dir.map(Path::to_path_buf),
            backend,
            stats: Stats::default(),
            merge_received: matches!(trust, RunVerdicts::Received { merge: true, .. }),
            run_verdicts_unused,
            calibration_sha256,
            notes: Arc::new(|_: &str| {}),
        })
    }

    /// Send lines about the judge's model (pull, load) to `notes`.
    pub fn with_notes(mut self, notes: Notes) -> Judge {
        self.notes = notes;
        self
    }

    /// Build the judge's model now (its key read, a local model pulled and loaded), so
    /// that a run fails before it spends anything when its judge cannot work.
    pub async fn preflight(&self) -> Result<()> {
        match self.provider().await {
            Some(Err(e)) => Err(Error::Model(format!("the judge cannot run: {e}"))),
            _ => Ok(()),
        }
    }

    /// The model, built on first use; `None` for a replay.
    async fn provider(&self) -> Option<&std::result::Result<Box<dyn Provider>, String>> {
        let Verdicts::Call(cell) = &self.backend else {
            return None;
        };
        Some(
            cell.get_or_init(|| async {
                let model = self.section.as_model();
                let build = || {
                    crate::provider::build(&model, 0, &mut |line| (self.notes)(line))
                        .map_err(|e| e.to_string())
                };
                // Loading a local model blocks: keep it off the async workers' backs.
                match tokio::runtime::Handle::current().runtime_flavor() {
                    tokio::runtime::RuntimeFlavor::CurrentThread => build(),
                    _ => tokio::task::block_in_place(build),
                }
            })
            .await,
        )
    }

    /// The model name recorded with every verdict.
    pub fn model(&self) -> &str {
        &self.section.name
    }

    /// The inputs as the judge sees them: those not listed in `inputs` are blanked.
    pub fn visible(&self, mut inputs: Inputs) -> Inputs {
        if !self.section.inputs.contains(&JudgeInput::Goal) {
            inputs.goal = None;
        }
        if !self.section.inputs.contains(&JudgeInput::Task) {
            inputs.task = None;
        }
        inputs
    }

    /// The cache key: sha256 of the judge's identity (which model, where), its answer
    /// budget, the rationale kept, the rubric and every input the judge sees
    /// (length-prefixed, so no two inputs collide), under [`KEY_VERSION`].
    pub fn key(&self, visible: &Inputs) -> Key {
        let mut h = Sha256::new();
        h.update(KEY_VERSION.as_bytes());
        h.update(b"\0");
        let mut part = |p: Option<&str>| match p {
            Some(p) => {
                h.update((p.len() as u64).to_le_bytes());
                h.update(p.as_bytes());
            }
            None => h.update(u64::MAX.to_le_bytes()),
        };
        part(Some(&self.identity));
        part(Some(&self.section.max_tokens.to_string()));
        part(Some(&self.section.rationale_chars.to_string()));
        part(Some(&self.rubric.sha256));
        part(Some(&visible.question));
        part(Some(&visible.response));
        part(visible.goal.as_deref());
        part(visible.task.as_deref());
        h.finalize().into()
    }

    /// Whether a recorded judgement was computed from exactly what this judge would see
    /// now: the same judge (identity and name), rubric, question, response and prompt
    /// (the key alone is computable by anyone, so a forged row could carry it), and a
    /// well-formed score. A record that fails is not served: the input is judged again.
    fn recorded_matches(&self, r: &Record, v: &Inputs) -> bool {
        r.judge_identity == self.identity
            && r.judge_model == self.section.name
            && r.rubric_sha256 == self.rubric.sha256
            && r.question == v.question
            && r.response_sha256 == crate::digest::sha256_hex(v.response.as_bytes())
            && r.score.is_none_or(|s| (0.0..=1.0).contains(&s))
            && self
                .rubric
                .render(v)
                .is_ok_and(|p| crate::digest::sha256_hex(p.as_bytes()) == r.prompt_sha256)
    }

    /// Judge many inputs: each distinct one once, from the store when it was judged
    /// before, else by the judge model with at most `concurrency` calls in flight
    /// (shared by every batch of every query using this judge). One record per input, in
    /// order, and whether it came from the store.
    pub async fn judge_all(&self, inputs: Vec<Inputs>) -> Vec<(Arc<Record>, bool)> {
        let visible: Vec<Inputs> = inputs.into_iter().map(|i| self.visible(i)).collect();
        let keys: Vec<Key> = visible.iter().map(|v| self.key(v)).collect();
        let mut found: ahash::AHashMap<Key, (Arc<Record>, bool)> = ahash::AHashMap::new();
        let mut misses: Vec<(Key, usize)> = Vec::new();
        let mut pending: ahash::AHashSet<Key> = ahash::AHashSet::new();
        for (i, k) in keys.iter().enumerate() {
            if found.contains_key(k) || !pending.insert(*k) {
                continue;
            }
            match self.store.get(k, |r| self.recorded_matches(r, &visible[i])) {
                Some(hit) => {
                    pending.remove(k);
                    found.insert(*k, hit);
                }
                None => misses.push((*k, i)),
            }
        }
        let made: Vec<Arc<Record>> = futures::stream::iter(misses)
            .map(|(k, i)| self.judge_once(k, &visible[i]))
            .buffer_unordered(self.section.concurrency.max(1))
            .collect()
            .await;
        for r in made {
            found.insert(r.key, (r, false));
        }
        keys.iter()
            .map(|k| {
                let (r, cached) = &found[k];
                (Arc::clone(r), *cached)
            })
            .collect()
    }

    /// Judge one input, once per process: a concurrent request for the same input waits
    /// for this one's judgement.
    async fn judge_once(&self, key: Key, v: &Inputs) -> Arc<Record> {
        let cell = {
            let mut inflight = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
            Arc::clone(inflight.entry(key).or_default())
        };
        let r = cell
            .get_or_init(|| async {
                // Another batch may have judged it since this one looked.
                match self.store.get(&key, |r| self.recorded_matches(r, v)) {
                    Some((r, _)) => r,
                    None => self.store.record(self.judge_one(key, v).await),
                }
            })
            .await
            .clone();
        self.inflight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key);
        r
    }

    async fn judge_one(&self, key: Key, v: &Inputs) -> Arc<Record> {
        let started = std::time::Instant::now();
        let mut rec = Record {
            key,
            judge_model: self.section.name.clone(),
            judge_identity: self.identity.clone(),
            rubric_sha256: self.rubric.sha256.clone(),
            prompt_sha256: String::new(),
            question: v.question.clone(),
            response_sha256: crate::digest::sha256_hex(v.response.as_bytes()),
            verdict: None,
            score: None,
            rationale: None,
            error: None,
            answer: None,
            latency_ms: None,
            judged_at: crate::text::utc_rfc3339(crate::text::unix_now()),
            calibration_sha256: self.calibration_sha256.clone(),
        };
        let prompt = match self.rubric.render(v) {
            Ok(p) => p,
            Err(e) => {
                rec.error = Some(e);
                return Arc::new(rec);
            }
        };
        rec.prompt_sha256 = crate::digest::sha256_hex(prompt.as_bytes());
        let answer = match &self.backend {
            Verdicts::Replay(file) => Err(format!(
                "no recorded verdict for this input in {} (key {}; a verdict is replayed only for the same inputs, rubric, max_tokens and rationale_chars)",
                file.display(),
                &hex::encode(key)[..16]
            )),
            Verdicts::Call(_) => match self.provider().await {
                Some(Ok(provider)) => {
                    let _permit = self.permits.acquire().await;
                    self.stats.calls.fetch_add(1, Ordering::Relaxed);
                    provider
                        .complete("judge", &[Message::user(prompt)])
                        .await
                        .map(|c| c.text)
                        .map_err(|e| format!("judge call failed: {}", e.message))
                }
                Some(Err(e)) => Err(format!("the judge cannot run: {e}")),
                None => Err("the judge has no model".into()),
            },
        };
        rec.latency_ms = Some(started.elapsed().as_secs_f64() * 1e3);
        match answer {
            Err(e) => rec.error = Some(e),
            Ok(text) => {
                rec.answer = Some(bounded(&text, ANSWER_CHARS));
                match answer::parse(&text) {
                    Ok(p) => {
                        rec.verdict = Some(p.verdict);
                        rec.score = Some(p.score);
                        rec.rationale = p
                            .rationale
                            .map(|r| bounded(&r, self.section.rationale_chars));
                    }
                    Err(e) => rec.error = Some(e),
                }
            }
        }
        Arc::new(rec)
    }

    /// What the judge did so far.
    pub fn report(&self) -> JudgeReport {
        let used = self.store.used();
        JudgeReport {
            provider: self.section.provider.as_str(),
            model: self.section.name.clone(),
            identity: self.identity.clone(),
            rubric: self
                .rubric
                .path
                .as_ref()
                .map_or_else(|| "built-in".to_owned(), |p| p.display().to_string()),
            rubric_sha256: self.rubric.sha256.clone(),
            inputs: self.section.inputs.iter().map(|i| i.as_str()).collect(),
            max_tokens: self.section.max_tokens,
            calls: self.stats.calls.load(Ordering::Relaxed),
            cache_hits: used.iter().filter(|(_, from_files)| *from_files).count() as u64,
            errors: used.iter().filter(|(r, _)| r.error.is_some()).count() as u64,
            cache_rejected: self.store.rejected(),
            run_verdicts_unused: self.run_verdicts_unused,
            judgements: used.len() as u64,
            cache: self.section.cache.clone(),
            calibration: self
                .section
                .calibration
                .clone()
                .zip(self.calibration_sha256.clone())
                .map(|(path, sha256)| CalibrationRef { path, sha256 }),
        }
    }

    /// Keep what was judged: the run's `judgements.parquet` (every judgement used, when
    /// a run folder is given and anything was judged) and the new verdicts in the shared
    /// cache. Returns the path written in the run folder.
    pub fn persist(&self, run_dir: Option<&Path>) -> Result<Option<PathBuf>> {
        self.persist_shared()?;
        match run_dir {
            Some(dir) => self.write_run_file(dir),
            None => Ok(None),
        }
    }

    /// Add the new verdicts to the shared cache, if one is configured (also when the
    /// scoring that paid for them failed).
    pub fn persist_shared(&self) -> Result<()> {
        // The cache receives the verdicts this judge made now; a received run's only when
        // the user vouched for it. Never what was read from another file: a folder's
        // judgements or a replay file could carry rows forged for this judge.
        let used: Vec<Arc<Record>> = self
            .store
            .used_with_origin()
            .into_iter()
            .filter(|(_, origin)| match origin {
                None => true,
                Some(Origin::ReceivedRun) => self.merge_received,
                Some(Origin::OwnRun | Origin::Shared | Origin::Replay) => false,
            })
            .map(|(r, _)| r)
            .collect();
        if let Some(shared) = &self.section.cache
            && !used.is_empty()
        {
            store::merge_into(shared, &used)?;
        }
        Ok(())
    }

    /// Write every judgement used into `dir/judgements.parquet`; `None` when nothing was
    /// judged (the file is then left as it was). A rescore that used exactly the folder's
    /// own judgements leaves the file as it is: it would be written the same.
    pub fn write_run_file(&self, dir: &Path) -> Result<Option<PathBuf>> {
        match self.run_file(dir)? {
            RunFile::Kept(path) => Ok(Some(path)),
            RunFile::New(path, file) => {
                file.commit()?;
                Ok(Some(path))
            }
            RunFile::None => Ok(None),
        }
    }

    /// The run folder's `judgements.parquet` for the judgements used: the file already
    /// there when it holds exactly those, else a new one written under a temporary name
    /// (committed with the run's results: [`crate::atomic::FolderCommit`]).
    pub fn run_file(&self, dir: &Path) -> Result<RunFile> {
        let path = dir.join(JUDGEMENTS_FILE);
        let own = self.run_dir.as_deref() == Some(dir);
        if own && self.store.used_is_run_file() && path.is_file() {
            return Ok(RunFile::Kept(path));
        }
        let used: Vec<Arc<Record>> = self.store.used().into_iter().map(|(r, _)| r).collect();
        if used.is_empty() {
            return Ok(RunFile::None);
        }
        let file = store::write_uncommitted(&path, &used)?;
        Ok(RunFile::New(path, file))
    }
}

/// A run folder's judgements file ([`Judge::run_file`]).
pub enum RunFile {
    /// The file there already holds the judgements used.
    Kept(PathBuf),
    /// Written under a temporary name, to be committed at `.0`.
    New(PathBuf, crate::atomic::TempFile),
    /// Nothing was judged.
    None,
}

/// The identity a replay answers as: the one recorded for the judge `name` in the file.
fn replay_identity(file: &Path, section: &JudgeSection) -> Result<String> {
    let records = store::read(file, crate::files::Links::Follow)?;
    let mut found: Vec<&str> = records
        .iter()
        .filter(|r| r.judge_model == section.name)
        .map(|r| r.judge_identity.as_str())
        .collect();
    found.sort_unstable();
    found.dedup();
    match found.as_slice() {
        [one] => Ok((*one).to_owned()),
        [] => {
            let mut names: Vec<&str> = records.iter().map(|r| r.judge_model.as_str()).collect();
            names.sort_unstable();
            names.dedup();
            Err(Error::NotFound(format!(
                "judge replay_from {}: no verdict of a judge named {:?} (it holds: {})",
                file.display(),
                crate::text::excerpt(&section.name, 60),
                names
                    .iter()
                    .map(|n| crate::text::excerpt(n, 60))
                    .collect::<Vec<_>>()
                    .join(", ")
            )))
        }
        many => Err(Error::State(format!(
            "judge replay_from {}: the judge {:?} answered as {} different models ({}); replay from a file of one",
            file.display(),
            crate::text::excerpt(&section.name, 60),
            many.len(),
            many.iter()
                .map(|n| crate::text::excerpt(n, 80))
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// At most `max` characters, with an ellipsis when cut.
fn bounded(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}
