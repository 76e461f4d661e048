//! `pieval corpus stats`: counts by family, surface, category, severity, source,
//! language, label and split, computed while streaming the corpus.

use std::collections::BTreeMap;
use std::path::Path;

use datafusion::arrow::array::{Array, AsArray};
use serde::Serialize;

use super::reader::{CorpusReader, ReadOptions};
use crate::error::Result;

/// The columns broken down, in report order.
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
    let mut reader = CorpusReader::open(path, ReadOptions::default())?;
    let mut breakdowns: BTreeMap<String, BTreeMap<String, u64>> = BREAKDOWNS
        .iter()
        .map(|c| (c.to_string(), BTreeMap::new()))
        .collect();
    for batch in reader.by_ref() {
        let batch = batch?;
        for column in BREAKDOWNS {
            let counts = breakdowns.get_mut(*column).expect("initialised");
            let array = batch
                .column_by_name(column)
                .expect("enriched schema")
                .as_string::<i32>();
            for row in 0..array.len() {
                let key = if array.is_null(row) {
                    "(none)"
                } else {
                    array.value(row)
                };
                match counts.get_mut(key) {
                    Some(n) => *n += 1,
                    None => {
                        counts.insert(key.to_owned(), 1);
                    }
                }
            }
        }
    }
    let report = reader.finish()?;
    Ok(CorpusStats {
        path: path.display().to_string(),
        sha256: report.sha256,
        total: report.valid_records,
        invalid_records: report.records - report.valid_records,
        breakdowns,
    })
}
