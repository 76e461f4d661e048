//! `pieval export`: runs into a data-warehouse layout.
//!
//! **Parquet** (Hive-partitioned, what Spark, Trino, DuckDB and BigQuery read):
//!
//! ```text
//! DIR/case_results/run_date=YYYY-MM-DD/model_name=NAME/part-RUN_ID.parquet
//! DIR/findings/run_date=YYYY-MM-DD/part-RUN_ID.parquet
//! DIR/controls/run_date=YYYY-MM-DD/part-RUN_ID.parquet      (runs with `pieval controls`)
//! DIR/runs/run_date=YYYY-MM-DD/part-RUN_ID.parquet
//! DIR/attack_cases/run_id=RUN_ID/part-0.parquet             (the corpus records each run used)
//! ```
//!
//! Partition columns live in the path only (Spark rejects a column in both). A file's
//! name is its run, so exporting a run again replaces its files: no duplicated rows.
//!
//! **SQLite**: `DIR/pieval.sqlite` with the same tables (partition columns as ordinary
//! columns), indexes on the usual keys; a run's rows are replaced in one transaction.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, Float64Array, Int64Array, RecordBatch, StringArray,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Float64Type, Int64Type, Schema, SchemaRef};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::parquet::arrow::arrow_reader::{
    ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use datafusion::parquet::errors::ParquetError;
use serde::Serialize;
use serde_json::Value;

use crate::corpus::{CorpusReader, ReadOptions};
use crate::error::{Error, Result};
use crate::rundir::{Manifest, Rate, RunResults, check_run_id};

/// The export formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    Parquet,
    Sqlite,
}

impl Format {
    pub const ALL: [Format; 2] = [Format::Parquet, Format::Sqlite];

    pub fn as_str(self) -> &'static str {
        match self {
            Format::Parquet => "parquet",
            Format::Sqlite => "sqlite",
        }
    }
}

/// The SQLite file of a `--format sqlite` export.
pub const SQLITE_FILE: &str = "pieval.sqlite";

/// What was exported of one run: table → rows.
#[derive(Debug, Clone, Serialize)]
pub struct RunExport {
    pub run_id: String,
    pub run_date: String,
    pub model_name: String,
    pub tables: Vec<(String, u64)>,
}

/// Everything an export did.
#[derive(Debug, Clone, Serialize)]
pub struct ExportReport {
    pub to: PathBuf,
    pub format: Format,
    pub runs: Vec<RunExport>,
}

/// The `run_date` of a run folder without a manifest (`pieval score`).
pub const UNDATED: &str = "undated";

/// One run folder's identity for the layout.
struct RunInfo {
    dir: PathBuf,
    run_id: String,
    run_date: String,
    model_name: String,
    manifest: Option<Manifest>,
}

fn run_info(dir: &Path) -> Result<RunInfo> {
    let (manifest, run_id) = crate::rundir::manifest_and_id(dir)?;
    check_run_id(&run_id)?;
    // The run's start date, from the manifest. A folder from `pieval score` has no
    // manifest and no date in its content: it goes to `run_date=undated`, so exporting it
    // again (after its files were touched) replaces its rows instead of adding a copy
    // under another date.
    let run_date = match manifest.as_ref().map(|m| m.timestamp.as_str()) {
        Some(t)
            if t.len() >= 10
                && t.as_bytes()[..10]
                    .iter()
                    .all(|b| b.is_ascii_digit() || *b == b'-') =>
        {
            t[..10].to_owned()
        }
        _ => UNDATED.to_owned(),
    };
    let model_name = manifest
        .as_ref()
        .map_or("unknown", |m| m.model_snapshot.name.as_str())
        .to_owned();
    Ok(RunInfo {
        dir: dir.to_path_buf(),
        run_id,
        run_date,
        model_name,
        manifest,
    })
}

/// A Hive partition value: bytes outside `[A-Za-z0-9._-]` as `%XX` (Hive's escaping,
/// which Spark, Trino and DuckDB undo), a leading dot too, so no value is a path trick.
pub fn partition_value(value: &str) -> String {
    if value.is_empty() {
        return "__HIVE_DEFAULT_PARTITION__".into();
    }
    let mut out = String::with_capacity(value.len());
    for (i, b) in value.bytes().enumerate() {
        let plain = b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || (b == b'.' && i > 0);
        if plain {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Where a table's rows come from.
enum Source {
    Parquet(PathBuf),
    /// A run's case_results.parquet, read as every query reads it
    /// ([`crate::engine::case_results_as_read`]: today's schema and meaning).
    CaseResults(PathBuf),
    Cases(PathBuf),
    Batch(RecordBatch),
}

impl Source {
    /// Feed every batch to `f`, streaming.
    fn for_each(&self, f: &mut dyn FnMut(RecordBatch) -> Result<()>) -> Result<()> {
        match self {
            Source::Parquet(path) => {
                // bounded decoding (src/engine/bounded.rs): the footer checked, text read
                // as views, batches cut by decoded bytes, the file's total counted
                let limits = crate::rundir::bounds::ParquetLimits::from_env()?;
                crate::rundir::bounds::check_parquet(path, &limits)?;
                let file = crate::files::open_regular(path, crate::files::Links::Refuse)?;
                let unreadable = |e: ParquetError| {
                    Error::config(path, format!("not a readable Parquet file: {e}"))
                };
                let schema = ParquetRecordBatchReaderBuilder::try_new(
                    file.try_clone()
                        .map_err(|e| Error::io(path, "cannot open", e))?,
                )
                .map_err(unreadable)?
                .schema()
                .clone();
                let views = Arc::new(crate::engine::bounded::as_views(&schema));
                let options = ArrowReaderOptions::new().with_schema(Arc::clone(&views));
                let reader = ParquetRecordBatchReaderBuilder::try_new_with_options(file, options)
                    .and_then(|b| b.with_batch_size(8192).build())
                    .map_err(unreadable)?;
                let guard = crate::engine::bounded::FileGuard::new(path, limits);
                for batch in reader {
                    let batch =
                        batch.map_err(|e| {
                            Error::from(guard.context(
                                datafusion::error::DataFusionError::ArrowError(Box::new(e), None),
                            ))
                        })?;
                    for piece in guard.pieces(&batch)? {
                        f(crate::engine::bounded::retype(&piece, &schema)?)?;
                    }
                }
            }
            Source::CaseResults(path) => {
                // the footer first (and its bounds), so a damaged file or a bomb is named
                crate::rundir::bounds::check_parquet(
                    path,
                    &crate::rundir::bounds::ParquetLimits::from_env()?,
                )?;
                let rt = crate::engine::runtime()?;
                rt.block_on(async {
                    use futures::StreamExt;
                    // one partition: the rows keep the file's order, run after run
                    let ctx = crate::engine::session_with_config_and_memory_limit(
                        crate::engine::session_config().with_target_partitions(1),
                        crate::engine::DEFAULT_MEMORY_LIMIT,
                    )?;
                    let table = crate::rundir::table_path(path)?;
                    crate::engine::register_case_results(&ctx, "case_results", &table).await?;
                    let mut stream = ctx
                        .sql("SELECT * FROM case_results")
                        .await?
                        .execute_stream()
                        .await?;
                    // under the schema schema() gives
                    let schema = crate::contract::arrow::case_results_schema();
                    while let Some(batch) = stream.next().await {
                        // text read as views: cast back, piece by piece (each at most
                        // the bounded reader's 128 MiB)
                        f(crate::engine::bounded::retype(&batch?, &schema)?)?;
                    }
                    Ok::<_, Error>(())
                })?;
            }
            Source::Cases(path) => {
                for batch in CorpusReader::open(path, ReadOptions::default())? {
                    f(batch?)?;
                }
            }
            Source::Batch(batch) => f(batch.clone())?,
        }
        Ok(())
    }

    fn schema(&self) -> Result<SchemaRef> {
        Ok(match self {
            Source::Parquet(path) => {
                let file = crate::files::open_regular(path, crate::files::Links::Refuse)?;
                ParquetRecordBatchReaderBuilder::try_new(file)
                    .map_err(|e| Error::config(path, format!("not a readable Parquet file: {e}")))?
                    .schema()
                    .clone()
            }
            Source::CaseResults(_) => crate::contract::arrow::case_results_schema(),
            Source::Cases(_) => ReadOptions::default().output_schema(),
            Source::Batch(batch) => batch.schema(),
        })
    }
}

/// One table of one run, with its partition keys (in path order).
struct TableExport {
    table: &'static str,
    partition: Vec<(&'static str, String)>,
    source: Source,
}

/// The tables of one run that exist.
fn run_tables(run: &RunInfo) -> Result<Vec<TableExport>> {
    let date = ("run_date", run.run_date.clone());
    let mut out = vec![TableExport {
        table: "runs",
        partition: vec![date.clone()],
        source: Source::Batch(runs_batch(run)?),
    }];
    let file = |name: &str| crate::rundir::artifact(&run.dir, name);
    if let Some(p) = file(crate::rundir::CASE_RESULTS_PARQUET)? {
        out.push(TableExport {
            table: "case_results",
            partition: vec![date.clone(), ("model_name", run.model_name.clone())],
            source: Source::CaseResults(p),
        });
    }
    if let Some(p) = file(crate::rundir::FINDINGS_FILE)? {
        out.push(TableExport {
            table: "findings",
            partition: vec![date.clone()],
            source: Source::Parquet(p),
        });
    }
    if let Some(p) = file("controls/controls.parquet")? {
        out.push(TableExport {
            table: "controls",
            partition: vec![date.clone()],
            source: Source::Parquet(p),
        });
    }
    if let Some(p) = file(crate::rundir::CASES_FILE)? {
        out.push(TableExport {
            table: "attack_cases",
            partition: vec![("run_id", run.run_id.clone())],
            source: Source::Cases(p),
        });
    }
    Ok(out)
}

/// The `runs` table's schema (with its partition column `run_date`).
pub fn runs_schema() -> SchemaRef {
    let text = |n: &str| Field::new(n, DataType::Utf8, true);
    let int = |n: &str| Field::new(n, DataType::Int64, true);
    let float = |n: &str| Field::new(n, DataType::Float64, true);
    Arc::new(Schema::new(vec![
        Field::new("run_id", DataType::Utf8, false),
        Field::new("run_date", DataType::Utf8, false),
        text("timestamp"),
        text("finished_at"),
        text("status"),
        text("experiment_name"),
        text("provider"),
        text("model_name"),
        text("mitigation"),
        int("seed"),
        text("corpus_path"),
        text("corpus_sha256"),
        text("config_sha256"),
        text("predictions_sha256"),
        text("git_commit"),
        text("pieval_version"),
        int("rows"),
        int("provider_errors"),
        int("manual_review"),
        float("attack_success_rate"),
        float("attack_success_ci_high"),
        float("leakage_rate"),
        float("over_refusal_rate"),
        text("manifest_json"),
    ]))
}

fn runs_batch(run: &RunInfo) -> Result<RecordBatch> {
    let m = run.manifest.as_ref();
    let results = m.and_then(|m| m.results.as_ref());
    let text = |v: Option<&str>| -> ArrayRef { Arc::new(StringArray::from(vec![v])) };
    let own = |v: &str| -> ArrayRef { Arc::new(StringArray::from(vec![Some(v)])) };
    let int = |v: Option<u64>| -> ArrayRef {
        Arc::new(Int64Array::from(vec![
            v.and_then(|v| i64::try_from(v).ok()),
        ]))
    };
    let float = |v: Option<f64>| -> ArrayRef { Arc::new(Float64Array::from(vec![v])) };
    let rate = |pick: fn(&RunResults) -> Option<&Rate>, value: fn(&Rate) -> Option<f64>| {
        float(results.and_then(pick).and_then(value))
    };
    let manifest_json = m
        .map(serde_json::to_string)
        .transpose()
        .map_err(|e| Error::Internal(format!("cannot encode the manifest: {e}")))?;
    let columns: Vec<ArrayRef> = vec![
        own(&run.run_id),
        own(&run.run_date),
        text(m.map(|m| m.timestamp.as_str())),
        text(m.and_then(|m| m.finished_at.as_deref())),
        text(m.and_then(|m| m.status).map(|s| s.as_str())),
        text(m.and_then(Manifest::experiment_name)),
        text(m.map(|m| m.model_snapshot.provider.as_str())),
        own(&run.model_name),
        text(m.map(|m| m.mitigation_snapshot.name.as_str())),
        int(m
            .and_then(Manifest::experiment_seed)
            .and_then(Value::as_u64)),
        text(m.map(|m| m.dataset_snapshot.path.as_str())),
        text(m.map(|m| m.dataset_snapshot.sha256.as_str())),
        text(m.map(|m| m.replay_hints.config_sha256.as_str())),
        text(results.map(|r| r.predictions_sha256.as_str())),
        text(m.and_then(|m| m.git_commit.as_deref())),
        text(m.and_then(|m| m.pieval_version.as_deref())),
        int(results.map(|r| r.rows)),
        int(results.map(|r| r.provider_errors)),
        int(results.map(|r| r.manual_review)),
        rate(|r| r.attack_success_rate.as_ref(), |r| r.rate),
        rate(|r| r.attack_success_rate.as_ref(), |r| r.ci_high),
        rate(|r| r.leakage_rate.as_ref(), |r| r.rate),
        rate(|r| r.over_refusal_rate.as_ref(), |r| r.rate),
        Arc::new(StringArray::from(vec![manifest_json])),
    ];
    Ok(RecordBatch::try_new(runs_schema(), columns)?)
}

/// Strings as Utf8 (not views), so every file of a table has one schema.
fn normalize(batch: &RecordBatch, drop: &[&str]) -> Result<RecordBatch> {
    let mut fields = Vec::new();
    let mut columns = Vec::new();
    for (field, col) in batch.schema().fields().iter().zip(batch.columns()) {
        if drop.contains(&field.name().as_str()) {
            continue;
        }
        let (ty, col) = match field.data_type() {
            DataType::Utf8View | DataType::LargeUtf8 => {
                (DataType::Utf8, cast(col, &DataType::Utf8)?)
            }
            other => (other.clone(), Arc::clone(col)),
        };
        fields.push(Field::new(field.name(), ty, field.is_nullable()));
        columns.push(col);
    }
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns,
    )?)
}

fn export_parquet(to: &Path, run: &RunInfo, t: &TableExport) -> Result<u64> {
    let mut dir = to.join(t.table);
    for (key, value) in &t.partition {
        dir.push(format!("{key}={}", partition_value(value)));
    }
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, "cannot create folder", e))?;
    let name = if t.table == "attack_cases" {
        "part-0.parquet".to_owned()
    } else {
        format!("part-{}.parquet", run.run_id)
    };
    let keys: Vec<&str> = t.partition.iter().map(|(k, _)| *k).collect();
    let schema = normalize(&RecordBatch::new_empty(t.source.schema()?), &keys)?.schema();
    let mut file = crate::atomic::ParquetFile::create(&dir.join(name), schema)?;
    t.source
        .for_each(&mut |batch| file.write(&normalize(&batch, &keys)?))?;
    file.commit()
}

/// Export runs (run folders) to `to`.
pub fn export(runs: &[PathBuf], to: &Path, format: Format) -> Result<ExportReport> {
    if runs.is_empty() {
        return Err(Error::NotFound(
            "nothing to export: no run given and none under the results folder".into(),
        ));
    }
    std::fs::create_dir_all(to).map_err(|e| Error::io(to, "cannot create folder", e))?;
    let infos: Vec<RunInfo> = runs.iter().map(|d| run_info(d)).collect::<Result<_>>()?;
    let mut report = ExportReport {
        to: to.to_path_buf(),
        format,
        runs: Vec::new(),
    };
    let mut db = match format {
        Format::Sqlite => Some(sqlite::open(&to.join(SQLITE_FILE))?),
        Format::Parquet => None,
    };
    for run in &infos {
        let mut tables = Vec::new();
        let exports = run_tables(run)?;
        match db.as_mut() {
            None => {
                for t in &exports {
                    tables.push((t.table.to_owned(), export_parquet(to, run, t)?));
                }
            }
            Some(conn) => tables = sqlite::export_run(conn, &run.run_id, &exports)?,
        }
        report.runs.push(RunExport {
            run_id: run.run_id.clone(),
            run_date: run.run_date.clone(),
            model_name: run.model_name.clone(),
            tables,
        });
    }
    if let Some(conn) = db.as_mut() {
        sqlite::create_indexes(conn)?;
    }
    Ok(report)
}

mod sqlite {
    //! The SQLite flavour of the export.

    use super::*;
    use rusqlite::Connection;
    use rusqlite::types::Value as Sql;

    pub fn open(path: &Path) -> Result<Connection> {
        let conn = Connection::open(path)
            .map_err(|e| Error::config(path, format!("cannot open SQLite database: {e}")))?;
        Ok(conn)
    }

    fn err(e: rusqlite::Error) -> Error {
        Error::Query(format!("SQLite export: {e}"))
    }

    fn sql_type(ty: &DataType) -> &'static str {
        match ty {
            DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
            | DataType::UInt64
            | DataType::Boolean => "INTEGER",
            DataType::Float16 | DataType::Float32 | DataType::Float64 => "REAL",
            _ => "TEXT",
        }
    }

    fn quote(name: &str) -> String {
        format!("\"{}\"", name.replace('"', "\"\""))
    }

    /// A column's cells as SQLite values.
    fn cells(col: &ArrayRef) -> Result<Vec<Sql>> {
        // Null where the column is null, else what `value` makes of the row.
        let each = |value: &dyn Fn(usize) -> Sql| -> Vec<Sql> {
            (0..col.len())
                .map(|i| if col.is_null(i) { Sql::Null } else { value(i) })
                .collect()
        };
        Ok(match (col.data_type(), sql_type(col.data_type())) {
            (DataType::Boolean, _) => {
                let a = col.as_boolean();
                each(&|i| Sql::Integer(a.value(i) as i64))
            }
            (_, "INTEGER") => {
                let a = cast(col, &DataType::Int64)?;
                let a = a.as_primitive::<Int64Type>();
                each(&|i| Sql::Integer(a.value(i)))
            }
            (_, "REAL") => {
                let a = cast(col, &DataType::Float64)?;
                let a = a.as_primitive::<Float64Type>();
                each(&|i| Sql::Real(a.value(i)))
            }
            (DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View, _) => {
                let a = cast(col, &DataType::Utf8)?;
                let a = a.as_string::<i32>();
                each(&|i| Sql::Text(a.value(i).to_owned()))
            }
            _ => {
                let f = ArrayFormatter::try_new(col.as_ref(), &FormatOptions::default())?;
                each(&|i| Sql::Text(f.value(i).to_string()))
            }
        })
    }

    /// Create the table, or add the columns it lacks.
    fn ensure_table(
        conn: &Connection,
        table: &str,
        fields: &[(String, &'static str)],
    ) -> Result<()> {
        let cols: Vec<String> = fields
            .iter()
            .map(|(n, t)| format!("{} {t}", quote(n)))
            .collect();
        conn.execute_batch(&format!(
            "CREATE TABLE IF NOT EXISTS {} ({});",
            quote(table),
            cols.join(", ")
        ))
        .map_err(err)?;
        let mut stmt = conn
            .prepare(&format!("PRAGMA table_info({})", quote(table)))
            .map_err(err)?;
        let existing: Vec<String> = stmt
            .query_map([], |r| r.get::<_, String>(1))
            .map_err(err)?
            .collect::<std::result::Result<_, _>>()
            .map_err(err)?;
        for (name, ty) in fields {
            if !existing.contains(name) {
                conn.execute_batch(&format!(
                    "ALTER TABLE {} ADD COLUMN {} {ty};",
                    quote(table),
                    quote(name)
                ))
                .map_err(err)?;
            }
        }
        Ok(())
    }

    /// Replace one run's rows in every table, in one transaction.
    pub fn export_run(
        conn: &mut Connection,
        run_id: &str,
        exports: &[TableExport],
    ) -> Result<Vec<(String, u64)>> {
        let tx = conn.transaction().map_err(err)?;
        let mut counts = Vec::new();
        for t in exports {
            let schema = t.source.schema()?;
            // Partition columns the rows lack become ordinary constant columns.
            let extra: Vec<&(&str, String)> = t
                .partition
                .iter()
                .filter(|(k, _)| schema.field_with_name(k).is_err())
                .collect();
            let mut fields: Vec<(String, &'static str)> = extra
                .iter()
                .map(|(k, _)| ((*k).to_owned(), "TEXT"))
                .collect();
            fields.extend(
                schema
                    .fields()
                    .iter()
                    .map(|f| (f.name().clone(), sql_type(f.data_type()))),
            );
            ensure_table(&tx, t.table, &fields)?;
            tx.execute(
                &format!("DELETE FROM {} WHERE run_id = ?1", quote(t.table)),
                [run_id],
            )
            .map_err(err)?;
            let names: Vec<String> = fields.iter().map(|(n, _)| quote(n)).collect();
            let marks: Vec<String> = (1..=fields.len()).map(|i| format!("?{i}")).collect();
            let mut insert = tx
                .prepare(&format!(
                    "INSERT INTO {} ({}) VALUES ({})",
                    quote(t.table),
                    names.join(", "),
                    marks.join(", ")
                ))
                .map_err(err)?;
            let mut rows = 0u64;
            t.source.for_each(&mut |batch| {
                let columns: Vec<Vec<Sql>> =
                    batch.columns().iter().map(cells).collect::<Result<_>>()?;
                for r in 0..batch.num_rows() {
                    let mut row: Vec<Sql> =
                        extra.iter().map(|(_, v)| Sql::Text(v.clone())).collect();
                    row.extend(columns.iter().map(|c| c[r].clone()));
                    insert
                        .execute(rusqlite::params_from_iter(row))
                        .map_err(err)?;
                }
                rows += batch.num_rows() as u64;
                Ok(())
            })?;
            counts.push((t.table.to_owned(), rows));
        }
        tx.commit().map_err(err)?;
        Ok(counts)
    }

    /// The indexes a warehouse user reaches for, on the tables that exist.
    pub fn create_indexes(conn: &mut Connection) -> Result<()> {
        let indexes: &[(&str, &[&str])] = &[
            ("case_results", &["run_id"]),
            ("case_results", &["case_id"]),
            ("case_results", &["attack_family", "attack_surface"]),
            ("findings", &["run_id", "case_id"]),
            ("attack_cases", &["case_id"]),
            ("attack_cases", &["run_id"]),
            ("controls", &["run_id", "control_id"]),
            ("controls", &["status"]),
            ("runs", &["run_id"]),
        ];
        for (table, cols) in indexes {
            let exists: bool = conn
                .query_row(
                    "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = ?1",
                    [table],
                    |r| r.get(0),
                )
                .map_err(err)?;
            if exists {
                conn.execute_batch(&format!(
                    "CREATE INDEX IF NOT EXISTS {} ON {} ({});",
                    quote(&format!("idx_{table}_{}", cols.join("_"))),
                    quote(table),
                    cols.iter().map(|c| quote(c)).collect::<Vec<_>>().join(", ")
                ))
                .map_err(err)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_values_are_escaped() {
        assert_eq!(
            partition_value("smollm2-135m-instruct"),
            "smollm2-135m-instruct"
        );
        assert_eq!(partition_value("gpt-4.1"), "gpt-4.1");
        assert_eq!(partition_value("meta/llama:3"), "meta%2Fllama%3A3");
        assert_eq!(partition_value(".."), "%2E.");
        assert_eq!(partition_value(""), "__HIVE_DEFAULT_PARTITION__");
        assert_eq!(partition_value("a b=c"), "a%20b%3Dc");
    }
}
