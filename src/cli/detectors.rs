//! `pieval detectors eval`: a detector measured against labelled responses
//! (src/ops/detector_eval.rs, queries/detectors/).

use crate::cli::ExitStatus;
use std::path::PathBuf;
use std::sync::Arc;

use crate::cli::judge::{JudgeSource, pct};
use crate::cli::output;
use crate::error::Result;
use crate::ops::detector_eval::{Detector, Evaluation, Mapping, evaluate, load_labels_within};

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Measure a detector against a labelled file: accuracy, precision, recall and F1 with
    /// 95% intervals and the confusion matrix, per split, per source and overall; the rows
    /// where it disagrees are written as Parquet for review.
    Eval(EvalArgs),
    /// Train pieval's injection model (`pi_injection_score`, the guardrail `builtin:
    /// model`, the input filter's `detector: model`) on one split of a labelled text
    /// file, reproducibly; its threshold is chosen by five-fold cross-validation on that split.
    /// Writes injection-model.bin and injection-model.toml.
    TrainInjection(TrainArgs),
}

#[derive(Debug, clap::Args)]
pub struct TrainArgs {
    /// The labelled texts (data/labels/guardrail.jsonl's fields).
    #[arg(long, default_value = "data/labels/guardrail.jsonl")]
    labels: PathBuf,
    /// The rows trained on: dev (default), test or all.
    #[arg(long, default_value = "dev", value_parser = ["dev", "test", "all"])]
    split: String,
    /// The held-out false-positive rate the threshold is set to.
    #[arg(long, default_value_t = 0.05)]
    max_fpr: f64,
    /// Where the model files go (data/rules is what pieval compiles in).
    #[arg(long, default_value = "data/rules")]
    output: PathBuf,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub struct EvalArgs {
    /// The detector: refusal, response_class, leakage, criteria, rule:ID (an injection
    /// rule of data/rules/injection.toml), injection (any of them) or judge (with --judge
    /// or --config).
    #[arg(long)]
    detector: String,
    /// The labelled file (JSONL, CSV or Parquet): response, label, and what the detector
    /// reads (protected, criteria, question); optionally id, source, split, prompt (what
    /// the user sent, for leakage), goal, task.
    #[arg(long)]
    labels: PathBuf,
    /// Read a field from another column: FIELD=COLUMN (fields: id, source, split,
    /// response, label, protected, prompt, criteria, question, goal, task). Repeatable.
    #[arg(long = "map", value_name = "FIELD=COLUMN")]
    map: Vec<String>,
    /// The leakage score from which the leakage detector fires (scoring's default).
    #[arg(long, default_value_t = crate::detect::udf::LEAKAGE_THRESHOLD)]
    threshold: f64,
    #[command(flatten)]
    judge: JudgeSource,
    /// Where to write disagreements.parquet and evaluation.json (default:
    /// results/detector-eval-<detector>-<UTC time>).
    #[arg(long)]
    output: Option<PathBuf>,
    #[arg(long)]
    json: bool,
    /// Memory the evaluation may hold, in MiB: the labelled file is read whole, so it
    /// may be at most a quarter of this (and 1,024 columns, lines of 16 MiB); queries
    /// beyond it fail with a clear error rather than exhaust the machine.
    #[arg(long, default_value_t = 4096, value_name = "MIB")]
    memory_limit: usize,
}

pub fn run(cmd: Command) -> Result<ExitStatus> {
    match cmd {
        Command::Eval(args) => run_eval(args),
        Command::TrainInjection(args) => run_train(args),
    }
}

fn run_train(args: TrainArgs) -> Result<ExitStatus> {
    use crate::guard::items::SplitChoice;
    let split = match args.split.as_str() {
        "dev" => SplitChoice::Dev,
        "test" => SplitChoice::Test,
        _ => SplitChoice::All,
    };
    let opt = crate::detect::model::TrainOptions::default();
    let (model, card) = crate::ops::train_injection::fit(&args.labels, split, args.max_fpr, &opt)?;
    let (bin, toml) = crate::ops::train_injection::write(&args.output, &model, &card)?;
    if args.json {
        output::json(&card)?;
    } else {
        output::stdout_line(&format!(
            "trained on {} rows ({} injections, {} benign) of {}; threshold {:.6}: cross-validated, recall {:.1}% at FPR {:.1}%\nwrote {} and {}",
            card.rows,
            card.positives,
            card.negatives,
            card.labels,
            card.threshold,
            card.held_out_recall * 100.0,
            card.held_out_fpr * 100.0,
            bin.display(),
            toml.display()
        ))?;
    }
    Ok(ExitStatus::Success)
}

fn run_eval(args: EvalArgs) -> Result<ExitStatus> {
    if !(0.0..=1.0).contains(&args.threshold) {
        return Err(crate::error::Error::Usage(format!(
            "--threshold {}: a leakage score threshold is between 0 and 1",
            args.threshold
        )));
    }
    if args.memory_limit == 0 || args.memory_limit > (1 << 30) {
        return Err(crate::error::Error::Usage(format!(
            "--memory-limit {}: give MiB from 1 to {}",
            args.memory_limit,
            1u64 << 30
        )));
    }
    let detector = Detector::parse(&args.detector, args.threshold)?;
    let mapping = Mapping::default().with(&args.map)?;
    let out = args.output.unwrap_or_else(|| {
        let name: String = detector
            .sql_name()
            .chars()
            .chain(
                match &detector {
                    Detector::Rule(id) => format!("-{id}"),
                    _ => String::new(),
                }
                .chars(),
            )
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        PathBuf::from("results").join(format!(
            "detector-eval-{name}-{}",
            crate::text::utc_compact_now()
        ))
    });
    let judge = match detector {
        Detector::Judge => {
            let section = args.judge.section()?;
            Some(Arc::new(
                crate::judge::Judge::open(&section, Some(&out))?.with_notes(output::notes()),
            ))
        }
        _ => None,
    };
    let eval: Evaluation = crate::engine::runtime()?.block_on(async {
        let labels =
            load_labels_within(&args.labels, &mapping, &detector, args.memory_limit << 20).await?;
        evaluate(&detector, &labels, judge, Some(&out)).await
    })?;
    if args.json {
        output::json(&eval)?;
        return Ok(ExitStatus::Success);
    }
    output::stdout_line(&render(&eval))?;
    Ok(ExitStatus::Success)
}

/// The evaluation as a table: one row per group (all, each split, each source).
pub fn render(eval: &Evaluation) -> String {
    let three = eval.groups.iter().any(|g| g.class_accuracy.is_some());
    let mut headers = vec![
        "rows",
        "accuracy [95%]",
        "precision [95%]",
        "recall [95%]",
        "F1 [95%]",
        "tp fp tn fn",
    ];
    if three {
        headers.push("3-class accuracy [95%]");
    }
    headers.insert(0, "group");
    let rows: Vec<Vec<String>> = eval
        .groups
        .iter()
        .map(|g| {
            let c = &g.confusion;
            let mut row = vec![
                if g.dimension == "all" {
                    "all".to_owned()
                } else {
                    format!("{} {}", g.dimension, g.value)
                },
                if g.undecided > 0 {
                    format!("{} ({} undecided)", g.rows, g.undecided)
                } else {
                    g.rows.to_string()
                },
                pct(&g.accuracy),
                pct(&g.precision),
                pct(&g.recall),
                pct(&g.f1),
                format!("{} {} {} {}", c.tp, c.fp, c.tn, c.fn_),
            ];
            if three {
                row.push(
                    g.class_accuracy
                        .as_ref()
                        .map(pct)
                        .unwrap_or_else(|| "–".into()),
                );
            }
            row
        })
        .collect();
    let mut text = format!(
        "detector {} on {} (sha256 {}…)\n",
        eval.detector,
        eval.labels.display(),
        &eval.labels_sha256[..12]
    );
    text.push_str(&output::table(&headers, &rows));
    text.push_str(&format!(
        "\n{} disagreement(s) to review",
        eval.disagreements
    ));
    for (name, path) in &eval.files {
        text.push_str(&format!("\nwrote {name}: {}", path.display()));
    }
    text
}
