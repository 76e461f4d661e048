//! Building Arrow batches of the enriched-case schema from checked records, shared by
//! the corpus readers (the JSONL pipeline's check workers and the Parquet reader), with
//! the options they read by and the pieces they share (id fingerprints, JSON messages).

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, Float64Builder, ListBuilder, RecordBatch, RecordBatchOptions, StringBuilder,
};
use datafusion::arrow::datatypes::SchemaRef;

use super::lines::DEFAULT_MAX_LINE_BYTES;
use crate::contract::arrow::enriched_case_schema;
use crate::contract::fields::{CASE_FIELDS, FieldKind};
use crate::contract::record::{CriteriaCache, FieldValue, RawRecord, parse_tags};
use crate::error::Result;

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
    /// The folder environment `include`s are read from (the corpus file's, set when a
    /// file is opened); `None`: an include is an error of the record.
    pub base_dir: Option<std::path::PathBuf>,
}

impl Default for ReadOptions {
    fn default() -> Self {
        Self {
            max_line_bytes: DEFAULT_MAX_LINE_BYTES,
            batch_size: 8192,
            max_reported: 100,
            build_batches: true,
            projection: None,
            base_dir: None,
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
    Tags(ListBuilder<StringBuilder>),
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
                    (true, FieldKind::Tags) => ColumnBuilder::Tags(ListBuilder::new(
                        StringBuilder::with_capacity(capacity, capacity * 8),
                    )),
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
                // Already checked: a list of distinct strings.
                (ColumnBuilder::Tags(b), Some(FieldValue::List(text))) => match parse_tags(text) {
                    Ok(tags) => {
                        for t in tags {
                            b.values().append_value(t);
                        }
                        b.append(true);
                    }
                    Err(_) => b.append_null(),
                },
                (ColumnBuilder::Tags(b), _) => b.append_null(),
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

    pub(crate) fn finish(&mut self) -> Result<RecordBatch> {
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
                ColumnBuilder::Tags(b) => Some(Arc::new(b.finish()) as ArrayRef),
            })
            .collect();
        // A projection of no columns (`SELECT count(*)`) still carries its row count.
        let options = RecordBatchOptions::new().with_row_count(Some(self.rows));
        self.rows = 0;
        RecordBatch::try_new_with_options(Arc::clone(&self.schema), columns, &options)
    }
}
