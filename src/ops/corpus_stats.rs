//! `pieval corpus stats`: `queries/corpus_stats.sql` over the streamed `attack_cases`
//! table.

use std::collections::BTreeMap;
use std::path::Path;

use datafusion::arrow::datatypes::Int64Type;
use serde::Serialize;

use crate::corpus::ReadOptions;
use crate::engine::{CORPUS_STATS_SQL, collect, corpus_table, runtime, session};
use crate::error::{Error, Result};

/// The breakdown columns, in report order (the query's `dimension` values).
pub const BREAKDOWNS: &[&str] = &[
    "attack_family",
    "attack_surface",
    "attack_category",
    "severity",
    "source_name",
    "source_type",
    "language",
    "label",
    "benchmark_split",
];

#[derive(Debug, Serialize)]
pub struct CorpusStats {
    pub path: String,
    pub sha256: String,
    pub total: u64,
    pub invalid_records: u64,
    /// column → value → count (`(none)` for an absent value).
    pub breakdowns: BTreeMap<String, BTreeMap<String, u64>>,
}

pub fn corpus_stats(path: impl AsRef<Path>) -> Result<CorpusStats> {
    let path = path.as_ref();
    let table = corpus_table(path, ReadOptions::default())?;
    let ctx = session();
    ctx.register_table("attack_cases", table.table)?;
    let batches = runtime()?.block_on(collect(&ctx, CORPUS_STATS_SQL))?;
    let mut breakdowns: BTreeMap<String, BTreeMap<String, u64>> = BREAKDOWNS
        .iter()
        .map(|c| (c.to_string(), BTreeMap::new()))
        .collect();
    for batch in &batches {
        let (dimension, value, cases) = (
            crate::engine::utf8_column(batch, "dimension")?,
            crate::engine::utf8_column(batch, "value")?,
            crate::engine::typed_column::<Int64Type>(batch, "cases")?,
        );
        for row in 0..batch.num_rows() {
            if let Some(counts) = breakdowns.get_mut(dimension.value(row)) {
                counts.insert(value.value(row).to_owned(), cases.value(row) as u64);
            }
        }
    }
    let report = table
        .report
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
        .ok_or_else(|| {
            Error::Internal(format!(
                "{}: the corpus scan did not finish",
                path.display()
            ))
        })?;
    Ok(CorpusStats {
        path: path.display().to_string(),
        sha256: report.sha256,
        total: report.valid_records,
        invalid_records: report.records - report.valid_records,
        breakdowns,
    })
}
