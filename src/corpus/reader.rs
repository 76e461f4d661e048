//! The streaming corpus reader: JSONL or Parquet attack cases → Arrow `RecordBatch`es
//! of the enriched-case schema, checking every record against the contract and
//! computing the file's sha256 on the way. Memory is bounded by one line (JSONL) or one
//! row group (Parquet), one output batch, and the set of `case_id` hashes.
//!
//! Every command reads corpora through here, so "valid" means the same thing for
//! `validate`, `enrich`, `corpus stats` and the runner.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::compute::filter_record_batch;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::parquet::arrow::arrow_reader::{
    ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder,
};
use serde::Serialize;

pub use super::batch::ReadOptions;
use super::batch::{CaseBatchBuilder, IdKeys};
use super::jsonl::{BlockResult, Next, Pipeline};
use crate::contract::fields::{CASE_FIELDS, FieldKind, case_field_index};
use crate::contract::record::{CriteriaCache, FieldValue, RawRecord, Violation, check_record};
use crate::digest::sha256_file;
use crate::error::{Error, Result};

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
    /// The digest of the shared environment files the records included
    /// ([`crate::corpus::includes::Includes::digest`]); absent when none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub includes_sha256: Option<String>,
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
    pub fn open(path: impl AsRef<Path>, mut opts: ReadOptions) -> Result<Self> {
        let path = path.as_ref();
        if opts.base_dir.is_none() {
            opts.base_dir = Some(match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => std::path::PathBuf::from("."),
            });
        }
        if let Some(bad) = opts
            .projection
            .iter()
            .flatten()
            .find(|i| **i >= CASE_FIELDS.len())
        {
            return Err(Error::Internal(format!(
                "projection index {bad} is out of range: the attack-case schema has {} columns",
                CASE_FIELDS.len()
            )));
        }
        let file = crate::files::open_input(path, "cannot open corpus")?;
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
                    includes_sha256: None,
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
                    Next::End {
                        sha256,
                        bytes,
                        includes_sha256,
                    } => {
                        c.report.sha256 = sha256;
                        c.report.bytes = bytes;
                        c.report.includes_sha256 = includes_sha256;
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
            } else if matches!(ty, DataType::List(_) | DataType::LargeList(_))
                && let Ok(list) = cast(array, &crate::contract::arrow::tags_type())
            {
                // A list of strings (framework tags); checked row by row as JSON text.
                Some(list)
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
                    let is_json_object = matches!(
                        spec.kind,
                        FieldKind::Object | FieldKind::Criteria | FieldKind::Environment
                    ) && s.trim_start().starts_with('{');
                    if is_json_object {
                        FieldValue::Object(s.into())
                    } else {
                        FieldValue::Str(s.into())
                    }
                }
                DataType::Boolean => FieldValue::Bool(a.as_boolean().value(row)),
                DataType::List(_) => {
                    let items = a.as_list::<i32>().value(row);
                    let items = items.as_string::<i32>();
                    let tags: Vec<Option<&str>> = items.iter().collect();
                    FieldValue::List(serde_json::to_string(&tags).unwrap_or_default().into())
                }
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
