//! `pieval verify ENVELOPE... [--public-key KEY] [--run-dir DIR]`.

use crate::cli::ExitStatus;
use std::path::PathBuf;

use crate::cli::output;
use crate::error::Result;
use crate::evidence::verify::{SignatureVerdict, verify_all};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Envelope files (results/<run>/controls/envelopes/<control>.json).
    #[arg(required = true)]
    envelopes: Vec<PathBuf>,
    /// The signer's public key (KEY.pub from `pieval keygen`). Without it nothing is
    /// authenticated: the check fails unless --digest-only says that is what you want.
    #[arg(long)]
    public_key: Option<PathBuf>,
    /// Check only that the files match the digests the envelopes state, without a key:
    /// anyone could have written such an envelope, so this proves integrity against
    /// accidents, not who made the evidence.
    #[arg(long, conflicts_with = "public_key")]
    digest_only: bool,
    /// Where the subjects are (default: the run folder the envelope is in).
    #[arg(long)]
    run_dir: Option<PathBuf>,
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Result<ExitStatus> {
    let (ok, reports) = verify_all(
        &args.envelopes,
        args.public_key.as_deref(),
        args.run_dir.as_deref(),
        args.digest_only,
    )?;
    let authenticated = args.public_key.is_some();
    if args.json {
        output::json(&reports)?;
    } else {
        let mut lines = Vec::new();
        for r in &reports {
            let what = if r.index {
                format!("{} (index of the controls folder)", r.envelope.display())
            } else {
                format!(
                    "{} ({} {})",
                    r.envelope.display(),
                    crate::text::excerpt(r.control_id.as_deref().unwrap_or("?"), 80),
                    crate::text::excerpt(r.status.as_deref().unwrap_or("?"), 40)
                )
            };
            if r.ok && !authenticated && !args.digest_only {
                lines.push(format!(
                    "FAIL  {what}: not authenticated: give --public-key KEY (or --digest-only to check the {} digest(s) alone, which anyone could have written)",
                    r.subjects.len()
                ));
            } else if r.ok {
                let sig = match &r.signature {
                    SignatureVerdict::Valid(id) => format!("signature valid (key {id})"),
                    _ => "NOT AUTHENTICATED (--digest-only: the signature was not checked)"
                        .to_owned(),
                };
                lines.push(format!(
                    "OK    {what}: {sig}; {} subject(s) match",
                    r.subjects.len()
                ));
            } else {
                lines.push(format!("FAIL  {what}: {}", r.problems().join("; ")));
            }
        }
        output::stdout_line(&lines.join("\n"))?;
    }
    Ok(if ok {
        ExitStatus::Success
    } else {
        ExitStatus::Failure
    })
}
