//! Scoring on a cluster whose executors write the results (docs/cluster.md, "Score and
//! query on it").
//!
//! The scoring plan (`queries/score_cases.sql`, planned here) is wrapped in a
//! [`PartWriterExec`]: each of its partitions — one task on some executor — streams its
//! scored rows into part files in the parts folder, which every executor sees
//! (case_results as Parquet and as JSONL, and findings as Parquet, through the same
//! writers a local run uses, and the summary's partial aggregates of its rows,
//! [`crate::scoring::summary`]), then returns one row: a [`PartReport`] naming its files with
//! their sizes and SHA-256 digests, and its tallies. Only those rows travel back.
//!
//! The client then commits: it checks that the reports cover every staged prediction
//! once ([`Coverage`]), checks every named part (size, digest, rows), splices the parts into the
//! run's files under temporary names — Parquet row groups copied as they are, without
//! decoding them; JSONL concatenated, by the executors where they can ([`super::assemble`])
//! — and renames them into place as a local run does;
//! the summary is the sum of the parts' partial aggregates, not a reading of the results.
//! A part no report names (a task attempt that was lost or retried) is never read, and
//! the parts folder goes with the staging folder.

use std::fmt;
use std::io::{Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::error::DataFusionError;
use datafusion::execution::TaskContext;
use datafusion::parquet::file::writer::SerializedFileWriter;
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning,
    PlanProperties, SendableRecordBatchStream,
};
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::scoring::{
    FindingsWriter, RESULT_BATCH_ROWS, ResultWriters, ReviewCount, SOURCE_LINE, Tally, coalesced,
    results_columns, tally,
};

/// The one column of [`PartWriterExec`]'s output: a [`PartReport`] as JSON.
const REPORT_COLUMN: &str = "part_report";

/// A part report's largest size: its files and tallies (review reasons with five
/// example ids each) take a few KiB.
const MAX_REPORT_BYTES: usize = 1 << 20;

/// The kinds of part file, in the order a report lists them.
pub const CASE_RESULTS_PARQUET: &str = "case_results.parquet";
pub const CASE_RESULTS_JSONL: &str = "case_results.jsonl";
pub const FINDINGS_PARQUET: &str = "findings.parquet";
/// The summary's partial aggregates of a part's rows, and its latencies (read, not
/// spliced: [`crate::scoring::summary`]).
pub const SUMMARY_PARTIAL_PARQUET: &str = "summary_partial.parquet";
pub const SUMMARY_LATENCY_PARQUET: &str = "summary_latency.parquet";

/// Every kind of part file, in the order a report lists them.
pub(crate) const KINDS: [&str; 5] = [
    CASE_RESULTS_PARQUET,
    CASE_RESULTS_JSONL,
    FINDINGS_PARQUET,
    SUMMARY_PARTIAL_PARQUET,
    SUMMARY_LATENCY_PARQUET,
];

/// Writes each partition of its input (the scored stream) into part files in `dir`, and
/// outputs one row per partition, its [`PartReport`].
pub struct PartWriterExec {
    input: Arc<dyn ExecutionPlan>,
    /// The parts folder (absolute; the same path on every executor).
    dir: String,
    properties: Arc<PlanProperties>,
}

impl fmt::Debug for PartWriterExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PartWriterExec")
            .field("dir", &self.dir)
            .finish()
    }
}

impl PartWriterExec {
    /// Refuses a folder that is not an absolute UTF-8 path or an `s3://` location (it
    /// travels as text and is opened by executors on other machines).
    pub fn try_new(input: Arc<dyn ExecutionPlan>, dir: &str) -> Result<Self> {
        if !shared_location(dir) {
            return Err(Error::Internal(format!(
                "PartWriterExec: the parts folder {dir:?} is not an absolute path"
            )));
        }
        let schema = report_schema();
        let properties = PlanProperties::new(
            EquivalenceProperties::new(schema),
            Partitioning::UnknownPartitioning(input.output_partitioning().partition_count()),
            EmissionType::Final,
            Boundedness::Bounded,
        );
        Ok(Self {
            input,
            dir: dir.to_owned(),
            properties: Arc::new(properties),
        })
    }

    /// The parts folder.
    pub fn dir(&self) -> &str {
        &self.dir
    }

    /// The scored stream it writes.
    pub fn input(&self) -> &Arc<dyn ExecutionPlan> {
        &self.input
    }
}

/// The methods of `ExecutionPlan` that are the same for each plan node of pieval's with
/// one input (`input`) and fixed properties (`properties`): its name, its one child, no
/// expressions, no repartitioning of its input.
macro_rules! single_input_node {
    // A node planned from a spec (`self.spec`, `Self::try_new(spec, input)`): rebuilt
    // from it over a new input.
    ($name:literal, from_spec) => {
        super::parts::single_input_node!($name);

        fn with_new_children(
            self: std::sync::Arc<Self>,
            children: Vec<std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>>,
        ) -> datafusion::error::Result<std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>>
        {
            let input = super::parts::only_child(self.name(), children)?;
            Ok(std::sync::Arc::new(Self::try_new(
                (*self.spec).clone(),
                input,
            )?))
        }
    };
    ($name:literal) => {
        fn name(&self) -> &str {
            $name
        }

        fn properties(&self) -> &std::sync::Arc<datafusion::physical_plan::PlanProperties> {
            &self.properties
        }

        fn children(&self) -> Vec<&std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
            vec![&self.input]
        }

        fn benefits_from_input_partitioning(&self) -> Vec<bool> {
            vec![false]
        }

        fn apply_expressions(
            &self,
            _f: &mut dyn FnMut(
                &std::sync::Arc<dyn datafusion::physical_expr::PhysicalExpr>,
            ) -> datafusion::error::Result<
                datafusion::common::tree_node::TreeNodeRecursion,
            >,
        ) -> datafusion::error::Result<datafusion::common::tree_node::TreeNodeRecursion> {
            Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
        }
    };
}
pub(crate) use single_input_node;

/// The one input of a plan node of pieval's that takes one (`with_new_children`).
pub(crate) fn only_child(
    node: &str,
    mut children: Vec<Arc<dyn ExecutionPlan>>,
) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
    match children.len() {
        1 => Ok(children.swap_remove(0)),
        n => Err(DataFusionError::Internal(format!(
            "{node} takes one input, not {n}"
        ))),
    }
}

/// [`PartWriterExec`]'s output schema.
fn report_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new(
        REPORT_COLUMN,
        DataType::Utf8,
        false,
    )]))
}

impl DisplayAs for PartWriterExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "PartWriterExec: dir={}", self.dir)
    }
}

impl ExecutionPlan for PartWriterExec {
    super::parts::single_input_node!("PartWriterExec");

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Self::try_new(
            only_child(self.name(), children)?,
            &self.dir,
        )?))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> datafusion::error::Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let dir = PathBuf::from(&self.dir);
        let schema = report_schema();
        let out = Arc::clone(&schema);
        let report = async move {
            let report = match crate::objstore::Location::of(&dir)? {
                None => write_part(input, &dir).await?,
                Some(loc) => write_part_to(input, &loc).await?,
            };
            let json = serde_json::to_string(&report)
                .map_err(|e| Error::Internal(format!("cannot encode a part report: {e}")))?;
            Ok(RecordBatch::try_new(
                out,
                vec![Arc::new(StringArray::from(vec![json]))],
            )?)
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            schema,
            futures::stream::once(report),
        )))
    }
}

/// What one partition wrote: its files, what it covers and its tallies.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PartReport {
    /// The predictions its rows came from. Not a partition number: Ballista hands each
    /// task a plan cut to its own partitions, numbered from 0 again.
    pub coverage: Coverage,
    /// Rows of its findings part.
    pub findings_rows: u64,
    /// case_results.parquet, case_results.jsonl, findings.parquet, summary_partial.parquet,
    /// summary_latency.parquet (by [`PartFile::kind`]).
    pub files: Vec<PartFile>,
    pub tally: Tally,
}

/// Which predictions a set of scored rows came from, by their `source_line`s: how many,
/// the first, and a fingerprint — the wrapping sum of a 64-bit mix of each line — that
/// adds up over parts. Parts cover the staged predictions once each exactly when their
/// rows and fingerprints add up to the staged file's (a part lost, or one reported
/// twice, changes both; 2^-64 is the chance of another set of lines matching).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coverage {
    pub rows: u64,
    pub fingerprint: u64,
    pub first_line: Option<i64>,
}

impl Coverage {
    /// Add the `source_line` column of a batch.
    pub fn add_batch(&mut self, batch: &RecordBatch) -> Result<()> {
        use datafusion::arrow::array::AsArray;
        use datafusion::arrow::datatypes::Int64Type;
        let col = batch
            .column_by_name(SOURCE_LINE)
            .ok_or_else(|| Error::Internal(format!("no {SOURCE_LINE} column to cover")))?;
        let col = datafusion::arrow::compute::cast(col, &DataType::Int64)?;
        let lines = col.as_primitive::<Int64Type>();
        for i in 0..lines.len() {
            self.add_line(lines.is_valid(i).then(|| lines.value(i)));
        }
        Ok(())
    }

    /// Add one row's `source_line`.
    pub fn add_line(&mut self, line: Option<i64>) {
        self.rows += 1;
        self.fingerprint = self
            .fingerprint
            .wrapping_add(mix(line.map_or(u64::MAX, |l| l as u64)));
        if let Some(l) = line {
            self.first_line = Some(self.first_line.map_or(l, |f| f.min(l)));
        }
    }

    fn add(&mut self, other: &Coverage) {
        self.rows = self.rows.saturating_add(other.rows);
        self.fingerprint = self.fingerprint.wrapping_add(other.fingerprint);
        self.first_line = match (self.first_line, other.first_line) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
}

/// SplitMix64's finalizer (Steele, Lea and Flood, "Fast splittable pseudorandom number
/// generators", OOPSLA 2014): consecutive lines spread over all 64 bits.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One part file: what kind of run file it is part of, its name in the parts folder,
/// its size and digest.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PartFile {
    pub kind: String,
    pub name: String,
    pub bytes: u64,
    pub sha256: String,
}

/// Stream one partition of the scored rows into part files in `dir` (on an executor).
async fn write_part(input: SendableRecordBatchStream, dir: &Path) -> Result<PartReport> {
    // A fresh name for each attempt: a retried task never writes over a part another
    // attempt may still be writing, and only the reported one is read.
    let stem = format!("part-{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
    let name = |kind: &str| format!("{stem}.{kind}");
    let scored = input.schema();
    let results_columns = results_columns(&scored);
    let schema = Arc::new(scored.project(&results_columns)?);
    let mut writers = ResultWriters::create_shared(
        &dir.join(name(CASE_RESULTS_PARQUET)),
        &dir.join(name(CASE_RESULTS_JSONL)),
        Arc::clone(&schema),
    )?;
    let mut findings =
        FindingsWriter::create_in(&dir.join(name(FINDINGS_PARQUET)), Arc::clone(&scored), true)
            .await?;
    let mut partials = crate::scoring::summary::Partials::new(Arc::clone(&schema)).await?;
    let mut counts = Tally::default();
    let mut coverage = Coverage::default();
    let mut stream = Box::pin(coalesced(input, RESULT_BATCH_ROWS));
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        coverage.add_batch(&batch)?;
        findings.write(&batch).await?;
        let batch = batch.project(&results_columns)?;
        tally(&batch, &mut counts)?;
        writers.write(&batch)?;
        partials.push(&batch).await?;
    }
    // Every part is hashed as it is written (shared files), not read back.
    let [parquet, jsonl] = writers.commit_hashed()?;
    let (findings_rows, findings_sha256, findings_bytes) = findings.commit_hashed()?;
    let [partial, latency] = partials.finish().await?.tables;
    let write_table =
        |table: crate::scoring::summary::Table, kind: &str| -> Result<(String, u64)> {
            let mut file =
                crate::atomic::ParquetFile::create_shared(&dir.join(name(kind)), table.schema)?;
            for batch in &table.batches {
                file.write(batch)?;
            }
            let (_, sha256, bytes) = file.commit_hashed()?;
            Ok((sha256, bytes))
        };
    let digests = [
        parquet,
        jsonl,
        (findings_sha256, findings_bytes),
        write_table(partial, SUMMARY_PARTIAL_PARQUET)?,
        write_table(latency, SUMMARY_LATENCY_PARQUET)?,
    ];
    let files = KINDS
        .into_iter()
        .zip(digests)
        .map(|(kind, (sha256, bytes))| PartFile {
            kind: kind.to_owned(),
            name: name(kind),
            bytes,
            sha256,
        })
        .collect();
    Ok(PartReport {
        coverage,
        findings_rows,
        files,
        tally: counts,
    })
}

/// Whether a path that travels in a plan names a place every executor can reach: an
/// absolute path (on a mount they all see), or a valid `s3://` location (reached through
/// each executor's own store).
pub(crate) fn shared_location(p: &str) -> bool {
    if p.contains('\0') {
        return false;
    }
    if crate::objstore::is_remote(Path::new(p)) {
        return crate::objstore::Location::parse(p).is_ok();
    }
    Path::new(p).is_absolute()
}

/// [`write_part`] into a prefix on object storage: the part files are written into a
/// private local folder (hashed as they are written), then each is uploaded (a
/// multipart upload above 8 MiB; it appears whole or not at all) and checked to be what
/// was hashed; the local folder goes in any case. Only then is the part reported: a
/// part whose upload failed is never named.
async fn write_part_to(
    input: SendableRecordBatchStream,
    dir: &crate::objstore::Location,
) -> Result<PartReport> {
    let scratch = crate::objstore::Scratch::create()?;
    let report = write_part(input, &scratch.dir).await?;
    let store = crate::objstore::Store::open(dir)?;
    for file in &report.files {
        let at = dir.child(&file.name);
        let sent = store.upload(&scratch.dir.join(&file.name), &at.key).await?;
        if (sent.bytes, sent.sha256.as_str()) != (file.bytes, file.sha256.as_str()) {
            return Err(Error::State(format!(
                "{at}: {} bytes, sha256 {} uploaded, but {} bytes, sha256 {} written",
                sent.bytes, sent.sha256, file.bytes, file.sha256
            )));
        }
    }
    Ok(report)
}

/// The reports of a [`PartWriterExec`] run, checked: each names one file of each kind by
/// a name the parts folder could hold, no part is reported twice, and together they cover
/// the staged predictions (`expected`) once each. In the order of their first lines.
pub fn reports(batches: &[RecordBatch], expected: &Coverage) -> Result<Vec<PartReport>> {
    let mut out: Vec<PartReport> = Vec::new();
    let mut names = std::collections::BTreeSet::new();
    let mut covered = Coverage::default();
    for batch in batches {
        let column = crate::engine::utf8_column(batch, REPORT_COLUMN)?;
        for i in 0..column.len() {
            if column.is_null(i) {
                return Err(Error::Query(
                    "the cluster returned an empty part report".into(),
                ));
            }
            if column.value(i).len() > MAX_REPORT_BYTES {
                return Err(Error::Query(format!(
                    "the cluster returned a part report of {} bytes (at most {MAX_REPORT_BYTES})",
                    column.value(i).len()
                )));
            }
            let report: PartReport = serde_json::from_str(column.value(i)).map_err(|e| {
                Error::Query(format!(
                    "the cluster returned a part report that does not parse: {e}"
                ))
            })?;
            if report.files.len() != KINDS.len() {
                return Err(Error::Query(format!(
                    "the cluster returned a part report of {} files, not {}",
                    report.files.len(),
                    KINDS.len()
                )));
            }
            for (file, kind) in report.files.iter().zip(KINDS) {
                let expected = format!(".{kind}");
                if file.kind != kind
                    || !file.name.starts_with("part-")
                    || !file.name.ends_with(&expected)
                    || file.name.contains(['/', '\\'])
                    || file.name.contains("..")
                {
                    return Err(Error::Query(format!(
                        "the cluster returned a part report that names {:?} as its {kind} part",
                        crate::text::excerpt(&file.name, 120)
                    )));
                }
                if !names.insert(file.name.clone()) {
                    return Err(Error::Query(format!(
                        "the cluster reported the part {} twice",
                        crate::text::excerpt(&file.name, 120)
                    )));
                }
            }
            if report.coverage.rows != report.tally.rows {
                return Err(Error::Query(format!(
                    "the cluster's report of {} counts {} rows and covers {}",
                    crate::text::excerpt(&report.files[0].name, 120),
                    report.tally.rows,
                    report.coverage.rows
                )));
            }
            covered.add(&report.coverage);
            out.push(report);
        }
    }
    if covered.rows != expected.rows || covered.fingerprint != expected.fingerprint {
        return Err(Error::Query(format!(
            "the cluster's {} part(s) hold {} rows that do not cover the {} staged \
             predictions once each (a part lost or reported twice)",
            out.len(),
            covered.rows,
            expected.rows
        )));
    }
    out.sort_by_key(|r| (r.coverage.first_line.is_none(), r.coverage.first_line));
    Ok(out)
}

/// The run's case_results and findings files spliced from checked parts (or put together
/// by the executors), under temporary names until the run's commit
/// ([`crate::atomic::FolderCommit`]).
pub struct Merged {
    files: Vec<(&'static str, crate::atomic::TempFile)>,
    uploaded: Vec<(&'static str, crate::objstore::FileEntry)>,
}

impl Merged {
    /// The files, by summary.json's `result_paths` key (for the run's commit), and
    /// those the executors put on object storage, by kind.
    #[allow(clippy::type_complexity)]
    pub fn files(
        self,
    ) -> (
        Vec<(&'static str, crate::atomic::TempFile)>,
        Vec<(&'static str, crate::objstore::FileEntry)>,
    ) {
        let files = self
            .files
            .into_iter()
            .map(|(kind, file)| (result_key(kind), file))
            .collect();
        (files, self.uploaded)
    }
}

/// summary.json's `result_paths` key of a run file.
pub(crate) fn result_key(kind: &str) -> &'static str {
    match kind {
        CASE_RESULTS_PARQUET => "case_results_parquet",
        CASE_RESULTS_JSONL => "case_results_jsonl",
        _ => "findings_parquet",
    }
}

/// Check every part the reports name and splice them into `output`'s case_results.parquet,
/// case_results.jsonl and findings.parquet (temporary until committed); the files the
/// executors put together ([`super::assemble`]) are taken as they are, and those they
/// put on object storage ([`super::upload`]) are left out.
pub fn merge(
    reports: &[PartReport],
    parts: &Path,
    output: &Path,
    mut assembled: std::collections::BTreeMap<&'static str, crate::atomic::TempFile>,
    uploaded: Vec<(&'static str, crate::objstore::FileEntry)>,
) -> Result<Merged> {
    let mut files = Vec::with_capacity(3);
    for (i, kind) in KINDS.into_iter().take(3).enumerate() {
        if uploaded.iter().any(|(k, _)| *k == kind) {
            continue;
        }
        if let Some(done) = assembled.remove(kind) {
            files.push((kind, done));
            continue;
        }
        let target = output.join(kind);
        let mut out = crate::atomic::TempFile::create(&target)?;
        let list = part_list(reports, i);
        if kind == CASE_RESULTS_JSONL {
            for (file, rows) in list {
                concat_jsonl(&parts.join(&file.name), file, rows, &mut out)?;
            }
        } else {
            splice_parquet(parts, &list, &mut out)?;
        }
        files.push((kind, out));
    }
    Ok(Merged { files, uploaded })
}

/// The parts of the `i`-th kind ([`KINDS`]), with the rows each holds.
pub fn part_list(reports: &[PartReport], i: usize) -> Vec<(&PartFile, u64)> {
    reports
        .iter()
        .map(|r| {
            let rows = if KINDS[i] == FINDINGS_PARQUET {
                r.findings_rows
            } else {
                r.coverage.rows
            };
            (&r.files[i], rows)
        })
        .collect()
}

/// The largest summary part read: its partials are a few rows per group of dimensions,
/// its latencies sixteen bytes a distinct value before compression.
const MAX_SUMMARY_PART_BYTES: u64 = 4 << 30;

/// The summary's partial aggregates of every part the reports name. Each file is read
/// once into memory, and what was read is what is hashed, checked against the decoding
/// bounds and decoded (no window for the file to change in between); its counts must be
/// those of its part's rows ([`crate::scoring::summary::check_received`]).
pub fn summary_partials(
    reports: &[PartReport],
    parts: &Path,
) -> Result<Vec<crate::scoring::summary::Partial>> {
    let limits = crate::rundir::bounds::ParquetLimits::from_env()?;
    let mut out = Vec::with_capacity(reports.len());
    for report in reports {
        let partial = crate::scoring::summary::Partial {
            tables: [
                read_summary_part(parts, &report.files[3], &limits)?,
                read_summary_part(parts, &report.files[4], &limits)?,
            ],
        };
        crate::scoring::summary::check_received(
            &partial,
            report.coverage.rows,
            &report.files[3].name,
        )?;
        out.push(partial);
    }
    // Every part's tables must have one shape (the same executors' code).
    if let Some(first) = out.first() {
        for p in &out {
            for i in 0..2 {
                if p.tables[i].schema.fields() != first.tables[i].schema.fields() {
                    return Err(Error::State(format!(
                        "{}: the summary parts of the executors differ in their columns",
                        parts.display()
                    )));
                }
            }
        }
    }
    Ok(out)
}

/// One summary part, read once into memory: hashed, its footer checked against the
/// decoding bounds, and decoded with the footer that was checked.
fn read_summary_part(
    parts: &Path,
    file: &PartFile,
    limits: &crate::rundir::bounds::ParquetLimits,
) -> Result<crate::scoring::summary::Table> {
    use datafusion::parquet::arrow::arrow_reader::{
        ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
    };
    use std::io::Read;
    let path = parts.join(&file.name);
    if file.bytes > MAX_SUMMARY_PART_BYTES {
        return Err(Error::State(format!(
            "{}: its executor reported {} bytes (a summary part is at most {})",
            path.display(),
            file.bytes,
            MAX_SUMMARY_PART_BYTES
        )));
    }
    let f = crate::files::open_regular(&path, crate::files::Links::Refuse)?;
    let mut bytes = Vec::new();
    f.take(file.bytes + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(&path, "cannot read", e))?;
    let digest = crate::digest::sha256_hex(&bytes);
    if bytes.len() as u64 != file.bytes || digest != file.sha256 {
        return Err(Error::State(format!(
            "{}: {} bytes, sha256 {digest}, but its executor reported {} bytes, sha256 {}: \
             the part changed after it was written",
            path.display(),
            bytes.len(),
            file.bytes,
            file.sha256
        )));
    }
    let bytes = bytes::Bytes::from(bytes);
    let meta = crate::rundir::bounds::check_parquet_chunks(&bytes, file.bytes, &path, limits)?;
    let read = |e: datafusion::parquet::errors::ParquetError| {
        Error::State(format!("{}: cannot read it: {e}", path.display()))
    };
    let meta = ArrowReaderMetadata::try_new(Arc::new(meta), ArrowReaderOptions::default())
        .map_err(read)?;
    let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(bytes, meta)
        .build()
        .map_err(read)?;
    let schema = datafusion::arrow::record_batch::RecordBatchReader::schema(&reader);
    let batches = reader.collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(crate::scoring::summary::Table { schema, batches })
}

/// A part's length is the one its executor reported.
fn length_as_reported(path: &Path, file: &PartFile, len: u64) -> Result<()> {
    if len != file.bytes {
        return Err(Error::State(format!(
            "{}: {len} bytes, but its executor reported {}: the part changed after it was written",
            path.display(),
            file.bytes
        )));
    }
    Ok(())
}

/// Open a part and check its size and digest against its report; the open file, at its
/// start.
fn open_checked(path: &Path, file: &PartFile) -> Result<std::fs::File> {
    let mut f = crate::files::open_regular(path, crate::files::Links::Refuse)?;
    let len = f
        .metadata()
        .map_err(|e| Error::io(path, "cannot read", e))?
        .len();
    length_as_reported(path, file, len)?;
    let digest = crate::digest::sha256_reader(&mut f, path)?;
    if digest != file.sha256 {
        return Err(Error::State(format!(
            "{}: sha256 {digest}, but its executor reported {}: the part changed after it was written",
            path.display(),
            file.sha256
        )));
    }
    f.rewind().map_err(|e| Error::io(path, "cannot read", e))?;
    Ok(f)
}

/// Append a JSONL part holding `rows` lines, checked as it is copied (one read: what
/// was hashed is what was copied): its size, SHA-256 and lines must be its report's, or
/// the copy is an error (and nothing is committed).
fn concat_jsonl(
    path: &Path,
    file: &PartFile,
    rows: u64,
    out: &mut crate::atomic::TempFile,
) -> Result<()> {
    copy_part(path, file, rows, |chunk| {
        out.write_all(chunk)
            .map_err(|e| Error::io(out.tmp_path(), "cannot write", e))
    })
}

/// Read a JSONL part once, handing each chunk to `write`, and check what was read: its
/// size and SHA-256 are the reported ones, and it holds `rows` whole lines.
pub(crate) fn copy_part(
    path: &Path,
    file: &PartFile,
    rows: u64,
    write: impl FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    let f = crate::files::open_regular(path, crate::files::Links::Refuse)?;
    copy_part_from(f, path, file, rows, write)
}

/// [`copy_part`] of a part read from `f` (`path` names it in errors).
pub(crate) fn copy_part_from(
    f: impl std::io::Read,
    path: &Path,
    file: &PartFile,
    rows: u64,
    mut write: impl FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    let mut lines = 0u64;
    let mut last = b'\n';
    let (digest, bytes) = crate::digest::sha256_streamed(f, path, |chunk| {
        lines += memchr::memchr_iter(b'\n', chunk).count() as u64;
        last = chunk[chunk.len() - 1];
        write(chunk)
    })?;
    as_reported(path, file, bytes, &digest)?;
    if lines != rows || last != b'\n' {
        return Err(Error::State(format!(
            "{}: {lines} lines, but its executor reported {rows} rows",
            path.display()
        )));
    }
    Ok(())
}

/// What was read of a part is what its executor reported: its length and SHA-256.
fn as_reported(path: &Path, file: &PartFile, bytes: u64, digest: &str) -> Result<()> {
    if bytes != file.bytes || digest != file.sha256 {
        return Err(Error::State(format!(
            "{}: {bytes} bytes, sha256 {digest}, but its executor reported {} bytes, sha256 {}: \
             the part changed after it was written",
            path.display(),
            file.bytes,
            file.sha256
        )));
    }
    Ok(())
}

/// Read a part once, handing the bytes `range` of it to `write` (a Parquet part's row
/// groups, [`ParquetLayout`]), and check the whole of what was read: its size and
/// SHA-256 are the reported ones.
pub(crate) fn copy_range(
    path: &Path,
    file: &PartFile,
    range: [u64; 2],
    write: impl FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    let f = crate::files::open_regular(path, crate::files::Links::Refuse)?;
    copy_range_from(f, path, file, range, write)
}

/// [`copy_range`] of a part read from `f` (`path` names it in errors).
pub(crate) fn copy_range_from(
    f: impl std::io::Read,
    path: &Path,
    file: &PartFile,
    range: [u64; 2],
    mut write: impl FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    let mut at = 0u64;
    let (digest, bytes) = crate::digest::sha256_streamed(f, path, |chunk| {
        let end = at + chunk.len() as u64;
        let (from, to) = (range[0].max(at), range[1].min(end));
        if from < to {
            write(&chunk[(from - at) as usize..(to - at) as usize])?;
        }
        at = end;
        Ok(())
    })?;
    as_reported(path, file, bytes, &digest)
}

/// A part's footer, and the name its errors give it.
pub type Footer = (
    PathBuf,
    datafusion::parquet::file::metadata::ParquetMetaData,
);

/// Each part's footer, checked: within the decoding bounds, holding the rows its
/// executor reported, with the first part's schema and key-value metadata.
fn checked_footers(parts: &Path, list: &[(&PartFile, u64)]) -> Result<Vec<Footer>> {
    let limits = crate::rundir::bounds::ParquetLimits::from_env()?;
    let mut out: Vec<Footer> = Vec::with_capacity(list.len());
    for (file, rows) in list {
        let path = parts.join(&file.name);
        let len = std::fs::symlink_metadata(&path)
            .map_err(|e| Error::io(&path, "cannot read", e))?
            .len();
        length_as_reported(&path, file, len)?;
        let meta =
            crate::rundir::bounds::check_parquet_file(&path, crate::files::Links::Refuse, &limits)?;
        push_footer(&mut out, path, meta, *rows)?;
    }
    if out.is_empty() {
        return Err(Error::Internal("no part to splice".into()));
    }
    Ok(out)
}

/// [`checked_footers`] of parts on object storage, under `parts` (an `s3://` prefix):
/// each part's footer read by range requests (and nothing else of it), made only while
/// the object has the size its executor reported; and each part's entity tag, on which
/// its later reads are made. Call on a blocking thread.
#[allow(clippy::type_complexity)]
pub fn remote_footers(
    parts: &crate::objstore::Location,
    list: &[(&PartFile, u64)],
) -> Result<(Vec<Footer>, Vec<Option<String>>)> {
    let limits = crate::rundir::bounds::ParquetLimits::from_env()?;
    let mut out: Vec<Footer> = Vec::with_capacity(list.len());
    let mut tags = Vec::with_capacity(list.len());
    // One connection for every part's footer.
    let store = crate::objstore::Store::open(parts)?;
    for (file, rows) in list {
        let at = parts.child(&file.name);
        let object =
            crate::objstore::BlockingObject::open_in(store.clone(), &at, Some((file.bytes, None)))?;
        let path = PathBuf::from(at.to_string());
        let meta = crate::rundir::bounds::check_parquet_groups(
            &object,
            file.bytes,
            &path,
            &limits,
            Some(&[]),
        )?;
        push_footer(&mut out, path, meta, *rows)?;
        tags.push(object.stamp().1);
    }
    if out.is_empty() {
        return Err(Error::Internal("no part to splice".into()));
    }
    Ok((out, tags))
}

/// Add a part's footer to `out`, checked: it holds the rows its executor reported, and
/// has the first part's schema and key-value metadata.
fn push_footer(
    out: &mut Vec<Footer>,
    path: PathBuf,
    meta: datafusion::parquet::file::metadata::ParquetMetaData,
    rows: u64,
) -> Result<()> {
    let in_groups: i64 = meta.row_groups().iter().map(|g| g.num_rows()).sum();
    if meta.file_metadata().num_rows() != in_groups || u64::try_from(in_groups).ok() != Some(rows) {
        return Err(Error::State(format!(
            "{}: {} rows ({in_groups} in its row groups), but its executor reported {rows}",
            path.display(),
            meta.file_metadata().num_rows()
        )));
    }
    if let Some((_, first)) = out.first() {
        let (a, b) = (first.file_metadata(), meta.file_metadata());
        if a.schema_descr().root_schema() != b.schema_descr().root_schema()
            || a.key_value_metadata() != b.key_value_metadata()
        {
            return Err(Error::State(format!(
                "{}: its Parquet schema differs from the first part's",
                path.display()
            )));
        }
    }
    out.push((path, meta));
    Ok(())
}

/// Write the parts' row groups, as they are, into one Parquet file: `sink` receives the
/// file, `open(i)` gives part `i`'s bytes; the file's metadata. The parts' page indexes
/// are not carried over (the spliced file has none).
fn write_spliced<R: datafusion::parquet::file::reader::ChunkReader>(
    footers: &[Footer],
    sink: impl Write + Send,
    target: &Path,
    mut open: impl FnMut(usize) -> Result<R>,
) -> Result<datafusion::parquet::file::metadata::ParquetMetaData> {
    use datafusion::parquet::column::writer::ColumnCloseResult;
    use datafusion::parquet::file::properties::WriterProperties;
    let first = footers[0].1.file_metadata();
    let schema = first.schema_descr_ptr();
    let mut props = WriterProperties::builder();
    if let Some(kv) = first.key_value_metadata() {
        props = props.set_key_value_metadata(Some(kv.clone()));
    }
    if let Some(by) = first.created_by() {
        props = props.set_created_by(by.to_owned());
    }
    let mut writer =
        SerializedFileWriter::new(sink, schema.root_schema_ptr(), Arc::new(props.build()))?;
    for (i, (path, meta)) in footers.iter().enumerate() {
        let f = open(i)?;
        let splice = |e: datafusion::parquet::errors::ParquetError| {
            Error::State(format!(
                "{}: cannot copy it into {}: {e}",
                path.display(),
                target.display()
            ))
        };
        for group in meta.row_groups() {
            let mut rg = writer.next_row_group().map_err(splice)?;
            for column in group.columns() {
                rg.append_column(
                    &f,
                    ColumnCloseResult {
                        bytes_written: column.compressed_size() as u64,
                        rows_written: group.num_rows() as u64,
                        metadata: column.clone(),
                        bloom_filter: None,
                        column_index: None,
                        offset_index: None,
                    },
                )
                .map_err(splice)?;
            }
            rg.close().map_err(splice)?;
        }
    }
    Ok(writer.close()?)
}

/// Splice Parquet parts (checked: [`checked_footers`], [`open_checked`]) into `out`:
/// their row groups copied as they are, no decoding.
fn splice_parquet(
    parts: &Path,
    list: &[(&PartFile, u64)],
    out: &mut crate::atomic::TempFile,
) -> Result<()> {
    let footers = checked_footers(parts, list)?;
    let target = out.tmp_path().to_path_buf();
    write_spliced(&footers, out, &target, |i| {
        open_checked(&footers[i].0, list[i].0)
    })
    .map(|_| ())
}

/// Where the executors put Parquet parts together ([`super::assemble`]): each part's
/// row groups, the bytes `ranges[i]` of part `i` (its column chunks, which lie end to end
/// from byte 4 in a file the part writer made), go one after the other from byte 4 of
/// the run's file; the client writes the header and `footer` — the one the splice above
/// would write, made by running it over placeholders of the same lengths.
pub struct ParquetLayout {
    pub ranges: Vec<[u64; 2]>,
    pub footer: Vec<u8>,
}

/// The header every Parquet file starts with (and its footer ends with).
pub const PARQUET_MAGIC: &[u8; 4] = b"PAR1";

/// [`ParquetLayout`] of parts (their footers checked); `None` when a part's chunks do
/// not lie end to end from byte 4 (the client splices it then).
pub fn parquet_layout(parts: &Path, list: &[(&PartFile, u64)]) -> Result<Option<ParquetLayout>> {
    layout_of(&checked_footers(parts, list)?, list)
}

/// [`parquet_layout`] from the parts' footers, checked.
pub fn layout_of(footers: &[Footer], list: &[(&PartFile, u64)]) -> Result<Option<ParquetLayout>> {
    let mut ranges = Vec::with_capacity(footers.len());
    for (_, meta) in footers {
        let mut at = PARQUET_MAGIC.len() as u64;
        for group in meta.row_groups() {
            for column in group.columns() {
                let start = column
                    .dictionary_page_offset()
                    .unwrap_or_else(|| column.data_page_offset());
                if u64::try_from(start).ok() != Some(at) {
                    return Ok(None);
                }
                at += column.compressed_size() as u64;
            }
        }
        ranges.push([PARQUET_MAGIC.len() as u64, at]);
    }
    let data: u64 = ranges.iter().map(|[a, b]| b - a).sum();
    let mut tail = Tail {
        at: 0,
        keep_from: PARQUET_MAGIC.len() as u64 + data,
        kept: Vec::new(),
    };
    let meta = write_spliced(footers, &mut tail, Path::new("the footer"), |i| {
        Ok(Placeholder(list[i].0.bytes))
    })?;
    // The footer follows the last chunk, and is a footer (its length, then the magic):
    // were the writer ever to put anything else between the chunks, the client splices.
    let last_end = meta
        .row_groups()
        .iter()
        .flat_map(|g| g.columns())
        .map(|c| {
            let start = c
                .dictionary_page_offset()
                .unwrap_or_else(|| c.data_page_offset());
            start.saturating_add(c.compressed_size())
        })
        .max()
        .map_or(Some(PARQUET_MAGIC.len() as u64), |e| u64::try_from(e).ok());
    let kept = &tail.kept;
    let framed = kept.len() >= 8
        && kept.ends_with(PARQUET_MAGIC)
        && u64::from(u32::from_le_bytes(
            kept[kept.len() - 8..kept.len() - 4]
                .try_into()
                .expect("4 bytes"),
        )) == kept.len() as u64 - 8;
    if last_end != Some(tail.keep_from) || !framed {
        return Ok(None);
    }
    Ok(Some(ParquetLayout {
        ranges,
        footer: tail.kept,
    }))
}

/// A sink that keeps only what is written from byte `keep_from` on.
struct Tail {
    at: u64,
    keep_from: u64,
    kept: Vec<u8>,
}

impl Write for Tail {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let end = self.at + buf.len() as u64;
        if end > self.keep_from {
            let skip = self.keep_from.saturating_sub(self.at) as usize;
            self.kept.extend_from_slice(&buf[skip..]);
        }
        self.at = end;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A part's length of zeros: what the splice copies, without reading it.
struct Placeholder(u64);

impl datafusion::parquet::file::reader::Length for Placeholder {
    fn len(&self) -> u64 {
        self.0
    }
}

impl datafusion::parquet::file::reader::ChunkReader for Placeholder {
    type T = std::io::Take<std::io::Repeat>;

    fn get_read(&self, start: u64) -> datafusion::parquet::errors::Result<Self::T> {
        use std::io::Read;
        Ok(std::io::repeat(0).take(self.0.saturating_sub(start)))
    }

    fn get_bytes(
        &self,
        start: u64,
        length: usize,
    ) -> datafusion::parquet::errors::Result<bytes::Bytes> {
        let _ = start;
        Ok(bytes::Bytes::from(vec![0; length]))
    }
}

/// Add a part's tallies to the run's, keeping the first examples of each review reason
/// in the order the parts are given (their first lines).
pub fn add(total: &mut Tally, part: &Tally) {
    // Saturating: the counts come from reports (checked against the parts' rows).
    total.rows = total.rows.saturating_add(part.rows);
    total.attack_success = total.attack_success.saturating_add(part.attack_success);
    total.over_refused = total.over_refused.saturating_add(part.over_refused);
    total.manual_review = total.manual_review.saturating_add(part.manual_review);
    for (reason, count) in &part.review {
        let entry = total.review.entry(reason.clone()).or_insert(ReviewCount {
            count: 0,
            first_case_ids: Vec::new(),
        });
        entry.count = entry.count.saturating_add(count.count);
        for id in &count.first_case_ids {
            if entry.first_case_ids.len() < crate::scoring::EXAMPLES {
                entry.first_case_ids.push(id.clone());
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, StringArray};

    fn batch(ids: &[&str]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("case_id", DataType::Utf8, false),
            Field::new("n", DataType::Int64, true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(ids.to_vec())),
                Arc::new(Int64Array::from_iter(
                    (0..ids.len() as i64).map(|i| (i % 3 != 0).then_some(i)),
                )),
            ],
        )
        .unwrap()
    }

    /// case_results rows of these ids (attacks, nothing decided, latencies 0, 1, …).
    fn case_results(ids: &[&str]) -> RecordBatch {
        use datafusion::arrow::array::{ArrayRef, BooleanArray, Float64Array, new_null_array};
        let schema = crate::contract::arrow::case_results_schema();
        let n = ids.len();
        let columns: Vec<ArrayRef> = schema
            .fields()
            .iter()
            .map(|f| -> ArrayRef {
                match (f.name().as_str(), f.data_type()) {
                    ("case_id", _) => Arc::new(StringArray::from(ids.to_vec())),
                    ("latency_ms", _) => {
                        Arc::new(Float64Array::from_iter_values((0..n).map(|i| i as f64)))
                    }
                    (_, DataType::Utf8) if !f.is_nullable() => {
                        Arc::new(StringArray::from(vec!["attack"; n]))
                    }
                    (_, DataType::Boolean) if !f.is_nullable() => {
                        Arc::new(BooleanArray::from(vec![false; n]))
                    }
                    (_, t) => new_null_array(t, n),
                }
            })
            .collect();
        RecordBatch::try_new(schema, columns).unwrap()
    }

    fn file(dir: &Path, name: &str, kind: &str) -> PartFile {
        let path = dir.join(name);
        PartFile {
            kind: kind.into(),
            name: name.into(),
            bytes: std::fs::metadata(&path).unwrap().len(),
            sha256: crate::digest::sha256_file(&path).unwrap(),
        }
    }

    /// The coverage of predictions on `lines`.
    fn lines(lines: std::ops::Range<i64>) -> Coverage {
        let mut c = Coverage::default();
        let schema = Arc::new(Schema::new(vec![Field::new(
            SOURCE_LINE,
            DataType::Int64,
            true,
        )]));
        let b = RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from_iter_values(lines))])
            .unwrap();
        c.add_batch(&b).unwrap();
        c
    }

    /// A part as an executor writes it, of the predictions on lines `first..`: the three
    /// files and a report.
    pub(crate) fn part(dir: &Path, first: i64, ids: &[&str]) -> PartReport {
        let stem = format!("part-{first:05}-00000000000000aa");
        let b = batch(ids);
        // Row groups of 2 rows, so a part holds several.
        let props = crate::atomic::writer_properties_with(2).unwrap();
        for kind in [CASE_RESULTS_PARQUET, FINDINGS_PARQUET] {
            let mut f = crate::atomic::ParquetFile::create_with(
                &dir.join(format!("{stem}.{kind}")),
                b.schema(),
                props.clone(),
            )
            .unwrap();
            f.write(&b).unwrap();
            f.commit().unwrap();
        }
        let jsonl: String = ids
            .iter()
            .map(|id| format!("{{\"case_id\":\"{id}\"}}\n"))
            .collect();
        std::fs::write(dir.join(format!("{stem}.{CASE_RESULTS_JSONL}")), jsonl).unwrap();
        // The summary parts of these rows, as an executor computes them.
        let rt = crate::engine::runtime().unwrap();
        let partial = rt.block_on(async {
            let mut p = crate::scoring::summary::Partials::new(case_results(ids).schema())
                .await
                .unwrap();
            p.push(&case_results(ids)).await.unwrap();
            p.finish().await.unwrap()
        });
        for (table, kind) in partial
            .tables
            .iter()
            .zip([SUMMARY_PARTIAL_PARQUET, SUMMARY_LATENCY_PARQUET])
        {
            let mut f = crate::atomic::ParquetFile::create(
                &dir.join(format!("{stem}.{kind}")),
                Arc::clone(&table.schema),
            )
            .unwrap();
            for b in &table.batches {
                f.write(b).unwrap();
            }
            f.commit().unwrap();
        }
        PartReport {
            coverage: lines(first..first + ids.len() as i64),
            findings_rows: ids.len() as u64,
            files: KINDS
                .iter()
                .map(|k| file(dir, &format!("{stem}.{k}"), k))
                .collect(),
            tally: Tally {
                rows: ids.len() as u64,
                ..Tally::default()
            },
        }
    }

    fn as_batch(reports: &[PartReport]) -> RecordBatch {
        let json: Vec<String> = reports
            .iter()
            .map(|r| serde_json::to_string(r).unwrap())
            .collect();
        RecordBatch::try_new(report_schema(), vec![Arc::new(StringArray::from(json))]).unwrap()
    }

    fn read_rows(path: &Path) -> Vec<String> {
        let f = std::fs::File::open(path).unwrap();
        let reader =
            datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f)
                .unwrap()
                .build()
                .unwrap();
        let mut out = Vec::new();
        for b in reader {
            let b = b.unwrap();
            let ids = b.column(0).as_any().downcast_ref::<StringArray>().unwrap();
            let n = b.column(1).as_any().downcast_ref::<Int64Array>().unwrap();
            for i in 0..b.num_rows() {
                out.push(format!(
                    "{}:{:?}",
                    ids.value(i),
                    n.is_valid(i).then(|| n.value(i))
                ));
            }
        }
        out
    }

    #[test]
    fn parts_are_spliced_by_first_line_without_decoding_and_committed_whole() {
        let parts = tempfile::tempdir().unwrap();
        let out = tempfile::tempdir().unwrap();
        let a = part(parts.path(), 1, &["a1", "a2", "a3"]);
        let empty = part(parts.path(), 90, &[]);
        let b = part(parts.path(), 4, &["b1", "b2", "b3", "b4", "b5"]);
        // Reports arrive in any order; an orphan part (a lost attempt) lies beside them.
        part(parts.path(), 50, &["orphan"]);
        let reports = reports(
            &[as_batch(&[b.clone(), a.clone()]), as_batch(&[empty])],
            &lines(1..9),
        )
        .unwrap();
        assert_eq!(
            reports
                .iter()
                .map(|r| r.coverage.first_line)
                .collect::<Vec<_>>(),
            [Some(1), Some(4), None]
        );
        let merged = merge(
            &reports,
            parts.path(),
            out.path(),
            Default::default(),
            Vec::new(),
        )
        .unwrap();
        // Nothing is in place before the commit.
        assert!(!out.path().join(CASE_RESULTS_PARQUET).exists());
        let mut commit = crate::atomic::FolderCommit::new(out.path());
        let mut keys = Vec::new();
        for (key, file) in merged.files().0 {
            keys.push(key);
            commit.put(file).unwrap();
        }
        commit.commit().unwrap();
        assert_eq!(
            keys,
            [
                "case_results_parquet",
                "case_results_jsonl",
                "findings_parquet"
            ]
        );
        let rows = read_rows(&out.path().join(CASE_RESULTS_PARQUET));
        assert_eq!(
            rows,
            [
                "a1:None",
                "a2:Some(1)",
                "a3:Some(2)",
                "b1:None",
                "b2:Some(1)",
                "b3:Some(2)",
                "b4:None",
                "b5:Some(4)"
            ]
        );
        assert_eq!(read_rows(&out.path().join(FINDINGS_PARQUET)), rows);
        let jsonl = std::fs::read_to_string(out.path().join(CASE_RESULTS_JSONL)).unwrap();
        assert_eq!(jsonl.lines().count(), 8);
        assert!(!jsonl.contains("orphan"));
        // The Arrow schema travels in the key-value metadata: types read back as written.
        let f = std::fs::File::open(out.path().join(CASE_RESULTS_PARQUET)).unwrap();
        let builder =
            datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f)
                .unwrap();
        assert_eq!(builder.schema().as_ref(), batch(&[]).schema().as_ref());
        assert_eq!(builder.metadata().num_row_groups(), 2 + 3);
    }

    #[test]
    fn a_part_changed_after_its_report_is_refused_and_nothing_is_committed() {
        let parts = tempfile::tempdir().unwrap();
        let out = tempfile::tempdir().unwrap();
        let a = part(parts.path(), 1, &["a1", "a2"]);
        let b = part(parts.path(), 3, &["b1"]);
        // Same size, other bytes.
        let jsonl = parts.path().join(&b.files[1].name);
        std::fs::write(&jsonl, "{\"case_id\":\"bX\"}\n").unwrap();
        let e = merge(
            &[a.clone(), b.clone()],
            parts.path(),
            out.path(),
            Default::default(),
            Vec::new(),
        )
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains(&b.files[1].name) && e.contains("sha256"), "{e}");
        // A part gone.
        std::fs::remove_file(parts.path().join(&a.files[0].name)).unwrap();
        let e = merge(
            &[a, b],
            parts.path(),
            out.path(),
            Default::default(),
            Vec::new(),
        )
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("part-00001"), "{e}");
        let left: Vec<_> = std::fs::read_dir(out.path()).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn summary_partials_are_read_only_as_reported() {
        let parts = tempfile::tempdir().unwrap();
        let a = part(parts.path(), 1, &["a1", "a2"]);
        let b = part(parts.path(), 3, &["b1"]);
        let read = summary_partials(&[a.clone(), b.clone()], parts.path()).unwrap();
        assert_eq!(read.len(), 2);
        let rows = |p: &crate::scoring::summary::Partial, i: usize| -> usize {
            p.tables[i].batches.iter().map(|b| b.num_rows()).sum()
        };
        assert_eq!((rows(&read[0], 0), rows(&read[0], 1)), (1, 2));
        let metrics = crate::engine::runtime()
            .unwrap()
            .block_on(crate::scoring::summary::from_partials(read))
            .unwrap();
        assert_eq!((metrics.total, metrics.attack_cases), (3, 3));
        assert_eq!(metrics.latency_ms.max, Some(1.0));
        // A part of another shape under the name (its digest is the report's).
        let mut other = b.clone();
        other.files[3] = other.files[0].clone();
        other.files[3].kind = SUMMARY_PARTIAL_PARQUET.into();
        let e = summary_partials(&[other], parts.path())
            .unwrap_err()
            .to_string();
        assert!(e.contains("without rows"), "{e}");
        // Partials that do not count the part's rows.
        let mut lying = b.clone();
        lying.coverage.rows = 5;
        let e = summary_partials(&[lying], parts.path())
            .unwrap_err()
            .to_string();
        assert!(e.contains("counts 1 rows, but the part holds 5"), "{e}");
        // Changed after its report.
        std::fs::write(
            parts.path().join(&a.files[3].name),
            b"PAR1 not a footer PAR1",
        )
        .unwrap();
        let e = summary_partials(&[a], parts.path())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("summary_partial.parquet") && e.contains("changed"),
            "{e}"
        );
    }

    #[test]
    fn a_report_that_lies_about_rows_is_refused() {
        let parts = tempfile::tempdir().unwrap();
        let out = tempfile::tempdir().unwrap();
        let mut a = part(parts.path(), 1, &["a1", "a2"]);
        a.coverage.rows = 3;
        let e = merge(
            &[a],
            parts.path(),
            out.path(),
            Default::default(),
            Vec::new(),
        )
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("reported 3"), "{e}");
        // The findings part is counted too.
        let mut b = part(parts.path(), 5, &["b1", "b2"]);
        b.findings_rows = 9;
        let e = merge(
            &[b],
            parts.path(),
            out.path(),
            Default::default(),
            Vec::new(),
        )
        .err()
        .unwrap()
        .to_string();
        assert!(
            e.contains("findings.parquet") && e.contains("reported 9"),
            "{e}"
        );
        assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0);
    }

    #[test]
    fn reports_must_cover_every_prediction_once_with_names_inside_the_parts_folder() {
        let parts = tempfile::tempdir().unwrap();
        let a = part(parts.path(), 1, &["a1", "a2"]);
        let b = part(parts.path(), 3, &["b1", "b2"]);
        let err =
            |batches: &[RecordBatch], c: &Coverage| reports(batches, c).unwrap_err().to_string();
        let all = lines(1..5);
        // A part lost.
        assert!(err(&[as_batch(&[a.clone()])], &all).contains("do not cover the 4 staged"));
        // The same part reported twice.
        assert!(err(&[as_batch(&[a.clone(), a.clone()])], &all).contains("twice"));
        // Another attempt of the same partition, under another name, and none of lines
        // 3–4: the rows add up to the staged count, the fingerprints do not.
        let mut again = part(parts.path(), 1, &["a1", "a2"]);
        for f in &mut again.files {
            f.name = f.name.replace("00000000000000aa", "00000000000000bb");
        }
        assert!(err(&[as_batch(&[a.clone(), again])], &all).contains("do not cover"));
        let mut evil = b.clone();
        evil.files[1].name = "../../etc/passwd.case_results.jsonl".into();
        assert!(err(&[as_batch(&[a.clone(), evil])], &all).contains("names"));
        let mut short = b.clone();
        short.files.pop();
        assert!(err(&[as_batch(&[a.clone(), short])], &all).contains("4 files"));
        let mut miscounted = b.clone();
        miscounted.tally.rows = 7;
        assert!(err(&[as_batch(&[a.clone(), miscounted])], &all).contains("counts 7 rows"));
        let garbage = RecordBatch::try_new(
            report_schema(),
            vec![Arc::new(StringArray::from(vec!["{not json"]))],
        )
        .unwrap();
        assert!(err(&[garbage], &all).contains("does not parse"));
        assert_eq!(reports(&[as_batch(&[b, a])], &all).unwrap().len(), 2);
    }
}
