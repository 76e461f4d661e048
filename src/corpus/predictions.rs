//! Predictions, the input of scoring: JSONL or Parquet (by extension) → Arrow batches
//! of the predictions schema, plus two columns the stream computes so SQL never needs a
//! window over millions of rows: `duplicate_prediction` (this `case_id` was seen on an
//! earlier row) and `source_line` (the line or row it came from).
//!
//! A malformed line (invalid JSON or UTF-8, no `case_id`, a field of the wrong type, a
//! line over 16 MiB) is an error naming file, line and field: scoring stops before
//! anything is written. A run's turn lines (`"pieval_record": "turn"`, the transcripts
//! of multi-turn attempts) are skipped: they are not predictions. A
//! null or empty response, an unknown case or a duplicate is not an error: the row is
//! kept and flagged for review by `queries/score_cases.sql`.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::fs::File;
use std::hash::BuildHasher;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanBuilder, Float64Builder, Int64Array, Int64Builder,
    RecordBatch, StringArray, StringBuilder, new_null_array,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Float64Type, Schema, SchemaRef};
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde::{Deserialize, Serialize};

use crate::contract::arrow::predictions_schema;
use crate::contract::fields::{PREDICTION_FIELDS, PredictionType, prediction_field_type};
use crate::contract::record::{FieldValue, FlatRecord};
use crate::corpus::lines::{Line, LineReader};
use crate::error::{Error, Result};
use crate::rundir::checkpoint::{MAX_LINE_BYTES, RECORD_KEY, TURN_LINE, TURN_PART_LINE};

/// How many ids to keep as examples per kind of flagged row.
const EXAMPLES: usize = 5;

/// The streamed table's schema: the contract's predictions schema + the two flags.
pub fn predictions_table_schema() -> SchemaRef {
    let mut fields: Vec<Field> = predictions_schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new("duplicate_prediction", DataType::Boolean, false));
    fields.push(Field::new("source_line", DataType::Int64, false));
    Arc::new(Schema::new(fields))
}

/// What the stream saw, for the score report.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PredictionStats {
    pub path: PathBuf,
    pub sha256: String,
    pub rows: u64,
    pub duplicates: u64,
    pub first_duplicates: Vec<String>,
    pub empty_responses: u64,
    pub first_empty_responses: Vec<String>,
    pub provider_errors: u64,
    pub first_provider_errors: Vec<String>,
}

fn note(count: &mut u64, examples: &mut Vec<String>, id: &str) {
    *count += 1;
    if examples.len() < EXAMPLES {
        examples.push(crate::text::excerpt(id, 80));
    }
}

enum Source {
    Jsonl(Box<LineReader<Box<dyn std::io::Read + Send>>>),
    /// Arrow batches: a Parquet file's, or a caller's (a Python table: [`PredictionsReader::from_batches`]).
    Parquet {
        reader: Batches,
        next_row: u64,
    },
}

/// Arrow record batches, as a Parquet reader or an Arrow C stream gives them.
pub type Batches = Box<
    dyn Iterator<Item = std::result::Result<RecordBatch, datafusion::arrow::error::ArrowError>>
        + Send,
>;

pub struct PredictionsReader {
    source: Source,
    batch_size: usize,
    sink: Sink,
    done: bool,
}

/// Everything but the input, so a row borrowed from the input can be accepted.
struct Sink {
    builders: Builders,
    seen: (RandomState, RandomState, HashMap<u128, ()>),
    /// `source_line`s whose key came on an earlier slice ([`Slice::seen_before`]).
    seen_before: Vec<[u64; 2]>,
    stats: PredictionStats,
    /// The `source_line` of the first line read, and how many lines the reader had
    /// counted before it (a slice's partial first line).
    first_line: u64,
    skip_lines: u64,
    /// Where a slice ends, in bytes the line reader has consumed: a line starting there
    /// or later belongs to the next slice.
    stop_at: Option<u64>,
}

/// A part of a predictions file read on its own, by a task on a cluster: a byte range
/// of a JSONL file (the lines that start in it) or a run of a Parquet file's row groups.
/// Read with where its lines stand in the whole file and which of its rows repeat a key
/// of an earlier slice, its rows are exactly the whole file's rows there —
/// `duplicate_prediction` and `source_line` included (docs/cluster.md).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slice {
    pub span: Span,
    /// The `source_line` of its first line (or row).
    pub first_line: u64,
    /// `source_line`s of its rows whose key (case and attempt) came on an earlier slice,
    /// as sorted, disjoint runs `[first, last]` (a file appended to itself is one run a
    /// slice, not a line each: the plan carrying them travels to every task). A run may
    /// cover lines that are not such rows but are never looked up (turn lines) or are
    /// flagged anyway (later rows of a key already in the slice, which the reader finds).
    pub seen_before: Vec<[u64; 2]>,
    /// Where `seen_before` is, when too many runs to travel in the plan: written by the
    /// client into a file of the staging folder, read by the slice's task
    /// (`cluster::score::slices::spill_runs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs_at: Option<RunsAt>,
}

/// A slice's repeated-row runs in the runs file: `count` pairs of little-endian u64
/// (`[first, last]`) from byte `offset`, whose SHA-256 is `sha256`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunsAt {
    pub offset: u64,
    pub count: u64,
    pub sha256: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Span {
    /// JSONL: the lines whose first byte is in `start..end`.
    Bytes { start: u64, end: u64 },
    /// Parquet: rows `start..end` (from 0, in file order), whichever row groups hold
    /// them.
    Rows { start: u64, end: u64 },
}

struct Builders {
    columns: Vec<Column>,
    duplicate: BooleanBuilder,
    line: Int64Builder,
    rows: usize,
    /// Bytes of text in the rows so far (a batch ends at [`BATCH_TEXT_BYTES`]).
    bytes: usize,
}

/// A JSONL batch's text at most (it also ends at the reader's row count): a batch of
/// 8,192 agent transcripts (46 KB each in the 1 GB Inspect log's predictions) is 377 MB,
/// and scoring holds several batches at once (each partition's, the join's output, the
/// detectors'). 16 MiB is 8,192 rows of 2 KB: the bench generator's ~1 KB responses
/// still come 8,192 a batch.
const BATCH_TEXT_BYTES: usize = 16 << 20;

enum Column {
    Text(StringBuilder),
    Float(Float64Builder),
    Count(Int64Builder),
    Flag(BooleanBuilder),
}

/// One prediction's values, borrowed from its line or row: text for the text fields, a
/// number for the numeric ones.
struct Row<'a> {
    values: [Option<std::borrow::Cow<'a, str>>; PREDICTION_FIELDS.len()],
    numbers: [Option<f64>; PREDICTION_FIELDS.len()],
}

impl Default for Row<'_> {
    fn default() -> Self {
        Self {
            values: std::array::from_fn(|_| None),
            numbers: [None; PREDICTION_FIELDS.len()],
        }
    }
}

fn field_index(name: &str) -> usize {
    PREDICTION_FIELDS
        .iter()
        .position(|(n, _)| *n == name)
        .expect("a prediction field")
}

/// What a numeric field holds, for messages.
fn expected(name: &str) -> &'static str {
    match prediction_field_type(name) {
        PredictionType::Count => "a non-negative integer",
        PredictionType::Flag => "true or false",
        PredictionType::Number => "a finite number",
        PredictionType::Text => "a string",
        PredictionType::Float => "a non-negative number",
    }
}

/// Check a numeric field's value: finite and non-negative, and whole for a count.
fn check_number(name: &str, x: f64) -> std::result::Result<f64, String> {
    let kind = prediction_field_type(name);
    let count = kind == PredictionType::Count;
    if kind == PredictionType::Number && x.is_finite() {
        return Ok(x);
    }
    if !(x.is_finite() && x >= 0.0) || (count && (x.fract() != 0.0 || x > f64::from(u32::MAX))) {
        return Err(format!("expected {}, found {x}", expected(name)));
    }
    Ok(x)
}

impl Builders {
    fn new(capacity: usize) -> Self {
        Self {
            columns: PREDICTION_FIELDS
                .iter()
                .map(|(name, _)| match prediction_field_type(name) {
                    PredictionType::Text => {
                        Column::Text(StringBuilder::with_capacity(capacity, capacity * 64))
                    }
                    PredictionType::Float | PredictionType::Number => {
                        Column::Float(Float64Builder::with_capacity(capacity))
                    }
                    PredictionType::Count => Column::Count(Int64Builder::with_capacity(capacity)),
                    PredictionType::Flag => Column::Flag(BooleanBuilder::with_capacity(capacity)),
                })
                .collect(),
            duplicate: BooleanBuilder::with_capacity(capacity),
            line: Int64Builder::with_capacity(capacity),
            rows: 0,
            bytes: 0,
        }
    }

    fn append(&mut self, row: &Row<'_>, duplicate: bool, line: u64) {
        for (i, c) in self.columns.iter_mut().enumerate() {
            match c {
                Column::Text(b) => {
                    let v = row.values[i].as_deref();
                    self.bytes += v.map_or(0, str::len);
                    b.append_option(v)
                }
                Column::Float(b) => b.append_option(row.numbers[i]),
                Column::Count(b) => b.append_option(row.numbers[i].map(|x| x as i64)),
                Column::Flag(b) => b.append_option(row.numbers[i].map(|x| x != 0.0)),
            }
        }
        self.duplicate.append_value(duplicate);
        self.line.append_value(line as i64);
        self.rows += 1;
    }

    fn finish(&mut self) -> Result<RecordBatch> {
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(PREDICTION_FIELDS.len() + 2);
        for c in &mut self.columns {
            columns.push(match c {
                Column::Text(b) => Arc::new(b.finish()),
                Column::Float(b) => Arc::new(b.finish()),
                Column::Count(b) => Arc::new(b.finish()),
                Column::Flag(b) => Arc::new(b.finish()),
            });
        }
        columns.push(Arc::new(self.duplicate.finish()));
        columns.push(Arc::new(self.line.finish()));
        self.rows = 0;
        self.bytes = 0;
        Ok(RecordBatch::try_new(predictions_table_schema(), columns)?)
    }
}

/// The row groups holding rows `start..end` of a Parquet file, and which of their rows to
/// read; `None` when the range is not within the file.
fn select_rows(
    meta: &datafusion::parquet::file::metadata::ParquetMetaData,
    start: u64,
    end: u64,
) -> Option<(
    Vec<usize>,
    datafusion::parquet::arrow::arrow_reader::RowSelection,
)> {
    use datafusion::parquet::arrow::arrow_reader::RowSelector;
    let (mut groups, mut selectors, mut first) = (Vec::new(), Vec::new(), 0u64);
    for (g, group) in meta.row_groups().iter().enumerate() {
        let n = u64::try_from(group.num_rows()).ok()?;
        let (a, b) = (first, first + n);
        first = b;
        if b <= start || a >= end {
            continue;
        }
        let (lo, hi) = (start.max(a) - a, end.min(b) - a);
        groups.push(g);
        if lo > 0 {
            selectors.push(RowSelector::skip(lo as usize));
        }
        selectors.push(RowSelector::select((hi - lo) as usize));
        if hi < n {
            selectors.push(RowSelector::skip((n - hi) as usize));
        }
    }
    (start <= end && end <= first).then(|| (groups, selectors.into()))
}

/// Whether `x` is in one of the sorted, disjoint runs `[first, last]`.
pub fn in_runs(runs: &[[u64; 2]], x: u64) -> bool {
    let i = runs.partition_point(|r| r[1] < x);
    runs.get(i).is_some_and(|r| r[0] <= x)
}

/// Whether a predictions path is read as Parquet (by its extension) or as JSONL.
pub fn is_parquet(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("parquet"))
}

/// Where a predictions reader reads: a local file, or an object read by range.
enum Input {
    File(File),
    Object(crate::objstore::BlockingObject),
}

/// The bytes of each of `groups`' column chunks, first to last (a row group's span).
fn group_ranges(
    meta: &datafusion::parquet::file::metadata::ParquetMetaData,
    groups: &[usize],
) -> Vec<(u64, u64)> {
    groups
        .iter()
        .filter_map(|&g| {
            let columns = meta.row_group(g).columns();
            let start = columns
                .iter()
                .map(|c| c.dictionary_page_offset().unwrap_or(c.data_page_offset()))
                .min()?;
            let end = columns
                .iter()
                .map(|c| {
                    c.dictionary_page_offset()
                        .unwrap_or(c.data_page_offset())
                        .saturating_add(c.compressed_size())
                })
                .max()?;
            Some((u64::try_from(start).ok()?, u64::try_from(end).ok()?))
        })
        .collect()
}

/// A Parquet predictions source over `reader` (the footer already bounds-checked): the
/// whole file, or the rows of a slice's span.
fn parquet_source<T: datafusion::parquet::file::reader::ChunkReader + 'static>(
    reader: T,
    path: &Path,
    batch_size: usize,
    slice: Option<&Slice>,
) -> Result<Source> {
    let not_readable = |e| Error::config(path, format!("not a readable Parquet file: {e}"));
    let mut builder = ParquetRecordBatchReaderBuilder::try_new(reader).map_err(not_readable)?;
    match slice.map(|s| s.span) {
        Some(Span::Rows { start, end }) => {
            let (groups, selection) =
                select_rows(builder.metadata(), start, end).ok_or_else(|| {
                    Error::Internal(format!(
                        "{}: rows {start}..{end} past the file's",
                        path.display()
                    ))
                })?;
            builder = builder
                .with_row_groups(groups)
                .with_row_selection(selection);
        }
        Some(Span::Bytes { .. }) => {
            return Err(Error::Internal(format!(
                "{}: a byte range of a Parquet file",
                path.display()
            )));
        }
        None => {}
    }
    let reader = builder
        .with_batch_size(batch_size)
        .build()
        .map_err(not_readable)?;
    Ok(Source::Parquet {
        reader: Box::new(reader),
        next_row: slice.map_or(1, |s| s.first_line),
    })
}

impl PredictionsReader {
    /// The whole file, with its SHA-256.
    pub fn open(path: impl AsRef<Path>, batch_size: usize) -> Result<Self> {
        Self::open_at(path.as_ref(), batch_size, None)
    }

    /// One slice of the file (no digest: the file's is taken whole).
    pub fn open_slice(path: impl AsRef<Path>, batch_size: usize, slice: &Slice) -> Result<Self> {
        Self::open_at(path.as_ref(), batch_size, Some(slice))
    }

    /// One slice of an object on object storage, read by range where it lies (on an
    /// executor: no local copy); `shown` names it in errors.
    pub fn open_object_slice(
        object: crate::objstore::BlockingObject,
        shown: &Path,
        batch_size: usize,
        slice: &Slice,
    ) -> Result<Self> {
        Self::open_input(Input::Object(object), shown, batch_size, Some(slice))
    }

    fn open_at(path: &Path, batch_size: usize, slice: Option<&Slice>) -> Result<Self> {
        let file = crate::files::open_input(path, "cannot open predictions")?;
        Self::open_input(Input::File(file), path, batch_size, slice)
    }

    fn open_input(
        input: Input,
        path: &Path,
        batch_size: usize,
        slice: Option<&Slice>,
    ) -> Result<Self> {
        use std::io::{Seek, SeekFrom};
        let parquet = is_parquet(path);
        let mut stats = PredictionStats {
            path: path.to_path_buf(),
            ..PredictionStats::default()
        };
        let (mut skip_lines, mut stop_at) = (0, None);
        let source = match (parquet, slice.map(|s| s.span)) {
            (true, span) => {
                let limits = crate::rundir::bounds::ParquetLimits::from_env()?;
                match input {
                    Input::File(file) => {
                        if span.is_none() {
                            stats.sha256 = crate::digest::sha256_file(path)?;
                        }
                        // Footer and page headers first: a decompression bomb is
                        // refused unread.
                        crate::rundir::bounds::check_parquet_file(
                            path,
                            crate::files::Links::Follow,
                            &limits,
                        )?;
                        parquet_source(file, path, batch_size, slice)?
                    }
                    Input::Object(object) => {
                        use crate::rundir::bounds::check_parquet_groups;
                        use datafusion::parquet::file::reader::Length;
                        let len = object.len();
                        // The footer first; then the page headers of the row groups this
                        // slice reads (not the whole object's), each group fetched whole
                        // by its first request and held while it is read.
                        let meta = check_parquet_groups(&object, len, path, &limits, Some(&[]))?;
                        let groups = match span {
                            Some(Span::Rows { start, end }) => select_rows(&meta, start, end)
                                .map(|(groups, _)| groups)
                                .unwrap_or_default(),
                            _ => (0..meta.num_row_groups()).collect(),
                        };
                        let object = object.holding(group_ranges(&meta, &groups));
                        check_parquet_groups(&object, len, path, &limits, Some(&groups))?;
                        parquet_source(object, path, batch_size, slice)?
                    }
                }
            }
            (false, None) => match input {
                Input::File(file) => Source::Jsonl(Box::new(LineReader::new(
                    Box::new(file) as Box<dyn std::io::Read + Send>,
                    MAX_LINE_BYTES,
                ))),
                Input::Object(_) => {
                    return Err(Error::Internal(format!(
                        "{}: an object is read by slices",
                        path.display()
                    )));
                }
            },
            (false, Some(Span::Bytes { start, end })) => {
                // Start on the byte before: the slice's first line is the one after the
                // newline found there (a line that started earlier is the slice before's).
                let from = start.saturating_sub(1);
                let read: Box<dyn std::io::Read + Send> = match input {
                    Input::File(mut file) => {
                        file.seek(SeekFrom::Start(from))
                            .map_err(|e| Error::io(path, "cannot read predictions", e))?;
                        Box::new(file)
                    }
                    Input::Object(object) => Box::new(object.read_from(from)),
                };
                let mut lines = LineReader::without_hash(read, MAX_LINE_BYTES);
                if start > 0 {
                    lines
                        .next_line()
                        .map_err(|e| Error::io(path, "cannot read predictions", e))?;
                    skip_lines = lines.line_no();
                }
                stop_at = Some(end.saturating_sub(from));
                Source::Jsonl(Box::new(lines))
            }
            (false, Some(Span::Rows { .. })) => {
                return Err(Error::Internal(format!(
                    "{}: rows of a JSONL file, not bytes",
                    path.display()
                )));
            }
        };
        Ok(Self {
            source,
            batch_size: batch_size.max(1),
            sink: Sink {
                seen_before: slice.map(|s| s.seen_before.clone()).unwrap_or_default(),
                first_line: slice.map_or(1, |s| s.first_line),
                skip_lines,
                stop_at,
                // Parquet batches come out as their columns: only JSONL lines need builders.
                ..Sink::new(stats, if parquet { 0 } else { batch_size })
            },
            done: false,
        })
    }

    /// Predictions given as Arrow batches (a table in memory, read in place: a batch of
    /// more than `batch_size` rows is sliced, not copied), checked as a Parquet file's
    /// rows are; `name` stands for the file in messages (no digest: there is no file).
    pub fn from_batches(name: &Path, batches: Batches, batch_size: usize) -> Self {
        let batch_size = batch_size.max(1);
        let sliced = batches.flat_map(move |b| -> Vec<_> {
            match b {
                Ok(b) if b.num_rows() > batch_size => (0..b.num_rows())
                    .step_by(batch_size)
                    .map(|at| Ok(b.slice(at, batch_size.min(b.num_rows() - at))))
                    .collect(),
                other => vec![other],
            }
        });
        Self {
            source: Source::Parquet {
                reader: Box::new(sliced),
                next_row: 1,
            },
            batch_size,
            sink: Sink::new(
                PredictionStats {
                    path: name.to_path_buf(),
                    ..PredictionStats::default()
                },
                0,
            ),
            done: false,
        }
    }

    /// The counts and examples; complete once the iterator is exhausted.
    pub fn stats(&self) -> &PredictionStats {
        &self.sink.stats
    }

    /// Lines (JSONL) or rows (Parquet) read so far, predictions or not.
    pub fn lines_read(&self) -> u64 {
        match &self.source {
            Source::Jsonl(lines) => lines.line_no() - self.sink.skip_lines,
            Source::Parquet { next_row, .. } => next_row - self.sink.first_line,
        }
    }
}

impl Sink {
    /// A sink for a whole input read from its first line (builders for `rows` rows: 0
    /// where batches come out as their columns).
    fn new(stats: PredictionStats, rows: usize) -> Self {
        Self {
            builders: Builders::new(rows),
            seen: (RandomState::new(), RandomState::new(), HashMap::new()),
            seen_before: Vec::new(),
            stats,
            first_line: 1,
            skip_lines: 0,
            stop_at: None,
        }
    }

    /// Record one valid row.
    fn accept(&mut self, row: &Row<'_>, line: u64) {
        let text = |name: &str| row.values[field_index(name)].as_deref();
        let duplicate = self.note_row(
            text("case_id").unwrap_or_default(),
            text("attempt_id"),
            text("response_text"),
            text("error"),
            line,
        );
        self.builders.append(row, duplicate, line);
    }

    /// Count one row in the stats; `true` when its case and attempt were seen before.
    fn note_row(
        &mut self,
        id: &str,
        attempt: Option<&str>,
        response: Option<&str>,
        error: Option<&str>,
        line: u64,
    ) -> bool {
        // An attempt is one prediction: the key is the case and the attempt.
        let key = (id, attempt);
        let h = ((self.seen.0.hash_one(key) as u128) << 64) | self.seen.1.hash_one(key) as u128;
        // Inserted either way: a later row of this key in the slice repeats it too.
        let duplicate = self.seen.2.insert(h, ()).is_some() | in_runs(&self.seen_before, line);
        let s = &mut self.stats;
        s.rows += 1;
        if duplicate {
            note(&mut s.duplicates, &mut s.first_duplicates, id);
        }
        if response.is_none_or(|r| r.trim().is_empty()) {
            note(&mut s.empty_responses, &mut s.first_empty_responses, id);
        }
        if error.is_some_and(|e| !e.is_empty()) {
            note(&mut s.provider_errors, &mut s.first_provider_errors, id);
        }
        duplicate
    }

    /// Read one JSONL line; `false` at the end.
    fn read_line(&mut self, lines: &mut LineReader<Box<dyn std::io::Read + Send>>) -> Result<bool> {
        if self.stop_at.is_some_and(|stop| lines.consumed() >= stop) {
            return Ok(false);
        }
        let no = self.first_line + lines.line_no() - self.skip_lines;
        let path = self.stats.path.clone();
        let bad = |field: Option<&str>, msg: String| Err(Error::input(&path, no, field, msg));
        let line = match lines
            .next_line()
            .map_err(|e| Error::io(&path, "cannot read predictions", e))?
        {
            None => {
                self.stats.sha256 = lines.sha256_hex();
                return Ok(false);
            }
            Some(Line::TooLong { len }) => {
                return bad(
                    None,
                    format!(
                        "line is {len} bytes, over the limit of {} MiB",
                        MAX_LINE_BYTES >> 20
                    ),
                );
            }
            Some(Line::Bytes(b)) => b,
        };
        let text = match std::str::from_utf8(line) {
            Ok(t) => t,
            Err(e) => {
                return bad(
                    None,
                    format!("invalid UTF-8 at byte {} of the line", e.valid_up_to() + 1),
                );
            }
        };
        if text.trim().is_empty() {
            return bad(
                None,
                "blank line (every line must hold one JSON object)".into(),
            );
        }
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let rec = FlatRecord::parse(text).map_err(|e| {
            Error::input(
                &path,
                no,
                None,
                crate::corpus::batch::json_error_message(&e, text),
            )
        })?;
        // A repeated key is an error, as in the corpus reader: which value wins would
        // otherwise depend on the reader.
        for (i, (key, _)) in rec.fields.iter().enumerate() {
            if rec.fields[..i].iter().any(|(k, _)| k == key) {
                return bad(Some(key), "duplicate key in the line".into());
            }
        }
        // A run's checkpoint holds its multi-turn attempts' turns as lines of their own
        // (`crate::rundir::checkpoint`): they are not predictions.
        match rec.get(RECORD_KEY) {
            None | Some(FieldValue::Null) => {}
            Some(FieldValue::Str(k)) if k == TURN_LINE || k == TURN_PART_LINE => return Ok(true),
            Some(_) => {
                return bad(
                    Some(RECORD_KEY),
                    format!(
                        "expected \"{TURN_LINE}\" or \"{TURN_PART_LINE}\", or no such key on a prediction"
                    ),
                );
            }
        }
        let mut row = Row::default();
        for (i, (name, required)) in PREDICTION_FIELDS.iter().enumerate() {
            match (rec.get(name), *name) {
                (None | Some(FieldValue::Null), _) if *required && *name == "case_id" => {
                    return bad(Some(name), "missing required field".into());
                }
                (None | Some(FieldValue::Null), _) => {}
                (Some(v), _) if prediction_field_type(name) != PredictionType::Text => {
                    let checked = match v {
                        FieldValue::Bool(b)
                            if prediction_field_type(name) == PredictionType::Flag =>
                        {
                            Ok(if *b { 1.0 } else { 0.0 })
                        }
                        FieldValue::Number(x)
                            if prediction_field_type(name) != PredictionType::Flag =>
                        {
                            check_number(name, *x)
                        }
                        other => Err(format!(
                            "expected {}, found {}",
                            expected(name),
                            other.kind_name()
                        )),
                    };
                    match checked {
                        Ok(x) => row.numbers[i] = Some(x),
                        Err(m) => return bad(Some(name), m),
                    }
                }
                (Some(FieldValue::Str(s)), "case_id") if s.trim().is_empty() => {
                    return bad(Some(name), "empty".into());
                }
                (Some(FieldValue::Str(s)), _) => row.values[i] = Some(s.clone()),
                (Some(v), _) => {
                    return bad(
                        Some(name),
                        format!("expected a string, found {}", v.kind_name()),
                    );
                }
            }
        }
        self.accept(&row, no);
        Ok(true)
    }

    /// Read one Parquet batch straight into the table's columns (the input's arrays,
    /// cast where their type differs; no row-by-row copy); `None` at the end.
    fn read_parquet(
        &mut self,
        reader: &mut Batches,
        next_row: &mut u64,
    ) -> Result<Option<RecordBatch>> {
        let Some(batch) = reader.next() else {
            return Ok(None);
        };
        let first = *next_row;
        let path = self.stats.path.clone();
        let batch = batch.map_err(|e| {
            Error::input(&path, first, None, format!("cannot decode the rows: {e}"))
        })?;
        let n = batch.num_rows();
        *next_row += n as u64;
        let schema = batch.schema();
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(PREDICTION_FIELDS.len() + 2);
        // (row, field, message) of the first bad value
        let mut first_bad: Option<(usize, usize, String)> = None;
        for (name, required) in PREDICTION_FIELDS {
            let kind = prediction_field_type(name);
            let Ok(i) = schema.index_of(name) else {
                if *required && *name == "case_id" {
                    return Err(Error::input(
                        &path,
                        0,
                        Some(name),
                        "no case_id column among the columns",
                    ));
                }
                columns.push(new_null_array(&column_type(kind), n));
                continue;
            };
            let read_as = match kind {
                PredictionType::Text => DataType::Utf8,
                PredictionType::Flag => DataType::Boolean,
                _ => DataType::Float64,
            };
            let col = cast(batch.column(i), &read_as).map_err(|e| {
                Error::input(
                    &path,
                    0,
                    Some(name),
                    format!(
                        "column of type {} cannot be read as {read_as}: {e}",
                        batch.column(i).data_type()
                    ),
                )
            })?;
            // A value the cast could not read became null: the first one is an error at
            // its row (a number given as text that is no number). Nulls are counted as
            // the values say (a column of type null, a dictionary's null values).
            let given = batch.column(i);
            let logical = given.logical_nulls();
            let lost = (col.null_count() != given.logical_null_count())
                .then(|| {
                    (0..n)
                        .find(|&r| logical.as_ref().is_none_or(|v| v.is_valid(r)) && col.is_null(r))
                })
                .flatten();
            if let Some(r) = lost {
                let shown = datafusion::arrow::util::display::array_value_to_string(given, r)
                    .unwrap_or_default();
                let msg = format!(
                    "expected {}, found {}",
                    expected(name),
                    crate::text::excerpt(&shown, 80)
                );
                let at = (r, field_index(name));
                if first_bad
                    .as_ref()
                    .is_none_or(|(row, field, _)| at < (*row, *field))
                {
                    first_bad = Some((r, at.1, msg));
                }
            }
            if matches!(kind, PredictionType::Text | PredictionType::Flag) {
                columns.push(col);
                continue;
            }
            // The same rule as a JSONL line, on the column's values; the first bad value
            // in row order (then field order, as a line is read) is the one reported.
            let bad = col
                .as_primitive::<Float64Type>()
                .iter()
                .enumerate()
                .find_map(|(r, x)| Some((r, check_number(name, x?).err()?)));
            if let Some((r, msg)) = bad {
                let at = (r, field_index(name));
                if first_bad
                    .as_ref()
                    .is_none_or(|(row, field, _)| at < (*row, *field))
                {
                    first_bad = Some((r, at.1, msg));
                }
            }
            columns.push(if kind == PredictionType::Count {
                // Checked whole and within u32 above: the cast is exact.
                cast(&col, &DataType::Int64)?
            } else {
                col
            });
        }
        let text = |name: &str| columns[field_index(name)].as_string::<i32>().clone();
        let (ids, responses) = (text("case_id"), text("response_text"));
        let (attempts, errors) = (text("attempt_id"), text("error"));
        let missing_id = (0..n).find(|&r| value(&ids, r).is_none_or(|s| s.trim().is_empty()));
        if let Some(r) = missing_id {
            // case_id is the first field: at the same row it is reported first.
            if first_bad.as_ref().is_none_or(|(row, _, _)| r <= *row) {
                first_bad = Some((r, 0, "missing or empty".into()));
            }
        }
        if let Some((r, field, msg)) = first_bad {
            let name = PREDICTION_FIELDS[field].0;
            return Err(Error::input(&path, first + r as u64, Some(name), msg));
        }
        let mut duplicate = BooleanBuilder::with_capacity(n);
        for r in 0..n {
            let id = value(&ids, r).unwrap_or_default();
            duplicate.append_value(self.note_row(
                id,
                value(&attempts, r),
                value(&responses, r),
                value(&errors, r),
                first + r as u64,
            ));
        }
        columns.push(Arc::new(duplicate.finish()));
        columns.push(Arc::new(Int64Array::from_iter_values(
            (first..first + n as u64).map(|x| x as i64),
        )));
        Ok(Some(RecordBatch::try_new(
            predictions_table_schema(),
            columns,
        )?))
    }
}

/// Row `r` of a text column.
fn value(a: &StringArray, r: usize) -> Option<&str> {
    a.is_valid(r).then(|| a.value(r))
}

/// The table's type for a prediction field.
fn column_type(kind: PredictionType) -> DataType {
    match kind {
        PredictionType::Text => DataType::Utf8,
        PredictionType::Float | PredictionType::Number => DataType::Float64,
        PredictionType::Count => DataType::Int64,
        PredictionType::Flag => DataType::Boolean,
    }
}

impl Iterator for PredictionsReader {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        if let Err(e) = crate::interrupt::check() {
            self.done = true;
            return Some(Err(e));
        }
        let lines = match &mut self.source {
            Source::Jsonl(lines) => lines,
            Source::Parquet { reader, next_row } => {
                let batch = self.sink.read_parquet(reader, next_row).transpose();
                self.done = !matches!(batch, Some(Ok(_)));
                return batch;
            }
        };
        loop {
            let sink = &mut self.sink;
            if sink.builders.rows >= self.batch_size || sink.builders.bytes >= BATCH_TEXT_BYTES {
                return Some(sink.builders.finish());
            }
            match sink.read_line(lines) {
                Ok(true) => {}
                Ok(false) => {
                    self.done = true;
                    return (sink.builders.rows > 0).then(|| sink.builders.finish());
                }
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Result<(Vec<RecordBatch>, PredictionStats)> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.jsonl");
        std::fs::write(&path, text).unwrap();
        let mut r = PredictionsReader::open(&path, 2)?;
        let batches = r.by_ref().collect::<Result<Vec<_>>>()?;
        let mut stats = r.stats().clone();
        stats.path = PathBuf::from("p.jsonl");
        Ok((batches, stats))
    }

    #[test]
    fn a_batch_of_long_responses_ends_at_its_text_budget() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.jsonl");
        let long = "x".repeat(1 << 20);
        let text: String = (0..40)
            .map(|i| format!("{{\"case_id\":\"c{i}\",\"response_text\":\"{long}\"}}\n"))
            .collect();
        std::fs::write(&path, text).unwrap();
        let batches = PredictionsReader::open(&path, 8192)
            .unwrap()
            .collect::<Result<Vec<_>>>()
            .unwrap();
        let rows: Vec<usize> = batches.iter().map(RecordBatch::num_rows).collect();
        // 16 MiB of text a batch: 16 responses of 1 MiB, then the rest
        assert_eq!(rows, [16, 16, 8]);
        let lines: Vec<i64> = batches
            .iter()
            .flat_map(|b| {
                b.column_by_name("source_line")
                    .unwrap()
                    .as_primitive::<datafusion::arrow::datatypes::Int64Type>()
                    .values()
                    .to_vec()
            })
            .collect();
        assert_eq!(lines, (1..=40).collect::<Vec<i64>>());
    }

    #[test]
    fn flags_duplicates_and_empty_responses_but_keeps_every_row() {
        let (batches, stats) = read(
            "{\"case_id\":\"a\",\"response_text\":\"hi\",\"latency_ms\":12.5}\n\
             {\"case_id\":\"b\",\"response_text\":null,\"error\":\"timeout\"}\n\
             {\"case_id\":\"a\",\"response_text\":\"\",\"extra\":{\"x\":1}}\n",
        )
        .unwrap();
        assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 3);
        assert_eq!(
            (
                stats.rows,
                stats.duplicates,
                stats.empty_responses,
                stats.provider_errors
            ),
            (3, 1, 2, 1)
        );
        assert_eq!(stats.first_duplicates, ["a"]);
        let last = &batches[1];
        assert!(
            last.column_by_name("duplicate_prediction")
                .unwrap()
                .as_boolean()
                .value(0)
        );
        assert_eq!(
            last.column_by_name("source_line")
                .unwrap()
                .as_primitive::<datafusion::arrow::datatypes::Int64Type>()
                .value(0),
            3
        );
    }

    /// Write `batch` as Parquet and read it back through the reader.
    fn read_parquet(
        batch: RecordBatch,
        size: usize,
    ) -> Result<(Vec<RecordBatch>, PredictionStats)> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.parquet");
        let mut w = datafusion::parquet::arrow::ArrowWriter::try_new(
            File::create(&path).unwrap(),
            batch.schema(),
            None,
        )
        .unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let mut r = PredictionsReader::open(&path, size)?;
        let batches = r.by_ref().collect::<Result<Vec<_>>>()?;
        Ok((batches, r.stats().clone()))
    }

    #[test]
    fn parquet_columns_come_out_as_the_same_rows_as_jsonl() {
        use datafusion::arrow::array::{Float64Array, Int32Array};
        let ids = ["a", "b", "a", "c", "a"];
        let responses = [Some("hi"), None, Some(" "), Some("x"), Some("y")];
        let attempts = [None, None, None, Some("c#rot13"), Some("a#rot13")];
        let latency = [Some(12.5), None, Some(3.0), Some(0.0), None];
        let turns = [None, Some(2), None, Some(0), Some(7)];
        let errors = [None, Some("timeout"), None, Some(""), None];
        let schema = Arc::new(Schema::new(vec![
            Field::new("case_id", DataType::Utf8, true),
            Field::new("response_text", DataType::Utf8, true),
            Field::new("attempt_id", DataType::Utf8, true),
            Field::new("latency_ms", DataType::Float64, true),
            // an integer column: read as the contract's count
            Field::new("turns_used", DataType::Int32, true),
            Field::new("error", DataType::Utf8, true),
            Field::new("unrelated", DataType::Utf8, true),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(ids.to_vec())),
                Arc::new(StringArray::from(responses.to_vec())),
                Arc::new(StringArray::from(attempts.to_vec())),
                Arc::new(Float64Array::from(latency.to_vec())),
                Arc::new(Int32Array::from(turns.to_vec())),
                Arc::new(StringArray::from(errors.to_vec())),
                Arc::new(StringArray::from(vec![Some("z"); 5])),
            ],
        )
        .unwrap();
        let lines: String = (0..5)
            .map(|i| {
                let mut o = serde_json::json!({"case_id": ids[i], "response_text": responses[i],
                    "attempt_id": attempts[i], "latency_ms": latency[i], "turns_used": turns[i],
                    "error": errors[i], "unrelated": "z"});
                o.as_object_mut().unwrap().retain(|_, v| !v.is_null());
                format!("{o}\n")
            })
            .collect();
        let (jsonl, jsonl_stats) = read(&lines).unwrap();
        let (parquet, parquet_stats) = read_parquet(batch, 2).unwrap();
        let all = |b: &[RecordBatch]| {
            datafusion::arrow::compute::concat_batches(&predictions_table_schema(), b).unwrap()
        };
        assert_eq!(all(&parquet), all(&jsonl));
        assert_eq!(
            parquet
                .iter()
                .map(RecordBatch::num_rows)
                .collect::<Vec<_>>(),
            [2, 2, 1]
        );
        let counts = |s: &PredictionStats| {
            (
                s.rows,
                s.duplicates,
                s.first_duplicates.clone(),
                s.empty_responses,
                s.provider_errors,
            )
        };
        assert_eq!(counts(&parquet_stats), counts(&jsonl_stats));
        assert_eq!(counts(&parquet_stats), (5, 1, vec!["a".to_owned()], 2, 1));
    }

    #[test]
    fn bad_parquet_values_name_the_row_and_field() {
        use datafusion::arrow::array::Float64Array;
        let schema = Arc::new(Schema::new(vec![
            Field::new("case_id", DataType::Utf8, true),
            Field::new("success_turn", DataType::Float64, true),
        ]));
        let batch = |turns: Vec<Option<f64>>, ids: Vec<Option<&str>>| {
            RecordBatch::try_new(
                Arc::clone(&schema),
                vec![
                    Arc::new(StringArray::from(ids)) as ArrayRef,
                    Arc::new(Float64Array::from(turns)),
                ],
            )
            .unwrap()
        };
        let err = |b| {
            let e = read_parquet(b, 2).unwrap_err().to_string();
            e.rsplit_once("p.parquet").unwrap().1.to_owned()
        };
        assert_eq!(
            err(batch(vec![Some(1.0), None, Some(1.5)], vec![Some("a"); 3])),
            ":3: success_turn: expected a non-negative integer, found 1.5"
        );
        assert_eq!(
            err(batch(
                vec![None, None, None],
                vec![Some("a"), Some(" "), Some("b")]
            )),
            ":2: case_id: missing or empty"
        );
        // The first bad row is reported, whichever column it is in (as a JSONL file's
        // first bad line is).
        assert_eq!(
            err(batch(
                vec![None, None, Some(-1.0)],
                vec![Some("a"), None, Some("b")]
            )),
            ":2: case_id: missing or empty"
        );
        assert_eq!(
            err(batch(
                vec![None, Some(2.5), None],
                vec![Some("a"), Some("b"), None]
            )),
            ":2: success_turn: expected a non-negative integer, found 2.5"
        );
    }

    #[test]
    fn turn_lines_are_not_predictions() {
        let (batches, stats) = read(
            "{\"pieval_record\":\"turn\",\"case_id\":\"a\",\"attempt_id\":\"a#pair\",\"index\":1,\"run_id\":\"r\",\"turn\":{\"turn\":1}}\n\
             {\"case_id\":\"a\",\"attempt_id\":\"a#pair\",\"response_text\":\"hi\",\"turn_lines\":1}\n\
             {\"case_id\":\"b\",\"response_text\":\"yo\"}\n",
        )
        .unwrap();
        assert_eq!(stats.rows, 2);
        assert_eq!(batches.iter().map(RecordBatch::num_rows).sum::<usize>(), 2);
        let e = read("{\"pieval_record\":\"other\",\"case_id\":\"a\"}\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("p.jsonl:1: pieval_record"), "{e}");
    }

    #[test]
    fn malformed_lines_name_file_line_and_field() {
        let err = |t: &str| {
            read(t)
                .unwrap_err()
                .to_string()
                .rsplit_once("p.jsonl")
                .unwrap()
                .1
                .to_owned()
        };
        assert_eq!(
            err("{\"case_id\":\"a\"}\n{\"response_text\":\"x\"}\n"),
            ":2: case_id: missing required field"
        );
        assert_eq!(
            err("{\"case_id\":\"a\",\"latency_ms\":\"fast\"}\n"),
            ":1: latency_ms: expected a non-negative number, found a string"
        );
        // The attempt counts of adaptive attacks: non-negative integers.
        assert_eq!(
            err("{\"case_id\":\"a\",\"turns_used\":\"three\"}\n"),
            ":1: turns_used: expected a non-negative integer, found a string"
        );
        assert_eq!(
            err("{\"case_id\":\"a\",\"success_turn\":1.5}\n"),
            ":1: success_turn: expected a non-negative integer, found 1.5"
        );
        assert_eq!(
            err("{\"case_id\":\"a\",\"turns_used\":-2}\n"),
            ":1: turns_used: expected a non-negative integer, found -2"
        );
        assert_eq!(
            err("{\"case_id\":\"a\",\"attempt_id\":[1]}\n"),
            ":1: attempt_id: expected a string, found an array"
        );
        assert_eq!(
            err("{\"case_id\":7}\n"),
            ":1: case_id: expected a string, found a number"
        );
        assert_eq!(
            err("{\"case_id\":\"a\"\n"),
            ":1: record: invalid JSON at column 14: EOF while parsing an object"
        );
        assert_eq!(
            err("{\"case_id\":\"a\",\"response_text\":[1]}\n"),
            ":1: response_text: expected a string, found an array"
        );
        assert_eq!(
            err("\n"),
            ":1: record: blank line (every line must hold one JSON object)"
        );
    }
}
