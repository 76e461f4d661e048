//! `pieval score`: predictions ⋈ attack_cases through `queries/score_cases.sql`, streamed
//! into `case_results.parquet` and `case_results.jsonl` in one pass. Files are written
//! under temporary names and renamed only when the whole query succeeded, so a failure
//! leaves no half-written artifact. summary.json's figures come from partial aggregates
//! of the same stream ([`summary`]), not from reading the results back.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use futures::StreamExt;
use serde::Serialize;

use crate::atomic::ParquetFile;
use crate::corpus::ReadOptions;
use crate::corpus::predictions::PredictionStats;
use crate::engine::{corpus_table, predictions_table, runtime};
use crate::error::{Error, Result};

pub use crate::cluster::score::{ClusterConnect, ClusterScoring, SubmitPlan};
use crate::cluster::score::{assemble, parts, slices, upload};
use crate::rundir::summary::AggregateMetrics;
use crate::scoring::summary;
use crate::scoring::{FindingsWriter, ResultWriters, Tally, results_columns, tally};
pub use crate::scoring::{ReviewCount, ScoringEngine};

/// `queries/score_cases.sql`.
pub const SCORE_CASES_SQL: &str = crate::engine::queries::SCORE_CASES.sql;
pub struct ScoreOptions {
    pub predictions: PathBuf,
    pub cases: PathBuf,
    pub output: PathBuf,
    pub run_id: String,
    pub mitigation: Option<String>,
    /// Leakage score from which the system prompt counts as leaked.
    pub leakage_threshold: f64,
    /// `summary.json`'s experiment_name (a run's config name).
    pub experiment_name: Option<String>,
    /// The judge for `judge` criteria; without one they go to manual review.
    pub judge: Option<Arc<crate::judge::Judge>>,
    /// Score on a cluster instead of in this process: opens the cluster's session (the
    /// cluster module builds it for `--cluster df://HOST:PORT`).
    pub cluster: Option<ClusterConnect>,
    /// With `cluster`: the folder the validated inputs are staged in, which the
    /// scheduler and every executor must see (default: the output folder).
    pub staging: Option<PathBuf>,
    /// Reviewers' verdicts to apply (human > judge > rules; `src/review/mod.rs`): a
    /// rescore passes the run's `reviews.parquet` when the user trusts it.
    pub reviews: Vec<crate::rundir::reviews::Review>,
    /// With `cluster` and a staging prefix on object storage: the `s3://` folder the
    /// run's new commit puts its files in (`v/COMMIT_ID/`), where the executors put the
    /// large files together themselves ([`upload`]); the report's `uploaded` names them.
    pub publish_dir: Option<String>,
    /// Each case's last row in `predictions`, when the corpus lists the cases in the
    /// order of their first rows (an import writes both so): the join then reads the
    /// corpus as the predictions need it and keeps only the cases rows still to come ask
    /// for, instead of all of them (`src/engine/case_window.rs`). Scoring in this
    /// process only.
    pub case_lives: Option<Arc<crate::engine::case_window::CaseLives>>,
    /// The predictions as Arrow batches in memory instead of the file `predictions` (which
    /// then only names them in messages): the Python package's tables, read in place.
    /// Scoring in this process only.
    pub predictions_batches: Option<PredictionsBatches>,
    /// Where the results' batches go too, as they are written (the Python package returns
    /// them as a table; they share the scored columns' buffers).
    pub keep_results: Option<Arc<std::sync::Mutex<Vec<datafusion::arrow::array::RecordBatch>>>>,
}

/// [`ScoreOptions::predictions_batches`]: taken by the one scoring that reads them.
pub type PredictionsBatches = Arc<std::sync::Mutex<Option<crate::corpus::predictions::Batches>>>;

impl ScoreOptions {
    pub fn new(predictions: PathBuf, cases: PathBuf, output: PathBuf, run_id: String) -> Self {
        Self {
            predictions,
            cases,
            output,
            run_id,
            mitigation: None,
            leakage_threshold: 0.5,
            experiment_name: None,
            judge: None,
            cluster: None,
            staging: None,
            reviews: Vec::new(),
            publish_dir: None,
            case_lives: None,
            predictions_batches: None,
            keep_results: None,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct ScoreReport {
    pub run_id: String,
    pub output: PathBuf,
    pub rows: u64,
    pub attack_success: u64,
    /// Benign controls refused, deflected or blocked (over_refused).
    pub over_refused: u64,
    pub manual_review: u64,
    /// review_reason → count and first case ids.
    pub review: BTreeMap<String, ReviewCount>,
    pub predictions: PredictionStats,
    pub cases_sha256: String,
    pub result_paths: BTreeMap<String, PathBuf>,
    /// `summary.json`'s aggregate_metrics.
    pub aggregate_metrics: AggregateMetrics,
    /// What the judge did, when one was configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub judge: Option<crate::judge::JudgeReport>,
    /// Where the scoring query ran.
    pub scoring: ScoringEngine,
    /// Run files the executors put into [`ScoreOptions::publish_dir`] (not in the local
    /// folder): the commit that publishes the folder must name them.
    #[serde(skip)]
    pub uploaded: Vec<crate::objstore::FileEntry>,
}

/// The session scoring runs in. The join stays as written: `attack_cases` (small) is the
/// build side and predictions stream through; left to itself the optimizer swaps the
/// sides of the outer join and collects every prediction into memory. And nothing is
/// repartitioned: the corpus is collected once (CollectLeft) and each partition of the
/// predictions table (one per core, sharing one reader) probes it. A hash repartition of
/// the predictions queued batches without bound when one partition ran ahead of the
/// other: memory grew with the input (2.8 GB on 4 GB of distinct responses).
pub fn scoring_session() -> datafusion::prelude::SessionContext {
    crate::engine::session_with(scoring_config())
}

/// [`scoring_session`]'s configuration (a cluster session starts from it too).
pub fn scoring_config() -> datafusion::prelude::SessionConfig {
    crate::engine::session_config()
        .set_bool("datafusion.optimizer.join_reordering", false)
        .set_bool("datafusion.optimizer.repartition_joins", false)
}

/// `score_params` as a one-row VALUES view (not an in-memory table, which a cluster
/// could not ship to its executors).
fn score_params(ctx: &datafusion::prelude::SessionContext, opts: &ScoreOptions) -> Result<()> {
    use datafusion::logical_expr::{LogicalPlanBuilder, lit};
    use datafusion::prelude::col;
    use datafusion::scalar::ScalarValue;
    let row = vec![
        lit(ScalarValue::Utf8(Some(opts.run_id.clone()))),
        lit(ScalarValue::Utf8(opts.mitigation.clone())),
        lit(ScalarValue::Float64(Some(opts.leakage_threshold))),
        lit(ScalarValue::Boolean(Some(opts.judge.is_some()))),
    ];
    let names = ["run_id", "mitigation", "leakage_threshold", "judge_enabled"];
    let plan = LogicalPlanBuilder::values(vec![row])?
        .project(
            names
                .iter()
                .enumerate()
                .map(|(i, n)| col(format!("column{}", i + 1)).alias(*n)),
        )?
        .build()?;
    let df = datafusion::dataframe::DataFrame::new(ctx.state(), plan);
    ctx.register_table("score_params", df.into_view())?;
    Ok(())
}

/// Register `reviews` (the latest verdict per case, `rundir::reviews::latest`) on a scoring session,
/// as a VALUES view so a cluster can ship it; empty without reviews.
pub fn register_reviews(
    ctx: &datafusion::prelude::SessionContext,
    reviews: &[crate::rundir::reviews::Review],
) -> Result<()> {
    use datafusion::logical_expr::{LogicalPlanBuilder, lit};
    use datafusion::prelude::col;
    use datafusion::scalar::ScalarValue;
    let s = |v: Option<&str>| lit(ScalarValue::Utf8(v.map(str::to_owned)));
    let latest = crate::rundir::reviews::latest(reviews);
    let empty = latest.is_empty();
    let rows: Vec<Vec<datafusion::logical_expr::Expr>> = if empty {
        vec![vec![
            s(None),
            s(None),
            lit(ScalarValue::Boolean(None)),
            s(None),
            s(None),
        ]]
    } else {
        latest
            .iter()
            .map(|r| {
                vec![
                    s(Some(&r.case_id)),
                    s(r.attempt_id.as_deref()),
                    lit(ScalarValue::Boolean(Some(r.verdict))),
                    s(Some(&r.response_sha256)),
                    s(Some(&r.reviewer)),
                ]
            })
            .collect()
    };
    let names = [
        "case_id",
        "attempt_id",
        "verdict",
        "response_sha256",
        "reviewer",
    ];
    let mut plan = LogicalPlanBuilder::values(rows)?.project(
        names
            .iter()
            .enumerate()
            .map(|(i, n)| col(format!("column{}", i + 1)).alias(*n)),
    )?;
    if empty {
        plan = plan.filter(lit(false))?;
    }
    let df = datafusion::dataframe::DataFrame::new(ctx.state(), plan.build()?);
    ctx.register_table("reviews", df.into_view())?;
    Ok(())
}

/// A scoring session (where `score_cases.sql` is planned, and run when local), where it
/// runs, and on a cluster what it needs there.
struct Opened {
    ctx: datafusion::prelude::SessionContext,
    scoring: ScoringEngine,
    cluster: Option<OnCluster>,
}

/// Scoring on a cluster: how plans are submitted, and the staging folder (the inputs
/// and the parts, removed when this drops).
struct OnCluster {
    submit: SubmitPlan,
    /// The predictions' rows (by `source_line`), which the parts must cover once each.
    staged: parts::Coverage,
    /// What the executors' survey of the predictions counted (a local run's counts).
    stats: PredictionStats,
    staging: Staging,
}

/// The scoring session and where it runs: this process, with the corpus and the
/// predictions streamed; or a cluster, with both in a folder the executors see (kept
/// until the guard drops).
async fn open_session(
    opts: &ScoreOptions,
    corpus: &crate::engine::CorpusTable,
    predictions: Option<&crate::engine::PredictionsTable>,
) -> Result<Opened> {
    let Some(connect) = &opts.cluster else {
        let predictions =
            predictions.ok_or_else(|| Error::Internal("no predictions table".into()))?;
        let ctx = scoring_session();
        ctx.register_table("attack_cases", corpus.table.clone())?;
        ctx.register_table("predictions", predictions.table.clone())?;
        return Ok(Opened {
            ctx,
            scoring: ScoringEngine::local(),
            cluster: None,
        });
    };
    if opts.judge.is_some() {
        return Err(Error::Usage(
            "--judge with --cluster: the judge calls a model from this process; score on \
             the cluster without it, then rescore locally with the judge \
             (`pieval replay RUN --rescore`, or `pieval score --judge`)"
                .into(),
        ));
    }
    cluster_session(connect, opts, corpus).await
}

/// Connect first (an unreachable or mismatched cluster fails before any work), then put
/// the inputs where the executors see them: the corpus (small: the join's build side)
/// validated and staged as Parquet here; the predictions as they are — linked into the
/// staging folder, or copied there when it is on another file system — and validated,
/// counted and checked for duplicates by the executors ([`slices`]). The scoring plan is
/// made here, in a session of the cluster session's configuration (its partitions: the
/// cluster's task slots).
async fn cluster_session(
    connect: &ClusterConnect,
    opts: &ScoreOptions,
    corpus: &crate::engine::CorpusTable,
) -> Result<Opened> {
    let ClusterScoring {
        ctx: remote,
        engine: mut scoring,
        submit,
    } = connect(scoring_config()).await?;
    let started = std::time::Instant::now();
    let staging = match &opts.staging {
        Some(dir) => match crate::objstore::Location::of(dir)? {
            Some(loc) => Staging::create_remote(&loc)?,
            None => Staging::create(dir, false)?,
        },
        None => Staging::create(&opts.output, true)?,
    };
    let local = datafusion::prelude::SessionContext::new_with_config(
        crate::engine::session_config().with_target_partitions(1),
    );
    local.register_table("attack_cases", corpus.table.clone())?;
    let planner = crate::engine::session_with(remote.copied_config());
    let cases = staging.dir.join(STAGED_CASES);
    let df = local.table("attack_cases").await?;
    let schema = df.schema().as_arrow().clone();
    stage(df, &cases).await?;
    let cases = staging.publish(STAGED_CASES).await?;
    if let Some(r) = &staging.remote {
        // The planner lists the staged corpus; the executors open their own store for
        // the bucket from their own environment (src/cluster/process.rs).
        let url = url::Url::parse(&format!("s3://{}", r.prefix.bucket))
            .map_err(|e| Error::Internal(format!("{}: {e}", r.prefix)))?;
        planner.register_object_store(&url, r.store.object_store());
    }
    // The folder's path was checked (UTF-8, nothing DataFusion reads as a pattern).
    planner
        .register_parquet(
            "attack_cases",
            &cases,
            datafusion::prelude::ParquetReadOptions::default().schema(&schema),
        )
        .await?;
    let (path, stamp) = staging.place(&opts.predictions).await?;
    let n = planner.copied_config().target_partitions();
    // What goes wrong in the staged file is said of the user's.
    let shown = |e| crate::objstore::relocate(e, Path::new(&path), &opts.predictions);
    let spans = {
        let (path, stamp) = (PathBuf::from(&path), stamp.clone());
        tokio::task::spawn_blocking(move || slices::spans(&path, &stamp, n))
            .await
            .map_err(|e| Error::Internal(format!("cutting the predictions: {e}")))?
            .map_err(shown)?
    };
    let mut surveyed = slices::survey(&submit, &path, stamp.clone(), &opts.predictions, &spans)
        .await
        .map_err(shown)?;
    let runs_path =
        match slices::spill_runs(&mut surveyed.slices, &staging.dir, slices::RUNS_IN_PLAN)? {
            Some(_) => Some(staging.publish(slices::RUNS_FILE).await?),
            None => None,
        };
    planner.register_table(
        "predictions",
        Arc::new(slices::SlicedPredictions {
            path,
            stamp,
            slices: surveyed.slices,
            runs_path,
        }),
    )?;
    scoring.staging_ms = Some(started.elapsed().as_millis() as u64);
    Ok(Opened {
        ctx: planner,
        scoring,
        cluster: Some(OnCluster {
            submit,
            staged: surveyed.coverage,
            stats: surveyed.stats,
            staging,
        }),
    })
}

/// Rows per row group of a staged input: a scan is split between executors by row
/// groups, so a file of one group would run on one task.
const STAGED_ROW_GROUP_ROWS: usize = 8192;

/// Stream a table into a staged Parquet file.
async fn stage(df: datafusion::dataframe::DataFrame, out: &Path) -> Result<()> {
    let props = crate::atomic::writer_properties_with(STAGED_ROW_GROUP_ROWS)?;
    let mut file = ParquetFile::create_with(out, Arc::new(df.schema().as_arrow().clone()), props)?;
    let mut stream = df.execute_stream().await?;
    while let Some(batch) = stream.next().await {
        file.write(&batch?)?;
    }
    file.commit()?;
    Ok(())
}

/// The staged corpus's name in the staging folder.
const STAGED_CASES: &str = "attack_cases.parquet";

/// A fresh folder for a cluster's inputs and parts, removed with everything in it when
/// dropped. Its name is a temporary one of this process (`.pieval-staging.tmp-PID-RANDOM`):
/// one that a killed scoring left is removed by the next pieval that writes in that
/// folder (`crate::atomic::clean_stale`).
///
/// With `--staging s3://BUCKET/PREFIX` the folder is a prefix on object storage
/// (`PREFIX/.pieval-staging.tmp-PID-RANDOM/`), which the executors read and write
/// through their own store (credentials from their own environment), and `dir` is a
/// private local folder of this process where the staged files are made before they are
/// uploaded and the reported parts are fetched.
struct Staging {
    /// The staging folder (a mount every executor sees), or this process's private
    /// folder beside a remote one.
    dir: PathBuf,
    remote: Option<RemoteStaging>,
    /// The private folder of a remote staging (removed when it drops).
    _scratch: Option<crate::objstore::Scratch>,
}

struct RemoteStaging {
    prefix: crate::objstore::Location,
    store: crate::objstore::Store,
}

impl Staging {
    /// In `parent`, which is created when `create_parent` (the output folder) and must
    /// exist otherwise (`--staging`: a mount that is missing is not made a local folder
    /// the executors cannot see).
    fn create(parent: &Path, create_parent: bool) -> Result<Self> {
        if create_parent {
            std::fs::create_dir_all(parent)
                .map_err(|e| Error::io(parent, "cannot create folder", e))?;
        } else if !parent.is_dir() {
            return Err(Error::Usage(format!(
                "--staging {}: not a folder (give one the scheduler and every executor see)",
                parent.display()
            )));
        }
        let parent = PathBuf::from(crate::rundir::table_path(parent)?);
        let dir = parent.join(staging_name());
        std::fs::create_dir(&dir).map_err(|e| Error::io(&dir, "cannot create folder", e))?;
        Ok(Self {
            dir,
            remote: None,
            _scratch: None,
        })
    }

    /// A fresh prefix under `parent` on object storage (nothing is written there yet: a
    /// prefix exists by its objects).
    fn create_remote(parent: &crate::objstore::Location) -> Result<Self> {
        // The staged corpus is read through DataFusion's listing, which takes these as a
        // pattern or an escape (as `crate::rundir::table_path` refuses for a folder).
        if parent
            .to_string()
            .contains(['*', '?', '[', ']', '{', '}', '#', '%'])
        {
            return Err(Error::Usage(format!(
                "--staging {parent}: a prefix with one of * ? [ ] {{ }} # % cannot be read \
                 safely (DataFusion reads them as a pattern); choose another"
            )));
        }
        let store = crate::objstore::Store::open(parent)?;
        let scratch = crate::objstore::Scratch::create()?;
        Ok(Self {
            dir: scratch.dir.clone(),
            remote: Some(RemoteStaging {
                prefix: parent.child(&staging_name()),
                store,
            }),
            _scratch: Some(scratch),
        })
    }

    /// Where the executors find the staged file `name` (made in [`Staging::dir`]): its
    /// absolute path, or its `s3://` location once it is uploaded there.
    async fn publish(&self, name: &str) -> Result<String> {
        let local = self.dir.join(name);
        match &self.remote {
            None => crate::rundir::table_path(&local),
            Some(r) => {
                let at = r.prefix.child(name);
                r.store.upload(&local, &at.key).await?;
                Ok(at.to_string())
            }
        }
    }

    /// Where the executors write the parts.
    fn parts(&self) -> Result<String> {
        match &self.remote {
            None => {
                let dir = self.dir.join("parts");
                std::fs::create_dir(&dir)
                    .map_err(|e| Error::io(&dir, "cannot create folder", e))?;
                crate::rundir::table_path(&dir)
            }
            Some(r) => Ok(r.prefix.child("parts").to_string()),
        }
    }

    /// The reported parts in a local folder: the parts folder itself, or, on object
    /// storage, a folder of this process's where each reported part — and no other —
    /// is fetched (checked against its report when it is spliced).
    /// The parts of the kinds in `skip` (put together on object storage) are not fetched.
    async fn local_parts(&self, reports: &[parts::PartReport], skip: &[&str]) -> Result<PathBuf> {
        let dir = self.dir.join("parts");
        let Some(r) = &self.remote else {
            return Ok(dir);
        };
        std::fs::create_dir(&dir).map_err(|e| Error::io(&dir, "cannot create folder", e))?;
        let parts = r.prefix.child("parts");
        let wanted = reports
            .iter()
            .flat_map(|p| &p.files)
            .filter(|f| !skip.contains(&f.kind.as_str()));
        {
            let mut fetches = futures::stream::iter(wanted.map(|file| {
                let at = parts.child(&file.name);
                let to = dir.join(&file.name);
                async move { r.store.download_at_most(&at.key, &to, file.bytes).await }
            }))
            .buffer_unordered(4);
            while let Some(fetched) = fetches.next().await {
                fetched?;
            }
        }
        Ok(dir)
    }
}

/// The staged predictions' name: `predictions.jsonl` or `predictions.parquet`, by the
/// kind of the file at `path`.
fn staged_name(path: &Path) -> String {
    let kind = if crate::corpus::predictions::is_parquet(path) {
        "parquet"
    } else {
        "jsonl"
    };
    format!("predictions.{kind}")
}

fn staging_name() -> String {
    format!(
        ".pieval-staging.tmp-{}-{:016x}",
        std::process::id(),
        fastrand::u64(..)
    )
}

impl Staging {
    /// The predictions where the executors read them, and their stamp. In a local
    /// folder, under a name of its kind (`predictions.jsonl` or `.parquet`): a hard link
    /// to the file itself when the folder is on its file system (nothing copied; the
    /// file keeps its own owner and mode, which the executors must be able to read), a
    /// copy of the opened file otherwise (another file system, or a link the system
    /// refuses); the staged entry is checked to be the file opened here, whatever was
    /// swapped in at `path` meanwhile. On object storage: an `s3://` file where it is
    /// (read by range by the executors, never copied), a local one uploaded under that
    /// name.
    async fn place(&self, path: &Path) -> Result<(String, slices::Stamp)> {
        if let Some(loc) = crate::objstore::Location::of(path)? {
            let store = crate::objstore::Store::open(&loc)?;
            let (len, e_tag) = store
                .head(&loc.key)
                .await?
                .ok_or_else(|| Error::NotFound(format!("{loc}: no such object")))?;
            return Ok((loc.to_string(), slices::Stamp::of_object(len, e_tag)));
        }
        let Some(r) = &self.remote else {
            let to = self.place_here(path)?;
            let stamp = slices::Stamp::of(&to)?;
            return Ok((crate::rundir::table_path(&to)?, stamp));
        };
        // Uploaded from where it is (no local copy), and checked to be the file as it was
        // before and after: a file written to meanwhile is refused, not staged torn.
        let opened = crate::files::open_input(path, "cannot open predictions")?;
        let is_file = opened
            .metadata()
            .map_err(|e| Error::io(path, "cannot read predictions", e))?
            .is_file();
        if !is_file {
            return Err(Error::Usage(format!(
                "--predictions {}: not a file",
                path.display()
            )));
        }
        let before = slices::Stamp::of(path)?;
        let at = r.prefix.child(&staged_name(path));
        let sent = r.store.upload(path, &at.key).await?;
        let (len, e_tag) = r
            .store
            .head(&at.key)
            .await?
            .ok_or_else(|| Error::NotFound(format!("{at}: no such object")))?;
        if slices::Stamp::of(path)? != before || sent.bytes != before.len || len != before.len {
            return Err(Error::State(format!(
                "--predictions {}: the file changed while it was staged ({} bytes before, {} \
                 sent, {} in {at}): stage again once nothing writes to it",
                path.display(),
                before.len,
                sent.bytes,
                len
            )));
        }
        Ok((at.to_string(), slices::Stamp::of_object(len, e_tag)))
    }

    fn place_here(&self, path: &Path) -> Result<PathBuf> {
        use std::os::unix::fs::MetadataExt;
        let to = self.dir.join(staged_name(path));
        let mut opened = crate::files::open_input(path, "cannot open predictions")?;
        let meta = opened
            .metadata()
            .map_err(|e| Error::io(path, "cannot read predictions", e))?;
        if !meta.is_file() {
            return Err(Error::Usage(format!(
                "--predictions {}: not a file",
                path.display()
            )));
        }
        // The file a link points at (a link to a link would be read relative to here).
        let linked = std::fs::canonicalize(path)
            .ok()
            .and_then(|from| std::fs::hard_link(from, &to).ok())
            .is_some();
        if linked {
            let staged = std::fs::symlink_metadata(&to)
                .map_err(|e| Error::io(&to, "cannot stage predictions", e))?;
            if !(staged.is_file() && staged.dev() == meta.dev() && staged.ino() == meta.ino()) {
                return Err(Error::State(format!(
                    "--predictions {}: the file changed while it was staged",
                    path.display()
                )));
            }
        } else {
            let mut out = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&to)
                .map_err(|e| Error::io(&to, "cannot stage predictions", e))?;
            std::io::copy(&mut opened, &mut out)
                .map_err(|e| Error::io(&to, "cannot stage predictions", e))?;
        }
        Ok(to)
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // A job the client gave up on (its scheduler gone) may still be putting parts in.
        if let Err((left, e)) =
            crate::atomic::remove_tree(&self.dir, std::time::Duration::from_secs(10))
        {
            eprintln!(
                "{}",
                crate::text::terminal(&format!(
                    "note: the staging folder {} was not removed ({e}); remove it once no \
                     scoring runs",
                    left.display()
                ))
            );
        }
        if let Some(r) = &self.remote {
            // Everything under the prefix: the staged inputs and every part, reported or
            // not (a lost attempt's). On a thread of its own with a fresh connection: this
            // may run inside the client's runtime, which must not block on itself.
            // At most a minute: a server that fails to the end leaves the prefix, said.
            let prefix = r.prefix.clone();
            let removed = std::thread::spawn(move || -> Result<()> {
                let store = crate::objstore::Store::open(&prefix)?;
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| Error::Internal(format!("a runtime: {e}")))?;
                rt.block_on(async {
                    tokio::time::timeout(
                        std::time::Duration::from_secs(60),
                        store.remove_prefix(&prefix.key),
                    )
                    .await
                    .unwrap_or_else(|_| Err(Error::State("no answer in 60 s".into())))
                })
            })
            .join();
            if let Ok(Err(e)) | Err(e) = removed.map_err(|_| Error::Internal("panicked".into())) {
                eprintln!(
                    "{}",
                    crate::text::terminal(&format!(
                        "note: the staging prefix {}/ was not removed ({e}); remove it when no \
                         scoring runs",
                        r.prefix
                    ))
                );
            }
        }
    }
}

/// Score predictions against a corpus; see the module docs.
pub fn score(opts: &ScoreOptions) -> Result<ScoreReport> {
    crate::rundir::check_run_id(&opts.run_id)?;
    let corpus = corpus_table(&opts.cases, ReadOptions::default())?;
    // On a cluster the executors read the predictions (an `s3://` file too).
    let given = opts
        .predictions_batches
        .as_ref()
        .map(|b| b.lock().unwrap_or_else(|p| p.into_inner()).take());
    let predictions = match (given, &opts.cluster) {
        (Some(_), Some(_)) => {
            return Err(Error::Usage(
                "predictions in memory are scored in this process, not on a cluster".into(),
            ));
        }
        (Some(None), None) => {
            return Err(Error::State(format!(
                "{}: read once already",
                opts.predictions.display()
            )));
        }
        (Some(Some(batches)), None) => Some(crate::engine::predictions_table_of(
            &opts.predictions,
            batches,
            8192,
        )),
        (None, None) => Some(predictions_table(&opts.predictions, 8192)?),
        (None, Some(_)) => None,
    };
    std::fs::create_dir_all(&opts.output)
        .map_err(|e| Error::io(&opts.output, "cannot create folder", e))?;
    // A scoring killed while it committed into this folder is completed first.
    crate::atomic::finish_commit(&opts.output)?;
    let rt = runtime()?;
    let opened = rt.block_on(open_session(opts, &corpus, predictions.as_ref()))?;
    let ctx = &opened.ctx;
    if opened.cluster.is_none() {
        crate::judge::udf::register(ctx, opts.judge.clone());
    }
    score_params(ctx, opts)?;
    register_reviews(ctx, &opts.reviews)?;

    let mut report = ScoreReport {
        run_id: opts.run_id.clone(),
        output: opts.output.clone(),
        rows: 0,
        attack_success: 0,
        over_refused: 0,
        manual_review: 0,
        review: BTreeMap::new(),
        predictions: PredictionStats::default(),
        cases_sha256: String::new(),
        result_paths: BTreeMap::new(),
        aggregate_metrics: AggregateMetrics::default(),
        judge: None,
        scoring: ScoringEngine {
            rulepack_digest: Some(crate::detect::packs::digest()),
            ..opened.scoring.clone()
        },
        uploaded: Vec::new(),
    };
    let mut counts = Tally::default();
    let scored = rt.block_on(async {
        match &opened.cluster {
            None => score_here(ctx, opts, &mut counts, &mut report.scoring).await,
            Some(cluster) => {
                score_on_cluster(ctx, cluster, opts, &mut counts, &mut report.scoring).await
            }
        }
    });
    let surveyed = opened.cluster.as_ref().map(|c| c.stats.clone());
    // The staged inputs and the parts go now, with a result or an error.
    drop(opened);
    let (pending, metrics) = match scored {
        Ok(p) => p,
        Err(e) => {
            // Verdicts already paid for are kept for the next attempt (shared cache).
            if let Some(judge) = &opts.judge {
                let _ = judge.persist_shared();
            }
            return Err(e);
        }
    };
    report.rows = counts.rows;
    report.attack_success = counts.attack_success;
    report.over_refused = counts.over_refused;
    report.manual_review = counts.manual_review;
    report.review = counts.review;
    // Results, findings, the verdicts behind them and the summary are committed in one
    // step ([`crate::atomic::FolderCommit`]): a kill at any point leaves this folder's
    // earlier scoring or this one, never a mix, and an earlier scoring's judgements go
    // with it when this one judged nothing.
    let mut commit = crate::atomic::FolderCommit::new(&opts.output);
    let (files, uploaded) = pending.files()?;
    for (key, file) in files {
        report.result_paths.insert(key.into(), commit.put(file)?);
    }
    // Put into the new commit's folder by the executors: named where the published
    // folder will have them, and no older copy left here to be published with them.
    for (kind, entry) in uploaded {
        commit.remove(kind)?;
        report
            .result_paths
            .insert(parts::result_key(kind).into(), opts.output.join(kind));
        report.uploaded.push(entry);
    }
    match opts.judge.as_ref().map(|j| j.run_file(&opts.output)) {
        Some(Ok(crate::judge::RunFile::Kept(path))) => {
            report
                .result_paths
                .insert("judgements_parquet".into(), path);
        }
        Some(Ok(crate::judge::RunFile::New(_, file))) => {
            let path = commit.put(file)?;
            report
                .result_paths
                .insert("judgements_parquet".into(), path);
        }
        Some(Ok(crate::judge::RunFile::None)) | None => {
            commit.remove(crate::judge::JUDGEMENTS_FILE)?;
        }
        Some(Err(e)) => return Err(e),
    }
    if let Some(judge) = &opts.judge {
        judge.persist_shared()?;
        report.judge = Some(judge.report());
    }
    report.aggregate_metrics = metrics;
    let summary_path = opts.output.join(crate::rundir::SUMMARY_FILE);
    report
        .result_paths
        .insert("summary_json".into(), summary_path.clone());
    let mut summary = serde_json::json!({
        "run_id": report.run_id,
        "experiment_name": opts.experiment_name,
        "aggregate_metrics": report.aggregate_metrics,
        "result_paths": report.result_paths,
        "scoring": report.scoring,
    });
    if let Some(j) = &report.judge {
        summary["judge"] = serde_json::to_value(j)
            .map_err(|e| Error::Internal(format!("cannot encode the judge report: {e}")))?;
    }
    // Renamed last: a reader that looks for the summary first finds the results in place.
    commit.put_json(&summary_path, &summary)?;
    commit.commit()?;
    report.predictions = surveyed.unwrap_or_else(|| {
        predictions
            .and_then(|p| p.stats.lock().unwrap_or_else(|p| p.into_inner()).take())
            .unwrap_or_default()
    });
    report.cases_sha256 = corpus
        .report
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .map(|r| r.sha256.clone())
        .unwrap_or_default();
    Ok(report)
}

/// Results scored, not yet committed: written here, or spliced from a cluster's parts.
enum Pending {
    Here(ResultWriters, FindingsWriter),
    Parts(parts::Merged),
}

impl Pending {
    /// The files, written and closed under temporary names, by summary.json's
    /// `result_paths` key; and those the executors put on object storage, by kind.
    #[allow(clippy::type_complexity)]
    fn files(
        self,
    ) -> Result<(
        Vec<(&'static str, crate::atomic::TempFile)>,
        Vec<(&'static str, crate::objstore::FileEntry)>,
    )> {
        match self {
            Pending::Here(writers, findings) => {
                let mut files = writers.finish()?;
                files.push(("findings_parquet", findings.finish()?));
                Ok((files, Vec::new()))
            }
            Pending::Parts(merged) => Ok(merged.files()),
        }
    }
}

/// Score in this process: the scored stream is written here, as it comes.
async fn score_here(
    ctx: &datafusion::prelude::SessionContext,
    opts: &ScoreOptions,
    counts: &mut Tally,
    scoring: &mut ScoringEngine,
) -> Result<(Pending, AggregateMetrics)> {
    let df = ctx.sql(SCORE_CASES_SQL).await?;
    let scored_schema = Arc::new(df.schema().as_arrow().clone());
    let results_columns = results_columns(&scored_schema);
    let schema = Arc::new(scored_schema.project(&results_columns)?);
    let mut writers = ResultWriters::create(&opts.output, Arc::clone(&schema))?;
    if let Some(kept) = &opts.keep_results {
        // the results' schema, even without a row
        kept.lock().unwrap_or_else(|p| p.into_inner()).push(
            datafusion::arrow::array::RecordBatch::new_empty(Arc::clone(&schema)),
        );
    }
    let mut findings = FindingsWriter::create(
        &opts.output.join(crate::rundir::FINDINGS_FILE),
        Arc::clone(&scored_schema),
    )
    .await?;
    let mut partials = summary::Partials::new(schema).await?;
    let mut window = None;
    let mut stream = match &opts.case_lives {
        None => df.execute_stream().await?,
        Some(lives) => {
            let task = Arc::new(df.task_ctx());
            let plan = df.create_physical_plan().await?;
            let (plan, rewritten) = crate::engine::case_window::rewrite(plan, lives)?;
            if rewritten {
                window = Some(Arc::clone(&plan));
            } else {
                eprintln!(
                    "note: scoring holds every case of the corpus (its join with the \
                     predictions is not of the shape read in the order written)"
                );
            }
            datafusion::physical_plan::execute_stream(plan, task)?
        }
    };
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        findings.write(&batch).await?;
        let batch = batch.project(&results_columns)?;
        tally(&batch, counts)?;
        writers.write(&batch)?;
        if let Some(kept) = &opts.keep_results {
            kept.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(batch.clone());
        }
        partials.push(&batch).await?;
    }
    let metrics = summary::from_partials(vec![partials.finish().await?]).await?;
    scoring.cases_held_most = window
        .as_ref()
        .and_then(crate::engine::case_window::cases_held_most);
    Ok((Pending::Here(writers, findings), metrics))
}

/// Score on a cluster whose executors write the results ([`parts`]): plan here, submit
/// the part writers, check and splice the reported parts, and add up the summary's
/// partial aggregates the executors computed.
async fn score_on_cluster(
    planner: &datafusion::prelude::SessionContext,
    cluster: &OnCluster,
    opts: &ScoreOptions,
    counts: &mut Tally,
    scoring: &mut ScoringEngine,
) -> Result<(Pending, AggregateMetrics)> {
    use futures::TryStreamExt;
    let started = std::time::Instant::now();
    let plan = planner
        .sql(SCORE_CASES_SQL)
        .await?
        .create_physical_plan()
        .await?;
    let dir_text = cluster.staging.parts()?;
    let writer = Arc::new(parts::PartWriterExec::try_new(plan, &dir_text)?);
    let root = Arc::new(
        datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec::new(writer),
    );
    let batches: Vec<RecordBatch> = (cluster.submit)(root).await?.try_collect().await?;
    let reports = parts::reports(&batches, &cluster.staged)?;
    scoring.query_ms = Some(started.elapsed().as_millis() as u64);
    scoring.parts = Some(reports.len());
    let started = std::time::Instant::now();
    for r in &reports {
        parts::add(counts, &r.tally);
    }
    // On object storage, into the run's new commit folder by the executors when the
    // run is there too ([`upload`]).
    let uploaded = match (&cluster.staging.remote, &opts.publish_dir) {
        (Some(r), Some(dest)) => {
            let dest = crate::objstore::Location::parse(dest)?;
            upload::assemble(&cluster.submit, &reports, &r.prefix.child("parts"), &dest).await?
        }
        _ => Vec::new(),
    };
    let skip: Vec<&str> = uploaded.iter().map(|(kind, _)| *kind).collect();
    let dir = cluster.staging.local_parts(&reports, &skip).await?;
    // The run's files put together by the executors when a rename can take them from
    // the staging folder into the run; spliced here otherwise.
    let assembled = if cluster.staging.remote.is_none()
        && assemble::can_assemble(&cluster.staging.dir, &opts.output)
    {
        assemble::assemble(
            &cluster.submit,
            &reports,
            &dir,
            &cluster.staging.dir,
            &opts.output,
        )
        .await?
    } else {
        Default::default()
    };
    scoring.assembled_by_executors = Some(
        assembled
            .keys()
            .chain(&skip)
            .map(|k| (*k).to_owned())
            .collect(),
    );
    let merged = parts::merge(&reports, &dir, &opts.output, assembled, uploaded)?;
    let metrics = summary::from_partials(parts::summary_partials(&reports, &dir)?).await?;
    scoring.commit_ms = Some(started.elapsed().as_millis() as u64);
    Ok((Pending::Parts(merged), metrics))
}

#[cfg(test)]
mod tests {
    use super::Staging;
    use crate::objstore::Location;

    #[test]
    fn a_staging_prefix_datafusion_would_read_as_a_pattern_is_refused() {
        // checked before any store is opened: no server is needed
        for prefix in [
            "s3://bkt/a*b",
            "s3://bkt/x[1]",
            "s3://bkt/{a,b}/c",
            "s3://bkt/50%",
        ] {
            let at = Location::parse(prefix).expect("a valid location");
            let err = Staging::create_remote(&at)
                .err()
                .unwrap_or_else(|| panic!("{prefix}: accepted"));
            let msg = err.to_string();
            assert!(
                msg.contains(prefix) && msg.contains("pattern"),
                "{prefix}: {msg}"
            );
        }
    }
}
