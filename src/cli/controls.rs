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
    /// Also write the controls as JUnit XML (a test case per control and group; the
    /// statuses of --fail-on, `fail` without it, are failures): what CI systems show.
    #[arg(long, value_name = "FILE")]
    junit: Option<PathBuf>,
    /// Also write SARIF 2.1.0: one result per successful attack, rule ids = attack
    /// families, the taxonomy's OWASP / MITRE ATLAS references as properties (code
    /// scanning dashboards read it).
    #[arg(long, value_name = "FILE")]
    sarif: Option<PathBuf>,
    /// The taxonomy whose framework references the SARIF carries.
    #[arg(long, default_value = crate::cli::paths::TAXONOMY)]
    taxonomy: PathBuf,
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
    if let Some(path) = &args.junit {
        let fail_on = if args.fail_on.is_empty() {
            vec![Status::Fail]
        } else {
            args.fail_on.clone()
        };
        let xml = crate::evidence::ci::junit(&report, &fail_on);
        crate::atomic::create_parent(path)?;
        crate::atomic::write_lines(path, std::iter::once(xml.trim_end().to_owned()))?;
    }
    if let Some(path) = &args.sarif {
        let taxonomy = args
            .taxonomy
            .exists()
            .then(|| crate::taxonomy::Taxonomy::load(&args.taxonomy))
            .transpose()?;
        let sarif = crate::evidence::ci::sarif(&dir, &report, taxonomy.as_ref())?;
        let text = serde_json::to_string_pretty(&sarif)
            .map_err(|e| crate::error::Error::Internal(format!("cannot encode SARIF: {e}")))?;
        crate::atomic::create_parent(path)?;
        crate::atomic::write_lines(path, std::iter::once(text))?;
    }
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
                    match r.framework_tags.label() {
                        l if l.is_empty() => "–".into(),
                        l => l,
                    },
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
                "frameworks",
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
