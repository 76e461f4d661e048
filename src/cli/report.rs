//! `pieval report RUN [--compare RUN ...] [--output FILE]`.

use crate::cli::ExitStatus;
use std::path::PathBuf;

use crate::cli::output;
use crate::cli::run::run_dir;
use crate::error::Result;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// A run id under --results, or a run folder.
    run: String,
    /// Runs to compare with (mitigations side by side, the cases that flipped).
    #[arg(long, value_name = "RUN")]
    compare: Vec<String>,
    /// Where to write the report (default: RUN/report.html).
    #[arg(long)]
    output: Option<PathBuf>,
    /// The folder holding run ids.
    #[arg(long, default_value = "results")]
    results: PathBuf,
}

pub fn run(args: Args) -> Result<ExitStatus> {
    let mut runs = vec![run_dir(&args.run, &args.results)?];
    for r in &args.compare {
        runs.push(run_dir(r, &args.results)?);
    }
    let output = args
        .output
        .unwrap_or_else(|| runs[0].join(crate::rundir::REPORT_FILE));
    let path = crate::report::write(&runs, &output)?;
    output::stdout_line(&format!("report: {}", path.display()))?;
    Ok(ExitStatus::Success)
}
