//! `pieval runs list | show RUN | diff RUN_A RUN_B`.

use crate::cli::ExitStatus;
use std::path::PathBuf;

use serde_json::Value;

use crate::cli::output;
use crate::cli::run::run_dir;
use crate::error::{Error, Result};
use crate::runner::diff::diff;
use crate::runner::run_index::Catalog;

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Every run in the catalogue (results/catalog.sqlite), newest first.
    List(ListArgs),
    /// One run: its manifest headline and metrics.
    Show(ShowArgs),
    /// Metric deltas with intervals and the cases that flipped, from run A to run B.
    Diff(DiffArgs),
}

#[derive(Debug, clap::Args)]
pub struct ListArgs {
    #[arg(long, default_value = "results")]
    results: PathBuf,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub struct ShowArgs {
    run: String,
    #[arg(long, default_value = "results")]
    results: PathBuf,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub struct DiffArgs {
    run_a: String,
    run_b: String,
    #[arg(long, default_value = "results")]
    results: PathBuf,
    /// Exit 1 when B is significantly worse than A (attack success, leakage,
    /// over-refusal or an agent's targeted attack success up, an agent's utility down;
    /// two-proportion z-test at 5%).
    #[arg(long)]
    fail_on_regression: bool,
    /// Flipped cases to list (all with --json).
    #[arg(long, default_value_t = 20)]
    limit: usize,
    #[arg(long)]
    json: bool,
}

fn rate(v: Option<f64>) -> String {
    v.map_or("–".into(), |r| format!("{:.1}%", r * 100.0))
}

pub fn run(cmd: Command) -> Result<ExitStatus> {
    match cmd {
        Command::List(a) => {
            let catalog = Catalog::open(&a.results)?;
            catalog.sync(&a.results)?;
            let runs = catalog.list()?;
            if a.json {
                output::json(&runs)?;
                return Ok(ExitStatus::Success);
            }
            let rows: Vec<Vec<String>> = runs
                .iter()
                .map(|r| {
                    vec![
                        r.run_id.clone(),
                        r.status.clone(),
                        r.started_at.clone(),
                        format!(
                            "{}:{}",
                            r.provider.as_deref().unwrap_or("?"),
                            r.model.as_deref().unwrap_or("?")
                        ),
                        r.mitigation.clone().unwrap_or_default(),
                        r.rows.or(r.selected).map_or("–".into(), |n| n.to_string()),
                        rate(r.attack_success_rate),
                        rate(r.leakage_rate),
                        rate(r.over_refusal_rate),
                    ]
                })
                .collect();
            output::stdout_line(&output::table(
                &[
                    "run_id",
                    "status",
                    "started",
                    "model",
                    "mitigation",
                    "cases",
                    "ASR",
                    "leakage",
                    "over-refusal",
                ],
                &rows,
            ))?;
            Ok(ExitStatus::Success)
        }
        Command::Show(a) => {
            let dir = run_dir(&a.run, &a.results)?;
            let m = crate::rundir::Manifest::read(&dir)?;
            let summary: Option<Value> = crate::rundir::read_artifact(
                &dir,
                crate::rundir::SUMMARY_FILE,
                crate::files::bounds::SUMMARY,
            )?
            .and_then(|t| serde_json::from_slice(&t).ok());
            if a.json {
                let mut doc = serde_json::to_value(&m)
                    .map_err(|e| Error::Internal(format!("cannot encode the manifest: {e}")))?;
                if let Some(s) = summary {
                    doc["summary"] = s;
                }
                output::json(&doc)?;
                return Ok(ExitStatus::Success);
            }
            // Absent: "–"; recorded as null: "null" (as the manifest says).
            let opt = |v: Option<&str>| v.map_or_else(|| "–".to_owned(), str::to_owned);
            let null = |v: Option<&str>| v.map_or_else(|| "null".to_owned(), str::to_owned);
            let mut text = String::new();
            let (data, model) = (&m.dataset_snapshot, &m.model_snapshot);
            for (label, value) in [
                ("run_id", m.run_id.clone()),
                ("status", opt(m.status.map(|s| s.as_str()))),
                ("started", m.timestamp.clone()),
                ("finished", opt(m.finished_at.as_deref())),
                ("config", null(m.config_source_path.as_deref())),
                ("corpus", data.path.clone()),
                ("corpus sha256", data.sha256.clone()),
                ("provider", model.provider.clone()),
                ("model", model.name.clone()),
                ("mitigation", m.mitigation_snapshot.name.clone()),
                ("seed", m.replay_hints.seed.to_string()),
                ("selected", m.replay_hints.selected.to_string()),
                ("git commit", null(m.git_commit.as_deref())),
            ] {
                text.push_str(&format!("{label:<14} {value}\n"));
            }
            if let Some(s) = summary {
                let m = &s["aggregate_metrics"];
                for key in [
                    "attack_success_rate",
                    "leakage_rate",
                    "refusal_rate",
                    "over_refusal_rate",
                ] {
                    let g = |k: &str| m[key][k].as_f64();
                    text.push_str(&format!(
                        "{key:<20} {} [{}–{}] n={}\n",
                        rate(g("rate")),
                        rate(g("ci_low")),
                        rate(g("ci_high")),
                        m[key]["n"]
                    ));
                }
            }
            text.push_str(&format!("folder         {}", dir.display()));
            output::stdout_line(&text)?;
            Ok(ExitStatus::Success)
        }
        Command::Diff(a) => {
            let (da, db) = (
                run_dir(&a.run_a, &a.results)?,
                run_dir(&a.run_b, &a.results)?,
            );
            let d = diff((&a.run_a, &da), (&a.run_b, &db))?;
            if a.json {
                output::json(&d)?;
            } else {
                let rows: Vec<Vec<String>> = d
                    .metrics
                    .iter()
                    .map(|m| {
                        let iv = |r: &crate::rundir::Rate| {
                            format!("{} [{}–{}]", rate(r.rate), rate(r.ci_low), rate(r.ci_high))
                        };
                        vec![
                            m.metric.clone(),
                            iv(&m.a),
                            iv(&m.b),
                            m.delta
                                .map_or("–".into(), |x| format!("{:+.1} pp", x * 100.0)),
                            m.z.map_or("–".into(), |z| format!("{z:+.2}")),
                            if m.regression {
                                "REGRESSION".into()
                            } else if m.significant {
                                "significant".into()
                            } else {
                                String::new()
                            },
                        ]
                    })
                    .collect();
                let mut text = output::table(&["metric", "A", "B", "delta", "z", ""], &rows);
                text.push_str(&format!(
                    "\ncases: {} became successful, {} stopped succeeding; {} only in A, {} only in B\n",
                    d.became_successful, d.became_unsuccessful, d.only_in_a, d.only_in_b
                ));
                for f in d.flips.iter().take(a.limit) {
                    let v = |x: Option<bool>| x.map_or("null".to_owned(), |b| b.to_string());
                    text.push_str(&format!(
                        "  {:<16} {} → {}  {}\n",
                        f.field,
                        v(f.a),
                        v(f.b),
                        crate::text::excerpt(&f.case_id, 80)
                    ));
                }
                if d.flips.len() > a.limit {
                    text.push_str(&format!(
                        "  … {} more (--limit, --json)\n",
                        d.flips.len() - a.limit
                    ));
                }
                output::stdout_line(text.trim_end())?;
            }
            Ok(if a.fail_on_regression && d.regression {
                ExitStatus::Failure
            } else {
                ExitStatus::Success
            })
        }
    }
}
