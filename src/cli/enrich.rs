//! `pieval enrich`: canonical corpus → taxonomy-enriched derivative.

use crate::cli::ExitStatus;
use std::path::PathBuf;

use crate::atomic::write_lines;
use crate::cli::{output, paths, validate};
use crate::contract::AttackCase;
use crate::corpus::{CorpusReader, ReadOptions};
use crate::error::Result;
use crate::taxonomy::Taxonomy;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The canonical corpus.
    #[arg(long, default_value = paths::CORPUS)]
    input: PathBuf,
    /// Where to write the enriched corpus.
    #[arg(long, default_value = paths::ENRICHED)]
    output: PathBuf,
    /// Taxonomy folder (or taxonomy.toml itself).
    #[arg(long, default_value = paths::TAXONOMY)]
    taxonomy: PathBuf,
    /// Print a JSON summary.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Result<ExitStatus> {
    let taxonomy = Taxonomy::load(&args.taxonomy)?;
    let mut reader = CorpusReader::open(&args.input, ReadOptions::default())?;
    let mut lines = Vec::new();
    let mut counts = std::collections::BTreeMap::<String, u64>::new();
    for batch in reader.by_ref() {
        for case in AttackCase::from_batch(&batch?)? {
            let enriched = taxonomy.enrich(&case);
            *counts
                .entry(
                    enriched
                        .attack_category
                        .map_or_else(String::new, |c| c.as_str().to_owned()),
                )
                .or_default() += 1;
            lines.push(enriched.to_json_line());
        }
    }
    let report = reader.finish()?;
    if !report.is_valid() {
        // Nothing is written from an invalid corpus.
        crate::cli::output::stderr_line(&format!("{}", validate::render(&report)));
        return report.into_result().map(|_| ExitStatus::Failure);
    }
    write_lines(&args.output, lines)?;
    if args.json {
        output::json(&serde_json::json!({
            "input": args.input, "input_sha256": report.sha256, "output": args.output,
            "taxonomy_version": taxonomy.version, "cases": report.valid_records, "categories": counts,
        }))?;
    } else {
        crate::cli::output::stderr_line(&format!(
            "enriched {} case(s) from {} with taxonomy {} into {}",
            report.valid_records,
            args.input.display(),
            taxonomy.version,
            args.output.display()
        ));
    }
    Ok(ExitStatus::Success)
}
