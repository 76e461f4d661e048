//! `pieval corpus synth | stats`.

use crate::cli::ExitStatus;
use std::path::PathBuf;

use crate::atomic::write_lines;
use crate::cli::{output, paths};
use crate::corpus::synth::synthesize;
use crate::error::Result;
use crate::ops::corpus_stats::{BREAKDOWNS, corpus_stats};

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Regenerate the canonical corpus from data/templates (synthetic cases plus the
    /// hand-written ones), deterministically: the same seed gives the same bytes.
    Synth {
        /// Seed for task/document choices and tokens (default: the templates' own).
        #[arg(long)]
        seed: Option<u64>,
        /// Where to write the corpus.
        #[arg(long, default_value = paths::CORPUS)]
        output: PathBuf,
        /// Template folder.
        #[arg(long, default_value = paths::TEMPLATES)]
        templates: PathBuf,
    },
    /// Counts by family, surface, category, severity, source, language, label, split.
    Stats {
        /// Corpus file (JSONL or Parquet); the enriched corpus shows categories.
        #[arg(default_value = paths::CORPUS)]
        path: PathBuf,
        /// Print one JSON document.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(cmd: Command) -> Result<ExitStatus> {
    match cmd {
        Command::Synth {
            seed,
            output: out,
            templates,
        } => {
            let cases = synthesize(&templates, seed)?;
            let n = cases.len();
            let benign = cases.iter().filter(|c| c.is_benign()).count();
            write_lines(&out, cases.iter().map(|c| c.to_json_line()))?;
            crate::cli::output::stderr_line(&format!(
                "wrote {n} cases ({benign} benign controls) to {}",
                out.display()
            ));
            Ok(ExitStatus::Success)
        }
        Command::Stats { path, json } => {
            let stats = corpus_stats(&path)?;
            // Invalid records are not counted; say so, and exit 1 (what was checked failed).
            let code = if stats.invalid_records > 0 {
                crate::cli::output::stderr_line(&format!(
                    "{}: {} invalid record(s) skipped; run `pieval validate {}` for the details",
                    stats.path, stats.invalid_records, stats.path
                ));
                ExitStatus::Failure
            } else {
                ExitStatus::Success
            };
            if json {
                output::json(&stats)?;
                return Ok(code);
            }
            let mut text = format!("{}: {} valid case(s)\n", stats.path, stats.total);
            for column in BREAKDOWNS {
                let counts = &stats.breakdowns[*column];
                let mut rows: Vec<(&String, &u64)> = counts.iter().collect();
                rows.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
                let rows: Vec<Vec<String>> = rows
                    .into_iter()
                    .map(|(k, n)| {
                        let share = if stats.total == 0 {
                            0.0
                        } else {
                            100.0 * *n as f64 / stats.total as f64
                        };
                        vec![k.clone(), n.to_string(), format!("{share:.1}%")]
                    })
                    .collect();
                text.push('\n');
                text.push_str(&output::table(&[column, "cases", "share"], &rows));
            }
            output::stdout_line(text.trim_end())?;
            Ok(code)
        }
    }
}
