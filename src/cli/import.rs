//! `pieval import TOOL PATH… --output RUN_DIR [--source-scorer NAME] [--correct-means
//! attack|defence] [--judge FILE] [--replace] [--json]`.

use std::path::PathBuf;

use crate::cli::{ExitStatus, output, paths};
use crate::error::Result;
use crate::import::{IMPORTERS, ImportOptions, import};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum CorrectMeans {
    /// A "correct" score means the attack succeeded (the target was emitted).
    Attack,
    /// A "correct" score means the model held.
    Defence,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The tool whose results these are.
    #[arg(value_parser = clap::builder::PossibleValuesParser::new(IMPORTERS.iter().map(|i| i.name)))]
    tool: String,
    /// Result files or folders (docs/import.md says what each tool's importer reads).
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// The run folder to write (its name is the run id); it must not exist.
    #[arg(long, short)]
    output: PathBuf,
    /// Write over an existing --output folder (swapped in whole when the import succeeds).
    #[arg(long)]
    replace: bool,
    /// The detector or scorer whose verdict is source_verdict (default: the tool's own
    /// reading; docs/import.md).
    #[arg(long, value_name = "NAME")]
    source_scorer: Option<String>,
    /// Inspect: what a "correct" score means.
    #[arg(long, value_enum, default_value_t = CorrectMeans::Attack)]
    correct_means: CorrectMeans,
    /// A judge config (the keys of evaluation.judge, as YAML): `judge` criteria are
    /// decided by it instead of going to manual review.
    #[arg(long, value_name = "FILE")]
    judge: Option<PathBuf>,
    /// A pieval corpus (file or folder) whose cases the results answer, matched by case
    /// id: AgentDojo's results against pieval's translation of its suites
    /// (data/agentdojo), whose criteria over the agent's calls pieval decides itself.
    #[arg(long, value_name = "PATH")]
    cases: Vec<PathBuf>,
    /// Traces (`otel`): the pieval run (its id) whose attempts sent the W3C traceparent
    /// the spans carry; spans are joined to its attempts by trace id.
    #[arg(long, value_name = "RUN_ID")]
    trace_run: Option<String>,
    /// The taxonomy the imported cases are enriched with (default: data/taxonomy when it
    /// exists here, else the one compiled into pieval).
    #[arg(long, value_name = "DIR")]
    taxonomy: Option<PathBuf>,
    /// Longest accepted line of a JSONL source, in bytes.
    #[arg(long, default_value_t = 64 << 20, value_parser = super::max_line_bytes)]
    max_line_bytes: usize,
    /// Print the report as one JSON document.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Result<ExitStatus> {
    // The command as typed (the program as `pieval`: its install path is no one's
    // business in a run folder that travels).
    let command = std::iter::once("pieval".to_owned())
        .chain(crate::cli::args())
        .map(|a| crate::text::escape_control(&a).into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    let opts = ImportOptions {
        tool: args.tool,
        paths: args.paths,
        output: args.output,
        replace: args.replace,
        source_scorer: args.source_scorer,
        correct_means_attack: args.correct_means == CorrectMeans::Attack,
        judge: args.judge,
        command,
        max_line_bytes: args.max_line_bytes,
        taxonomy: args
            .taxonomy
            .or_else(|| Some(PathBuf::from(paths::TAXONOMY)).filter(|p| p.exists())),
        cases: args.cases,
        trace_run: args.trace_run,
    };
    let report = import(&opts)?;
    if args.json {
        output::json(&report)?;
        return Ok(ExitStatus::Success);
    }
    let version = report
        .tool_version
        .as_deref()
        // read from the tool's file: hostile text until escaped
        .map(|v| format!(" {}", crate::text::escape_control(v)))
        .unwrap_or_default();
    let mut text = format!(
        "imported {} result(s) of {}{version} from {} file(s) into {} (run {})\n  cases: {}   tool calls: {}   the tool's scores: {}\n  pieval: attack_success {}   manual_review {}\n",
        report.predictions,
        report.tool,
        report.sources.len(),
        crate::text::escape_control(&report.output.display().to_string()),
        report.run_id,
        report.cases,
        report.tool_calls,
        report.source_scores,
        report.attack_success,
        report.manual_review,
    );
    if report.source_verdicts > 0 {
        let decided = report.agreed + report.disagreed;
        text.push_str(&format!(
            "  verdicts: the tool gave {}; pieval decided {decided} of them and agrees on {} ({}), disagrees on {}\n  see them: pieval sql \"SELECT * FROM verdict_disagreements\" --results {}\n",
            report.source_verdicts,
            report.agreed,
            if decided > 0 {
                format!("{:.1}%", 100.0 * report.agreed as f64 / decided as f64)
            } else {
                "-".into()
            },
            report.disagreed,
            crate::text::escape_control(
                &report
                    .output
                    .parent()
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|| ".".into())
            ),
        ));
    }
    output::stdout_line(text.trim_end())?;
    Ok(ExitStatus::Success)
}
