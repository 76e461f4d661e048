//! The tables every pieval session can query: `attack_cases` (the enriched corpus when
//! present), and, across every run under the results folder, `case_results`,
//! `findings`, `turns` (multi-turn transcripts), `controls`, `summaries` and `runs` — each row tagged with its `run_id`;
//! `scored` is case_results with each response's `rule_spans` (what `queries/findings.sql`
//! reads), `summary_partial` and `summary_latency` their partial aggregates (what
//! `queries/summary.sql` and `queries/metrics/totals.sql` read).
//! Plus any
//! file the user registers (Parquet, JSONL, CSV, by extension).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::dataframe::DataFrame;
use datafusion::datasource::MemTable;
use datafusion::prelude::{CsvReadOptions, JsonReadOptions, ParquetReadOptions, SessionContext};
use serde_json::Value;

use super::corpus_table;
use crate::contract::arrow::{case_results_schema, findings_schema};
use crate::corpus::ReadOptions;
use crate::error::{Error, Result};

/// The run folders under `results` (those holding a `case_results.parquet` or a
/// `summary.json`), sorted by name.
pub fn run_dirs(results: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(results) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            if !crate::rundir::is_run_folder(p) {
                return false;
            }
            // A killed scoring's commit is completed (reading the run says why not).
            let _ = crate::atomic::finish_commit(p);
            p.join(crate::rundir::CASE_RESULTS_PARQUET).exists()
                || p.join(crate::rundir::SUMMARY_FILE).exists()
        })
        .collect();
    dirs.sort();
    dirs
}

fn utf8(path: &Path) -> Result<&str> {
    path.to_str()
        .ok_or_else(|| Error::Usage(format!("{}: not a UTF-8 path", path.display())))
}

/// A table over the same-named Parquet file of every run, or an empty table of the
/// contract schema when no run has one. A run whose file is unreadable (truncated, a
/// symbolic link) is left out and said in `skipped`, so one corrupt run does not take
/// every query down.
async fn register_runs_parquet(
    ctx: &SessionContext,
    name: &str,
    file: &str,
    runs: &[PathBuf],
    empty: SchemaRef,
    skipped: &mut Vec<String>,
    as_read: fn(DataFrame) -> Result<DataFrame>,
    in_process: bool,
) -> Result<()> {
    let mut files: Vec<String> = Vec::new();
    let mut paths: Vec<PathBuf> = Vec::new();
    for dir in runs {
        match crate::rundir::parquet_artifact(dir, file) {
            Ok(Some(p)) => match crate::rundir::table_path(&p) {
                Ok(t) => {
                    files.push(t);
                    paths.push(p);
                }
                Err(e) => skipped.push(format!("{name}: left out {e}")),
            },
            Ok(None) => {}
            Err(e) => skipped.push(format!("{name}: left out {e}")),
        }
    }
    let df = if files.is_empty() {
        // An empty relation (not an in-memory table): a cluster can ship it too.
        let schema = datafusion::common::DFSchema::try_from(empty.as_ref().clone())?;
        DataFrame::new(
            ctx.state(),
            datafusion::logical_expr::LogicalPlan::EmptyRelation(
                datafusion::logical_expr::EmptyRelation {
                    produce_one_row: false,
                    schema: Arc::new(schema),
                },
            ),
        )
    } else if in_process {
        // Read with the current schema (columns added since a run was written read as
        // NULL), each file with bounded decoding, its errors naming the run.
        ctx.read_table(Arc::new(
            super::bounded::BoundedRunTable::try_new(ctx, empty, &paths).await?,
        ))?
    } else {
        // A cluster's executors read the files (checked above, footer and bounds).
        ctx.read_parquet(files, ParquetReadOptions::default().schema(&empty))
            .await?
    };
    ctx.register_table(name, as_read(df)?.into_view())?;
    Ok(())
}

/// One row per run: run_id, path, and the headline figures of its summary.json.
fn summaries_table(runs: &[PathBuf], skipped: &mut Vec<String>) -> Result<MemTable> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("run_id", DataType::Utf8, false),
        Field::new("experiment_name", DataType::Utf8, true),
        Field::new("path", DataType::Utf8, false),
        Field::new("total", DataType::Int64, true),
        Field::new("errors", DataType::Int64, true),
        Field::new("manual_review", DataType::Int64, true),
        Field::new("attack_success_rate", DataType::Float64, true),
        Field::new("attack_success_ci_low", DataType::Float64, true),
        Field::new("attack_success_ci_high", DataType::Float64, true),
        Field::new("leakage_rate", DataType::Float64, true),
        Field::new("refusal_rate", DataType::Float64, true),
        Field::new("over_refusal_rate", DataType::Float64, true),
        Field::new("summary_json", DataType::Utf8, false),
    ]));
    let mut rows: Vec<(String, Option<String>, String, Value, String)> = Vec::new();
    for dir in runs {
        let path = match crate::rundir::artifact(dir, crate::rundir::SUMMARY_FILE) {
            Ok(Some(p)) => p,
            Ok(None) => continue,
            Err(e) => {
                skipped.push(format!("summaries: left out {e}"));
                continue;
            }
        };
        let text = match crate::files::read_text_bounded(
            &path,
            crate::files::Links::Refuse,
            crate::files::bounds::SUMMARY,
        ) {
            Ok(t) => t,
            Err(e) => {
                skipped.push(format!("summaries: left out {e}"));
                continue;
            }
        };
        let doc: Value = match serde_json::from_str(&text) {
            Ok(doc @ Value::Object(_)) => doc,
            Ok(_) => {
                skipped.push(format!(
                    "summaries: left out {}: not a JSON object",
                    path.display()
                ));
                continue;
            }
            Err(e) => {
                skipped.push(format!(
                    "summaries: left out {}: not valid JSON: {e}",
                    path.display()
                ));
                continue;
            }
        };
        let run_id = doc["run_id"]
            .as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| {
                dir.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default()
            });
        rows.push((
            run_id,
            doc["experiment_name"].as_str().map(str::to_owned),
            dir.display().to_string(),
            doc["aggregate_metrics"].clone(),
            text,
        ));
    }
    let int = |key: &str| {
        Arc::new(
            rows.iter()
                .map(|r| r.3[key].as_i64())
                .collect::<Int64Array>(),
        ) as ArrayRef
    };
    let rate = |metric: &str, field: &str| {
        Arc::new(
            rows.iter()
                .map(|r| r.3[metric][field].as_f64())
                .collect::<Float64Array>(),
        ) as ArrayRef
    };
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![
            Arc::new(
                rows.iter()
                    .map(|r| Some(r.0.as_str()))
                    .collect::<StringArray>(),
            ),
            Arc::new(rows.iter().map(|r| r.1.as_deref()).collect::<StringArray>()),
            Arc::new(
                rows.iter()
                    .map(|r| Some(r.2.as_str()))
                    .collect::<StringArray>(),
            ),
            int("total"),
            int("errors"),
            int("manual_review"),
            rate("attack_success_rate", "rate"),
            rate("attack_success_rate", "ci_low"),
            rate("attack_success_rate", "ci_high"),
            rate("leakage_rate", "rate"),
            rate("refusal_rate", "rate"),
            rate("over_refusal_rate", "rate"),
            Arc::new(
                rows.iter()
                    .map(|r| Some(r.4.as_str()))
                    .collect::<StringArray>(),
            ),
        ],
    )?;
    Ok(MemTable::try_new(schema, vec![vec![batch]])?)
}

/// One row per run folder: run_id, path, and which artifacts it holds.
fn runs_table(runs: &[PathBuf]) -> Result<MemTable> {
    let artifacts = [
        crate::rundir::MANIFEST_FILE,
        crate::rundir::CASE_RESULTS_JSONL,
        crate::rundir::CASE_RESULTS_PARQUET,
        crate::rundir::FINDINGS_FILE,
        crate::rundir::SUMMARY_FILE,
        crate::rundir::PREDICTIONS_FILE,
    ];
    let mut fields = vec![
        Field::new("run_id", DataType::Utf8, false),
        Field::new("path", DataType::Utf8, false),
    ];
    fields.extend(artifacts.iter().map(|a| {
        Field::new(
            format!("has_{}", a.replace('.', "_")),
            DataType::Boolean,
            false,
        )
    }));
    let schema = Arc::new(Schema::new(fields));
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(
            runs.iter()
                .map(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
                .collect::<StringArray>(),
        ),
        Arc::new(
            runs.iter()
                .map(|d| Some(d.display().to_string()))
                .collect::<StringArray>(),
        ),
    ];
    for a in artifacts {
        columns.push(Arc::new(
            runs.iter()
                .map(|d| Some(d.join(a).exists()))
                .collect::<datafusion::arrow::array::BooleanArray>(),
        ));
    }
    Ok(MemTable::try_new(
        Arc::clone(&schema),
        vec![vec![RecordBatch::try_new(schema, columns)?]],
    )?)
}

/// Register the standard tables. `corpus` is the attack-case file; `results` the folder
/// of run folders. Returns what was left out (corrupt or linked files of some run), one
/// line each, for the caller to show.
pub async fn register_standard_tables(
    ctx: &SessionContext,
    corpus: &Path,
    results: &Path,
) -> Result<Vec<String>> {
    register_tables(ctx, corpus, results, true).await
}

/// A read-only query (no DDL, no DML, no other statement) as a DataFrame.
pub async fn read_only(ctx: &SessionContext, sql: &str) -> Result<DataFrame> {
    let options = datafusion::execution::context::SQLOptions::new()
        .with_allow_ddl(false)
        .with_allow_dml(false)
        .with_allow_statements(false);
    ctx.sql_with_options(sql, options)
        .await
        .map_err(|e| Error::Query(format!("the query cannot run: {e}")))
}

/// A read-only query in a session of `memory_limit` bytes over the standard tables of
/// `results` (when given), `corpus` as `attack_cases` (when it exists) and `tables`
/// (Arrow batches in memory, by name); its schema and batches. The Python package's
/// `pieval.sql`.
pub async fn query_read_only(
    sql: &str,
    results: Option<&Path>,
    corpus: &Path,
    tables: Vec<(String, SchemaRef, Vec<RecordBatch>)>,
    memory_limit: usize,
) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let ctx = super::session_with_memory_limit(memory_limit)?;
    match results {
        Some(results) => {
            for line in register_standard_tables(&ctx, corpus, results).await? {
                eprintln!("{}", crate::text::terminal(&format!("warning: {line}")));
            }
        }
        None if corpus.exists() => {
            ctx.register_table(
                "attack_cases",
                corpus_table(corpus, ReadOptions::default())?.table,
            )?;
        }
        None => {}
    }
    for (name, schema, batches) in tables {
        let table = MemTable::try_new(schema, vec![batches])?;
        ctx.register_table(name.as_str(), Arc::new(table))?;
    }
    let df = read_only(&ctx, sql).await?;
    let mut stream = df.execute_stream().await?;
    // the batches' own schema (what a consumer reads their buffers by)
    let schema = stream.schema();
    let mut out = Vec::new();
    use futures::StreamExt;
    while let Some(batch) = stream.next().await {
        crate::interrupt::check()?;
        out.push(batch?);
    }
    Ok((schema, out))
}

/// The standard tables a cluster can read (`pieval sql --cluster`): every table over
/// files, by absolute path (the executors read them): `case_results`, `scored`,
/// `findings`, `turns`, `controls`, and `attack_cases` when the corpus is Parquet. The
/// tables this process builds in memory (`summaries`, `runs`, a JSONL corpus read
/// through the validating reader) are not shipped.
pub async fn register_cluster_tables(
    ctx: &SessionContext,
    corpus: &Path,
    results: &Path,
) -> Result<Vec<String>> {
    // Each run's files are registered by absolute path (rundir::table_path).
    let mut skipped = register_tables(ctx, corpus, results, false).await?;
    let parquet = corpus
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("parquet"));
    if parquet && corpus.is_file() {
        // Read with the enriched corpus's schema, as the local reader gives it.
        let schema = crate::contract::arrow::enriched_case_schema();
        ctx.register_parquet(
            "attack_cases",
            &crate::rundir::table_path(corpus)?,
            ParquetReadOptions::default().schema(&schema),
        )
        .await?;
    } else if corpus.exists() {
        skipped.push(format!(
            "attack_cases: not on the cluster ({} is not Parquet; give --cases FILE.parquet, \
             e.g. from `pieval sql 'SELECT * FROM attack_cases' --format parquet --output F`)",
            corpus.display()
        ));
    }
    Ok(skipped)
}

async fn register_tables(
    ctx: &SessionContext,
    corpus: &Path,
    results: &Path,
    in_process: bool,
) -> Result<Vec<String>> {
    // A limit that does not parse stops the command, rather than leaving every run out.
    crate::rundir::bounds::ParquetLimits::from_env()?;
    let mut skipped = Vec::new();
    if in_process && corpus.exists() {
        ctx.register_table(
            "attack_cases",
            corpus_table(corpus, ReadOptions::default())?.table,
        )?;
    }
    let runs = run_dirs(results);
    register_runs_parquet(
        ctx,
        "case_results",
        crate::rundir::CASE_RESULTS_PARQUET,
        &runs,
        case_results_schema(),
        &mut skipped,
        crate::engine::case_results_as_read,
        in_process,
    )
    .await?;
    // What queries/findings.sql reads while scoring (the scored stream: case_results and
    // each response's rule spans), so the file runs as it is over finished runs.
    let scored = ctx
        .sql("SELECT *, pi_rule_spans(response_text) AS rule_spans FROM case_results")
        .await?;
    ctx.register_table("scored", scored.into_view())?;
    // What queries/summary.sql and queries/metrics/totals.sql read.
    crate::engine::register_summary_partial(ctx).await?;
    register_runs_parquet(
        ctx,
        "findings",
        crate::rundir::FINDINGS_FILE,
        &runs,
        findings_schema(),
        &mut skipped,
        Ok,
        in_process,
    )
    .await?;
    register_runs_parquet(
        ctx,
        "turns",
        crate::rundir::TURNS_FILE,
        &runs,
        crate::contract::arrow::turns_schema(),
        &mut skipped,
        Ok,
        in_process,
    )
    .await?;
    register_runs_parquet(
        ctx,
        "tool_calls",
        crate::rundir::TOOL_CALLS_FILE,
        &runs,
        crate::contract::arrow::tool_calls_schema(),
        &mut skipped,
        Ok,
        in_process,
    )
    .await?;
    register_runs_parquet(
        ctx,
        "source_scores",
        crate::rundir::SOURCE_SCORES_FILE,
        &runs,
        crate::contract::arrow::source_scores_schema(),
        &mut skipped,
        Ok,
        in_process,
    )
    .await?;
    // Guardrail runs (src/guard): one row per text given, and the view their curves read.
    register_runs_parquet(
        ctx,
        "guard_results",
        crate::guard::RESULTS_FILE,
        &runs,
        crate::guard::results_schema(),
        &mut skipped,
        Ok,
        in_process,
    )
    .await?;
    register_guard_views(ctx)?;
    // Imported runs: the tool's verdicts beside pieval's (queries/import/).
    for (name, q) in [
        (
            "verdict_agreement",
            crate::engine::queries::VERDICT_AGREEMENT,
        ),
        (
            "verdict_disagreements",
            crate::engine::queries::VERDICT_DISAGREEMENTS,
        ),
    ] {
        let view = ctx.sql(q.sql).await?;
        ctx.register_table(name, view.into_view())?;
    }
    register_runs_parquet(
        ctx,
        "controls",
        "controls/controls.parquet",
        &runs,
        crate::contract::arrow::controls_schema(),
        &mut skipped,
        Ok,
        in_process,
    )
    .await?;
    if in_process {
        ctx.register_table("summaries", Arc::new(summaries_table(&runs, &mut skipped)?))?;
        ctx.register_table("runs", Arc::new(runs_table(&runs)?))?;
    }
    Ok(skipped)
}

/// One run's `guard_results` (its `guard_results.parquet`, read with bounds as its case
/// results are; no rows for a run that is not a guardrail run) and the views over it:
/// what the controls and the report read.
pub async fn register_run_guard_results(ctx: &SessionContext, run: &Path) -> Result<()> {
    let schema = crate::guard::results_schema();
    match crate::rundir::parquet_artifact(run, crate::guard::RESULTS_FILE)? {
        Some(p) => {
            let table = crate::engine::bounded::BoundedRunTable::try_new(ctx, schema, &[p]).await?;
            ctx.register_table("guard_results", Arc::new(table))?;
        }
        None => {
            ctx.register_table(
                "guard_results",
                Arc::new(datafusion::datasource::MemTable::try_new(
                    schema,
                    vec![vec![]],
                )?),
            )?;
        }
    }
    register_guard_views(ctx)
}

/// The views the guardrail queries and controls read besides `guard_results`:
/// `guard_roc` (queries/guardrail/roc.sql) and `guard_at_fpr` (at_fpr.sql, over it).
pub fn register_guard_views(ctx: &SessionContext) -> Result<()> {
    for (name, q) in [
        ("guard_roc", crate::engine::queries::GUARD_ROC),
        ("guard_at_fpr", crate::engine::queries::GUARD_AT_FPR),
    ] {
        let view = futures::executor::block_on(ctx.sql(q.sql))?;
        ctx.register_table(name, view.into_view())?;
    }
    Ok(())
}

/// Register a user file as a table, by extension: .parquet, .jsonl / .ndjson / .json,
/// .csv. Table names are SQL identifiers.
pub async fn register_file(ctx: &SessionContext, name: &str, path: &Path) -> Result<()> {
    let valid_name = !name.is_empty()
        && name.as_bytes()[0].is_ascii_alphabetic()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !valid_name {
        return Err(Error::Usage(format!(
            "table name {name:?} must be letters, digits and '_', starting with a letter"
        )));
    }
    if !path.exists() {
        return Err(Error::io(
            path,
            "cannot open table file",
            std::io::Error::from(std::io::ErrorKind::NotFound),
        ));
    }
    let p = utf8(path)?;
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    match ext.as_str() {
        "parquet" => {
            // Footer and page headers first: a decompression bomb is refused unread.
            crate::rundir::bounds::check_parquet_file(
                path,
                crate::files::Links::Follow,
                &crate::rundir::bounds::ParquetLimits::from_env()?,
            )?;
            ctx.register_parquet(name, p, ParquetReadOptions::default())
                .await?
        }
        "jsonl" | "ndjson" | "json" => {
            // Newline-delimited JSON (one object per line).
            let extension = format!(".{ext}");
            ctx.register_json(
                name,
                p,
                JsonReadOptions::default().file_extension(&extension),
            )
            .await?
        }
        "csv" => ctx.register_csv(name, p, CsvReadOptions::new()).await?,
        other => {
            return Err(Error::Usage(format!(
                "{}: unknown table format {other:?} (use .parquet, .jsonl or .csv)",
                path.display()
            )));
        }
    }
    Ok(())
}
