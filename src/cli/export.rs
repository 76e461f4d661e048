//! `pieval export [RUN...] --to DIR [--format parquet|sqlite]`.

use crate::cli::ExitStatus;
use std::path::PathBuf;

use crate::cli::output;
use crate::cli::run::run_dir;
use crate::error::{Error, Result};
use crate::export::{Format, SQLITE_FILE, export};
use crate::objstore;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Run ids under --results or run folders; default: every run under --results.
    runs: Vec<String>,
    /// The warehouse folder (created when missing), or `s3://BUCKET/PREFIX` (Parquet:
    /// each file one object, written whole; docs/object-storage.md).
    #[arg(long)]
    to: PathBuf,
    /// Hive-partitioned Parquet tables, or one SQLite file (DIR/pieval.sqlite).
    #[arg(long, value_parser = super::choice(&Format::ALL, Format::as_str), default_value = "parquet")]
    format: Format,
    #[arg(long, default_value = "results")]
    results: PathBuf,
    /// Verify every run's controls folder (its signed index and every envelope) with this
    /// public key before exporting anything; a run whose evidence does not verify stops
    /// the export (exit 1) and nothing is written.
    #[arg(long, value_name = "KEY")]
    public_key: Option<PathBuf>,
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Result<ExitStatus> {
    // Object storage (src/objstore.rs): committed runs under an `s3://` --results are
    // fetched and checked first; an `s3://` --to is exported here, then uploaded.
    let mut scratch = None;
    let rt = crate::engine::runtime()?;
    let results = objstore::local_results(&args.results, &mut scratch, &rt)?;
    let remote_to = objstore::Location::of(&args.to)?;
    if remote_to.is_some() && args.format == Format::Sqlite {
        return Err(Error::Usage(format!(
            "--to {} --format sqlite: a SQLite file is updated in place, which object \
             storage cannot do; export Parquet there, or SQLite to a local folder",
            args.to.display()
        )));
    }
    let runs: Vec<PathBuf> = if args.runs.is_empty() {
        crate::engine::tables::run_dirs(&results)
    } else {
        args.runs
            .iter()
            .map(|r| run_dir(r, &results))
            .collect::<Result<_>>()?
    };
    if let Some(key) = &args.public_key {
        let key = crate::evidence::dsse::read_verifying_key(key)?;
        let mut problems = Vec::new();
        for run in &runs {
            for r in crate::evidence::verify::verify_controls_folder(run, &key)? {
                if !r.ok {
                    problems.push(format!(
                        "{}: {}",
                        r.envelope.display(),
                        r.problems().join("; ")
                    ));
                }
            }
        }
        if !problems.is_empty() {
            for p in &problems {
                output::stderr_line(&format!("FAIL  {p}"));
            }
            output::stderr_line("nothing was exported: the evidence above does not verify");
            return Ok(ExitStatus::Failure);
        }
    }
    let relocated = |e| objstore::relocate(e, &results, &args.results);
    let mut report = match &remote_to {
        None => export(&runs, &args.to, args.format).map_err(relocated)?,
        Some(to) => {
            let local = objstore::Scratch::dir_of(&mut scratch)?.join("export");
            let report = export(&runs, &local, args.format).map_err(relocated)?;
            objstore::upload_tree(to, &local, "runs", &rt)?;
            report
        }
    };
    report.to = args.to.clone();
    drop(scratch);
    if args.json {
        return output::json(&report).map(|_| ExitStatus::Success);
    }
    let rows: Vec<Vec<String>> = report
        .runs
        .iter()
        .map(|r| {
            let tables: Vec<String> = r.tables.iter().map(|(t, n)| format!("{t} {n}")).collect();
            vec![
                r.run_id.clone(),
                r.run_date.clone(),
                r.model_name.clone(),
                tables.join(", "),
            ]
        })
        .collect();
    let mut text = output::table(&["run", "run_date", "model_name", "rows per table"], &rows);
    text.push_str(&match args.format {
        Format::Parquet => format!("\nHive-partitioned Parquet under {}", args.to.display()),
        Format::Sqlite => format!("\nSQLite: {}", args.to.join(SQLITE_FILE).display()),
    });
    output::stdout_line(&text)?;
    Ok(ExitStatus::Success)
}
