//! sha256, the one digest pieval records (corpus, config, predictions, evidence,
//! envelopes, models), as lowercase hex.

use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::files::Links;

/// Lowercase hex sha256 of bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// sha256 of a whole regular file, streamed (a FIFO or a device is an error, not a
/// read that never ends).
pub fn sha256_file(path: &Path) -> Result<String> {
    sha256_file_in(path, Links::Follow)
}

/// [`sha256_file`] of a file in a folder that may come from someone else: with
/// [`Links::Refuse`], a symbolic link is an error.
pub fn sha256_file_in(path: &Path, links: Links) -> Result<String> {
    sha256_reader(crate::files::open_regular(path, links)?, path)
}

/// sha256 of everything `f` reads, streamed; `path` names it in errors.
pub fn sha256_reader(f: impl Read, path: &Path) -> Result<String> {
    Ok(sha256_streamed(f, path, |_| Ok(()))?.0)
}

/// sha256 and length of everything `f` reads, streamed, each chunk handed to `chunk` as
/// it is hashed (to copy what was hashed, in one read); `path` names it in errors.
pub fn sha256_streamed(
    mut f: impl Read,
    path: &Path,
    mut chunk: impl FnMut(&[u8]) -> Result<()>,
) -> Result<(String, u64)> {
    let mut running = Running::default();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| Error::io(path, "cannot read", e))?;
        if n == 0 {
            break;
        }
        running.update(&buf[..n]);
        chunk(&buf[..n])?;
    }
    Ok(running.finish())
}

/// sha256 and length of bytes given in order, as they are written (a file hashed while it
/// is written is not read again).
#[derive(Clone, Default)]
pub struct Running {
    hasher: Sha256,
    bytes: u64,
}

impl Running {
    pub fn update(&mut self, bytes: &[u8]) {
        self.hasher.update(bytes);
        self.bytes += bytes.len() as u64;
    }

    /// The hex digest and the length.
    pub fn finish(self) -> (String, u64) {
        (hex::encode(self.hasher.finalize()), self.bytes)
    }
}
