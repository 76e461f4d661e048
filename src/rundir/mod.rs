//! The run folder on disk, owned in one place: its file names, run ids and their checks,
//! the typed [`Manifest`], and the checkpoint (`predictions.jsonl`). Everything above
//! (`runner`, `engine`, `evidence`, `export`, `cli`) reads a run through this module.
//!
//! A run lives in `<output_dir>/<run_id>/`:
//! - `manifest.json` — written (atomically) when the run starts with `status: running`,
//!   rewritten at the end with `completed` (or `interrupted`, `failed`);
//! - `cases.jsonl` — the selected cases, enriched, exactly as scored;
//! - `predictions.jsonl` — the checkpoint: one line per finished case, appended as each
//!   case finishes (a multi-turn attempt's turns on lines of their own just before it), so
//!   a killed run loses no finished case; `--resume` repairs a torn tail
//!   ([`checkpoint::read_checkpoint`]);
//! - `turns.parquet` — a multi-turn strategy's transcripts, one row per turn, and an
//!   agent's, one row per model answer (from the checkpoint, when the run is scored);
//! - `tool_calls.parquet` — an agent's tool calls with their results, one row per call;
//! - `case_results.{jsonl,parquet}`, `findings.parquet`, `summary.json`,
//!   `judgements.parquet` — from the scoring engine;
//! - `source_scores.parquet` — an imported run's: every score the source tool gave;
//! - `controls/` — controls and their envelopes (`pieval controls`).
//!
//! The folder holding runs also holds `catalog.sqlite` (the run catalogue).

pub mod bounds;
pub mod checkpoint;
pub mod manifest;
pub mod reviews;
pub mod summary;

use std::path::Path;

pub use checkpoint::{PredictionRecord, TurnRecord, read_checkpoint, read_checkpoint_with};
pub use manifest::{Manifest, ModelSpeed, Rate, RunResults, RunStatus};

use crate::error::{Error, Result};

pub const MANIFEST_FILE: &str = "manifest.json";
pub const CASES_FILE: &str = "cases.jsonl";
pub const PREDICTIONS_FILE: &str = "predictions.jsonl";
pub const CASE_RESULTS_JSONL: &str = "case_results.jsonl";
pub const CASE_RESULTS_PARQUET: &str = "case_results.parquet";
pub const FINDINGS_FILE: &str = "findings.parquet";
pub const SUMMARY_FILE: &str = "summary.json";
pub const JUDGEMENTS_FILE: &str = "judgements.parquet";
/// Multi-turn strategies: one row per turn.
pub const TURNS_FILE: &str = "turns.parquet";
/// Agents: one row per tool call.
pub const TOOL_CALLS_FILE: &str = "tool_calls.parquet";
/// Imported runs (`pieval import`): every score the source tool gave.
pub const SOURCE_SCORES_FILE: &str = "source_scores.parquet";
pub const CONTROLS_DIR: &str = "controls";
/// The run's HTML report (`pieval report`, written by `pieval run`).
pub const REPORT_FILE: &str = "report.html";
/// In the folder that holds the runs.
pub const CATALOG_FILE: &str = "catalog.sqlite";

/// `dir/name` when it is a regular file, `None` when it is absent. A run folder may come
/// from someone else, so a symbolic link in it (or its name being a link, a folder, a
/// device) is an error, never followed: a planted `manifest.json -> ~/.aws/credentials`
/// must not be read, hashed into evidence or exported.
///
/// A scoring killed while it replaced the folder's results left a journal: it is
/// applied first ([`crate::atomic::finish_commit`]), so what is read is one scoring's.
pub fn artifact(dir: &Path, name: &str) -> Result<Option<std::path::PathBuf>> {
    crate::atomic::finish_commit(dir)?;
    // Every component of `name` (`controls/controls.parquet`) is checked, not only the last.
    let mut path = dir.to_path_buf();
    let mut meta = None;
    for part in Path::new(name).components() {
        let std::path::Component::Normal(part) = part else {
            return Err(Error::Internal(format!(
                "{name}: not a plain relative name"
            )));
        };
        path.push(part);
        let m = match std::fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io(&path, "cannot read", e)),
        };
        if m.file_type().is_symlink() {
            return Err(Error::State(format!(
                "{}: a symbolic link in a run folder is not followed (a run folder may come from someone else)",
                path.display()
            )));
        }
        meta = Some(m);
    }
    let Some(meta) = meta else {
        return Ok(None);
    };
    if !meta.is_file() {
        return Err(Error::State(format!(
            "{}: not a regular file",
            path.display()
        )));
    }
    Ok(Some(path))
}

/// The whole of `dir/name`, at most `max` bytes, when it is a regular file; `None` when
/// it is absent. Links anywhere on the way are errors ([`artifact`]), and the file is
/// opened without following one ([`crate::files`]), so a FIFO, `/dev/zero` or a link
/// swapped in after the check is an error, never a read that does not end.
pub fn read_artifact(dir: &Path, name: &str, max: u64) -> Result<Option<Vec<u8>>> {
    let Some(path) = artifact(dir, name)? else {
        return Ok(None);
    };
    crate::files::read_bounded(&path, crate::files::Links::Refuse, max).map(Some)
}

/// The path DataFusion is given to read a checked artifact: absolute (so a relative name
/// such as `file:x` is not taken for a URL) and free of the characters it reads as a
/// pattern or a URL part (`*?[]{}#%`), so the file read is the file checked.
pub fn table_path(path: &Path) -> Result<String> {
    let abs = std::fs::canonicalize(path).map_err(|e| Error::io(path, "cannot resolve", e))?;
    let text = abs
        .to_str()
        .ok_or_else(|| Error::Usage(format!("{}: not a UTF-8 path", path.display())))?;
    if text.contains(['*', '?', '[', ']', '{', '}', '#', '%']) {
        return Err(Error::Usage(format!(
            "{}: a folder or file name with one of * ? [ ] {{ }} # % cannot be read safely (DataFusion reads them as a pattern); rename it",
            path.display()
        )));
    }
    Ok(text.to_owned())
}

/// A run folder: a real folder, not a symbolic link to one.
pub fn is_run_folder(dir: &Path) -> bool {
    std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir())
}

/// A run's Parquet artifact, checked readable (its footer and metadata parse, its chunks
/// lie inside it) and within the decoding bounds ([`bounds::check_parquet`]) before a
/// query scans it: a truncated file or a decompression bomb is an error naming it, not a
/// panic or an abort mid-query.
pub fn parquet_artifact(dir: &Path, name: &str) -> Result<Option<std::path::PathBuf>> {
    let Some(path) = artifact(dir, name)? else {
        return Ok(None);
    };
    bounds::check_parquet(&path, &bounds::ParquetLimits::from_env()?)?;
    Ok(Some(path))
}

/// `.run.lock` in a run folder while a process runs or resumes it: two `--resume` of one
/// run would both call the model for the same cases. The lock holds the owner's process
/// id; a lock whose process is gone (a kill) is taken over. Removed when dropped.
pub struct RunLock(std::path::PathBuf);

pub const LOCK_FILE: &str = ".run.lock";

impl RunLock {
    pub fn take(dir: &Path) -> Result<RunLock> {
        use std::io::Write;
        let path = dir.join(LOCK_FILE);
        for _ in 0..2 {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(mut f) => {
                    let _ = writeln!(f, "{}", std::process::id());
                    return Ok(RunLock(path));
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    // A regular file of a few bytes, never through a link: a lock planted
                    // as a FIFO or a link to /dev/zero is no owner, and is taken over.
                    let owner =
                        crate::files::read_text_bounded(&path, crate::files::Links::Refuse, 64)
                            .unwrap_or_default();
                    let owner = owner.trim();
                    let alive = owner.parse::<u32>().is_ok_and(|pid| {
                        !Path::new("/proc/self").exists()
                            || Path::new(&format!("/proc/{pid}")).exists()
                    });
                    if alive {
                        return Err(Error::State(format!(
                            "{} is being run by process {} (its {LOCK_FILE}); wait for it, or remove the file if that process is gone",
                            dir.display(),
                            crate::text::excerpt(owner, 20)
                        )));
                    }
                    // Left by a killed process: take it over.
                    let _ = std::fs::remove_file(&path);
                }
                Err(e) => return Err(Error::io(&path, "cannot create the run lock", e)),
            }
        }
        Err(Error::State(format!(
            "{}: cannot take the run lock",
            dir.display()
        )))
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A run id usable as a folder name: no separators, no `..`, no hidden names.
pub fn check_run_id(id: &str) -> Result<()> {
    let ok = (1..=128).contains(&id.len())
        && id.as_bytes()[0].is_ascii_alphanumeric()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && !id.contains("..");
    if ok {
        Ok(())
    } else {
        Err(Error::Usage(format!(
            "run id {:?} is not allowed: use letters, digits, '.', '_' and '-' (starting with a letter or digit, no '..', at most 128 characters)",
            crate::text::excerpt(id, 60)
        )))
    }
}

/// `{name}-{UTC time}-{4 hex}`, with the name reduced to run-id characters.
pub fn new_run_id(name: &str) -> Result<String> {
    let mut clean: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .take(64)
        .collect();
    clean = clean
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .replace("..", "-");
    if clean.is_empty() {
        clean = "run".into();
    }
    let id = format!(
        "{clean}-{}-{:04x}",
        crate::text::utc_compact_now(),
        fastrand::u16(..)
    );
    check_run_id(&id)?;
    Ok(id)
}

/// A run folder's manifest, or `None` for a folder without one (made by `pieval score`),
/// and its run id: the manifest's, else the folder name.
pub fn manifest_and_id(dir: &Path) -> Result<(Option<Manifest>, String)> {
    let manifest = match artifact(dir, MANIFEST_FILE)? {
        Some(_) => Some(Manifest::read(dir)?),
        None => None,
    };
    let id = match &manifest {
        Some(m) => m.run_id.clone(),
        None => dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
    };
    Ok((manifest, id))
}
