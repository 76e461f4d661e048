//! `pieval verify ENVELOPE... [--public-key KEY] [--run-dir DIR]`.

use std::path::PathBuf;

use crate::cli::output;
use crate::error::Result;
use crate::evidence::dsse::read_verifying_key;
use crate::evidence::verify::{SignatureVerdict, verify_envelope};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Envelope files (results/<run>/controls/envelopes/<control>.json).
    #[arg(required = true)]
    envelopes: Vec<PathBuf>,
    /// The signer's public key (KEY.pub from `pieval keygen`). Without it only the
    /// subject digests are checked.
    #[arg(long)]
    public_key: Option<PathBuf>,
    /// Where the subjects are (default: the run folder the envelope is in).
    #[arg(long)]
    run_dir: Option<PathBuf>,
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Result<u8> {
    let key = args
        .public_key
        .as_deref()
        .map(read_verifying_key)
        .transpose()?;
    let mut reports = Vec::with_capacity(args.envelopes.len());
    for path in &args.envelopes {
        reports.push(verify_envelope(
            path,
            key.as_ref(),
            args.run_dir.as_deref(),
        )?);
    }
    let ok = reports.iter().all(|r| r.ok);
    if args.json {
        output::json(&reports)?;
    } else {
        let mut lines = Vec::new();
        for r in &reports {
            let what = format!(
                "{} ({} {})",
                r.envelope.display(),
                crate::text::excerpt(r.control_id.as_deref().unwrap_or("?"), 80),
                crate::text::excerpt(r.status.as_deref().unwrap_or("?"), 40)
            );
            if r.ok {
                let sig = match &r.signature {
                    SignatureVerdict::Valid(id) => format!("signature valid (key {id})"),
                    _ => "signature not checked (no --public-key)".to_owned(),
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
    Ok(if ok { 0 } else { 1 })
}
