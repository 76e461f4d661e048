//! `pieval sql [QUERY] [--file F.sql] [--table NAME=PATH ...] [--format ...] [--output P]`.

use crate::cli::ExitStatus;
use std::io::Write;
use std::path::{Path, PathBuf};

use datafusion::arrow::array::RecordBatch;
use datafusion::parquet::arrow::ArrowWriter;
use futures::StreamExt;

use crate::cli::paths;
use crate::engine::runtime;
use crate::engine::tables::{register_file, register_standard_tables};
use crate::error::{Error, Result};
use crate::objstore;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    Table,
    /// CSV as the data is: byte-exact, for programs.
    Csv,
    /// CSV for a spreadsheet: a text cell that a spreadsheet would run as a formula
    /// (starting with `=`, `+`, `-`, `@`, a tab or a carriage return) gets a leading `'`
    /// (OWASP's advice against CSV injection), so `=HYPERLINK(…)` from a model's answer
    /// shows as text.
    SpreadsheetCsv,
    Json,
    Parquet,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The query. Tables: attack_cases, case_results, findings, turns, tool_calls, source_scores, summaries, runs (all runs
    /// under --results, rows tagged with run_id), scored (case_results with rule_spans, what
    /// queries/findings.sql reads), plus any --table; the detector UDFs
    /// (pi_criteria_match, pi_refusal, pi_leakage, pi_rule_hits, …) are registered.
    query: Option<String>,
    /// Read the query from a file (e.g. queries/summary.sql).
    #[arg(long, conflicts_with = "query")]
    file: Option<PathBuf>,
    /// Register a Parquet, JSONL or CSV file as a table (repeatable).
    #[arg(long = "table", value_name = "NAME=PATH")]
    tables: Vec<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// Write the result to a file instead of stdout (required for parquet).
    #[arg(long)]
    output: Option<PathBuf>,
    /// The folder of run folders, or `s3://BUCKET/PREFIX` of runs `pieval score` committed
    /// there (docs/object-storage.md).
    #[arg(long, default_value = "results")]
    results: PathBuf,
    /// The corpus behind attack_cases (default: the enriched corpus when present).
    #[arg(long)]
    cases: Option<PathBuf>,
    /// A judge config (the keys of evaluation.judge, as YAML) for pi_judge(...); new
    /// verdicts go to its shared cache when it names one.
    #[arg(long, value_name = "FILE")]
    judge: Option<PathBuf>,
    /// With --format table: show at most this many rows (a table is held in memory to
    /// align it; csv, json and parquet stream every row).
    #[arg(long, default_value_t = 10_000, value_name = "N")]
    max_rows: usize,
    /// Stop the query after this many seconds (exit 2).
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<f64>,
    /// Run the query on a Ballista cluster (`df://HOST:PORT`; built with the
    /// `distributed` feature). The tables over files are read by the executors at
    /// absolute paths they must see; summaries, runs and a JSONL corpus stay local and
    /// are not available there (docs/cluster.md).
    #[arg(long, value_name = "URL", conflicts_with = "judge")]
    cluster: Option<String>,
    /// Memory the query may hold for sorts, joins and aggregates, in MiB; beyond it they
    /// fail with a clear error rather than exhaust the machine.
    #[arg(long, default_value_t = 4096, value_name = "MIB")]
    memory_limit: usize,
}

pub fn run(args: Args) -> Result<ExitStatus> {
    let sql = match (&args.query, &args.file) {
        (Some(q), None) => q.clone(),
        (None, Some(f)) => {
            std::fs::read_to_string(f).map_err(|e| Error::io(f, "cannot read query", e))?
        }
        _ => return Err(Error::Usage("give a query, or --file with one".into())),
    };
    if args.format == Format::Parquet && args.output.is_none() {
        return Err(Error::Usage("--format parquet needs --output".into()));
    }
    let cases = args.cases.clone().unwrap_or_else(|| {
        let enriched = Path::new(paths::ENRICHED);
        if enriched.exists() {
            enriched.to_path_buf()
        } else {
            PathBuf::from(paths::CORPUS)
        }
    });
    let timeout = match args.timeout {
        None => None,
        Some(t) if t.is_finite() && t > 0.0 && t <= 86_400.0 => {
            Some(std::time::Duration::from_secs_f64(t))
        }
        Some(t) => {
            return Err(Error::Usage(format!(
                "--timeout {t}: give a number of seconds from 0 to 86400"
            )));
        }
    };
    if args.memory_limit == 0 || args.memory_limit > (1 << 30) {
        return Err(Error::Usage(format!(
            "--memory-limit {}: give MiB from 1 to {}",
            args.memory_limit,
            1u64 << 30
        )));
    }
    let judge = super::judge::open_judge(args.judge.as_deref(), None)?;
    // Object storage: the committed runs under an `s3://` --results, an `s3://` corpus
    // and `s3://` tables are fetched (and checked) into a private folder first, then read
    // as local files are, bounds checks included (src/objstore.rs).
    let mut scratch = None;
    let (results, cases, tables) = {
        let rt = runtime()?;
        let results = objstore::local_results(&args.results, &mut scratch, &rt)?;
        let cases = objstore::local_input(&cases, &mut scratch, &rt)?;
        let mut tables = Vec::new();
        for spec in &args.tables {
            let (name, path) = spec
                .split_once('=')
                .ok_or_else(|| Error::Usage(format!("--table {spec:?}: expected NAME=PATH")))?;
            let local = objstore::local_input(Path::new(path), &mut scratch, &rt)?;
            tables.push((name.to_owned(), local));
        }
        if scratch.is_some() && args.cluster.is_some() {
            return Err(Error::Usage(
                "--cluster with s3:// tables: the executors read files at paths they see; \
                 query object storage without --cluster (docs/object-storage.md)"
                    .into(),
            ));
        }
        (results, cases, tables)
    };
    let query = async {
        let (ctx, skipped) = match &args.cluster {
            None => {
                let ctx = crate::engine::session_with_memory_limit(args.memory_limit << 20)?;
                crate::judge::udf::register(&ctx, judge.clone());
                let skipped = register_standard_tables(&ctx, &cases, &results).await?;
                (ctx, skipped)
            }
            Some(url) => cluster_session(url, &cases, &results).await?,
        };
        for line in skipped {
            // A fetched run's copy is named as the object it came from.
            let line = line.replace(
                &results.display().to_string(),
                &args.results.display().to_string(),
            );
            crate::cli::output::stderr_line(&format!("warning: {line}"));
        }
        for (name, path) in &tables {
            let path = match &args.cluster {
                // The executors read it: by absolute path.
                Some(_) => PathBuf::from(crate::rundir::table_path(path)?),
                None => path.clone(),
            };
            register_file(&ctx, name, &path).await?;
        }
        let df = crate::engine::tables::read_only(&ctx, &sql).await?;
        if args.cluster.is_some() && has_union(df.logical_plan())? {
            return Err(Error::Usage(
                "--cluster: this query has a UNION, which Ballista 55 answers wrongly or \
                 never on some plans (a union of a union with an aggregate counted 150 rows \
                 for 100; queries/summary.sql does not finish): run it without --cluster \
                 (docs/cluster.md#limits)"
                    .into(),
            ));
        }
        let schema = std::sync::Arc::new(df.schema().as_arrow().clone());
        let mut stream = df.execute_stream().await?;
        let mut sink = Sink::open(args.format, args.output.as_deref(), schema, args.max_rows)?;
        while let Some(batch) = stream.next().await {
            sink.write(&batch?)?;
        }
        sink.finish()
    };
    let ran = runtime()?.block_on(async {
        match timeout {
            None => query.await,
            Some(limit) => match tokio::time::timeout(limit, query).await {
                Ok(result) => result,
                Err(_) => Err(Error::Query(format!(
                    "the query did not finish within --timeout {} s; nothing was written",
                    limit.as_secs_f64()
                ))),
            },
        }
    });
    ran.map_err(|e| {
        let mut e = objstore::relocate(e, &results, &args.results);
        for ((_, local), spec) in tables.iter().zip(&args.tables) {
            if let Some((_, given)) = spec.split_once('=') {
                e = objstore::relocate(e, local, Path::new(given));
            }
        }
        e
    })?;
    if let Some(j) = &judge {
        j.persist(None)?;
        crate::cli::output::stderr_line(&super::judge::judge_line(&j.report()));
    }
    Ok(ExitStatus::Success)
}

/// Whether a plan (its subqueries too) holds a UNION.
fn has_union(plan: &datafusion::logical_expr::LogicalPlan) -> Result<bool> {
    use datafusion::common::tree_node::TreeNodeRecursion;
    use datafusion::logical_expr::LogicalPlan;
    let mut found = false;
    plan.apply_with_subqueries(|p| {
        found |= matches!(p, LogicalPlan::Union(_));
        Ok(if found {
            TreeNodeRecursion::Stop
        } else {
            TreeNodeRecursion::Continue
        })
    })?;
    Ok(found)
}

/// A session on the cluster at `url`, with the tables it can read.
#[cfg(feature = "distributed")]
async fn cluster_session(
    url: &str,
    cases: &Path,
    results: &Path,
) -> Result<(datafusion::prelude::SessionContext, Vec<String>)> {
    let session = crate::cluster::connect(url, crate::engine::session_config()).await?;
    let skipped =
        crate::engine::tables::register_cluster_tables(&session.ctx, cases, results).await?;
    Ok((session.ctx, skipped))
}

#[cfg(not(feature = "distributed"))]
async fn cluster_session(
    url: &str,
    _cases: &Path,
    _results: &Path,
) -> Result<(datafusion::prelude::SessionContext, Vec<String>)> {
    crate::cluster::parse_url(url)?;
    Err(crate::cluster::not_built())
}

/// Where results go: stdout or a file written atomically.
enum Sink {
    Table {
        batches: Vec<RecordBatch>,
        target: Target,
        /// Rows kept (at most `max`) and rows seen past it.
        kept: usize,
        max: usize,
        more: u64,
    },
    /// The writer, and whether formula-like text is neutralised.
    Csv(datafusion::arrow::csv::Writer<Target>, bool),
    Json(datafusion::arrow::json::ArrayWriter<Target>),
    Parquet(ArrowWriter<Target>),
}

/// stdout, or a temporary file renamed over the output on success.
enum Target {
    Stdout(std::io::Stdout),
    /// stdout that is a terminal: escaped as it is written.
    Terminal(super::output::TerminalWriter<std::io::Stdout>),
    File(crate::atomic::TempFile),
}

impl Write for Target {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Target::Stdout(s) => s.write(buf),
            Target::Terminal(t) => t.write(buf),
            Target::File(file) => file.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Target::Stdout(s) => s.flush(),
            Target::Terminal(t) => t.flush(),
            Target::File(file) => file.flush(),
        }
    }
}

impl Target {
    fn open(output: Option<&Path>) -> Result<Self> {
        Ok(match output {
            None if std::io::IsTerminal::is_terminal(&std::io::stdout()) => {
                Target::Terminal(super::output::TerminalWriter::new(std::io::stdout()))
            }
            None => Target::Stdout(std::io::stdout()),
            Some(out) => Target::File(crate::atomic::TempFile::create(out)?),
        })
    }

    fn commit(self) -> Result<()> {
        match self {
            Target::Stdout(mut s) => s
                .flush()
                .map_err(|e| Error::io("<stdout>", "cannot write", e)),
            Target::Terminal(mut t) => t
                .flush()
                .map_err(|e| Error::io("<stdout>", "cannot write", e)),
            Target::File(file) => file.commit(),
        }
    }
}

impl Sink {
    fn open(
        format: Format,
        output: Option<&Path>,
        schema: datafusion::arrow::datatypes::SchemaRef,
        max_rows: usize,
    ) -> Result<Self> {
        let target = Target::open(output)?;
        Ok(match format {
            Format::Table => Sink::Table {
                batches: Vec::new(),
                target,
                kept: 0,
                max: max_rows,
                more: 0,
            },
            Format::Csv | Format::SpreadsheetCsv => Sink::Csv(
                datafusion::arrow::csv::WriterBuilder::new()
                    .with_header(true)
                    .build(target),
                format == Format::SpreadsheetCsv,
            ),
            Format::Json => Sink::Json(datafusion::arrow::json::ArrayWriter::new(target)),
            Format::Parquet => Sink::Parquet(ArrowWriter::try_new(target, schema, None)?),
        })
    }

    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        match self {
            Sink::Table {
                batches,
                kept,
                max,
                more,
                ..
            } => {
                let take = batch.num_rows().min(*max - *kept);
                if take > 0 {
                    batches.push(batch.slice(0, take));
                    *kept += take;
                }
                *more += (batch.num_rows() - take) as u64;
            }
            Sink::Csv(w, false) => w.write(batch)?,
            Sink::Csv(w, true) => w.write(&neutralise_formulas(batch)?)?,
            Sink::Json(w) => w.write(batch)?,
            Sink::Parquet(w) => w.write(batch)?,
        }
        Ok(())
    }

    fn finish(self) -> Result<()> {
        let target = match self {
            Sink::Table {
                batches,
                mut target,
                max,
                more,
                ..
            } => {
                let text = super::output::sanitized_batches(&batches)?;
                writeln!(target, "{text}").map_err(|e| Error::io("<output>", "cannot write", e))?;
                if more > 0 {
                    writeln!(
                        target,
                        "… {more} more row(s) not shown (--max-rows {max}; --format csv or json streams them all)"
                    )
                    .map_err(|e| Error::io("<output>", "cannot write", e))?;
                }
                target
            }
            Sink::Csv(w, _) => w.into_inner(),
            Sink::Json(mut w) => {
                w.finish()?;
                w.into_inner()
            }
            Sink::Parquet(w) => w.into_inner()?,
        };
        target.commit()
    }
}

/// Text cells a spreadsheet would evaluate as a formula, prefixed with `'` (OWASP, "CSV
/// Injection"): every string column, whatever its Arrow string type, becomes Utf8.
fn neutralise_formulas(batch: &RecordBatch) -> Result<RecordBatch> {
    use datafusion::arrow::array::{Array, ArrayRef, AsArray, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    let risky = |s: &str| s.starts_with(['=', '+', '-', '@', '\t', '\r']);
    let mut fields = Vec::with_capacity(batch.num_columns());
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(batch.num_columns());
    for (field, col) in batch.schema().fields().iter().zip(batch.columns()) {
        let text_values =
            |t: &DataType| matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View);
        let is_text = match col.data_type() {
            DataType::Dictionary(_, values) => text_values(values),
            t => text_values(t),
        };
        if is_text {
            let text = datafusion::arrow::compute::cast(col, &DataType::Utf8)?;
            let text = text.as_string::<i32>();
            let out: StringArray = (0..text.len())
                .map(|i| {
                    (!text.is_null(i)).then(|| {
                        let v = text.value(i);
                        if risky(v) {
                            format!("'{v}")
                        } else {
                            v.to_owned()
                        }
                    })
                })
                .collect();
            fields.push(Field::new(
                field.name(),
                DataType::Utf8,
                field.is_nullable(),
            ));
            columns.push(std::sync::Arc::new(out));
        } else {
            fields.push(field.as_ref().clone());
            columns.push(col.clone());
        }
    }
    Ok(RecordBatch::try_new(
        std::sync::Arc::new(Schema::new(fields)),
        columns,
    )?)
}

#[cfg(test)]
mod formula_tests {
    use super::*;
    use datafusion::arrow::array::{Array, Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;

    #[test]
    fn formula_like_text_is_shown_as_text() {
        let batch = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("t", DataType::Utf8, true),
                Field::new("n", DataType::Int64, false),
            ])),
            vec![
                Arc::new(StringArray::from(vec![
                    Some("=HYPERLINK(\"http://x\",\"y\")"),
                    Some("+1"),
                    Some("-2"),
                    Some("@SUM(A1)"),
                    Some("\tx"),
                    Some("plain = text"),
                    None,
                ])),
                Arc::new(Int64Array::from(vec![-1, 2, 3, 4, 5, 6, 7])),
            ],
        )
        .unwrap();
        let out = neutralise_formulas(&batch).unwrap();
        let t = out
            .column(0)
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        let got: Vec<Option<&str>> = t.iter().collect();
        assert_eq!(
            got,
            vec![
                Some("'=HYPERLINK(\"http://x\",\"y\")"),
                Some("'+1"),
                Some("'-2"),
                Some("'@SUM(A1)"),
                Some("'\tx"),
                Some("plain = text"),
                None
            ]
        );
        assert_eq!(
            out.column(1).as_ref(),
            batch.column(1).as_ref(),
            "numbers untouched"
        );
        // Dictionary-encoded text (a categorical Parquet column) too.
        let dict: datafusion::arrow::array::DictionaryArray<
            datafusion::arrow::datatypes::Int32Type,
        > = vec!["=1+1", "ok", "=1+1"].into_iter().collect();
        let batch = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new(
                "d",
                dict.data_type().clone(),
                false,
            )])),
            vec![Arc::new(dict)],
        )
        .unwrap();
        let out = neutralise_formulas(&batch).unwrap();
        let t = out
            .column(0)
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        assert_eq!(t.value(0), "'=1+1");
        assert_eq!(t.value(1), "ok");
    }
}
