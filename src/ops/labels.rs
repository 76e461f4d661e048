//! What `judge calibrate` and `detectors eval` share about labelled files: the column
//! mapping (`--map FIELD=COLUMN`), the shape check made before a reader sees a file, and
//! a statistic with its interval.

use std::collections::HashSet;
use std::path::Path;

use datafusion::arrow::array::Array;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::stats::{Confusion, bootstrap, wilson};

/// Bootstrap resamples behind an interval that has no closed form, and their seed.
pub const RESAMPLES: usize = 2000;
pub const SEED: u64 = 0;

/// Which column each field of a labelled file is read from: the field's own name unless
/// `--map FIELD=COLUMN` says otherwise. Shared by `judge calibrate` and `detectors eval`.
#[derive(Clone, Debug)]
pub struct ColumnMapping {
    fields: &'static [&'static str],
    columns: Vec<String>,
}

impl ColumnMapping {
    pub fn new(fields: &'static [&'static str]) -> Self {
        Self {
            fields,
            columns: fields.iter().map(|f| (*f).to_owned()).collect(),
        }
    }

    /// Apply `FIELD=COLUMN` overrides.
    pub fn with(mut self, overrides: &[String]) -> Result<Self> {
        let mut mapped: Vec<&str> = Vec::new();
        for spec in overrides {
            let (field, column) = spec
                .split_once('=')
                .ok_or_else(|| Error::Usage(format!("--map {spec:?}: expected FIELD=COLUMN")))?;
            let i = self
                .fields
                .iter()
                .position(|f| *f == field)
                .ok_or_else(|| {
                    Error::Usage(format!(
                        "--map {:?}: the fields are {}",
                        crate::text::excerpt(field, 40),
                        self.fields.join(", ")
                    ))
                })?;
            if mapped.contains(&field) {
                return Err(Error::Usage(format!(
                    "--map {:?}: the field is mapped twice (give one --map per field)",
                    crate::text::excerpt(field, 40)
                )));
            }
            mapped.push(field);
            self.columns[i] = column.to_owned();
        }
        Ok(self)
    }

    /// The column a field is read from.
    pub fn column<'a>(&'a self, field: &'a str) -> &'a str {
        self.fields
            .iter()
            .position(|f| *f == field)
            .map_or(field, |i| self.columns[i].as_str())
    }
}

/// A statistic with its 95% interval.
#[derive(Clone, Debug, Serialize)]
pub struct Estimate {
    pub value: Option<f64>,
    pub ci_low: Option<f64>,
    pub ci_high: Option<f64>,
    /// `wilson_95` or `bootstrap_95`.
    pub interval: &'static str,
}

impl Estimate {
    pub(crate) fn wilson(k: u64, n: u64) -> Self {
        let ci = wilson(k, n);
        Estimate {
            value: (n > 0).then(|| k as f64 / n as f64),
            ci_low: ci.map(|c| c.0),
            ci_high: ci.map(|c| c.1),
            interval: "wilson_95",
        }
    }

    pub(crate) fn bootstrap(
        pairs: &[(bool, bool)],
        value: Option<f64>,
        stat: fn(&Confusion) -> Option<f64>,
    ) -> Self {
        let ci = value.and(bootstrap(pairs, stat, RESAMPLES, SEED));
        Estimate {
            value,
            ci_low: ci.map(|c| c.0),
            ci_high: ci.map(|c| c.1),
            interval: "bootstrap_95",
        }
    }
}

/// Columns a labelled file may have at most (its fields are 11; the reader prepares a
/// buffer per column and batch, so 50,000 columns cost gigabytes).
pub const MAX_LABEL_COLUMNS: usize = 1024;
/// A line of a labelled CSV or JSONL file at most.
pub const MAX_LABEL_LINE_BYTES: u64 = 16 << 20;

/// Check a labelled file's shape before a reader sees it, reading it once as bytes: at
/// most [`MAX_LABEL_COLUMNS`] columns (a CSV header, the keys of a JSONL file's first
/// 1,000 lines, a Parquet footer), lines of at most [`MAX_LABEL_LINE_BYTES`], and small
/// enough for the rows held in memory (a quarter of `memory_limit`: the file is read
/// whole, then normalized and scored). Errors name the file.
pub fn check_label_file(path: &Path, memory_limit: usize) -> Result<()> {
    use std::io::{BufRead, BufReader};
    let budget = (memory_limit / 4) as u64;
    let too_big = |what: String| {
        Error::input(
            path,
            0,
            None,
            format!(
                "{what}, more than a quarter of the {} MiB memory limit (the labels are held in memory; `detectors eval --memory-limit` raises it)",
                memory_limit >> 20
            ),
        )
    };
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    if ext == "parquet" {
        let limits = crate::rundir::bounds::ParquetLimits {
            max_decoded_bytes: budget,
            max_columns: MAX_LABEL_COLUMNS,
        };
        crate::rundir::bounds::check_parquet_file(path, crate::files::Links::Follow, &limits)?;
        // What a footer need not declare (one value repeated through a dictionary on every
        // row): the text the rows decode to, summed over views that point into the file's
        // pages (nothing is copied), against the same budget.
        use datafusion::arrow::array::AsArray;
        use datafusion::parquet::arrow::arrow_reader::{
            ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
        };
        let unreadable = |e: datafusion::parquet::errors::ParquetError| {
            Error::config(path, format!("not a readable Parquet file: {e}"))
        };
        let schema = ParquetRecordBatchReaderBuilder::try_new(crate::files::open_input(
            path,
            "cannot open",
        )?)
        .map_err(unreadable)?
        .schema()
        .clone();
        let views = std::sync::Arc::new(crate::engine::bounded::as_views(&schema));
        let reader = ParquetRecordBatchReaderBuilder::try_new_with_options(
            crate::files::open_input(path, "cannot open")?,
            ArrowReaderOptions::new().with_schema(views),
        )
        .map_err(unreadable)?
        .with_batch_size(1024)
        .build()
        .map_err(unreadable)?;
        let mut text: u64 = 0;
        for batch in reader {
            let batch = batch
                .map_err(|e| Error::config(path, format!("not a readable Parquet file: {e}")))?;
            for col in batch.columns() {
                if let Some(v) = col.as_string_view_opt() {
                    text += v.views().iter().map(|x| u64::from(*x as u32)).sum::<u64>();
                } else if let Some(d) = col.as_any_dictionary_opt() {
                    // A dictionary column (the file's Arrow schema may ask for one): each
                    // row costs its value's length once read.
                    let values = d.values();
                    let lens: Vec<u64> = match values.data_type() {
                        datafusion::arrow::datatypes::DataType::Utf8 => {
                            let v = values.as_string::<i32>();
                            (0..v.len()).map(|i| v.value(i).len() as u64).collect()
                        }
                        datafusion::arrow::datatypes::DataType::LargeUtf8 => {
                            let v = values.as_string::<i64>();
                            (0..v.len()).map(|i| v.value(i).len() as u64).collect()
                        }
                        datafusion::arrow::datatypes::DataType::Utf8View => {
                            let v = values.as_string_view();
                            v.views().iter().map(|x| u64::from(*x as u32)).collect()
                        }
                        _ => Vec::new(),
                    };
                    if !lens.is_empty() {
                        text += d
                            .normalized_keys()
                            .iter()
                            .map(|k| lens.get(*k).copied().unwrap_or(0))
                            .sum::<u64>();
                    }
                }
            }
            if text > budget {
                return Err(too_big(format!(
                    "text that decodes to more than {}",
                    crate::rundir::bounds::human(budget)
                )));
            }
        }
        return Ok(());
    }
    let file = crate::files::open_input(path, "cannot open")?;
    let len = file
        .metadata()
        .map_err(|e| Error::io(path, "cannot read", e))?
        .len();
    if len > budget {
        return Err(too_big(format!(
            "{} of labels",
            crate::rundir::bounds::human(len)
        )));
    }
    let csv = ext == "csv";
    if csv {
        // The header as the CSV reader itself parses it (a quote inside a field is text
        // to it, so counting by hand would be fooled), read from at most one line's bound.
        use std::io::Read;
        let head = crate::files::open_input(path, "cannot open")?;
        let (schema, _) = datafusion::arrow::csv::reader::Format::default()
            .with_header(true)
            .infer_schema(head.take(MAX_LABEL_LINE_BYTES + 1), Some(0))
            .map_err(|e| {
                Error::input(path, 1, None, format!("the CSV header does not read: {e}"))
            })?;
        if schema.fields().len() > MAX_LABEL_COLUMNS {
            return Err(Error::input(
                path,
                1,
                None,
                format!("more than {MAX_LABEL_COLUMNS} columns in the header"),
            ));
        }
    }
    let mut reader = BufReader::with_capacity(1 << 16, file);
    // the first record (CSV header) or the first 1,000 lines (JSONL keys)
    let mut line: Vec<u8> = Vec::new();
    let (mut line_no, mut width) = (1u64, 0u64);
    // Non-blank JSONL lines read for their keys (schema inference skips blank ones).
    let mut records = 0u64;
    let mut keys: HashSet<String> = HashSet::new();
    let mut columns = 1usize;
    let mut in_quotes = false;
    let mut header_done = !csv;
    loop {
        let buf = reader
            .fill_buf()
            .map_err(|e| Error::io(path, "cannot read", e))?;
        if buf.is_empty() {
            break;
        }
        let n = buf.len();
        for &b in buf {
            if csv && !header_done {
                match b {
                    b'"' => in_quotes = !in_quotes,
                    b',' if !in_quotes => columns += 1,
                    b'\n' if !in_quotes => header_done = true,
                    _ => {}
                }
                if columns > MAX_LABEL_COLUMNS {
                    return Err(Error::input(
                        path,
                        1,
                        None,
                        format!("more than {MAX_LABEL_COLUMNS} columns in the header"),
                    ));
                }
            }
            if b == b'\n' {
                if !csv && records < 1000 {
                    if !line.iter().all(u8::is_ascii_whitespace) {
                        records += 1;
                    }
                    // Every key at every depth: a nested object's fields are columns
                    // too, to the reader's schema inference.
                    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&line) {
                        fn walk(v: &serde_json::Value, at: &str, keys: &mut HashSet<String>) {
                            match v {
                                serde_json::Value::Object(m) => {
                                    for (k, v) in m {
                                        let path = format!("{at}.{k}");
                                        walk(v, &path, keys);
                                        keys.insert(path);
                                    }
                                }
                                serde_json::Value::Array(a) => {
                                    for v in a {
                                        walk(v, &format!("{at}[]"), keys);
                                    }
                                }
                                _ => {}
                            }
                        }
                        walk(&v, "", &mut keys);
                    }
                    line.clear();
                    if keys.len() > MAX_LABEL_COLUMNS {
                        return Err(Error::input(
                            path,
                            line_no,
                            None,
                            format!("more than {MAX_LABEL_COLUMNS} distinct fields"),
                        ));
                    }
                }
                line_no += 1;
                width = 0;
            } else {
                width += 1;
                if width > MAX_LABEL_LINE_BYTES {
                    return Err(Error::input(
                        path,
                        line_no,
                        None,
                        format!("a line longer than {} MiB", MAX_LABEL_LINE_BYTES >> 20),
                    ));
                }
                if !csv && records < 1000 {
                    line.push(b);
                }
            }
        }
        reader.consume(n);
    }
    Ok(())
}
