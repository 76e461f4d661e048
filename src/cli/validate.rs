//! `pieval validate [PATH...]`: the contract check.

use crate::cli::ExitStatus;
use std::path::PathBuf;

use crate::cli::output;
use crate::contract::Level;
use crate::corpus::lines::DEFAULT_MAX_LINE_BYTES;
use crate::corpus::{ReadOptions, ValidationReport, validate_file};
use crate::error::Result;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Corpus files (JSONL, or Parquet by extension).
    #[arg(default_value = super::paths::CORPUS)]
    paths: Vec<PathBuf>,
    /// Longest accepted line in bytes; longer lines are violations.
    #[arg(long, default_value_t = DEFAULT_MAX_LINE_BYTES, value_parser = super::max_line_bytes)]
    max_line_bytes: usize,
    /// How many violations to list per file (all are counted).
    #[arg(long, default_value_t = 100)]
    max_errors: usize,
    /// Print one JSON document (a report per file) instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Result<ExitStatus> {
    let opts = ReadOptions {
        max_line_bytes: args.max_line_bytes,
        max_reported: args.max_errors,
        ..ReadOptions::default()
    };
    let mut reports = Vec::with_capacity(args.paths.len());
    for path in &args.paths {
        reports.push(validate_file(path, opts.clone())?);
    }
    if args.json {
        output::json(&reports)?;
    } else {
        for r in &reports {
            output::stdout_line(&render(r))?;
        }
    }
    Ok(if reports.iter().all(ValidationReport::is_valid) {
        ExitStatus::Success
    } else {
        ExitStatus::Failure
    })
}

/// The text report: one line per violation, then a summary line.
pub fn render(r: &ValidationReport) -> String {
    let file = r.path.display();
    let mut out = String::new();
    for v in &r.violations {
        let field = v.field.as_deref().unwrap_or("record");
        let level = if v.level == Level::Warning {
            "warning: "
        } else {
            ""
        };
        let loc = if v.line == 0 {
            format!("{file}")
        } else {
            format!("{file}:{}", v.line)
        };
        out.push_str(&format!("{loc}: {field}: {level}{}\n", v.problem));
    }
    let listed = r.violations.len() as u64;
    let total = r.errors + r.warnings;
    if listed < total {
        out.push_str(&format!(
            "… {} more violation(s) not listed (--max-errors)\n",
            total - listed
        ));
    }
    let verdict = if r.is_valid() { "valid" } else { "INVALID" };
    out.push_str(&format!(
        "{file}: {verdict}: {} record(s), {} valid, {} error(s), {} warning(s); sha256 {}",
        r.records, r.valid_records, r.errors, r.warnings, r.sha256
    ));
    out
}
