//! `pieval cluster scheduler|executor|info`: the processes of a Ballista cluster with
//! pieval's functions registered (docs/cluster.md; feature `distributed`).

use crate::cli::ExitStatus;
use std::net::SocketAddr;
use std::path::PathBuf;

use crate::error::Result;

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Start a scheduler: plans queries and hands their tasks to the executors; serves
    /// what it holds (rule-pack digest, functions, executors) for the others to check.
    Scheduler {
        /// Address to listen on (gRPC, and the description at /pieval/v1/cluster).
        #[arg(long, default_value = "127.0.0.1:50050", value_name = "ADDR")]
        bind: SocketAddr,
        /// The host name executors and clients reach this scheduler at (default: the
        /// bind address).
        #[arg(long, value_name = "HOST")]
        external_host: Option<String>,
    },
    /// Start an executor: runs tasks of the scheduler's queries. Refuses to start when
    /// its rule packs or functions differ from the scheduler's.
    Executor {
        /// The scheduler, df://HOST:PORT.
        #[arg(long, value_name = "URL")]
        scheduler: String,
        /// Address to serve results on (Arrow Flight); gRPC takes the next port.
        #[arg(long, default_value = "127.0.0.1:50051", value_name = "ADDR")]
        bind: SocketAddr,
        /// The host name the scheduler and clients reach this executor at (default: the
        /// address the scheduler sees it connect from).
        #[arg(long, value_name = "HOST")]
        external_host: Option<String>,
        /// Partitions it runs at once (default: its cores).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4096))]
        concurrency: Option<u32>,
        /// Folder for shuffle files (default: a temporary folder).
        #[arg(long, value_name = "DIR")]
        work_dir: Option<PathBuf>,
    },
    /// Print what a scheduler holds (pieval version, rule-pack digest, executors) as
    /// JSON, and whether this pieval matches it (exit 1 when it does not).
    Info {
        /// The scheduler, df://HOST:PORT.
        #[arg(long, value_name = "URL")]
        scheduler: String,
    },
}

#[cfg(not(feature = "distributed"))]
pub fn run(_cmd: Command) -> Result<ExitStatus> {
    Err(crate::cluster::not_built())
}

/// Run the scheduler until it ends or is asked to stop: SIGTERM (what `podman stop`,
/// `docker stop` and Kubernetes send) or SIGINT. Ballista's scheduler handles neither, and
/// in a container the process is PID 1, for which the kernel ignores a signal it does not
/// handle: without this, `stop` waited its 10 s and killed it. (The executor handles
/// both itself.)
#[cfg(feature = "distributed")]
async fn until_stopped(process: impl std::future::Future<Output = Result<()>>) -> Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())
        .map_err(|e| crate::error::Error::Internal(format!("cannot handle SIGTERM: {e}")))?;
    tokio::select! {
        r = process => r,
        _ = term.recv() => Ok(()),
        _ = tokio::signal::ctrl_c() => Ok(()),
    }
}

#[cfg(feature = "distributed")]
pub fn run(cmd: Command) -> Result<ExitStatus> {
    use crate::cluster::{ClusterInfo, ExecutorOptions, SchedulerOptions};
    let rt = crate::engine::runtime()?;
    match cmd {
        Command::Scheduler {
            bind,
            external_host,
        } => {
            super::output::stderr_line(&format!(
                "pieval scheduler on {bind}, rule packs {}",
                crate::detect::packs::digest()
            ));
            rt.block_on(until_stopped(crate::cluster::run_scheduler(
                SchedulerOptions {
                    bind,
                    external_host,
                },
            )))?;
            Ok(ExitStatus::Success)
        }
        Command::Executor {
            scheduler,
            bind,
            external_host,
            concurrency,
            work_dir,
        } => {
            let scheduler = crate::cluster::parse_url(&scheduler)?;
            if let Some(dir) = &work_dir {
                std::fs::create_dir_all(dir)
                    .map_err(|e| crate::error::Error::io(dir, "cannot create folder", e))?;
            }
            super::output::stderr_line(&format!(
                "pieval executor on {bind} for df://{}:{}, rule packs {}",
                scheduler.0,
                scheduler.1,
                crate::detect::packs::digest()
            ));
            // Ballista's executor stops on SIGTERM and SIGINT by itself, and gracefully:
            // it tells the scheduler it is stopping and lets its running tasks finish.
            rt.block_on(crate::cluster::run_executor(ExecutorOptions {
                scheduler,
                bind,
                external_host,
                concurrency: concurrency.map(|n| n as usize),
                work_dir,
            }))?;
            Ok(ExitStatus::Success)
        }
        Command::Info { scheduler } => {
            let (host, port) = crate::cluster::parse_url(&scheduler)?;
            let info = rt.block_on(crate::cluster::fetch_info(&host, port))?;
            let mismatch = ClusterInfo::local().mismatch(&info, "client");
            super::output::json(&serde_json::json!({
                "scheduler": format!("df://{host}:{port}"),
                "cluster": info,
                "matches_this_pieval": mismatch.is_none(),
                "mismatch": mismatch,
            }))?;
            Ok(if mismatch.is_some() {
                ExitStatus::Failure
            } else {
                ExitStatus::Success
            })
        }
    }
}
