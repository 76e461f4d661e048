//! Writing files so that a failure never leaves a half-written artifact: everything is
//! written to a temporary name in the same folder, synced, then renamed over the target.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The temporary name used while `path` is being written.
pub fn temp_path(path: &Path) -> Result<PathBuf> {
    let file_name = path
        .file_name()
        .ok_or_else(|| Error::Usage(format!("{}: not a file path", path.display())))?;
    Ok(path.with_file_name(format!(
        ".{}.{}.tmp",
        file_name.to_string_lossy(),
        std::process::id()
    )))
}

/// Write lines (each followed by a newline) to `path` atomically.
pub fn write_lines(path: &Path, lines: impl IntoIterator<Item = String>) -> Result<()> {
    write_with(path, |push| {
        for line in lines {
            push(&line)?;
        }
        Ok(())
    })
}

/// Write `path` atomically from a producer that pushes lines (each gets a newline) and
/// may fail: on failure nothing is left behind.
pub fn write_with(
    path: &Path,
    produce: impl FnOnce(&mut dyn FnMut(&str) -> Result<()>) -> Result<()>,
) -> Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, "cannot create folder", e))?;
    let tmp = temp_path(path)?;
    let result = (|| {
        let f = std::fs::File::create(&tmp).map_err(|e| Error::io(&tmp, "cannot create", e))?;
        let mut w = std::io::BufWriter::new(f);
        produce(&mut |line: &str| {
            w.write_all(line.as_bytes())
                .and_then(|_| w.write_all(b"\n"))
                .map_err(|e| Error::io(&tmp, "cannot write", e))
        })?;
        let f = w
            .into_inner()
            .map_err(|e| Error::io(&tmp, "cannot write", e.into_error()))?;
        f.sync_all()
            .map_err(|e| Error::io(&tmp, "cannot sync", e))?;
        std::fs::rename(&tmp, path).map_err(|e| Error::io(path, "cannot replace", e))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
