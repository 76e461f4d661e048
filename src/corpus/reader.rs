//! The streaming corpus reader: JSONL or Parquet attack cases → Arrow `RecordBatch`es
//! of the enriched-case schema, checking every record against the contract and
//! computing the file's sha256 on the way. Memory is bounded by one line (JSONL) or one
//! row group (Parquet), one output batch, and the set of `case_id` hashes.
//!
//! Every command reads corpora through here, so "valid" means the same thing for
//! `validate`, `enrich`, `corpus stats` and the runner.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::fs::File;
use std::hash::BuildHasher;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, Float64Builder, RecordBatch, StringBuilder,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::parquet::arrow::arrow_reader::{
    ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder,
};
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::lines::{DEFAULT_MAX_LINE_BYTES, Line, LineReader};
use crate::contract::arrow::enriched_case_schema;
use crate::contract::fields::{CASE_FIELDS, FieldKind, case_field_index};
use crate::contract::record::{CriteriaCache, FieldValue, RawRecord, Violation, check_record};
use crate::error::{Error, Result};

#[derive(Clone, Debug)]
pub struct ReadOptions {
    /// Longest JSONL line accepted, in bytes.
    pub max_line_bytes: usize,
    /// Rows per output batch.
    pub batch_size: usize,
    /// How many violations to keep for the report (all are counted).
    pub max_reported: usize,
    /// Build Arrow batches (off for `validate`, which only checks).
    pub build_batches: bool,
}

impl Default for ReadOptions {
    fn default() -> Self {
        Self {
            max_line_bytes: DEFAULT_MAX_LINE_BYTES,
            batch_size: 8192,
            max_reported: 100,
            build_batches: true,
        }
    }
}

/// What reading a corpus found. `violations` holds the first `max_reported`.
#[derive(Clone, Debug, Serialize)]
pub struct ValidationReport {
    pub path: PathBuf,
    pub format: &'static str,
    pub sha256: String,
    pub bytes: u64,
    pub records: u64,
    pub valid_records: u64,
    pub errors: u64,
    pub warnings: u64,
    pub violations: Vec<Violation>,
    /// True when more violations exist than are listed.
    pub truncated: bool,
}

impl ValidationReport {
    pub fn is_valid(&self) -> bool {
        self.errors == 0
    }

    /// `Err(Error::Invalid)` when the corpus broke the contract, naming the first problem.
    pub fn into_result(self) -> Result<Self> {
        if self.is_valid() {
            return Ok(self);
        }
        Err(Error::Invalid {
            path: self.path.clone(),
            count: self.errors,
        })
    }

    fn push(&mut self, v: Violation, max: usize) {
        match v.level {
            crate::contract::Level::Error => self.errors += 1,
            crate::contract::Level::Warning => self.warnings += 1,
        }
        if self.violations.len() < max {
            self.violations.push(v);
        } else {
            self.truncated = true;
        }
    }
}

enum Source {
    Jsonl(Box<LineReader<File>>),
    Parquet {
        reader: ParquetRecordBatchReader,
        /// Row number (1-based) of the first row of the next batch.
        next_row: u64,
    },
}

/// Iterate over validated batches; call [`CorpusReader::finish`] for the report.
pub struct CorpusReader {
    source: Source,
    checker: Checker,
    done: bool,
}

/// Everything but the input: kept apart so a line borrowed from the source can be
/// checked while the checker is mutated.
struct Checker {
    opts: ReadOptions,
    builder: CaseBatchBuilder,
    criteria: CriteriaCache,
    ids: IdSet,
    report: ValidationReport,
    scratch: Vec<Violation>,
}

impl CorpusReader {
    /// Open a corpus; `.parquet` files are read as Parquet, anything else as JSONL.
    pub fn open(path: impl AsRef<Path>, opts: ReadOptions) -> Result<Self> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| Error::io(path, "cannot open corpus", e))?;
        let is_parquet = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("parquet"));
        let (source, format, sha256) = if is_parquet {
            let sha = sha256_file(path)?;
            let reader = ParquetRecordBatchReaderBuilder::try_new(file)
                .map_err(|e| Error::config(path, format!("not a readable Parquet file: {e}")))?
                .with_batch_size(opts.batch_size)
                .build()
                .map_err(|e| Error::config(path, format!("not a readable Parquet file: {e}")))?;
            (
                Source::Parquet {
                    reader,
                    next_row: 1,
                },
                "parquet",
                sha,
            )
        } else {
            let lines = LineReader::new(file, opts.max_line_bytes);
            (Source::Jsonl(Box::new(lines)), "jsonl", String::new())
        };
        Ok(Self {
            source,
            done: false,
            checker: Checker {
                builder: CaseBatchBuilder::new(opts.batch_size),
                opts,
                criteria: CriteriaCache::default(),
                ids: IdSet::default(),
                report: ValidationReport {
                    path: path.to_path_buf(),
                    format,
                    sha256,
                    bytes: 0,
                    records: 0,
                    valid_records: 0,
                    errors: 0,
                    warnings: 0,
                    violations: Vec::new(),
                    truncated: false,
                },
                scratch: Vec::new(),
            },
        })
    }

    pub fn schema(&self) -> SchemaRef {
        enriched_case_schema()
    }

    /// The report; meaningful once the iterator is exhausted (it drains it if not).
    pub fn finish(mut self) -> Result<ValidationReport> {
        while let Some(batch) = self.next() {
            batch?;
        }
        Ok(self.checker.report)
    }

    /// Read until a batch is full or the input ends.
    fn fill_batch(&mut self) -> Result<Option<RecordBatch>> {
        loop {
            let c = &mut self.checker;
            if c.builder.len() >= c.opts.batch_size {
                return c.builder.finish().map(Some);
            }
            let more = match &mut self.source {
                Source::Jsonl(lines) => c.read_jsonl_line(lines)?,
                Source::Parquet { reader, next_row } => c.read_parquet_batch(reader, next_row)?,
            };
            if !more {
                self.done = true;
                if let Source::Jsonl(lines) = &mut self.source {
                    c.report.sha256 = lines.sha256_hex();
                    c.report.bytes = lines.bytes_read();
                }
                return if c.builder.len() > 0 {
                    c.builder.finish().map(Some)
                } else {
                    Ok(None)
                };
            }
        }
    }
}

impl Checker {
    /// Handle one JSONL line; `false` at end of input.
    fn read_jsonl_line(&mut self, lines: &mut LineReader<File>) -> Result<bool> {
        let path = &self.report.path;
        let max = self.opts.max_reported;
        let no = lines.line_no() + 1;
        let line = lines
            .next_line()
            .map_err(|e| Error::io(path, "cannot read corpus", e))?;
        let Some(line) = line else { return Ok(false) };
        self.report.records += 1;
        let mut bytes = match line {
            Line::TooLong { len } => {
                let limit = self.opts.max_line_bytes;
                self.report.push(
                    Violation::error(
                        no,
                        None,
                        format!(
                            "line is {len} bytes, over the limit of {limit} (--max-line-bytes)"
                        ),
                    ),
                    max,
                );
                return Ok(true);
            }
            Line::Bytes(b) => b,
        };
        if no == 1 && bytes.starts_with(b"\xEF\xBB\xBF") {
            self.report.push(
                Violation::error(
                    no,
                    None,
                    "file starts with a UTF-8 byte-order mark (BOM); save it as UTF-8 without BOM",
                ),
                max,
            );
            bytes = &bytes[3..];
        }
        let text = match std::str::from_utf8(bytes) {
            Ok(t) => t,
            Err(e) => {
                self.report.push(
                    Violation::error(
                        no,
                        None,
                        format!("invalid UTF-8 at byte {} of the line", e.valid_up_to() + 1),
                    ),
                    max,
                );
                return Ok(true);
            }
        };
        if text.trim().is_empty() {
            self.report.push(
                Violation::error(
                    no,
                    None,
                    "blank line (every line must hold one JSON object)",
                ),
                max,
            );
            return Ok(true);
        }
        let rec = match RawRecord::parse(text) {
            Ok(r) => r,
            Err(e) => {
                self.report.push(
                    Violation::error(no, None, json_error_message(&e, text)),
                    max,
                );
                return Ok(true);
            }
        };
        self.accept(&rec, no);
        Ok(true)
    }

    /// Handle one Parquet batch, row by row; `false` at end of input.
    fn read_parquet_batch(
        &mut self,
        reader: &mut ParquetRecordBatchReader,
        next_row: &mut u64,
    ) -> Result<bool> {
        let Some(batch) = reader.next() else {
            return Ok(false);
        };
        let path = self.report.path.clone();
        let batch = batch.map_err(|e| {
            Error::input(
                &path,
                *next_row,
                None,
                format!("cannot decode Parquet rows: {e}"),
            )
        })?;
        let first_row = *next_row;
        *next_row += batch.num_rows() as u64;
        let columns =
            ParquetColumns::new(&batch, first_row, &mut self.report, self.opts.max_reported)?;
        for row in 0..batch.num_rows() {
            self.report.records += 1;
            let rec = columns.record(row);
            self.accept(&rec, first_row + row as u64);
        }
        Ok(true)
    }

    /// Check a parsed record, then keep it when it is valid.
    fn accept(&mut self, rec: &RawRecord<'_>, no: u64) {
        let max = self.opts.max_reported;
        self.scratch.clear();
        check_record(rec, no, &mut self.criteria, &mut self.scratch);
        if let Some(FieldValue::Str(id)) = rec.get("case_id")
            && let Some(first) = self.ids.insert(id, no)
        {
            self.scratch.push(Violation::error(
                no,
                Some("case_id"),
                format!(
                    "duplicate case_id {:?} (first at line {first})",
                    crate::text::excerpt(id, 80)
                ),
            ));
        }
        let mut valid = true;
        for v in self.scratch.drain(..) {
            valid &= v.level == crate::contract::Level::Warning;
            self.report.push(v, max);
        }
        if valid {
            self.report.valid_records += 1;
            if self.opts.build_batches {
                self.builder.append(rec, &mut self.criteria);
            }
        }
    }
}

impl Iterator for CorpusReader {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.fill_batch() {
            Ok(Some(b)) => Some(Ok(b)),
            Ok(None) => None,
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

/// serde_json's message without its "at line 1 column N" tail, with the column first.
fn json_error_message(e: &serde_json::Error, text: &str) -> String {
    let msg = e.to_string();
    let msg = msg
        .rsplit_once(" at line ")
        .map_or(msg.as_str(), |(m, _)| m);
    if e.is_syntax() || e.is_eof() {
        format!("invalid JSON at column {}: {msg}", e.column())
    } else if !text.trim_start().starts_with('{') {
        format!("expected a JSON object per line: {msg}")
    } else {
        format!("invalid record at column {}: {msg}", e.column())
    }
}

/// The set of case ids seen, as 128-bit hashes (two independently keyed SipHashes), so
/// duplicate detection needs 20 bytes a case rather than the ids themselves.
#[derive(Default)]
struct IdSet {
    keys: (RandomState, RandomState),
    seen: HashMap<u128, u64>,
}

impl IdSet {
    /// Insert; returns the line of the first occurrence when `id` was seen before.
    fn insert(&mut self, id: &str, line: u64) -> Option<u64> {
        let h = ((self.keys.0.hash_one(id) as u128) << 64) | self.keys.1.hash_one(id) as u128;
        match self.seen.entry(h) {
            std::collections::hash_map::Entry::Occupied(e) => Some(*e.get()),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(line);
                None
            }
        }
    }
}

/// Builds batches of the enriched-case schema from valid records.
struct CaseBatchBuilder {
    strings: Vec<Option<StringBuilder>>,
    confidence: Float64Builder,
    rows: usize,
}

impl CaseBatchBuilder {
    fn new(capacity: usize) -> Self {
        let strings = CASE_FIELDS
            .iter()
            .map(|f| {
                (f.kind != FieldKind::Probability)
                    .then(|| StringBuilder::with_capacity(capacity, capacity * 32))
            })
            .collect();
        Self {
            strings,
            confidence: Float64Builder::with_capacity(capacity),
            rows: 0,
        }
    }

    fn len(&self) -> usize {
        self.rows
    }

    fn append(&mut self, rec: &RawRecord<'_>, criteria: &mut CriteriaCache) {
        for ((spec, value), builder) in CASE_FIELDS.iter().zip(&rec.fields).zip(&mut self.strings) {
            match (builder, value) {
                (None, Some(FieldValue::Number(x))) => self.confidence.append_value(*x),
                (None, _) => self.confidence.append_null(),
                (Some(b), Some(v @ (FieldValue::Object(_) | FieldValue::Str(_))))
                    if spec.kind == FieldKind::Criteria =>
                {
                    // Already checked: the cache holds the canonical form.
                    match criteria.check(v) {
                        Ok(canonical) => b.append_value(canonical),
                        Err(_) => b.append_null(),
                    }
                }
                (Some(b), Some(FieldValue::Str(s))) => b.append_value(s),
                (Some(b), Some(FieldValue::Object(t))) => b.append_value(t),
                (Some(b), _) => b.append_null(),
            }
        }
        self.rows += 1;
    }

    fn finish(&mut self) -> Result<RecordBatch> {
        let columns: Vec<ArrayRef> = self
            .strings
            .iter_mut()
            .map(|b| match b {
                Some(b) => Arc::new(b.finish()) as ArrayRef,
                None => Arc::new(self.confidence.finish()) as ArrayRef,
            })
            .collect();
        self.rows = 0;
        Ok(RecordBatch::try_new(enriched_case_schema(), columns)?)
    }
}

/// Parquet columns mapped onto contract fields, for row-wise checking.
struct ParquetColumns {
    /// Per contract field: the column, already cast to Utf8 unless numeric/boolean.
    columns: Vec<Option<ArrayRef>>,
}

impl ParquetColumns {
    fn new(
        batch: &RecordBatch,
        first_row: u64,
        report: &mut ValidationReport,
        max: usize,
    ) -> Result<Self> {
        let mut columns = vec![None; CASE_FIELDS.len()];
        for (field, array) in batch.schema().fields().iter().zip(batch.columns()) {
            let Some(i) = case_field_index(field.name()) else {
                if first_row == 1 {
                    report.push(
                        Violation::warning(
                            0,
                            Some(field.name()),
                            "not a contract field; it is ignored",
                        ),
                        max,
                    );
                }
                continue;
            };
            let ty = array.data_type();
            columns[i] = if ty.is_numeric() || *ty == DataType::Boolean || *ty == DataType::Utf8 {
                Some(array.clone())
            } else if matches!(
                ty,
                DataType::LargeUtf8 | DataType::Utf8View | DataType::Dictionary(..)
            ) {
                Some(cast(array, &DataType::Utf8)?)
            } else {
                if first_row == 1 {
                    report.push(
                        Violation::error(
                            0,
                            Some(field.name()),
                            format!("column type {ty} is not supported; store it as a string"),
                        ),
                        max,
                    );
                }
                None
            };
        }
        Ok(Self { columns })
    }

    fn record(&self, row: usize) -> RawRecord<'_> {
        let mut rec = RawRecord::default();
        for ((spec, slot), column) in CASE_FIELDS
            .iter()
            .zip(rec.fields.iter_mut())
            .zip(&self.columns)
        {
            let Some(a) = column else { continue };
            if a.is_null(row) {
                continue;
            }
            *slot = Some(match a.data_type() {
                DataType::Utf8 => {
                    let s = a.as_string::<i32>().value(row);
                    let is_json_object =
                        matches!(spec.kind, FieldKind::Object | FieldKind::Criteria)
                            && s.trim_start().starts_with('{');
                    if is_json_object {
                        FieldValue::Object(s.into())
                    } else {
                        FieldValue::Str(s.into())
                    }
                }
                DataType::Boolean => FieldValue::Bool(a.as_boolean().value(row)),
                _ => match cast(&a.slice(row, 1), &DataType::Float64) {
                    Ok(f) => FieldValue::Number(
                        f.as_primitive::<datafusion::arrow::datatypes::Float64Type>()
                            .value(0),
                    ),
                    Err(_) => FieldValue::Number(f64::NAN),
                },
            });
        }
        rec
    }
}

/// sha256 of a whole file, streamed.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = File::open(path).map_err(|e| Error::io(path, "cannot open", e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| Error::io(path, "cannot read", e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}

/// Validate a corpus without building batches.
pub fn validate_file(path: impl AsRef<Path>, opts: ReadOptions) -> Result<ValidationReport> {
    CorpusReader::open(
        path,
        ReadOptions {
            build_batches: false,
            ..opts
        },
    )?
    .finish()
}

/// A whole corpus in memory, for commands that need random access to a small corpus
/// (the generator's checks, enrichment tests). Fails when the corpus is invalid.
pub struct LoadedCorpus {
    pub batches: Vec<RecordBatch>,
    pub report: ValidationReport,
}

pub fn load_corpus(path: impl AsRef<Path>) -> Result<LoadedCorpus> {
    let mut reader = CorpusReader::open(path, ReadOptions::default())?;
    let mut batches = Vec::new();
    for b in reader.by_ref() {
        batches.push(b?);
    }
    let report = reader.finish()?;
    let report = report.into_result()?;
    Ok(LoadedCorpus { batches, report })
}
