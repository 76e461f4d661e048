//! `pieval run CONFIG [--sample-size N] [--output-dir DIR] [--resume RUN_ID] [--dry-run]`
//! and `pieval replay RUN [--rescore]`.

use std::path::{Path, PathBuf};

use crate::cli::{ExitStatus, output, paths};
use crate::error::{Error, Result};
use crate::rundir::Rate;
use crate::rundir::summary::CorrectedRate;
use crate::runner::{self, RunEvent, RunOptions, RunOutcome};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The experiment config (YAML).
    config: PathBuf,
    /// Override experiment.sample_size.
    #[arg(long)]
    sample_size: Option<usize>,
    /// Override experiment.output_dir (where run folders and catalog.sqlite live).
    #[arg(long)]
    output_dir: Option<PathBuf>,
    /// Continue an interrupted run: skip its finished cases, run the rest.
    #[arg(long, value_name = "RUN_ID")]
    resume: Option<String>,
    /// Render every request, call nothing (execution_mode: dry_run).
    #[arg(long)]
    dry_run: bool,
    /// Print the outcome as one JSON document.
    #[arg(long)]
    json: bool,
}

fn options(config: PathBuf, output_dir: Option<PathBuf>, json: bool) -> RunOptions {
    RunOptions {
        config,
        sample_size: None,
        output_dir,
        resume: None,
        dry_run: false,
        progress: Some(progress(!json)),
        taxonomy: PathBuf::from(paths::TAXONOMY),
    }
}

/// The run's progress on stderr: setup notes always, a bar while the model is called
/// (on a terminal, when `bar`).
fn progress(bar: bool) -> runner::Progress {
    use std::io::IsTerminal;
    let bar = bar && std::io::stderr().is_terminal();
    let current: std::sync::Mutex<Option<indicatif::ProgressBar>> = std::sync::Mutex::new(None);
    std::sync::Arc::new(move |event: RunEvent<'_>| {
        let mut current = current.lock().unwrap_or_else(|e| e.into_inner());
        match event {
            RunEvent::Note(line) => output::stderr_line(line),
            RunEvent::Calling { pending } if bar => {
                let pb = indicatif::ProgressBar::new(pending);
                pb.set_style(
                    indicatif::ProgressStyle::with_template(
                        "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} {per_sec} ETA {eta} {msg}",
                    )
                    .expect("a valid template"),
                );
                *current = Some(pb);
            }
            RunEvent::CaseDone {
                successes,
                errors,
                blocked,
            } => {
                if let Some(pb) = current.as_ref() {
                    pb.inc(1);
                    pb.set_message(format!(
                        "successes {successes} errors {errors} blocked {blocked}"
                    ));
                }
            }
            RunEvent::Interrupted => {
                if let Some(pb) = current.take() {
                    pb.abandon_with_message("interrupted");
                }
            }
            RunEvent::CallsDone => {
                if let Some(pb) = current.take() {
                    pb.finish_and_clear();
                }
            }
            RunEvent::Calling { .. } => {}
        }
    })
}

#[derive(Debug, clap::Args)]
pub struct CleanupArgs {
    /// Your experiment config: its target's session and teardown steps are the ones
    /// run (a run folder's own are not trusted).
    config: PathBuf,
    /// The run whose plants to remove (a run id under the output folder, or a path).
    #[arg(long, value_name = "RUN")]
    run: String,
    /// Override experiment.output_dir.
    #[arg(long)]
    output_dir: Option<PathBuf>,
}

/// `pieval cleanup CONFIG --run RUN`: remove what a killed run's application target
/// planted and did not remove (its `plants.jsonl`); exit 1 when some could not be.
pub fn cleanup(args: CleanupArgs) -> Result<ExitStatus> {
    let loaded = crate::experiment::config::Config::load(&args.config)?;
    let results = args
        .output_dir
        .clone()
        .unwrap_or_else(|| loaded.config.experiment.output_dir.clone());
    let dir = run_dir(&args.run, &results)?;
    let (before, after) = runner::cleanup(&loaded.config, &dir, Some(&progress(false)))?;
    output::stdout_line(&format!(
        "{}: {} attempt(s) were left planted, {} removed, {} still planted",
        dir.display(),
        before,
        before.saturating_sub(after),
        after
    ))?;
    Ok(if after == 0 {
        ExitStatus::Success
    } else {
        ExitStatus::Failure
    })
}

pub fn run(args: Args) -> Result<ExitStatus> {
    let mut opts = options(args.config, args.output_dir, args.json);
    opts.sample_size = args.sample_size;
    opts.resume = args.resume;
    opts.dry_run = args.dry_run;
    let outcome = runner::run(&opts)?;
    report(outcome, args.json)
}

/// The end-of-run summary (table or JSON); exit 2 when interrupted.
fn report(mut outcome: RunOutcome, json: bool) -> Result<ExitStatus> {
    // A scored run gets its HTML report; a report that cannot be written does not undo
    // the run (its artifacts are there), it is said.
    let scored = outcome.score.is_some()
        || outcome
            .guardrail
            .as_ref()
            .is_some_and(|g| g.summary.is_some());
    if scored {
        let path = outcome.dir.join(crate::rundir::REPORT_FILE);
        match crate::report::write(std::slice::from_ref(&outcome.dir), &path) {
            Ok(p) => outcome.report = Some(p),
            Err(e) => output::stderr_line(&format!("warning: no report written: {e}")),
        }
    }
    let outcome = &outcome;
    if json {
        output::json(outcome)?;
    } else {
        output::stdout_line(&summary_text(outcome))?;
        if let Some(p) = &outcome.report {
            output::stdout_line(&format!("report: {}", p.display()))?;
        }
    }
    if outcome.status == runner::Ended::Run(crate::rundir::RunStatus::Interrupted) {
        crate::cli::output::stderr_line(&format!(
            "error: run {} was interrupted; continue it with: pieval run <CONFIG> --resume {}",
            outcome.run_id, outcome.run_id
        ));
        return Ok(ExitStatus::Error);
    }
    Ok(ExitStatus::Success)
}

fn pct(v: Option<&Rate>) -> String {
    let n = v.map_or(0, |v| v.n);
    match (
        v.and_then(|v| v.rate),
        v.and_then(|v| v.ci_low),
        v.and_then(|v| v.ci_high),
    ) {
        (Some(r), Some(lo), Some(hi)) => format!(
            "{:5.1}%  [{:.1}–{:.1}]  n={n}",
            r * 100.0,
            lo * 100.0,
            hi * 100.0
        ),
        _ => format!("    –  n={n}"),
    }
}

/// A rate corrected for detector error (`aggregate_metrics.corrected.rates.*`), or why
/// not.
fn corrected(v: Option<&CorrectedRate>) -> String {
    match (
        v.and_then(|v| v.corrected.flatten()),
        v.and_then(|v| v.ci_low),
        v.and_then(|v| v.ci_high),
    ) {
        (Some(r), Some(lo), Some(hi)) => {
            format!("{:5.1}%  [{:.1}–{:.1}]", r * 100.0, lo * 100.0, hi * 100.0)
        }
        _ => "    –".to_owned(),
    }
}

fn summary_text(o: &RunOutcome) -> String {
    if let Some(g) = &o.guardrail {
        return guard_summary_text(o, g);
    }
    let mut s = format!(
        "run {} {}: {} case(s) selected, {} run now, {} resumed, {} provider error(s), {} blocked by the mitigation\n",
        o.run_id, o.status, o.selected, o.executed, o.resumed, o.errors, o.blocked
    );
    if let Some(r) = &o.score {
        let m = &r.aggregate_metrics;
        let row = |label: &str, key: &str| {
            vec![
                label.to_owned(),
                pct(m.rate(key)),
                corrected(m.corrected.rates.get(key)),
            ]
        };
        let echoes = m.echoes;
        let mut rows = vec![
            row("attack success", "attack_success_rate"),
            row("system-prompt leakage", "leakage_rate"),
            row("refusal", "refusal_rate"),
            row("over-refusal (benign)", "over_refusal_rate"),
        ];
        // Agentic cases: AgentDojo's three numbers and whether the payload reached the model.
        for (label, key) in [
            ("utility without attack", "utility_rate"),
            ("utility under attack", "utility_under_attack_rate"),
            ("targeted attack success", "targeted_attack_success_rate"),
            ("injection delivered", "injection_delivered_rate"),
        ] {
            if m.rate(key).is_some() {
                rows.push(row(label, key));
            }
        }
        rows.push(vec![
            "manual review".to_owned(),
            if echoes > 0 {
                format!("{}  ({echoes} echoes)", r.manual_review)
            } else {
                r.manual_review.to_string()
            },
            String::new(),
        ]);
        s.push_str(&output::table(
            &[
                "metric",
                "rate  [Wilson 95%]",
                "corrected for detector error  [95%]",
            ],
            &rows,
        ));
        s.push('\n');
        if let Some(by) = m.rates.by.get("by_attack_surface") {
            let rows: Vec<Vec<String>> = by
                .iter()
                .map(|(k, v)| vec![k.to_owned(), pct(v.get("attack_success_rate"))])
                .collect();
            s.push_str(&output::table(&["attack_surface", "attack success"], &rows));
            s.push('\n');
        }
    }
    if let Some(j) = o.score.as_ref().and_then(|r| r.judge.as_ref()) {
        s.push_str(&super::judge::judge_line(j));
        s.push('\n');
    }
    let sp = &o.speed;
    if let (Some(p), Some(g)) = (sp.prompt_tokens_per_s, sp.generation_tokens_per_s) {
        let n = sp.instances.unwrap_or(1);
        let per = if n > 1 {
            format!(
                " per model × {n} models side by side (together ≈ {:.0} and {:.0} tok/s)",
                p * n as f64,
                g * n as f64
            )
        } else {
            String::new()
        };
        s.push_str(&format!(
            "model speed: prompt {p:.0} tok/s ({} tokens), generation {g:.0} tok/s ({} tokens){per}, {:.1} cases/minute\n",
            sp.prompt_tokens,
            sp.completion_tokens,
            sp.cases_per_minute.unwrap_or(0.0)
        ));
    }
    s.push_str(&format!("artifacts: {}", o.dir.display()));
    s
}

#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// A run id under the results folder, or a run folder.
    run: String,
    /// Re-score the stored predictions with today's detectors (no model calls), in place.
    /// A judge configured in the run (or given with --judge) answers from the run's
    /// judgements.parquet first: verdicts already made are not asked again.
    #[arg(long)]
    rescore: bool,
    /// With --rescore: score on a Ballista cluster (`df://HOST:PORT`, docs/cluster.md);
    /// the manifest and the run catalogue record it, with the executor count.
    #[arg(long, value_name = "URL", requires = "rescore")]
    cluster: Option<String>,
    /// With --cluster: a folder the scheduler and every executor see, or an
    /// `s3://BUCKET/PREFIX` they all reach, for the staged inputs and the parts (default:
    /// the run folder).
    #[arg(long, value_name = "DIR", requires = "cluster")]
    staging: Option<PathBuf>,
    /// A judge config (YAML) of yours to use instead of the run's evaluation.judge.
    #[arg(long, value_name = "FILE")]
    judge: Option<PathBuf>,
    /// An experiment config of yours whose model section replaces the run's (the run's
    /// endpoint and key variable came with the run folder and are not trusted).
    #[arg(long, value_name = "CONFIG")]
    model_from: Option<PathBuf>,
    /// Confirm that the endpoint recorded in the run (its model's, its judge's, its
    /// attacker's or translator's base_url, exactly as the refusal message shows it) may
    /// be called with the key in the environment variable the run names.
    #[arg(long, value_name = "URL")]
    trust_endpoint: Vec<String>,
    /// With --rescore: the run is yours or vouched for — use the verdicts recorded in its
    /// judgements.parquet (only those whose every input — judge, rubric, question,
    /// response, prompt — matches), and let them join the judge's shared cache. Without
    /// it the run's verdicts are not used: the judge is asked again.
    #[arg(long, requires = "rescore")]
    trust_judgements: bool,
    /// With --rescore: apply the reviewers' verdicts in the run's reviews.parquet
    /// (`pieval review`; the latest per case, each only on the response it was given
    /// on), which take precedence over the judge and the rules. Without it they are not
    /// applied (a run folder is not trusted) and a note says how many were left.
    #[arg(long, requires = "rescore")]
    trust_reviews: bool,
    /// Confirm that pieval may use the local files the run's config names outside the
    /// run folder (its corpus, a model file, a judge's rubric, calibration, cache or
    /// replay file), as the refusal lists them. Without it such a run is refused: give
    /// your own sections instead (--judge FILE, --model-from CONFIG).
    #[arg(long)]
    trust_paths: bool,
    /// Without --rescore: your copy of the run's corpus, used instead of the path the
    /// run recorded (its sha256 must still be the recorded one).
    #[arg(long, value_name = "PATH", conflicts_with = "rescore")]
    dataset: Option<PathBuf>,
    /// The results folder holding run ids.
    #[arg(long, default_value = "results")]
    results: PathBuf,
    #[arg(long)]
    json: bool,
}

/// A run folder from a run id or a path (ids cannot escape the results folder). A run
/// folder holds a `manifest.json` (`pieval run`) or a `case_results.parquet` (`pieval
/// score`).
pub fn run_dir(spec: &str, results: &Path) -> Result<PathBuf> {
    // A real folder (not a link to one) holding a manifest or results.
    let is_run = |d: &Path| {
        if !crate::rundir::is_run_folder(d) {
            return false;
        }
        // A scoring killed inside its commit is completed (reading it says why not).
        let _ = crate::atomic::finish_commit(d);
        d.join(crate::rundir::MANIFEST_FILE).is_file()
            || d.join(crate::rundir::CASE_RESULTS_PARQUET).is_file()
    };
    let p = PathBuf::from(spec);
    if is_run(&p) {
        return Ok(p);
    }
    crate::rundir::check_run_id(spec)?;
    let dir = results.join(spec);
    if is_run(&dir) {
        Ok(dir)
    } else {
        Err(Error::NotFound(format!(
            "no run {spec:?}: neither a run folder nor a run id under {}",
            results.display()
        )))
    }
}

pub fn replay(args: ReplayArgs) -> Result<ExitStatus> {
    let dir = run_dir(&args.run, &args.results)?;
    let opts = runner::replay::ReplayOptions {
        dir,
        rescore: args.rescore,
        dataset: args.dataset,
        judge: args.judge,
        model_from: args.model_from,
        cluster: args.cluster.map(|url| (url, args.staging)),
        trust: runner::replay::Trust {
            endpoints: args.trust_endpoint,
            judgements: args.trust_judgements,
            reviews: args.trust_reviews,
            paths: args.trust_paths,
        },
    };
    let notes = progress(false);
    let rerun = |path: PathBuf| options(path, None, args.json);
    let outcome = runner::replay::replay(&opts, &notes, &rerun)?;
    report(outcome, args.json)
}

/// The end of a guardrail run, for a terminal: the calls, then the figures over every text.
fn guard_summary_text(o: &RunOutcome, g: &runner::guard::GuardDone) -> String {
    use output::table;
    let mut s = format!(
        "guardrail run {} {}: {} text(s), {} classified now, {} resumed, {} flagged, {} error(s)\n",
        o.run_id, o.status, g.items, g.executed, g.resumed, g.flagged, g.errors
    );
    let Some(b) = &g.summary else { return s };
    let f = |v: &serde_json::Value| v.as_f64();
    let pct = |v: &serde_json::Value, lo: &serde_json::Value, hi: &serde_json::Value| match (
        f(v),
        f(lo),
        f(hi),
    ) {
        (Some(r), Some(l), Some(h)) => {
            format!("{:5.1}%  [{:.1}–{:.1}]", r * 100.0, l * 100.0, h * 100.0)
        }
        (Some(r), _, _) => format!("{:5.1}%", r * 100.0),
        _ => "    –".to_owned(),
    };
    let d = &b["detection"];
    let count = |k: &str, v: &serde_json::Value| format!("{k}={}", v.as_u64().unwrap_or(0));
    let mut rows = vec![
        vec![
            "recall (TPR)".to_owned(),
            pct(&d["tpr"], &d["tpr_low"], &d["tpr_high"]),
            format!("{} of {}", count("tp", &d["tp"]), d["positives"]),
        ],
        vec![
            "false-positive rate".to_owned(),
            pct(&d["fpr"], &d["fpr_low"], &d["fpr_high"]),
            format!("{} of {}", count("fp", &d["fp"]), d["negatives"]),
        ],
        vec![
            "precision".to_owned(),
            pct(&d["precision"], &d["precision_low"], &d["precision_high"]),
            String::new(),
        ],
        vec![
            "balanced accuracy".to_owned(),
            pct(
                &d["balanced_accuracy"],
                &d["balanced_accuracy_low"],
                &d["balanced_accuracy_high"],
            ),
            String::new(),
        ],
    ];
    if let Some(list) = b["at_fpr"].as_array() {
        for r in list {
            rows.push(vec![
                format!(
                    "recall at FPR ≤ {:.0}%",
                    f(&r["max_fpr"]).unwrap_or(0.0) * 100.0
                ),
                pct(&r["recall"], &r["recall_low"], &r["recall_high"]),
                match f(&r["threshold"]) {
                    Some(t) => format!("score ≥ {t:.4}"),
                    None => "no threshold within it".to_owned(),
                },
            ]);
        }
    }
    let o_d = &b["over_defence"];
    if o_d.is_object() {
        rows.push(vec![
            "over-defence accuracy (hard benign)".to_owned(),
            pct(
                &o_d["accuracy"],
                &o_d["accuracy_low"],
                &o_d["accuracy_high"],
            ),
            format!("n={}", o_d["n"]),
        ]);
    }
    let a = &b["areas"];
    rows.push(vec![
        "ROC AUC / average precision".to_owned(),
        match (f(&a["roc_auc"]), f(&a["average_precision"])) {
            (Some(x), Some(y)) => format!("{x:.4} / {y:.4}"),
            _ => "–".to_owned(),
        },
        format!("{} threshold(s)", a["points"]),
    ]);
    let l = &b["latency_ms"];
    if let (Some(p50), Some(p95), Some(p99)) = (f(&l["p50"]), f(&l["p95"]), f(&l["p99"])) {
        rows.push(vec![
            "latency p50 / p95 / p99".to_owned(),
            format!("{p50:.1} / {p95:.1} / {p99:.1} ms"),
            String::new(),
        ]);
    }
    s.push_str(&table(&["metric", "value  [Wilson 95%]", ""], &rows));
    s.push('\n');
    s
}
