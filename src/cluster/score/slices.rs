//! Predictions read by the cluster, not by the client (docs/cluster.md, "Score and query
//! on it"): the file is cut into slices — byte ranges of a JSONL file, equal runs of a
//! Parquet file's rows — each read by a task through the same validating reader a local
//! run streams ([`crate::corpus::predictions`]), in two passes:
//!
//! 1. **The survey** ([`PredictionsScanExec::survey`]): each slice's task validates its
//!    rows and returns how many lines it holds, which of them are not predictions (a
//!    run's turn lines), the key (case and attempt) of the first row of each key in it,
//!    and its counts and examples; one more task takes the file's SHA-256. The client
//!    then knows where each slice's lines stand in the file, which rows repeat a key of
//!    an earlier slice, the counts a local run reports, and the first bad line in file
//!    order (the same error a local run gives, with the same line number).
//! 2. **The scan** ([`PredictionsScanExec::scan`]), under the scoring plan: each slice is
//!    read again, told its first line and its rows that repeat an earlier slice's key,
//!    so `source_line` and `duplicate_prediction` are exactly a local run's.
//!
//! The client reads no prediction: it cuts the file by its size (or its footer), and
//! receives one small row per distinct key per slice.

use std::collections::HashSet;
use std::fmt;
use std::hash::BuildHasher;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, RecordBatch, StringBuilder, UInt64Builder,
};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use datafusion::catalog::Session;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::DataFusionError;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning,
    PlanProperties, SendableRecordBatchStream,
};
use serde::{Deserialize, Serialize};

use super::SubmitPlan;
use super::parts::Coverage;
use crate::corpus::predictions::{
    PredictionStats, PredictionsReader, Slice, Span, is_parquet, predictions_table_schema,
};
use crate::engine::stream_table::{Batches, reader_stream};
use crate::error::{Error, Result};

/// Rows per batch a slice's reader builds.
const BATCH_ROWS: usize = 8192;
/// Examples kept per kind of flagged row (as the local reader keeps).
const EXAMPLES: usize = 5;

/// A scan of a predictions file's slices on a cluster: the survey (one partition per
/// slice, and one for the file's digest) or the scan of the scoring plan (one per
/// slice, in the predictions table's schema, projected). Its input is [`numbered`]:
/// each partition learns which slice it reads.
pub struct PredictionsScanExec {
    spec: Arc<ScanSpec>,
    input: Arc<dyn ExecutionPlan>,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
}

/// What a [`PredictionsScanExec`] travels as (JSON, in pieval's plan codec), with its
/// input.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ScanSpec {
    /// The file, at a path every executor sees (absolute).
    pub path: String,
    /// The file as it was cut: every task checks it still is, before and after it reads.
    pub stamp: Stamp,
    pub slices: Vec<Slice>,
    pub survey: bool,
    pub projection: Option<Vec<usize>>,
    /// The runs file of slices whose runs did not travel in the plan ([`spill_runs`]),
    /// at a path every executor sees (absolute).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs_path: Option<String>,
}

/// A file's length and modification time, as the client saw it when it cut the file: a
/// file written to while it is scored (appended, rewritten in place) is refused by the
/// task that sees the change, never scored half old, half new.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamp {
    pub len: u64,
    pub modified_s: i64,
    pub modified_ns: u32,
    /// An object's entity tag (an `s3://` file: every range a task fetches is asked for
    /// only if the object still has it, and its size; the time fields are 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub e_tag: Option<String>,
}

impl Stamp {
    pub fn of(path: &Path) -> Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).map_err(|e| Error::io(path, "cannot read", e))?;
        Ok(Self {
            len: m.len(),
            modified_s: m.mtime(),
            modified_ns: m.mtime_nsec().clamp(0, 999_999_999) as u32,
            e_tag: None,
        })
    }

    /// An object's stamp: its size and entity tag.
    pub fn of_object(len: u64, e_tag: Option<String>) -> Self {
        Self {
            len,
            modified_s: 0,
            modified_ns: 0,
            e_tag,
        }
    }

    /// The file at `path` is still as stamped. (An object is checked by every request
    /// its reader makes: [`crate::objstore::BlockingObject`].)
    fn check(&self, path: &Path) -> Result<()> {
        if crate::objstore::is_remote(path) {
            return Ok(());
        }
        let now = Self::of(path)?;
        if now != *self {
            return Err(Error::State(format!(
                "{}: the predictions changed while they were scored ({} bytes, modified at \
                 {}.{:09}, when cut; now {} bytes, modified at {}.{:09}): score again once \
                 nothing writes to the file",
                path.display(),
                self.len,
                self.modified_s,
                self.modified_ns,
                now.len,
                now.modified_s,
                now.modified_ns
            )));
        }
        Ok(())
    }
}

impl fmt::Debug for PredictionsScanExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PredictionsScanExec")
            .field("path", &self.spec.path)
            .field("slices", &self.spec.slices.len())
            .field("survey", &self.spec.survey)
            .finish()
    }
}

/// The schema of a numbered input ([`numbered`]): the partition's number.
fn index_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new(
        "partition",
        DataType::UInt32,
        false,
    )]))
}

/// The input of a node of pieval's whose partitions each do their own work on a cluster
/// (a slice to read, a part to copy): `n` partitions of one row, the partition's number.
/// Ballista hands each task a plan restricted to its own partitions, renumbered from 0,
/// and restricts only the scans it knows (files, memory): a node of pieval's with no
/// input would be told partition 0 in every task; through this input, each partition
/// learns which it is.
pub(crate) fn numbered(n: usize) -> Result<Arc<dyn ExecutionPlan>> {
    let partitions = (0..n as u32)
        .map(|i| {
            Ok(vec![RecordBatch::try_new(
                index_schema(),
                vec![Arc::new(datafusion::arrow::array::UInt32Array::from(vec![
                    i,
                ]))],
            )?])
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(
        datafusion::datasource::memory::MemorySourceConfig::try_new_exec(
            &partitions,
            index_schema(),
            None,
        )?,
    )
}

/// Refuses an input that is not [`numbered`]'s.
pub(crate) fn check_numbered(node: &str, input: &Arc<dyn ExecutionPlan>) -> Result<()> {
    if input.schema().fields() != index_schema().fields() {
        return Err(Error::Internal(format!(
            "{node}: an input that is not partition numbers"
        )));
    }
    Ok(())
}

/// The rows of `work(i)` for each number `i` partition `partition` of a [`numbered`]
/// input holds, one after the other.
pub(crate) fn each_number(
    input: &Arc<dyn ExecutionPlan>,
    partition: usize,
    context: Arc<TaskContext>,
    schema: SchemaRef,
    work: impl Fn(usize) -> datafusion::error::Result<SendableRecordBatchStream> + Send + Sync + 'static,
) -> datafusion::error::Result<SendableRecordBatchStream> {
    use futures::{StreamExt, TryStreamExt};
    let numbers = input.execute(partition, context)?;
    let out = Arc::clone(&schema);
    let work = Arc::new(work);
    let stream = futures::stream::once(async move {
        let batches: Vec<RecordBatch> = numbers.try_collect().await?;
        let mut numbers = Vec::new();
        for b in &batches {
            numbers.extend(
                b.column(0)
                    .as_primitive::<datafusion::arrow::datatypes::UInt32Type>()
                    .values()
                    .iter()
                    .map(|&i| i as usize),
            );
        }
        Ok::<_, DataFusionError>(numbers)
    })
    .map_ok(move |numbers| {
        let (work, out) = (Arc::clone(&work), Arc::clone(&out));
        futures::stream::iter(numbers)
            .map(move |i| match work(i) {
                Ok(s) => s,
                Err(e) => Box::pin(RecordBatchStreamAdapter::new(
                    Arc::clone(&out),
                    futures::stream::once(async move { Err(e) }),
                )) as SendableRecordBatchStream,
            })
            .flatten()
    })
    .try_flatten();
    Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
}

impl PredictionsScanExec {
    /// The survey of `spans` of the file at `path`, stamped `stamp`.
    pub fn survey(path: &str, stamp: Stamp, spans: &[Span]) -> Result<Self> {
        let slices = spans
            .iter()
            .map(|&span| Slice {
                span,
                first_line: 1,
                seen_before: Vec::new(),
                runs_at: None,
            })
            .collect();
        Self::planned(ScanSpec {
            path: path.to_owned(),
            stamp,
            slices,
            survey: true,
            projection: None,
            runs_path: None,
        })
    }

    /// The scoring plan's scan of `slices`, as surveyed (their runs in the plan, or in
    /// the file at `runs_path`: [`spill_runs`]).
    pub fn scan(
        path: &str,
        stamp: Stamp,
        slices: Vec<Slice>,
        runs_path: Option<String>,
        projection: Option<Vec<usize>>,
    ) -> Result<Self> {
        Self::planned(ScanSpec {
            path: path.to_owned(),
            stamp,
            slices,
            survey: false,
            projection,
            runs_path,
        })
    }

    /// With its input: one partition per slice (and the digest's), each its number.
    fn planned(spec: ScanSpec) -> Result<Self> {
        let n = spec.slices.len() + usize::from(spec.survey);
        Self::try_new(spec, numbered(n)?)
    }

    /// Refuses a path that is not absolute UTF-8 (or an `s3://` location), a projection out of the schema, an
    /// input that is not partition numbers.
    pub fn try_new(spec: ScanSpec, input: Arc<dyn ExecutionPlan>) -> Result<Self> {
        if !super::parts::shared_location(&spec.path) {
            return Err(Error::Internal(format!(
                "PredictionsScanExec: the predictions path {:?} is not an absolute path",
                spec.path
            )));
        }
        match &spec.runs_path {
            Some(p) if !super::parts::shared_location(p) => {
                return Err(Error::Internal(format!(
                    "PredictionsScanExec: the runs path {p:?} is not an absolute path"
                )));
            }
            None if spec.slices.iter().any(|s| s.runs_at.is_some()) => {
                return Err(Error::Internal(
                    "PredictionsScanExec: slices whose runs are in a file, and no file".into(),
                ));
            }
            _ => {}
        }
        check_numbered("PredictionsScanExec", &input)?;
        let schema = if spec.survey {
            survey_schema()
        } else {
            let full = predictions_table_schema();
            match &spec.projection {
                Some(p) => Arc::new(full.project(p)?),
                None => full,
            }
        };
        let properties = PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(input.output_partitioning().partition_count()),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        Ok(Self {
            spec: Arc::new(spec),
            input,
            schema,
            properties: Arc::new(properties),
        })
    }

    pub fn spec(&self) -> &ScanSpec {
        &self.spec
    }

    pub fn input(&self) -> &Arc<dyn ExecutionPlan> {
        &self.input
    }
}

impl DisplayAs for PredictionsScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "PredictionsScanExec: {} slices of {}{}",
            self.spec.slices.len(),
            self.spec.path,
            if self.spec.survey { ", survey" } else { "" }
        )
    }
}

impl ExecutionPlan for PredictionsScanExec {
    super::parts::single_input_node!("PredictionsScanExec", from_spec);

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> datafusion::error::Result<SendableRecordBatchStream> {
        let spec = Arc::clone(&self.spec);
        let schema = Arc::clone(&self.schema);
        let out = Arc::clone(&schema);
        each_number(&self.input, partition, context, schema, move |i| {
            slice_stream(&spec, &out, i)
        })
    }
}

/// The rows of slice `i` (or, past the last slice of a survey, the file's digest).
fn slice_stream(
    spec: &ScanSpec,
    schema: &SchemaRef,
    i: usize,
) -> datafusion::error::Result<SendableRecordBatchStream> {
    let path = PathBuf::from(&spec.path);
    let out = Arc::clone(schema);
    let name = "predictions".to_owned();
    let stamp = spec.stamp.clone();
    let Some(slice) = spec.slices.get(i).cloned() else {
        if spec.survey && i == spec.slices.len() {
            return Ok(reader_stream(name, Arc::clone(schema), move || {
                // The bytes that were cut, and only those.
                use std::io::Read;
                stamp.check(&path)?;
                let file: Box<dyn Read> = match crate::objstore::Location::of(&path)? {
                    None => Box::new(crate::files::open_input(&path, "cannot open predictions")?),
                    Some(loc) => Box::new(object(&loc, &stamp)?.read_from(0)),
                };
                let (sha256, read) =
                    crate::digest::sha256_streamed(file.take(stamp.len), &path, |_| Ok(()))?;
                stamp.check(&path)?;
                if read != stamp.len {
                    return Err(Error::State(format!(
                        "{}: {read} bytes read of {}",
                        path.display(),
                        stamp.len
                    )));
                }
                let report = SliceReport {
                    sha256: Some(sha256),
                    ..SliceReport::default()
                };
                let batch = survey_batch(&out, i as u32, SurveyRows::new(), &report)?;
                Ok(Box::new(std::iter::once(Ok(batch))) as Batches)
            }));
        }
        return Err(DataFusionError::Internal(format!(
            "PredictionsScanExec: no slice {i} of {}",
            spec.slices.len()
        )));
    };
    if spec.survey {
        return Ok(reader_stream(name, Arc::clone(schema), move || {
            stamp.check(&path)?;
            let reader = open_slice(&path, &stamp, &slice)?;
            let batch = survey_slice(reader, i as u32, &out)?;
            stamp.check(&path)?;
            Ok(Box::new(std::iter::once(Ok(batch))) as Batches)
        }));
    }
    let projection = spec.projection.clone();
    let runs_path = spec.runs_path.clone();
    Ok(reader_stream(name, Arc::clone(schema), move || {
        stamp.check(&path)?;
        let mut slice = slice;
        if let (Some(at), Some(runs)) = (slice.runs_at.take(), &runs_path) {
            slice.seen_before = read_runs(Path::new(runs), &at)?;
        }
        let reader = open_slice(&path, &stamp, &slice)?;
        let rows = reader.map(move |b| match (&projection, b) {
            (Some(p), Ok(b)) => Ok(b.project(p)?),
            (_, b) => b,
        });
        // After the last batch, the file is checked again: a change while it was read
        // fails the task rather than end it.
        let after = std::iter::once(()).filter_map(move |()| stamp.check(&path).err().map(Err));
        Ok(Box::new(rows.chain(after)) as Batches)
    }))
}

/// The object at `loc`, as it was stamped when it was cut.
fn object(
    loc: &crate::objstore::Location,
    stamp: &Stamp,
) -> Result<crate::objstore::BlockingObject> {
    crate::objstore::BlockingObject::open(loc, Some((stamp.len, stamp.e_tag.as_deref())))
}

/// A reader of one slice of the predictions: of the local file, or of the object by
/// range where it lies (`s3://`: nothing copied to the executor first).
fn open_slice(path: &Path, stamp: &Stamp, slice: &Slice) -> Result<PredictionsReader> {
    match crate::objstore::Location::of(path)? {
        None => PredictionsReader::open_slice(path, BATCH_ROWS, slice),
        Some(loc) => {
            PredictionsReader::open_object_slice(object(&loc, stamp)?, path, BATCH_ROWS, slice)
        }
    }
}

/// The survey's rows: a slice's key rows (`line`, `case_id`, `attempt_id`), its lines
/// that are not predictions (`line` only), and its one report row (`report`, JSON). Lines
/// are the slice's own, from 1.
fn survey_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("slice", DataType::UInt32, false),
        Field::new("line", DataType::UInt64, true),
        Field::new("case_id", DataType::Utf8, true),
        Field::new("attempt_id", DataType::Utf8, true),
        Field::new("report", DataType::Utf8, true),
    ]))
}

/// What a slice's survey found besides its keys (or, for the last partition, the file's
/// digest).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct SliceReport {
    lines: u64,
    rows: u64,
    /// Rows repeating a key of an earlier row of the slice, and the first few (line, id).
    duplicates: u64,
    first_duplicates: Vec<(u64, String)>,
    empty_responses: u64,
    first_empty_responses: Vec<String>,
    provider_errors: u64,
    first_provider_errors: Vec<String>,
    /// The slice's first bad line (its own line number; 0: the file as a whole).
    error: Option<BadLine>,
    sha256: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct BadLine {
    line: u64,
    field: Option<String>,
    message: String,
}

/// One survey row per key row and skipped line, then the report row.
struct SurveyRows {
    line: UInt64Builder,
    case_id: StringBuilder,
    attempt_id: StringBuilder,
    rows: usize,
}

impl SurveyRows {
    fn new() -> Self {
        Self {
            line: UInt64Builder::new(),
            case_id: StringBuilder::new(),
            attempt_id: StringBuilder::new(),
            rows: 0,
        }
    }

    fn push(&mut self, line: u64, key: Option<(&str, Option<&str>)>) {
        self.line.append_value(line);
        self.case_id.append_option(key.map(|k| k.0));
        self.attempt_id.append_option(key.and_then(|k| k.1));
        self.rows += 1;
    }
}

fn survey_batch(
    schema: &SchemaRef,
    slice: u32,
    mut rows: SurveyRows,
    report: &SliceReport,
) -> Result<RecordBatch> {
    let json = serde_json::to_string(report)
        .map_err(|e| Error::Internal(format!("cannot encode a slice report: {e}")))?;
    let n = rows.rows + 1;
    rows.line.append_null();
    rows.case_id.append_null();
    rows.attempt_id.append_null();
    let mut reports = StringBuilder::new();
    for _ in 1..n {
        reports.append_null();
    }
    reports.append_value(json);
    let columns: Vec<ArrayRef> = vec![
        Arc::new(datafusion::arrow::array::UInt32Array::from(vec![slice; n])),
        Arc::new(rows.line.finish()),
        Arc::new(rows.case_id.finish()),
        Arc::new(rows.attempt_id.finish()),
        Arc::new(reports.finish()),
    ];
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}

/// Survey one slice (on an executor): read it as a local run would, from line 1.
fn survey_slice(
    mut reader: PredictionsReader,
    index: u32,
    schema: &SchemaRef,
) -> Result<RecordBatch> {
    let mut report = SliceReport::default();
    let mut rows = SurveyRows::new();
    let mut next_line = 1u64;
    for batch in reader.by_ref() {
        let batch = match batch {
            Ok(b) => b,
            Err(Error::Input {
                line,
                field,
                message,
                ..
            }) => {
                report.error = Some(BadLine {
                    line,
                    field,
                    message,
                });
                break;
            }
            Err(e) => return Err(e),
        };
        let lines = batch
            .column_by_name("source_line")
            .ok_or_else(|| Error::Internal("predictions without source_line".into()))?
            .as_primitive::<Int64Type>()
            .clone();
        let duplicate = batch
            .column_by_name("duplicate_prediction")
            .ok_or_else(|| Error::Internal("predictions without duplicate_prediction".into()))?
            .as_boolean()
            .clone();
        let ids = crate::engine::utf8_column(&batch, "case_id")?;
        let attempts = crate::engine::utf8_column(&batch, "attempt_id")?;
        for r in 0..batch.num_rows() {
            let line = lines.value(r) as u64;
            for skipped in next_line..line {
                rows.push(skipped, None);
            }
            next_line = line + 1;
            if duplicate.value(r) {
                report.duplicates += 1;
                if report.first_duplicates.len() < EXAMPLES {
                    report
                        .first_duplicates
                        .push((line, crate::text::excerpt(ids.value(r), 80)));
                }
            } else {
                let attempt = attempts.is_valid(r).then(|| attempts.value(r));
                rows.push(line, Some((ids.value(r), attempt)));
            }
        }
    }
    if report.error.is_none() {
        report.lines = reader.lines_read();
        for skipped in next_line..=report.lines {
            rows.push(skipped, None);
        }
    }
    let stats = reader.stats();
    report.rows = stats.rows;
    report.empty_responses = stats.empty_responses;
    report.first_empty_responses = stats.first_empty_responses.clone();
    report.provider_errors = stats.provider_errors;
    report.first_provider_errors = stats.first_provider_errors.clone();
    survey_batch(schema, index, rows, &report)
}

/// How to cut the file at `path` into `n` slices: equal byte ranges of a JSONL file,
/// equal runs of rows of a Parquet file (its footer is read here; a slice reads the row
/// groups that hold its rows, selecting them).
///
/// An `s3://` file is read by range (from a blocking thread of a tokio runtime:
/// `spawn_blocking`), and must still be as `stamp` records it.
pub fn spans(path: &Path, stamp: &Stamp, n: usize) -> Result<Vec<Span>> {
    let n = n.max(1);
    let remote = match crate::objstore::Location::of(path)? {
        Some(loc) => Some(object(&loc, stamp)?),
        None => None,
    };
    if !is_parquet(path) {
        let size = match &remote {
            Some(object) => object.stamp().0,
            None => std::fs::metadata(path)
                .map_err(|e| Error::io(path, "cannot read predictions", e))?
                .len(),
        };
        let at = |i: usize| (u128::from(size) * i as u128 / n as u128) as u64;
        return Ok((0..n)
            .map(|i| Span::Bytes {
                start: at(i),
                end: at(i + 1),
            })
            .collect());
    }
    let limits = crate::rundir::bounds::ParquetLimits::from_env()?;
    let meta = match &remote {
        // The footer's checks only: each task walks the page headers of its own row
        // groups before it decodes them (a file on object storage is not read whole here).
        Some(object) => crate::rundir::bounds::check_parquet_groups(
            object,
            object.stamp().0,
            path,
            &limits,
            Some(&[]),
        )?,
        None => {
            crate::rundir::bounds::check_parquet_file(path, crate::files::Links::Follow, &limits)?
        }
    };
    let rows = meta
        .row_groups()
        .iter()
        .map(|g| u64::try_from(g.num_rows()))
        .sum::<std::result::Result<u64, _>>()
        .map_err(|_| Error::config(path, "a negative row count in its footer"))?;
    let at = |i: usize| (u128::from(rows) * i as u128 / n as u128) as u64;
    Ok((0..n)
        .map(|i| Span::Rows {
            start: at(i),
            end: at(i + 1),
        })
        .collect())
}

/// What the survey told the client: the slices to scan, the counts a local run reports,
/// and which `source_line`s the scored parts must cover.
pub struct Surveyed {
    pub slices: Vec<Slice>,
    pub stats: PredictionStats,
    pub coverage: Coverage,
}

/// Survey the file at `path` (as the executors see it) cut at `spans`; `shown` is the
/// path the user gave, which messages and the report name.
pub async fn survey(
    submit: &SubmitPlan,
    path: &str,
    stamp: Stamp,
    shown: &Path,
    spans: &[Span],
) -> Result<Surveyed> {
    use futures::TryStreamExt;
    let plan = Arc::new(PredictionsScanExec::survey(path, stamp, spans)?);
    let root =
        Arc::new(datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec::new(plan));
    let batches: Vec<RecordBatch> = submit(root).await?.try_collect().await?;
    surveyed(&batches, shown, spans)
}

/// The survey's rows, put together: checked (one report per slice and one digest),
/// slice by slice in file order.
fn surveyed(batches: &[RecordBatch], shown: &Path, spans: &[Span]) -> Result<Surveyed> {
    let bad =
        |what: String| Error::Query(format!("the cluster's survey of the predictions: {what}"));
    let n = spans.len();
    let mut reports: Vec<Option<SliceReport>> = vec![None; n + 1];
    // (line, batch, row) of each slice's key rows and skipped lines.
    let mut rows: Vec<Vec<(u64, u32, u32)>> = vec![Vec::new(); n];
    for (b, batch) in batches.iter().enumerate() {
        if batch.schema().fields() != survey_schema().fields() {
            return Err(bad("rows of another shape".into()));
        }
        let slice = batch
            .column(0)
            .as_primitive::<datafusion::arrow::datatypes::UInt32Type>();
        let line = batch
            .column(1)
            .as_primitive::<datafusion::arrow::datatypes::UInt64Type>();
        let report = batch.column(4).as_string::<i32>();
        for r in 0..batch.num_rows() {
            let s = slice.value(r) as usize;
            if s > n {
                return Err(bad(format!("a row of slice {s} of {n}")));
            }
            if report.is_valid(r) {
                let parsed: SliceReport = serde_json::from_str(report.value(r))
                    .map_err(|e| bad(format!("a report that does not parse: {e}")))?;
                if reports[s].replace(parsed).is_some() {
                    return Err(bad(format!("slice {s} reported twice")));
                }
            } else if s < n && line.is_valid(r) {
                rows[s].push((line.value(r), b as u32, r as u32));
            } else {
                return Err(bad(format!("a row of slice {s} without a line")));
            }
        }
    }
    let mut reports = reports
        .into_iter()
        .enumerate()
        .map(|(s, r)| r.ok_or_else(|| bad(format!("no report of slice {s}"))))
        .collect::<Result<Vec<_>>>()?;
    let digest = reports
        .pop()
        .and_then(|r| r.sha256)
        .ok_or_else(|| bad("no digest".into()))?;
    // The first bad line in file order is the one a local run reports.
    let mut first_line = 1u64;
    for report in &reports {
        if let Some(e) = &report.error {
            let line = if e.line == 0 {
                0
            } else {
                first_line + e.line - 1
            };
            return Err(Error::input(
                shown,
                line,
                e.field.as_deref(),
                e.message.clone(),
            ));
        }
        first_line += report.lines;
    }
    let mut stats = PredictionStats {
        path: shown.to_path_buf(),
        sha256: digest,
        ..PredictionStats::default()
    };
    let mut slices = Vec::with_capacity(n);
    let mut coverage = Coverage::default();
    let mut dup_examples: Vec<(u64, String)> = Vec::new();
    let hasher = (
        std::collections::hash_map::RandomState::new(),
        std::collections::hash_map::RandomState::new(),
    );
    let mut seen: HashSet<u128> = HashSet::new();
    let mut first_line = 1u64;
    for (s, report) in reports.iter().enumerate() {
        let keys = &mut rows[s];
        keys.sort_unstable();
        let (mut seen_before, mut repeated) = (Vec::<[u64; 2]>::new(), 0u64);
        // Whether the last key row was a repeat: a run goes on over the lines between two
        // repeats that are not key rows (turn lines, repeats within the slice), which the
        // reader never looks up (turn lines) or flags anyway (repeats).
        let mut in_run = false;
        let abs = |l: u64| (first_line + l - 1) as i64;
        // Every line but the turn lines is a prediction the parts must cover.
        let (mut skipped, mut covered_to, mut last) = (0u64, 1u64, 0u64);
        for &(line, b, r) in keys.iter() {
            if line <= last || line > report.lines {
                return Err(bad(format!(
                    "slice {s}: line {line} repeated or past its {} lines",
                    report.lines
                )));
            }
            last = line;
            let batch = &batches[b as usize];
            let ids = batch.column(2).as_string::<i32>();
            let attempts = batch.column(3).as_string::<i32>();
            let r = r as usize;
            if ids.is_null(r) {
                for l in covered_to..line {
                    coverage.add_line(Some(abs(l)));
                }
                covered_to = line + 1;
                skipped += 1;
                continue;
            }
            let key = (
                ids.value(r),
                attempts.is_valid(r).then(|| attempts.value(r)),
            );
            let h = ((hasher.0.hash_one(key) as u128) << 64) | hasher.1.hash_one(key) as u128;
            if seen.insert(h) {
                in_run = false;
            } else {
                let line = abs(line) as u64;
                match seen_before.last_mut() {
                    Some(run) if in_run => run[1] = line,
                    _ => seen_before.push([line, line]),
                }
                in_run = true;
                repeated += 1;
                if dup_examples.len() < EXAMPLES {
                    dup_examples.push((line, crate::text::excerpt(key.0, 80)));
                }
            }
        }
        for l in covered_to..=report.lines {
            coverage.add_line(Some(abs(l)));
        }
        let predictions = report.lines - skipped;
        if predictions != report.rows {
            return Err(bad(format!(
                "slice {s} counts {} predictions in {} lines, {skipped} of them turn lines",
                report.rows, report.lines
            )));
        }
        stats.rows += report.rows;
        stats.duplicates += report.duplicates + repeated;
        dup_examples.extend(
            report
                .first_duplicates
                .iter()
                .map(|(l, id)| (first_line + l - 1, id.clone())),
        );
        dup_examples.sort_unstable();
        dup_examples.truncate(EXAMPLES);
        for (count, examples, theirs, their_examples) in [
            (
                &mut stats.empty_responses,
                &mut stats.first_empty_responses,
                report.empty_responses,
                &report.first_empty_responses,
            ),
            (
                &mut stats.provider_errors,
                &mut stats.first_provider_errors,
                report.provider_errors,
                &report.first_provider_errors,
            ),
        ] {
            *count += theirs;
            let room = EXAMPLES.saturating_sub(examples.len());
            examples.extend(their_examples.iter().take(room).cloned());
        }
        slices.push(Slice {
            span: spans[s],
            first_line,
            seen_before,
            runs_at: None,
        });
        first_line += report.lines;
    }
    stats.first_duplicates = dup_examples.into_iter().map(|(_, id)| id).collect();
    Ok(Surveyed {
        slices,
        stats,
        coverage,
    })
}

/// The most repeated-row runs that travel in the scan plan (about 20 bytes each, and
/// every task receives the whole plan, under the scheduler's 16 MiB message limit).
pub const RUNS_IN_PLAN: usize = 4096;

/// The name of the runs file in the staging folder ([`spill_runs`]).
pub const RUNS_FILE: &str = "seen_before.runs";

/// When the slices' repeated-row runs number more than `max_in_plan` (a file whose
/// repeats alternate with new keys: one run per repeat), write them into `dir` (the
/// staging folder, which the executors see) and leave each slice only where its runs
/// are and their SHA-256; each task reads its own. The file's path, if one was written.
pub fn spill_runs(slices: &mut [Slice], dir: &Path, max_in_plan: usize) -> Result<Option<PathBuf>> {
    use std::io::Write;
    let total: usize = slices.iter().map(|s| s.seen_before.len()).sum();
    if total <= max_in_plan {
        return Ok(None);
    }
    let path = dir.join(RUNS_FILE);
    let mut file = crate::atomic::TempFile::create(&path)?;
    let mut offset = 0u64;
    for slice in slices.iter_mut().filter(|s| !s.seen_before.is_empty()) {
        let mut bytes = Vec::with_capacity(slice.seen_before.len() * 16);
        for [first, last] in &slice.seen_before {
            bytes.extend_from_slice(&first.to_le_bytes());
            bytes.extend_from_slice(&last.to_le_bytes());
        }
        file.write_all(&bytes)
            .map_err(|e| Error::io(&path, "cannot write", e))?;
        slice.runs_at = Some(crate::corpus::predictions::RunsAt {
            offset,
            count: slice.seen_before.len() as u64,
            sha256: crate::digest::sha256_hex(&bytes),
        });
        offset += bytes.len() as u64;
        slice.seen_before = Vec::new();
    }
    file.commit()?;
    Ok(Some(path))
}

/// A slice's runs from the runs file, as the client wrote them: their bytes' SHA-256
/// checked, sorted and disjoint.
fn read_runs(path: &Path, at: &crate::corpus::predictions::RunsAt) -> Result<Vec<[u64; 2]>> {
    use std::io::{Read, Seek, SeekFrom};
    let bad = |why: String| {
        Error::State(format!(
            "{}: the repeated rows of a slice {why}",
            path.display()
        ))
    };
    let past_end = |size: u64| {
        bad(format!(
            "are {} runs from byte {}, past the end of the file ({size} bytes)",
            at.count, at.offset
        ))
    };
    // Within the file before anything is allocated for them.
    let within = |size: u64| {
        at.count
            .checked_mul(16)
            .filter(|&n| at.offset.checked_add(n).is_some_and(|end| end <= size))
            .ok_or_else(|| past_end(size))
    };
    let (bytes, len) = match crate::objstore::Location::of(path)? {
        Some(loc) => {
            let object = crate::objstore::BlockingObject::open(&loc, None)?;
            let len = within(object.stamp().0)?;
            (object.range(at.offset, at.offset + len)?.to_vec(), len)
        }
        None => {
            let mut file = crate::files::open_regular(path, crate::files::Links::Refuse)?;
            let size = file
                .metadata()
                .map_err(|e| Error::io(path, "cannot read", e))?
                .len();
            let len = within(size)?;
            file.seek(SeekFrom::Start(at.offset))
                .map_err(|e| Error::io(path, "cannot read", e))?;
            let mut bytes = Vec::with_capacity(len as usize);
            file.take(len)
                .read_to_end(&mut bytes)
                .map_err(|e| Error::io(path, "cannot read", e))?;
            (bytes, len)
        }
    };
    if bytes.len() as u64 != len || crate::digest::sha256_hex(&bytes) != at.sha256 {
        return Err(bad(
            "are not what the client wrote (the file changed)".into()
        ));
    }
    let runs: Vec<[u64; 2]> = bytes
        .chunks_exact(16)
        .map(|c| {
            let n = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
            [n(&c[..8]), n(&c[8..])]
        })
        .collect();
    let ordered = runs.iter().all(|[a, b]| a <= b) && runs.windows(2).all(|w| w[0][1] < w[1][0]);
    if !ordered {
        return Err(bad("are not sorted, disjoint runs".into()));
    }
    Ok(runs)
}

/// `predictions` for the scoring plan on a cluster: the surveyed slices, scanned by the
/// executors.
#[derive(Debug)]
pub struct SlicedPredictions {
    pub path: String,
    pub stamp: Stamp,
    pub slices: Vec<Slice>,
    /// Where the slices' runs are when they do not travel in the plan ([`spill_runs`]).
    pub runs_path: Option<String>,
}

#[async_trait::async_trait]
impl TableProvider for SlicedPredictions {
    fn schema(&self) -> SchemaRef {
        predictions_table_schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(PredictionsScanExec::scan(
            &self.path,
            self.stamp.clone(),
            self.slices.clone(),
            self.runs_path.clone(),
            projection.cloned(),
        )?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::compute::{concat_batches, sort_to_indices, take_record_batch};
    use futures::TryStreamExt;

    /// Every partition of `plan` run here, as executors would, last first: nothing may
    /// depend on the order partitions come back in.
    async fn run_all(plan: Arc<dyn ExecutionPlan>) -> Result<Vec<RecordBatch>> {
        let ctx = datafusion::prelude::SessionContext::new();
        let n = plan.properties().partitioning.partition_count();
        let mut out = Vec::new();
        for p in (0..n).rev() {
            let stream = plan.execute(p, ctx.task_ctx())?;
            out.extend(stream.try_collect::<Vec<_>>().await?);
        }
        Ok(out)
    }

    /// Rows in `source_line` order.
    fn by_line(batches: &[RecordBatch]) -> RecordBatch {
        let all = concat_batches(&predictions_table_schema(), batches).unwrap();
        let order =
            sort_to_indices(all.column_by_name("source_line").unwrap(), None, None).unwrap();
        take_record_batch(&all, &order).unwrap()
    }

    /// The file read whole in this process, as a local run does.
    fn whole(path: &Path) -> Result<(RecordBatch, PredictionStats, Coverage)> {
        let mut reader = PredictionsReader::open(path, 3)?;
        let batches = reader.by_ref().collect::<Result<Vec<_>>>()?;
        let mut coverage = Coverage::default();
        for b in &batches {
            coverage.add_batch(b)?;
        }
        Ok((by_line(&batches), reader.stats().clone(), coverage))
    }

    /// The survey's rows of the file cut at `spans`, run here.
    fn survey_rows(path: &Path, spans: &[Span]) -> Result<Vec<RecordBatch>> {
        let plan = PredictionsScanExec::survey(path.to_str().unwrap(), Stamp::of(path)?, spans)?;
        crate::engine::runtime()?.block_on(run_all(Arc::new(plan)))
    }

    /// The file read in `n` slices: surveyed, then scanned.
    fn sliced(path: &Path, n: usize) -> Result<(RecordBatch, PredictionStats, Coverage)> {
        sliced_with(path, n, None)
    }

    /// [`sliced`], the slices' runs written to a runs file in `spill` (then read by each
    /// slice's scan) when there are any.
    fn sliced_with(
        path: &Path,
        n: usize,
        spill: Option<&Path>,
    ) -> Result<(RecordBatch, PredictionStats, Coverage)> {
        let rt = crate::engine::runtime()?;
        rt.block_on(async {
            let text = path.to_str().unwrap();
            let stamp = Stamp::of(path)?;
            let spans = spans(path, &stamp, n)?;
            let survey = run_all(Arc::new(PredictionsScanExec::survey(
                text,
                stamp.clone(),
                &spans,
            )?))
            .await?;
            let mut s = surveyed(&survey, path, &spans)?;
            let runs = match spill {
                Some(dir) => {
                    spill_runs(&mut s.slices, dir, 0)?.map(|p| p.to_str().unwrap().to_owned())
                }
                None => None,
            };
            let scan = run_all(Arc::new(PredictionsScanExec::scan(
                text, stamp, s.slices, runs, None,
            )?))
            .await?;
            Ok((by_line(&scan), s.stats, s.coverage))
        })
    }

    /// Lines of every kind: keys repeated near and far (across any cut), attempts of one
    /// case, a run's turn lines, empty responses, provider errors, CRLF, a last line
    /// without its newline.
    fn lines(n: usize) -> String {
        let mut rng = fastrand::Rng::with_seed(7);
        let mut text = String::new();
        for i in 0..n {
            let line = match rng.u8(..10) {
                0 => format!(
                    r#"{{"pieval_record":"turn","case_id":"c{}","turn":1,"text":"hi"}}"#,
                    rng.usize(..n)
                ),
                1 => format!(
                    r#"{{"case_id":"c{}","attempt_id":"a{}","response_text":"try {i}"}}"#,
                    rng.usize(..8),
                    rng.u8(..3)
                ),
                2 => format!(
                    r#"{{"case_id":"c{}","response_text":"","error":"HTTP 500"}}"#,
                    rng.usize(..n)
                ),
                3 => format!(
                    r#"{{"case_id":"c{}","response_text":null,"latency_ms":{i}}}"#,
                    rng.usize(..n)
                ),
                _ => format!(
                    r#"{{"case_id":"c{}","response_text":"{}","latency_ms":{}.5}}"#,
                    rng.usize(..n),
                    "word ".repeat(rng.usize(..40)),
                    i
                ),
            };
            text.push_str(&line);
            text.push_str(if i % 11 == 0 { "\r\n" } else { "\n" });
        }
        text.pop();
        text
    }

    #[test]
    fn slices_read_as_the_whole_file_reads_whatever_the_cut() {
        let dir = tempfile::tempdir().unwrap();
        let jsonl = dir.path().join("p.jsonl");
        std::fs::write(&jsonl, lines(300)).unwrap();
        let (rows, stats, coverage) = whole(&jsonl).unwrap();
        assert!(stats.duplicates > 20 && stats.rows > 200, "{stats:?}");
        assert!(rows.num_rows() < 300, "turn lines are not predictions");
        // More slices than lines too: empty slices, slices inside one line.
        // And with the repeated rows' runs read from a runs file, not the plan.
        let spill = dir.path().join("staging");
        std::fs::create_dir(&spill).unwrap();
        for n in [1, 2, 3, 7, 16, 301, 2000] {
            for from in [None, Some(spill.as_path())] {
                let (r, s, c) = sliced_with(&jsonl, n, from).unwrap();
                assert_eq!(r, rows, "{n} slices, {from:?}");
                assert_eq!(format!("{s:?}"), format!("{stats:?}"), "{n} slices");
                assert_eq!(c, coverage, "{n} slices");
            }
        }

        // Parquet: slices of rows across row groups of 7, row numbers as lines.
        let parquet = dir.path().join("p.parquet");
        let contract: Vec<usize> = (0..rows.num_columns() - 2).collect();
        let file = std::fs::File::create(&parquet).unwrap();
        let props = datafusion::parquet::file::properties::WriterProperties::builder()
            .set_max_row_group_row_count(Some(7))
            .build();
        let batch = rows.project(&contract).unwrap();
        let mut w =
            datafusion::parquet::arrow::ArrowWriter::try_new(file, batch.schema(), Some(props))
                .unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let (rows, stats, coverage) = whole(&parquet).unwrap();
        for n in [1, 2, 5, 13, 100] {
            let (r, s, c) = sliced(&parquet, n).unwrap();
            assert_eq!(r, rows, "{n} slices");
            assert_eq!(format!("{s:?}"), format!("{stats:?}"), "{n} slices");
            assert_eq!(c, coverage, "{n} slices");
        }
    }

    #[test]
    fn runs_too_many_for_the_plan_go_in_a_file_each_task_checks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.jsonl");
        // Repeats alternating with new keys: one run per repeat.
        let text: String = (0..600)
            .map(|i| {
                let key = if i % 2 == 1 && i > 300 { i - 301 } else { i };
                format!("{{\"case_id\":\"c{key}\",\"response_text\":\"r\"}}\n")
            })
            .collect();
        std::fs::write(&path, text).unwrap();
        let (rows, stats, _) = whole(&path).unwrap();
        assert_eq!(stats.duplicates, 150);
        let spans = spans(&path, &Stamp::of(&path).unwrap(), 4).unwrap();
        let survey = survey_rows(&path, &spans).unwrap();
        let mut s = surveyed(&survey, &path, &spans).unwrap();
        let total: usize = s.slices.iter().map(|s| s.seen_before.len()).sum();
        assert!(total > 100, "{total} runs");
        // Under the limit, nothing is written; over it, every run moves to the file.
        let staging = dir.path().join("staging");
        std::fs::create_dir(&staging).unwrap();
        assert_eq!(spill_runs(&mut s.slices, &staging, total).unwrap(), None);
        let runs = spill_runs(&mut s.slices, &staging, total - 1)
            .unwrap()
            .unwrap();
        assert!(s.slices.iter().all(|s| s.seen_before.is_empty()));
        assert_eq!(std::fs::metadata(&runs).unwrap().len(), total as u64 * 16);
        let stamp = Stamp::of(&path).unwrap();
        let scan = |slices: Vec<Slice>, runs: Option<&Path>| {
            let plan = PredictionsScanExec::scan(
                path.to_str().unwrap(),
                stamp.clone(),
                slices,
                runs.map(|p| p.to_str().unwrap().to_owned()),
                None,
            )?;
            crate::engine::runtime()?.block_on(run_all(Arc::new(plan)))
        };
        assert_eq!(by_line(&scan(s.slices.clone(), Some(&runs)).unwrap()), rows);
        // The plan is refused without the file, and a task refuses a file changed since.
        assert!(scan(s.slices.clone(), None).is_err());
        let mut bytes = std::fs::read(&runs).unwrap();
        bytes[20] ^= 1;
        std::fs::write(&runs, &bytes).unwrap();
        let err = scan(s.slices.clone(), Some(&runs)).unwrap_err().to_string();
        assert!(err.contains("not what the client wrote"), "{err}");
        // Cut short (the bytes as written, less the last run): past the end of the file.
        bytes[20] ^= 1;
        std::fs::write(&runs, &bytes[..bytes.len() - 16]).unwrap();
        let err = scan(s.slices.clone(), Some(&runs)).unwrap_err().to_string();
        assert!(err.contains("past the end of the file"), "{err}");
        // A forged count is refused before anything is allocated for it.
        let mut forged = s.slices.clone();
        let last = forged
            .iter_mut()
            .rev()
            .find(|s| s.runs_at.is_some())
            .unwrap();
        last.runs_at.as_mut().unwrap().count = u64::MAX / 8;
        std::fs::write(&runs, &bytes).unwrap();
        let err = scan(forged, Some(&runs)).unwrap_err().to_string();
        assert!(err.contains("past the end of the file"), "{err}");
        // A runs file that is a symbolic link is not read.
        #[cfg(unix)]
        {
            let link = staging.join("link.runs");
            std::os::unix::fs::symlink(&runs, &link).unwrap();
            assert!(scan(s.slices, Some(&link)).is_err());
        }
    }

    #[test]
    fn a_file_appended_to_itself_repeats_in_a_run_a_slice() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.jsonl");
        let half: String = (0..400)
            .map(|i| format!("{{\"case_id\":\"c{i}\",\"response_text\":\"r\"}}\n"))
            .collect();
        std::fs::write(&path, format!("{half}{half}")).unwrap();
        let (rows, stats, coverage) = whole(&path).unwrap();
        assert_eq!(stats.duplicates, 400);
        let spans = spans(&path, &Stamp::of(&path).unwrap(), 4).unwrap();
        let survey = survey_rows(&path, &spans).unwrap();
        let s = surveyed(&survey, &path, &spans).unwrap();
        // The second half's slices: one run each, whatever their length.
        let runs: Vec<usize> = s.slices.iter().map(|s| s.seen_before.len()).collect();
        assert_eq!(runs, [0, 0, 1, 1]);
        assert_eq!(s.slices[3].seen_before[0][1], 800);
        assert_eq!(s.coverage, coverage);
        let (r, st, _) = sliced(&path, 4).unwrap();
        assert_eq!((r, format!("{st:?}")), (rows, format!("{stats:?}")));
        // Membership in runs.
        let runs = [[3, 5], [9, 9], [11, 12]];
        let inside: Vec<u64> = (0..15)
            .filter(|&x| crate::corpus::predictions::in_runs(&runs, x))
            .collect();
        assert_eq!(inside, [3, 4, 5, 9, 11, 12]);

        // A run's checkpoint (a turn line after each prediction) appended to itself: the
        // turn lines do not break the runs.
        let half: String = (0..200)
            .map(|i| {
                format!(
                    "{{\"case_id\":\"c{i}\",\"response_text\":\"r\"}}\n\
                     {{\"pieval_record\":\"turn\",\"case_id\":\"c{i}\"}}\n"
                )
            })
            .collect();
        std::fs::write(&path, format!("{half}{half}")).unwrap();
        let spans = super::spans(&path, &Stamp::of(&path).unwrap(), 4).unwrap();
        let survey = survey_rows(&path, &spans).unwrap();
        let s = surveyed(&survey, &path, &spans).unwrap();
        let runs: Vec<usize> = s.slices.iter().map(|s| s.seen_before.len()).collect();
        assert_eq!(runs, [0, 0, 1, 1]);
        let (rows, stats, _) = whole(&path).unwrap();
        let (r, st, _) = sliced(&path, 4).unwrap();
        assert_eq!((r, format!("{st:?}")), (rows, format!("{stats:?}")));
    }

    /// A file written to while it is scored: the task that sees it refuses it.
    #[test]
    fn a_file_changed_after_it_was_cut_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.jsonl");
        std::fs::write(&path, lines(60)).unwrap();
        let stamp = Stamp::of(&path).unwrap();
        let spans = spans(&path, &Stamp::of(&path).unwrap(), 2).unwrap();
        let text = path.to_str().unwrap();
        let rt = crate::engine::runtime().unwrap();
        // Appended after the cut.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        std::io::Write::write_all(&mut f, b"\n{\"case_id\":\"late\"}\n").unwrap();
        drop(f);
        let e = rt
            .block_on(run_all(Arc::new(
                PredictionsScanExec::survey(text, stamp.clone(), &spans).unwrap(),
            )))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("the predictions changed while they were scored"),
            "{e}"
        );
        let e = rt
            .block_on(run_all(Arc::new(
                PredictionsScanExec::scan(text, stamp.clone(), Vec::new(), None, None).unwrap(),
            )))
            .map(|_| ())
            .and_then(|()| {
                rt.block_on(run_all(Arc::new(
                    PredictionsScanExec::scan(
                        text,
                        stamp,
                        vec![Slice {
                            span: spans[0],
                            first_line: 1,
                            seen_before: Vec::new(),
                            runs_at: None,
                        }],
                        None,
                        None,
                    )
                    .unwrap(),
                )))
                .map(|_| ())
            })
            .unwrap_err()
            .to_string();
        assert!(e.contains("changed while they were scored"), "{e}");
    }

    #[test]
    fn a_bad_line_is_the_one_a_local_run_names() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.jsonl");
        let good = lines(120);
        let mut text: Vec<String> = good.lines().map(str::to_owned).collect();
        text[40] = r#"{"case_id": "c1", "response_text": 7}"#.into();
        text[90] = "{not json".into();
        let long = format!(
            r#"{{"case_id":"c2","response_text":"{}"}}"#,
            "x".repeat(17 << 20)
        );
        for (bad, also) in [(40, None), (90, None), (3, Some(long))] {
            let mut t = text.clone();
            if let Some(l) = &also {
                t[bad] = l.clone();
            }
            let only_later = bad != 40;
            if only_later {
                t[40] = good.lines().nth(40).unwrap().to_owned();
            }
            std::fs::write(&path, t.join("\n")).unwrap();
            let local = whole(&path).unwrap_err().to_string();
            assert!(local.contains(&format!(":{}:", bad + 1)), "{local}");
            for n in [1, 3, 8] {
                let e = sliced(&path, n).unwrap_err().to_string();
                assert_eq!(e, local, "{n} slices");
            }
        }
    }

    #[test]
    fn a_survey_that_does_not_add_up_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.jsonl");
        std::fs::write(&path, lines(50)).unwrap();
        let spans = spans(&path, &Stamp::of(&path).unwrap(), 3).unwrap();
        let survey = survey_rows(&path, &spans).unwrap();
        assert!(surveyed(&survey, &path, &spans).is_ok());
        // A slice missing (a lost task), or reported twice.
        let e = surveyed(&survey[1..], &path, &spans)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("no report of slice"), "{e}");
        let mut twice = survey.clone();
        twice.push(survey[0].clone());
        let e = surveyed(&twice, &path, &spans).err().unwrap().to_string();
        assert!(e.contains("reported twice"), "{e}");
        // A row past the slice's lines (the first slice: the last partition run).
        let last = survey.len() - 1;
        let b = &survey[last];
        let mut columns = b.columns().to_vec();
        let lines = b
            .column(1)
            .as_primitive::<datafusion::arrow::datatypes::UInt64Type>();
        columns[1] = Arc::new(datafusion::arrow::array::UInt64Array::from_iter(
            lines.iter().map(|l| l.map(|l| l + 1000)),
        ));
        let mut bent = survey.clone();
        bent[last] = RecordBatch::try_new(b.schema(), columns).unwrap();
        let e = surveyed(&bent, &path, &spans).err().unwrap().to_string();
        assert!(e.contains("past its"), "{e}");
    }
}
