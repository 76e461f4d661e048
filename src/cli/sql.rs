//! `pieval sql [QUERY] [--file F.sql] [--table NAME=PATH ...] [--format ...] [--output P]`.

use std::io::Write;
use std::path::{Path, PathBuf};

use datafusion::arrow::array::RecordBatch;
use datafusion::execution::context::SQLOptions;
use datafusion::parquet::arrow::ArrowWriter;
use futures::StreamExt;

use crate::cli::paths;
use crate::engine::catalog::{register_file, register_standard_tables};
use crate::engine::{runtime, session};
use crate::error::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    Table,
    Csv,
    Json,
    Parquet,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The query. Tables: attack_cases, case_results, findings, summaries, runs (all runs
    /// under --results, rows tagged with run_id), plus any --table; the detector UDFs
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
    /// The folder of run folders.
    #[arg(long, default_value = "results")]
    results: PathBuf,
    /// The corpus behind attack_cases (default: the enriched corpus when present).
    #[arg(long)]
    cases: Option<PathBuf>,
    /// A judge config (the keys of evaluation.judge, as YAML) for pi_judge(...); new
    /// verdicts go to its shared cache when it names one.
    #[arg(long, value_name = "FILE")]
    judge: Option<PathBuf>,
}

pub fn run(args: Args) -> Result<u8> {
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
    let judge = super::judge::open_judge(args.judge.as_deref(), None)?;
    runtime()?.block_on(async {
        let ctx = session();
        crate::judge::udf::register(&ctx, judge.clone());
        register_standard_tables(&ctx, &cases, &args.results).await?;
        for spec in &args.tables {
            let (name, path) = spec
                .split_once('=')
                .ok_or_else(|| Error::Usage(format!("--table {spec:?}: expected NAME=PATH")))?;
            register_file(&ctx, name, Path::new(path)).await?;
        }
        // Read-only: no DDL, no DML, no SET/other statements.
        let options = SQLOptions::new()
            .with_allow_ddl(false)
            .with_allow_dml(false)
            .with_allow_statements(false);
        let df = ctx
            .sql_with_options(&sql, options)
            .await
            .map_err(|e| Error::Query(format!("the query cannot run: {e}")))?;
        let schema = std::sync::Arc::new(df.schema().as_arrow().clone());
        let mut stream = df.execute_stream().await?;
        let mut sink = Sink::open(args.format, args.output.as_deref(), schema)?;
        while let Some(batch) = stream.next().await {
            sink.write(&batch?)?;
        }
        sink.finish()
    })?;
    if let Some(j) = &judge {
        j.persist(None)?;
        eprintln!("{}", super::judge::judge_line(&j.report()));
    }
    Ok(0)
}

/// Where results go: stdout or a file written atomically.
enum Sink {
    Table {
        batches: Vec<RecordBatch>,
        target: Target,
    },
    Csv(datafusion::arrow::csv::Writer<Target>),
    Json(datafusion::arrow::json::ArrayWriter<Target>),
    Parquet(ArrowWriter<Target>),
}

/// stdout, or a temporary file renamed over the output on success.
enum Target {
    Stdout(std::io::Stdout),
    File(crate::atomic::TempFile),
}

impl Write for Target {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Target::Stdout(s) => s.write(buf),
            Target::File(file) => file.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Target::Stdout(s) => s.flush(),
            Target::File(file) => file.flush(),
        }
    }
}

impl Target {
    fn open(output: Option<&Path>) -> Result<Self> {
        Ok(match output {
            None => Target::Stdout(std::io::stdout()),
            Some(out) => Target::File(crate::atomic::TempFile::create(out)?),
        })
    }

    fn commit(self) -> Result<()> {
        match self {
            Target::Stdout(mut s) => s
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
    ) -> Result<Self> {
        let target = Target::open(output)?;
        Ok(match format {
            Format::Table => Sink::Table {
                batches: Vec::new(),
                target,
            },
            Format::Csv => Sink::Csv(
                datafusion::arrow::csv::WriterBuilder::new()
                    .with_header(true)
                    .build(target),
            ),
            Format::Json => Sink::Json(datafusion::arrow::json::ArrayWriter::new(target)),
            Format::Parquet => Sink::Parquet(ArrowWriter::try_new(target, schema, None)?),
        })
    }

    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        match self {
            Sink::Table { batches, .. } => batches.push(batch.clone()),
            Sink::Csv(w) => w.write(batch)?,
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
            } => {
                let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches)?;
                writeln!(target, "{text}").map_err(|e| Error::io("<output>", "cannot write", e))?;
                target
            }
            Sink::Csv(w) => w.into_inner(),
            Sink::Json(mut w) => {
                w.finish()?;
                w.into_inner()
            }
            Sink::Parquet(w) => w.into_inner()?,
        };
        target.commit()
    }
}
