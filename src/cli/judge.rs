//! `pieval judge calibrate` and `pieval judge prompt`, and the `--judge FILE` option that
//! `score`, `sql` and `replay --rescore` share.

use crate::cli::ExitStatus;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::cli::output;
use crate::error::{Error, Result};
use crate::experiment::config::Config;
use crate::judge::config::JudgeSection;
use crate::judge::{Inputs, Judge, JudgeReport, Rubric};
use crate::ops::calibrate::{Calibration, Mapping, calibrate, load_labels};
use crate::ops::labels::Estimate;

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Measure the judge against labelled responses: accuracy, precision, recall, F1 and
    /// Cohen's kappa with 95% intervals, and the rows where it disagrees.
    Calibrate(CalibrateArgs),
    /// Print the exact prompt the judge receives for one input (rubric rendered).
    Prompt(PromptArgs),
}

/// Where the judge's settings come from.
#[derive(Debug, clap::Args)]
pub struct JudgeSource {
    /// A judge config: the keys of `evaluation.judge` as YAML (provider, name, base_url,
    /// api_key_env, concurrency, timeout_s, max_retries, rubric, inputs, …).
    #[arg(long, value_name = "FILE", conflicts_with = "config")]
    judge: Option<PathBuf>,
    /// An experiment config whose `evaluation.judge` to use.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

impl JudgeSource {
    pub(crate) fn section(&self) -> Result<JudgeSection> {
        match (&self.judge, &self.config) {
            (Some(f), _) => JudgeSection::load(f),
            (None, Some(c)) => Config::load(c)?.config.evaluation.judge.ok_or_else(|| {
                Error::State(format!("{}: no evaluation.judge section", c.display()))
            }),
            (None, None) => Err(Error::Usage(
                "name the judge: --judge FILE (a judge config) or --config EXPERIMENT.yaml".into(),
            )),
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct CalibrateArgs {
    /// The labelled file (JSONL, CSV or Parquet): response, question, label, and
    /// optionally goal, task, id.
    #[arg(long)]
    labels: PathBuf,
    #[command(flatten)]
    source: JudgeSource,
    /// Read a field from another column: FIELD=COLUMN (fields: id, question, response,
    /// label, goal, task). Repeatable.
    #[arg(long = "map", value_name = "FIELD=COLUMN")]
    map: Vec<String>,
    /// Where to write judged.parquet, disagreements.parquet and calibration.json
    /// (default: results/judge-calibration-<UTC time>).
    #[arg(long)]
    output: Option<PathBuf>,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub struct PromptArgs {
    #[command(flatten)]
    source: JudgeSource,
    #[arg(long)]
    question: String,
    #[arg(long)]
    response: String,
    #[arg(long)]
    goal: Option<String>,
    #[arg(long)]
    task: Option<String>,
}

pub fn run(cmd: Command) -> Result<ExitStatus> {
    match cmd {
        Command::Calibrate(args) => run_calibrate(args),
        Command::Prompt(args) => {
            let section = args.source.section()?;
            let rubric = Rubric::load(section.rubric.as_deref())?;
            // Only what the config lets the judge see.
            let mut inputs = Inputs {
                question: args.question,
                response: args.response,
                goal: args.goal,
                task: args.task,
            };
            use crate::judge::config::JudgeInput;
            if !section.inputs.contains(&JudgeInput::Goal) {
                inputs.goal = None;
            }
            if !section.inputs.contains(&JudgeInput::Task) {
                inputs.task = None;
            }
            let text = rubric.render(&inputs).map_err(|e| {
                Error::config(section.rubric.as_deref().unwrap_or(Path::new("rubric")), e)
            })?;
            output::stdout_line(&text)?;
            Ok(ExitStatus::Success)
        }
    }
}

pub(crate) fn pct(e: &Estimate) -> String {
    match (e.value, e.ci_low, e.ci_high) {
        (Some(v), Some(lo), Some(hi)) => format!("{v:.3}  [{lo:.3}–{hi:.3}]"),
        (Some(v), _, _) => format!("{v:.3}"),
        _ => "–".into(),
    }
}

fn run_calibrate(args: CalibrateArgs) -> Result<ExitStatus> {
    let section = args.source.section()?;
    let mapping = Mapping::default().with(&args.map)?;
    let out = args.output.unwrap_or_else(|| {
        PathBuf::from("results").join(format!(
            "judge-calibration-{}",
            crate::text::utc_compact_now()
        ))
    });
    let judge = Arc::new(Judge::open(&section, Some(&out))?.with_notes(output::notes()));
    let cal: Calibration = crate::engine::runtime()?.block_on(async {
        let labels = load_labels(&args.labels, &mapping).await?;
        calibrate(judge, &labels, &out).await
    })?;
    if args.json {
        output::json(&cal)?;
        return Ok(ExitStatus::Success);
    }
    let c = &cal.confusion;
    let rows = vec![
        vec![
            "accuracy".to_owned(),
            pct(&cal.accuracy),
            "Wilson".to_owned(),
        ],
        vec![
            "accuracy, all rows".to_owned(),
            pct(&cal.accuracy_all_rows),
            "Wilson".to_owned(),
        ],
        vec![
            "precision".to_owned(),
            pct(&cal.precision),
            "Wilson".to_owned(),
        ],
        vec!["recall".to_owned(), pct(&cal.recall), "Wilson".to_owned()],
        vec!["F1".to_owned(), pct(&cal.f1), "bootstrap".to_owned()],
        vec![
            "Cohen's kappa".to_owned(),
            pct(&cal.kappa),
            "bootstrap".to_owned(),
        ],
    ];
    let mut text = format!(
        "judge {} ({}) on {} ({} rows, sha256 {}…)\n",
        crate::text::excerpt(&cal.judge.model, 80),
        cal.judge.provider,
        cal.labels.display(),
        cal.rows,
        &cal.labels_sha256[..12]
    );
    text.push_str(&output::table(
        &["metric", "value  [95%]", "interval"],
        &rows,
    ));
    text.push_str(&format!(
        "\nconfusion (label × verdict): tp {} fp {} tn {} fn {}; undecided {} (no verdict: errors or unreadable answers)\n",
        c.tp, c.fp, c.tn, c.fn_, cal.undecided
    ));
    text.push_str(&judge_line(&cal.judge));
    text.push_str(&format!(
        "\n{} disagreement(s) to review: {}\nwrote {}",
        cal.disagreements,
        cal.files["disagreements"].display(),
        cal.files["calibration"].display()
    ));
    output::stdout_line(&text)?;
    Ok(ExitStatus::Success)
}

/// One line on what the judge did.
pub fn judge_line(j: &JudgeReport) -> String {
    format!(
        "judge {} ({}): {} judgement(s), {} call(s), {} from the cache, {} without a verdict",
        crate::text::excerpt(&j.model, 80),
        j.provider,
        j.judgements,
        j.calls,
        j.cache_hits,
        j.errors
    )
}

/// The judge of `--judge FILE`, for `score`, `sql` and `replay --rescore`.
pub fn open_judge(file: Option<&Path>, run_dir: Option<&Path>) -> Result<Option<Arc<Judge>>> {
    file.map(|f| {
        let section = JudgeSection::load(f)?;
        Judge::open(&section, run_dir).map(|j| Arc::new(j.with_notes(output::notes())))
    })
    .transpose()
}
