//! `pieval ingest SOURCE PATH... [--output P] [--map FIELD=COLUMN ...] [--set FIELD=VALUE ...]
//! [--source-name NAME] [--skip-invalid]`.

use crate::cli::ExitStatus;
use std::path::PathBuf;

use crate::cli::output;
use crate::error::{Error, Result};
use crate::ingest::{Options, Output, SourceKind, ingest};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The source format.
    #[arg(value_parser = super::choice(&SourceKind::ALL, SourceKind::as_str))]
    source: SourceKind,
    /// Source files or folders (docs/corpus.md says what each source reads).
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// The corpus to write; an existing one is appended to (ids checked against it).
    /// Default: JSONL on stdout.
    #[arg(long, short)]
    output: Option<PathBuf>,
    /// FIELD=COLUMN: take a contract field from a column (jsonl, csv, parquet).
    #[arg(long = "map", value_name = "FIELD=COLUMN")]
    maps: Vec<String>,
    /// FIELD=VALUE: a constant for every case (any contract field, or `license`).
    #[arg(long = "set", value_name = "FIELD=VALUE")]
    sets: Vec<String>,
    /// The cases' source_name (default: the source's own name, or the file stem).
    #[arg(long)]
    source_name: Option<String>,
    /// Skip source records that cannot become valid cases (counted, the first few
    /// shown) instead of failing on the first.
    #[arg(long)]
    skip_invalid: bool,
    /// Longest accepted line (JSONL) or record (CSV), in bytes.
    #[arg(long, default_value_t = crate::corpus::lines::DEFAULT_MAX_LINE_BYTES, value_parser = super::max_line_bytes)]
    max_line_bytes: usize,
    /// Print the report as JSON (on stderr when the cases go to stdout).
    #[arg(long)]
    json: bool,
    /// The source's stricter success rule, labelled as such (injecagent: the stolen
    /// data must be e-mailed to the attacker's address; ids end in `-strict`).
    #[arg(long)]
    strict: bool,
}

fn pairs(flag: &str, items: &[String]) -> Result<Vec<(String, String)>> {
    items
        .iter()
        .map(|s| {
            s.split_once('=')
                .map(|(a, b)| (a.trim().to_owned(), b.to_owned()))
                .filter(|(a, _)| !a.is_empty())
                .ok_or_else(|| Error::Usage(format!("{flag} {s:?}: expected FIELD=VALUE")))
        })
        .collect()
}

pub fn run(args: Args) -> Result<ExitStatus> {
    let opts = Options {
        maps: pairs("--map", &args.maps)?,
        sets: pairs("--set", &args.sets)?,
        source_name: args.source_name.clone(),
        skip_invalid: args.skip_invalid,
        max_line_bytes: args.max_line_bytes,
        strict: args.strict,
    };
    let mut stdout = std::io::BufWriter::new(std::io::stdout());
    let output = match args.output.as_deref() {
        Some(path) => Output::File(path),
        None => Output::Stream(&mut stdout),
    };
    let report = ingest(args.source, &args.paths, output, &opts)?;
    // With the cases on stdout, the report goes to stderr.
    let to_stdout = args.output.is_some();
    let text = if args.json {
        serde_json::to_string_pretty(&report).map_err(|e| Error::Internal(e.to_string()))?
    } else {
        let mut s = format!(
            "ingested {} case(s) from {} ({} file(s) or folder(s))",
            report.written,
            report.source,
            report.files.len()
        );
        if let Some(out) = &report.output {
            s.push_str(&format!(" into {}", out.display()));
            if report.existing > 0 {
                s.push_str(&format!(" (appended to {} existing)", report.existing));
            }
        }
        if report.repeated_records > 0 {
            s.push_str(&format!(
                "\n{} repeated record(s) (same id, same content) written once",
                report.repeated_records
            ));
        }
        if report.content_duplicates > 0 {
            s.push_str(&format!(
                "\n{} case(s) duplicate the content of another case (kept; first: {})",
                report.content_duplicates,
                report
                    .first_content_duplicates
                    .iter()
                    .map(|(a, b)| format!("{a} = {b}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if report.skipped_invalid > 0 {
            s.push_str(&format!(
                "\nskipped {} invalid source record(s); the first:\n  {}",
                report.skipped_invalid,
                report.first_invalid.join("\n  ")
            ));
        }
        s
    };
    if to_stdout {
        output::stdout_line(&text)?;
    } else {
        crate::cli::output::stderr_line(&format!("{text}"));
    }
    Ok(ExitStatus::Success)
}
