//! `pieval review RUN [--reviewer NAME] [--sample N] [--seed S] [--port P]`: serve the
//! run's review queue on a local page until interrupted (`src/review/`).

use crate::cli::ExitStatus;
use std::path::PathBuf;

use crate::cli::output;
use crate::cli::run::run_dir;
use crate::error::Result;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// A run id under --results, or a run folder.
    run: String,
    /// The reviewer's name the form starts with (each verdict records who gave it).
    #[arg(long)]
    reviewer: Option<String>,
    /// Also queue this many decided cases, drawn with --seed, for audit.
    #[arg(long, default_value_t = 0)]
    sample: usize,
    /// The seed of the audit sample.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The port on 127.0.0.1 (0: any free port).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// The folder holding run ids.
    #[arg(long, default_value = "results")]
    results: PathBuf,
}

pub fn run(args: Args) -> Result<ExitStatus> {
    let dir = run_dir(&args.run, &args.results)?;
    let (run_id, dir) = crate::review::open_run(&dir)?;
    let items = crate::review::queue(&dir, args.sample, args.seed)?;
    let count = items.len();
    let rt = crate::engine::runtime()?;
    rt.block_on(async {
        let served = crate::review::server::bind(
            crate::review::server::Options {
                run_dir: dir.clone(),
                run_id: run_id.clone(),
                reviewer: args.reviewer.clone(),
                items,
            },
            args.port,
        )
        .await?;
        output::stdout_line(&format!(
            "{count} case(s) to review in run {run_id}; open (local only, the token is the key):"
        ))?;
        output::stdout_line(&format!("review: {}", served.url))?;
        output::stdout_line(&format!(
            "verdicts go to {}; apply them with: pieval replay {} --rescore --trust-reviews (Ctrl-C stops the server)",
            dir.join(crate::rundir::reviews::REVIEWS_FILE).display(),
            dir.display()
        ))?;
        served
            .run(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
    })?;
    Ok(ExitStatus::Success)
}
