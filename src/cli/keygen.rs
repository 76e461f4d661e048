//! `pieval keygen --output KEY`: an Ed25519 key pair for signing control envelopes.

use crate::cli::ExitStatus;
use std::path::PathBuf;

use crate::cli::output;
use crate::error::Result;
use crate::evidence::dsse::{generate_key, key_id, public_key_path, write_key_pair};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The private key file (PKCS#8 PEM, mode 0600); the public key goes to KEY.pub
    /// (SPKI PEM). Existing files are never overwritten.
    #[arg(long, short)]
    output: PathBuf,
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Result<ExitStatus> {
    let key = generate_key()?;
    write_key_pair(&args.output, &key)?;
    let id = key_id(&key.verifying_key());
    let public = public_key_path(&args.output);
    if args.json {
        output::json(&serde_json::json!({
            "private_key": args.output,
            "public_key": public,
            "key_id": id,
        }))?;
    } else {
        output::stdout_line(&format!(
            "private key {} (keep it secret)\npublic key  {}\nkey id      {id}",
            args.output.display(),
            public.display()
        ))?;
    }
    Ok(ExitStatus::Success)
}
