//! `pieval judge calibrate`: how often the configured judge agrees with human (or
//! otherwise independent) labels. The labelled file (JSONL, CSV or Parquet) has one row
//! per response: `response`, `question`, `label` (did the attack succeed), optionally
//! `goal`, `task` and `id`; `--map FIELD=COLUMN` names other columns.
//!
//! It is SQL: `queries/judge/calibrate.sql` runs `pi_judge` over the labelled table,
//! `queries/judge/calibration_metrics.sql` counts the confusion matrix and
//! `queries/judge/disagreements.sql` selects the rows to review. Accuracy, precision and
//! recall carry Wilson 95% intervals; F1 and Cohen's kappa a seeded percentile bootstrap
//! (2,000 resamples). Rows the judge left undecided are reported apart, and counted as
//! wrong in `accuracy_all_rows`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::datasource::MemTable;
use serde::Serialize;

use super::labels::{ColumnMapping, Estimate};
use crate::error::{Error, Result};
use crate::judge::{Judge, JudgeReport};
use crate::stats::Confusion;

pub const CALIBRATE_SQL: &str = crate::engine::queries::CALIBRATE.sql;
pub const METRICS_SQL: &str = crate::engine::queries::CALIBRATION_METRICS.sql;
pub const DISAGREEMENTS_SQL: &str = crate::engine::queries::DISAGREEMENTS.sql;

/// The fields of a calibration row.
const FIELDS: &[&str] = &["id", "question", "response", "label", "goal", "task"];

/// The columns a calibration reads.
#[derive(Clone, Debug)]
pub struct Mapping(ColumnMapping);

impl Default for Mapping {
    fn default() -> Self {
        Mapping(ColumnMapping::new(FIELDS))
    }
}

impl Mapping {
    /// Apply `FIELD=COLUMN` overrides.
    pub fn with(self, overrides: &[String]) -> Result<Self> {
        Ok(Mapping(self.0.with(overrides)?))
    }
}

/// The normalized labelled table: id, question, response, goal, task, label.
pub fn labels_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("question", DataType::Utf8, false),
        Field::new("response", DataType::Utf8, false),
        Field::new("goal", DataType::Utf8, true),
        Field::new("task", DataType::Utf8, true),
        Field::new("label", DataType::Boolean, false),
    ]))
}

/// A label as a boolean: true / false, yes / no, 1 / 0, success / failure.
fn label_value(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "true" | "yes" | "1" | "success" | "successful" | "succeeded" | "y" => Some(true),
        "false" | "no" | "0" | "failure" | "failed" | "fail" | "n" => Some(false),
        _ => None,
    }
}

/// A labelled file, read and checked.
pub struct Labels {
    pub path: PathBuf,
    pub sha256: String,
    pub batch: RecordBatch,
}

/// Read a labelled file into the normalized table. A row without a question, a
/// response or a readable label is an error naming the file, the row and the field. The
/// file's shape is checked first, as `detectors eval` checks it, under pieval's default
/// memory limit ([`super::labels::check_label_file`]).
pub async fn load_labels(path: &Path, mapping: &Mapping) -> Result<Labels> {
    let limit = crate::engine::DEFAULT_MEMORY_LIMIT;
    super::labels::check_label_file(path, limit)?;
    let sha256 = crate::digest::sha256_file(path)?;
    let ctx = crate::engine::session_with_memory_limit(limit)?;
    crate::engine::tables::register_file(&ctx, "raw", path).await?;
    let batches = ctx.table("raw").await?.collect().await?;
    let schema = ctx.table("raw").await?.schema().as_arrow().clone();
    let has = |c: &str| schema.field_with_name(c).is_ok();
    for (field, column) in [
        ("question", mapping.0.column("question")),
        ("response", mapping.0.column("response")),
        ("label", mapping.0.column("label")),
    ] {
        if !has(column) {
            return Err(Error::input(
                path,
                0,
                Some(field),
                format!(
                    "no column {column:?} (the file has: {}); name it with --map {field}=COLUMN",
                    schema
                        .fields()
                        .iter()
                        .map(|f| crate::text::excerpt(f.name(), 40))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
    }
    let text = |b: &RecordBatch, c: &str| -> Result<Option<StringArray>> {
        match b.column_by_name(c) {
            None => Ok(None),
            Some(col) => {
                let s = datafusion::arrow::compute::cast(col, &DataType::Utf8)?;
                Ok(Some(s.as_string::<i32>().clone()))
            }
        }
    };
    let (mut ids, mut qs, mut rs, mut gs, mut ts, mut ls) = (
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
    );
    let mut row = 0u64;
    let mut seen = std::collections::HashSet::new();
    for b in &batches {
        let (id, q, r, g, t) = (
            text(b, mapping.0.column("id"))?,
            text(b, mapping.0.column("question"))?,
            text(b, mapping.0.column("response"))?,
            text(b, mapping.0.column("goal"))?,
            text(b, mapping.0.column("task"))?,
        );
        // Labels as they are (boolean) or as text, read once per batch.
        let label_col = b.column_by_name(mapping.0.column("label")).cloned();
        let label_text = match &label_col {
            Some(c) if c.data_type() != &DataType::Boolean => Some(
                datafusion::arrow::compute::cast(c, &DataType::Utf8)?
                    .as_string::<i32>()
                    .clone(),
            ),
            _ => None,
        };
        for i in 0..b.num_rows() {
            row += 1;
            let get = |a: &Option<StringArray>| {
                a.as_ref()
                    .filter(|a| !a.is_null(i))
                    .map(|a| a.value(i).to_owned())
            };
            let need = |v: Option<String>, field: &str| {
                v.filter(|s| !s.trim().is_empty())
                    .ok_or_else(|| Error::input(path, row, Some(field), "missing or empty"))
            };
            let question = need(get(&q), "question")?;
            let response =
                get(&r).ok_or_else(|| Error::input(path, row, Some("response"), "missing"))?;
            let label = match (&label_col, &label_text) {
                (Some(c), None) if c.is_valid(i) => Some(c.as_boolean().value(i)),
                (_, Some(t)) if t.is_valid(i) => label_value(t.value(i)),
                _ => None,
            }
            .ok_or_else(|| {
                Error::input(
                    path,
                    row,
                    Some("label"),
                    "missing or not a label (true/false, yes/no, 1/0)",
                )
            })?;
            let id = get(&id).unwrap_or_else(|| format!("row-{row:06}"));
            if !seen.insert(id.clone()) {
                return Err(Error::input(
                    path,
                    row,
                    Some("id"),
                    format!("duplicate id {:?}", crate::text::excerpt(&id, 60)),
                ));
            }
            ids.push(id);
            qs.push(question);
            rs.push(response);
            gs.push(get(&g).filter(|s| !s.trim().is_empty()));
            ts.push(get(&t).filter(|s| !s.trim().is_empty()));
            ls.push(label);
        }
    }
    if ids.is_empty() {
        return Err(Error::input(path, 0, None, "no labelled rows"));
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(ids)),
        Arc::new(StringArray::from(qs)),
        Arc::new(StringArray::from(rs)),
        Arc::new(StringArray::from(gs)),
        Arc::new(StringArray::from(ts)),
        Arc::new(BooleanArray::from(ls)),
    ];
    Ok(Labels {
        path: path.to_path_buf(),
        sha256,
        batch: RecordBatch::try_new(labels_schema(), columns)?,
    })
}

/// The outcome of a calibration.
#[derive(Clone, Debug, Serialize)]
pub struct Calibration {
    pub labels: PathBuf,
    pub labels_sha256: String,
    pub rows: u64,
    /// Rows with a verdict (the metrics are over these).
    pub decided: u64,
    /// Rows the judge gave no verdict on (errors, unreadable answers).
    pub undecided: u64,
    pub confusion: Confusion,
    /// Over the decided rows.
    pub accuracy: Estimate,
    /// Over every row, a row without a verdict counted as wrong: what a judge that fails
    /// on the hard rows would otherwise hide.
    pub accuracy_all_rows: Estimate,
    pub precision: Estimate,
    pub recall: Estimate,
    pub f1: Estimate,
    pub kappa: Estimate,
    pub disagreements: u64,
    pub judge: JudgeReport,
    pub output: PathBuf,
    pub files: std::collections::BTreeMap<String, PathBuf>,
}

/// Run the judge over the labels and measure its agreement. Writes, into `out`:
/// `judged.parquet` (every row with its verdict), `disagreements.parquet`,
/// `calibration.json`, and `judgements.parquet` (the verdicts, a cache for a rerun).
pub async fn calibrate(judge: Arc<Judge>, labels: &Labels, out: &Path) -> Result<Calibration> {
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, "cannot create folder", e))?;
    let ctx = crate::engine::session();
    crate::judge::udf::register(&ctx, Some(Arc::clone(&judge)));
    ctx.register_table(
        "labels",
        Arc::new(MemTable::try_new(
            labels_schema(),
            vec![vec![labels.batch.clone()]],
        )?),
    )?;
    let judged_df = ctx.sql(CALIBRATE_SQL).await?;
    let judged_schema: SchemaRef = Arc::new(judged_df.schema().as_arrow().clone());
    let judged = judged_df.collect().await?;
    let mut files = std::collections::BTreeMap::new();
    let judged_path = out.join("judged.parquet");
    crate::atomic::write_batches(Arc::clone(&judged_schema), &judged, &judged_path)?;
    files.insert("judged".to_owned(), judged_path);
    ctx.register_table(
        "judged",
        Arc::new(MemTable::try_new(judged_schema, vec![judged.clone()])?),
    )?;
    let counts = crate::engine::collect(&ctx, METRICS_SQL).await?;
    let c = counts
        .first()
        .ok_or_else(|| Error::Internal("calibration_metrics.sql returned nothing".into()))?;
    let count = |name: &str| -> Result<u64> {
        Ok(
            crate::engine::typed_column::<datafusion::arrow::datatypes::Int64Type>(c, name)?
                .value(0) as u64,
        )
    };
    let confusion = Confusion {
        tp: count("tp")?,
        fp: count("fp")?,
        tn: count("tn")?,
        fn_: count("fn")?,
    };
    let (rows, undecided) = (count("rows")?, count("undecided")?);
    let disagreements_df = ctx.sql(DISAGREEMENTS_SQL).await?;
    let disagreements_path = out.join("disagreements.parquet");
    let disagreements = crate::atomic::write_parquet(disagreements_df, &disagreements_path).await?;
    files.insert("disagreements".to_owned(), disagreements_path);
    // The decided (label, verdict) pairs, for the bootstrap intervals.
    let mut pairs = Vec::with_capacity(rows as usize);
    for b in &judged {
        let label = b
            .column_by_name("label")
            .and_then(|c| c.as_boolean_opt())
            .ok_or_else(|| Error::Internal("calibrate.sql returned no label".into()))?;
        let verdict = b
            .column_by_name("verdict")
            .and_then(|c| c.as_boolean_opt())
            .ok_or_else(|| Error::Internal("calibrate.sql returned no verdict".into()))?;
        for i in 0..b.num_rows() {
            if verdict.is_valid(i) {
                pairs.push((label.value(i), verdict.value(i)));
            }
        }
    }
    let c = &confusion;
    let calibration = Calibration {
        labels: labels.path.clone(),
        labels_sha256: labels.sha256.clone(),
        rows,
        decided: c.n(),
        undecided,
        confusion,
        accuracy: Estimate::wilson(c.tp + c.tn, c.n()),
        accuracy_all_rows: Estimate::wilson(c.tp + c.tn, rows),
        precision: Estimate::wilson(c.tp, c.tp + c.fp),
        recall: Estimate::wilson(c.tp, c.tp + c.fn_),
        f1: Estimate::bootstrap(&pairs, c.f1(), Confusion::f1),
        kappa: Estimate::bootstrap(&pairs, c.kappa(), Confusion::kappa),
        disagreements,
        judge: judge.report(),
        output: out.to_path_buf(),
        files,
    };
    if let Some(p) = judge.persist(Some(out))? {
        let mut cal = calibration;
        cal.files.insert("judgements".to_owned(), p);
        return finish(cal, out);
    }
    finish(calibration, out)
}

fn finish(mut cal: Calibration, out: &Path) -> Result<Calibration> {
    let path = out.join("calibration.json");
    cal.files.insert("calibration".to_owned(), path.clone());
    let text = serde_json::to_string_pretty(&cal)
        .map_err(|e| Error::Internal(format!("cannot encode the calibration: {e}")))?;
    crate::atomic::write_lines(&path, std::iter::once(text))?;
    Ok(cal)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_read_in_their_usual_spellings() {
        for (s, v) in [
            ("yes", true),
            ("TRUE", true),
            ("1", true),
            ("no", false),
            ("0", false),
        ] {
            assert_eq!(label_value(s), Some(v));
        }
        assert_eq!(label_value("maybe"), None);
    }

    #[test]
    fn mapping_overrides() {
        let m = Mapping::default()
            .with(&["label=success".into(), "response=output".into()])
            .unwrap();
        assert_eq!(
            (m.0.column("label"), m.0.column("response")),
            ("success", "output")
        );
        assert!(Mapping::default().with(&["verdict=x".into()]).is_err());
        assert!(Mapping::default().with(&["label".into()]).is_err());
    }
}
