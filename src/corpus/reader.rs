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
    Array, ArrayRef, AsArray, BooleanArray, Float64Builder, RecordBatch, RecordBatchOptions,
    StringBuilder,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::compute::filter_record_batch;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::parquet::arrow::arrow_reader::{
    ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder,
};
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::jsonl::{BlockResult, Next, Pipeline};
use super::lines::DEFAULT_MAX_LINE_BYTES;
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
    /// Columns of the enriched-case schema to build (by index); `None` builds all.
    /// Every record is still fully checked; unprojected values are just not copied.
    pub projection: Option<Vec<usize>>,
}

impl Default for ReadOptions {
    fn default() -> Self {
        Self {
            max_line_bytes: DEFAULT_MAX_LINE_BYTES,
            batch_size: 8192,
            max_reported: 100,
            build_batches: true,
            projection: None,
        }
    }
}

impl ReadOptions {
    /// The schema of the batches these options produce (out-of-range projection
    /// indexes, which [`CorpusReader::open`] rejects, are ignored here).
    pub fn output_schema(&self) -> SchemaRef {
        let full = enriched_case_schema();
        match &self.projection {
            Some(p) => {
                let fields: Vec<_> = p
                    .iter()
                    .filter_map(|i| full.fields().get(*i).cloned())
                    .collect();
                Arc::new(datafusion::arrow::datatypes::Schema::new(fields))
            }
            None => full,
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
        let first = self
            .violations
            .iter()
            .find(|v| v.level == crate::contract::Level::Error)
            .map(|v| {
                format!(
                    "{}: {}: {}",
                    v.line,
                    v.field.as_deref().unwrap_or("record"),
                    v.problem
                )
            })
            .unwrap_or_default();
        Err(Error::Invalid {
            path: self.path.clone(),
            count: self.errors,
            first,
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
    Jsonl(Box<Pipeline>),
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
        if let Some(bad) = opts
            .projection
            .iter()
            .flatten()
            .find(|i| **i >= CASE_FIELDS.len())
        {
            return Err(Error::Usage(format!(
                "projection index {bad} is out of range: the attack-case schema has {} columns",
                CASE_FIELDS.len()
            )));
        }
        let file = File::open(path).map_err(|e| Error::io(path, "cannot open corpus", e))?;
        let ids = IdSet::default();
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
            let pipeline = Pipeline::start(file, &opts, ids.keys.clone());
            (Source::Jsonl(Box::new(pipeline)), "jsonl", String::new())
        };
        Ok(Self {
            source,
            done: false,
            checker: Checker {
                builder: CaseBatchBuilder::new(&opts),
                opts,
                criteria: CriteriaCache::default(),
                ids,
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
        self.checker.opts.output_schema()
    }

    /// The report; meaningful once the iterator is exhausted (it drains it if not).
    pub fn finish(mut self) -> Result<ValidationReport> {
        for batch in self.by_ref() {
            batch?;
        }
        Ok(self.checker.report)
    }

    /// The next non-empty batch, or `None` at the end of input.
    fn fill_batch(&mut self) -> Result<Option<RecordBatch>> {
        let c = &mut self.checker;
        match &mut self.source {
            Source::Jsonl(pipeline) => loop {
                let next = pipeline
                    .next()
                    .map_err(|e| Error::io(&c.report.path, "cannot read corpus", e))?;
                match next {
                    Next::Block(block) => {
                        if let Some(batch) = c.merge_block(block)? {
                            return Ok(Some(batch));
                        }
                    }
                    Next::End { sha256, bytes } => {
                        c.report.sha256 = sha256;
                        c.report.bytes = bytes;
                        return Ok(None);
                    }
                }
            },
            Source::Parquet { reader, next_row } => loop {
                if c.builder.len() >= c.opts.batch_size {
                    return c.builder.finish().map(Some);
                }
                if !c.read_parquet_batch(reader, next_row)? {
                    return if c.builder.len() > 0 {
                        c.builder.finish().map(Some)
                    } else {
                        Ok(None)
                    };
                }
            },
        }
    }
}

impl Checker {
    /// Fold one JSONL block's result into the report, in file order: duplicate ids are
    /// decided here (the first occurrence in the file wins) and their rows dropped.
    fn merge_block(&mut self, mut block: BlockResult) -> Result<Option<RecordBatch>> {
        let max = self.opts.max_reported;
        self.report.records += block.records;
        self.report.valid_records += block.valid;
        let mut dropped = Vec::new();
        let mut duplicates = false;
        for e in block.ids.drain(..) {
            if let Some(first) = self.ids.insert_hash(e.hash, e.line) {
                duplicates = true;
                block.violations.push(Violation::error(
                    e.line,
                    Some("case_id"),
                    format!(
                        "duplicate case_id {:?} (first at line {first})",
                        crate::text::excerpt(&block.id_text[e.id.clone()], 80)
                    ),
                ));
                if e.valid {
                    self.report.valid_records -= 1;
                }
                dropped.extend(e.row);
            }
        }
        if duplicates {
            // Stable: a duplicate is reported after the record's other problems.
            block.violations.sort_by_key(|v| v.line);
        }
        for v in block.violations {
            self.report.push(v, max);
        }
        let Some(batch) = block.batch.transpose()? else {
            return Ok(None);
        };
        if dropped.is_empty() {
            return Ok(Some(batch));
        }
        let keep: BooleanArray = (0..batch.num_rows())
            .map(|r| Some(!dropped.contains(&r)))
            .collect();
        let batch = filter_record_batch(&batch, &keep)?;
        Ok((batch.num_rows() > 0).then_some(batch))
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
            && let Some(first) = self.ids.insert_hash(self.ids.keys.hash(id), no)
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
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

/// serde_json's message without its "at line 1 column N" tail, with the column first.
pub(crate) fn json_error_message(e: &serde_json::Error, text: &str) -> String {
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

/// Two independently keyed SipHashes: a 128-bit fingerprint of a case id. Shared by
/// the check workers so they all hash alike.
#[derive(Clone, Default)]
pub(crate) struct IdKeys(RandomState, RandomState);

impl IdKeys {
    pub(crate) fn hash(&self, id: &str) -> u128 {
        ((self.0.hash_one(id) as u128) << 64) | self.1.hash_one(id) as u128
    }
}

/// The set of case ids seen, as fingerprints, so duplicate detection needs about 20
/// bytes a case rather than the ids themselves.
#[derive(Default)]
struct IdSet {
    keys: IdKeys,
    seen: HashMap<u128, u64>,
}

impl IdSet {
    /// Insert; returns the line of the first occurrence when the id was seen before.
    fn insert_hash(&mut self, hash: u128, line: u64) -> Option<u64> {
        match self.seen.entry(hash) {
            std::collections::hash_map::Entry::Occupied(e) => Some(*e.get()),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(line);
                None
            }
        }
    }
}

/// Builds batches of the enriched-case schema from valid records.
pub(crate) struct CaseBatchBuilder {
    /// One per contract field, in [`CASE_FIELDS`] order; `Skip` when not projected.
    columns: Vec<ColumnBuilder>,
    schema: SchemaRef,
    rows: usize,
}

enum ColumnBuilder {
    Skip,
    Text(StringBuilder),
    Number(Float64Builder),
}

impl CaseBatchBuilder {
    pub(crate) fn new(opts: &ReadOptions) -> Self {
        let capacity = opts.batch_size;
        let columns = CASE_FIELDS
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let wanted = opts.projection.as_ref().is_none_or(|p| p.contains(&i));
                match (wanted, f.kind) {
                    (false, _) => ColumnBuilder::Skip,
                    (true, FieldKind::Probability) => {
                        ColumnBuilder::Number(Float64Builder::with_capacity(capacity))
                    }
                    (true, _) => {
                        ColumnBuilder::Text(StringBuilder::with_capacity(capacity, capacity * 32))
                    }
                }
            })
            .collect();
        Self {
            columns,
            schema: opts.output_schema(),
            rows: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.rows
    }

    pub(crate) fn append(&mut self, rec: &RawRecord<'_>, criteria: &mut CriteriaCache) {
        for ((spec, value), column) in CASE_FIELDS.iter().zip(&rec.fields).zip(&mut self.columns) {
            match (column, value) {
                (ColumnBuilder::Skip, _) => {}
                (ColumnBuilder::Number(b), Some(FieldValue::Number(x))) => b.append_value(*x),
                (ColumnBuilder::Number(b), _) => b.append_null(),
                (
                    ColumnBuilder::Text(b),
                    Some(v @ (FieldValue::Object(_) | FieldValue::Str(_))),
                ) if spec.kind == FieldKind::Criteria => {
                    // Already checked: the cache holds the canonical form.
                    match criteria.check(v) {
                        Ok(canonical) => b.append_value(canonical),
                        Err(_) => b.append_null(),
                    }
                }
                (ColumnBuilder::Text(b), Some(FieldValue::Str(s))) => b.append_value(s),
                (ColumnBuilder::Text(b), Some(FieldValue::Object(t))) => b.append_value(t),
                (ColumnBuilder::Text(b), _) => b.append_null(),
            }
        }
        self.rows += 1;
    }

    fn finish(&mut self) -> Result<RecordBatch> {
        Ok(self.finish_arrow()?)
    }

    pub(crate) fn finish_arrow(&mut self) -> datafusion::arrow::error::Result<RecordBatch> {
        let columns: Vec<ArrayRef> = self
            .columns
            .iter_mut()
            .filter_map(|c| match c {
                ColumnBuilder::Skip => None,
                ColumnBuilder::Text(b) => Some(Arc::new(b.finish()) as ArrayRef),
                ColumnBuilder::Number(b) => Some(Arc::new(b.finish()) as ArrayRef),
            })
            .collect();
        // A projection of no columns (`SELECT count(*)`) still carries its row count.
        let options = RecordBatchOptions::new().with_row_count(Some(self.rows));
        self.rows = 0;
        RecordBatch::try_new_with_options(Arc::clone(&self.schema), columns, &options)
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
