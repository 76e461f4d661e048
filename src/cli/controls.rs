//! `pieval controls RUN [--catalog DIR] [--sign-key KEY] [--fail-on STATUS,...]`.

use crate::cli::ExitStatus;
use std::path::{Path, PathBuf};

use crate::cli::output;
use crate::cli::run::run_dir;
use crate::error::Result;
use crate::evidence::controls::{Status, run_controls};
use crate::evidence::definitions::{builtin_catalog, load_catalog};
use crate::evidence::dsse::read_signing_key;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// A run id under --results, or a run folder.
    run: String,
    /// The control catalogue folder (*.sql). Default: queries/controls when it exists,
    /// else the catalogue compiled into pieval.
    #[arg(long)]
    catalog: Option<PathBuf>,
    /// Ed25519 private key (PKCS#8 PEM, from `pieval keygen`) to sign the envelopes;
    /// without it they are written unsigned ("signatures": []).
    #[arg(long)]
    sign_key: Option<PathBuf>,
    /// Exit 1 when any control ends in one of these statuses (comma-separated), e.g.
    /// `--fail-on fail` for a release gate, `--fail-on fail,needs_review` for a stricter one.
    #[arg(long, value_delimiter = ',', value_parser = super::choice_with_help(&Status::ALL, Status::as_str, Status::help))]
    fail_on: Vec<Status>,
    #[arg(long, default_value = "results")]
    results: PathBuf,
    #[arg(long)]
    json: bool,
}

fn value(v: Option<f64>, count: bool) -> String {
    match v {
        None => "–".into(),
        Some(x) if count => format!("{x:.0}"),
        Some(x) => format!("{:.1}%", x * 100.0),
    }
}

pub fn run(args: Args) -> Result<ExitStatus> {
    let dir = run_dir(&args.run, &args.results)?;
    let catalog = match &args.catalog {
        Some(d) => load_catalog(d)?,
        None if Path::new("queries/controls").is_dir() => {
            load_catalog(Path::new("queries/controls"))?
        }
        None => builtin_catalog()?,
    };
    let key = args.sign_key.as_deref().map(read_signing_key).transpose()?;
    let report = run_controls(&dir, &catalog, key.as_ref())?;
    let failing = report
        .controls
        .iter()
        .any(|c| args.fail_on.contains(&c.result.status));
    if args.json {
        output::json(&report)?;
    } else {
        let rows: Vec<Vec<String>> = report
            .controls
            .iter()
            .map(|c| {
                let count = c.control.statistic == crate::evidence::definitions::Statistic::Count;
                let r = &c.result;
                vec![
                    c.control.id.clone(),
                    r.status.as_str().to_owned(),
                    format!(
                        "{}{}",
                        value(r.measured, count),
                        r.group_key
                            .as_deref()
                            .map(|g| format!(" ({g})"))
                            .unwrap_or_default()
                    ),
                    format!(
                        "{} {}",
                        c.control.comparator.as_str(),
                        value(Some(c.control.threshold), count)
                    ),
                    format!("{}/{}", r.k, r.n),
                    match (r.ci_low, r.ci_high) {
                        (Some(lo), Some(hi)) => format!("{:.1}–{:.1}%", lo * 100.0, hi * 100.0),
                        _ => "–".into(),
                    },
                    c.evidence_rows.to_string(),
                ]
            })
            .collect();
        let mut text = output::table(
            &[
                "control",
                "status",
                "measured",
                "threshold",
                "k/n",
                "Wilson 95%",
                "evidence rows",
            ],
            &rows,
        );
        let counts: Vec<String> = [
            Status::Pass,
            Status::Fail,
            Status::InsufficientData,
            Status::NeedsReview,
        ]
        .iter()
        .map(|s| format!("{} {}", report.count(*s), s.as_str()))
        .collect();
        text.push_str(&format!(
            "\n{} control(s): {}\n",
            report.controls.len(),
            counts.join(", ")
        ));
        text.push_str(&match &report.key_id {
            Some(id) => format!("envelopes signed with Ed25519 key {id}\n"),
            None => "envelopes unsigned (give --sign-key to sign them)\n".to_owned(),
        });
        text.push_str(&format!("artifacts: {}", report.dir.display()));
        output::stdout_line(&text)?;
    }
    Ok(if failing {
        ExitStatus::Failure
    } else {
        ExitStatus::Success
    })
}
