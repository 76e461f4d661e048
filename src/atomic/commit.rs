//! Several files of one folder replaced in one step: a scoring's case_results, findings,
//! judgements and summary. A folder has no rename of many files at once, so the step is
//! a journal (the write-ahead log of a database, in one file):
//!
//! 1. every new file is written under its temporary name beside its target and synced;
//!    each is checked to still be the file written (another machine's clean-up may take
//!    a file whose process id it does not know), and the folder synced;
//! 2. the journal `.pieval-commit.json` — each target with its temporary name and length,
//!    and the files to remove — is written under a temporary name, synced and renamed
//!    into place, and the folder synced. **This rename is the commit**: before it the
//!    folder holds the old files (the new ones only under temporary names, which no
//!    reader opens); after it the new files are the folder's, whatever happens next;
//! 3. the journal is applied: every file it names checked first, then the last file (the
//!    summary, which readers look for first) removed, the removals made, the files renamed
//!    in order (the summary last), the folder synced and the journal removed.
//!
//! A process killed in step 3 leaves the journal: the next pieval that reads the folder
//! (the run folder's `artifact`), lists it, writes in it ([`super::clean_stale`]) or scores
//! into it applies it again first — each step can be repeated — so a reader sees the old
//! files or the new ones, never a mix. Committing and applying hold an exclusive lock on
//! the folder (`flock` on the folder itself: nothing is created for it), so two processes
//! never apply one journal at once or write one over another. The guarantee is about
//! kills and crashes: a reader that opened the old summary before a commit and reads the
//! results after it (no lock is held while a query runs) can still pair them. The same
//! shape as the object-store commit (`src/objstore.rs`: files first, then one atomic
//! pointer).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::TempFile;
use crate::error::{Error, Result};

/// The journal's name, in the folder it commits into.
pub const JOURNAL: &str = ".pieval-commit.json";

/// The files a commit may write or remove: a scoring's (the run folder's names). A
/// journal planted in a folder received from someone else can do no more than replace
/// these with files of that same folder.
pub const COMMITTED_FILES: [&str; 6] = [
    "case_results.parquet",
    "case_results.jsonl",
    "findings.parquet",
    "judgements.parquet",
    "summary.json",
    // a guardrail run's results (src/runner/guard.rs)
    "guard_results.parquet",
];

/// A journal names a few files; anything larger was not written here.
const MAX_JOURNAL_BYTES: u64 = 1 << 20;

const VERSION: u32 = 1;

/// In debug builds (the tests'), set to a step number, the process aborts (as a kill
/// would: no destructor runs) after that step of applying its own journal — 0: the
/// journal written, nothing applied; k: k removals and renames done.
pub const CRASH_ENV: &str = "PIEVAL_TEST_CRASH_IN_COMMIT";

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Journal {
    pieval_commit: u32,
    remove: Vec<String>,
    put: Vec<Put>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Put {
    name: String,
    tmp: String,
    bytes: u64,
}

/// New files and removals of one folder, committed together by [`FolderCommit::commit`];
/// dropped uncommitted, the new files' temporary names are removed and nothing changes.
pub struct FolderCommit {
    dir: PathBuf,
    put: Vec<(String, TempFile)>,
    remove: Vec<String>,
}

impl FolderCommit {
    pub fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
            put: Vec::new(),
            remove: Vec::new(),
        }
    }

    /// Replace (or create) the file `file` was written for, which must be in this
    /// folder; its final path. Files are renamed in the order they are put (the one a
    /// reader looks for first, the summary, last).
    pub fn put(&mut self, file: TempFile) -> Result<PathBuf> {
        let name = file
            .path
            .file_name()
            .and_then(|n| n.to_str())
            .map(str::to_owned)
            .unwrap_or_default();
        let tmp_name = file
            .tmp
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if file.path.parent() != Some(self.dir.as_path())
            || file.tmp.parent() != Some(self.dir.as_path())
            || check_put(&name, tmp_name).is_err()
            || self.put.iter().any(|(n, _)| *n == name)
        {
            return Err(Error::Internal(format!(
                "{}: not a new file of {} for one commit",
                file.path.display(),
                self.dir.display()
            )));
        }
        let path = file.path.clone();
        self.put.push((name, file));
        Ok(path)
    }

    /// Put `value` as pretty JSON and a line break at `path` (a summary), as [`Self::put`].
    pub fn put_json(&mut self, path: &Path, value: &serde_json::Value) -> Result<PathBuf> {
        use std::io::Write as _;
        let text = serde_json::to_string_pretty(value)
            .map_err(|e| Error::Internal(format!("cannot encode {}: {e}", path.display())))?;
        let mut file = TempFile::create(path)?;
        file.write_all(text.as_bytes())
            .and_then(|()| file.write_all(b"\n"))
            .map_err(|e| Error::io(path, "cannot write", e))?;
        self.put(file)
    }

    /// Remove `name` from the folder (if it is there) with the commit.
    pub fn remove(&mut self, name: &str) -> Result<()> {
        check_name(name)?;
        if !self.remove.iter().any(|n| n == name) {
            self.remove.push(name.to_owned());
        }
        Ok(())
    }

    /// Sync every new file, write the journal (the commit), apply it.
    pub fn commit(self) -> Result<()> {
        let crash = if cfg!(debug_assertions) {
            std::env::var(CRASH_ENV)
                .ok()
                .and_then(|s| s.trim().parse::<usize>().ok())
        } else {
            None
        };
        self.commit_with(&mut |step| {
            if crash == Some(step) {
                std::process::abort();
            }
            false
        })
    }

    /// [`FolderCommit::commit`], asking `stop` after each step whether to stop there
    /// (as a kill would: what is done stays done, the journal stays).
    fn commit_with(self, stop: &mut dyn FnMut(usize) -> bool) -> Result<()> {
        let dir = self.dir;
        let _lock = lock(&dir)?;
        // An unfinished commit of a killed process goes first: its journal must not be
        // replaced by this one before it is applied.
        finish_locked(&dir)?;
        let mut journal = Journal {
            pieval_commit: VERSION,
            remove: self
                .remove
                .into_iter()
                .filter(|r| !self.put.iter().any(|(n, _)| n == r))
                .collect(),
            put: Vec::with_capacity(self.put.len()),
        };
        let mut files = Vec::with_capacity(self.put.len());
        for (name, mut file) in self.put {
            let bytes = file.sync()?;
            file.check_in_place()?;
            let tmp = file
                .tmp
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_owned();
            journal.put.push(Put { name, tmp, bytes });
            files.push(file);
        }
        sync_dir(&dir)?;
        let text = serde_json::to_vec_pretty(&journal)
            .map_err(|e| Error::Internal(format!("cannot encode a commit journal: {e}")))?;
        let journal_path = dir.join(JOURNAL);
        let mut file = TempFile::open(&journal_path)?;
        std::io::Write::write_all(&mut file, &text)
            .map_err(|e| Error::io(&file.tmp, "cannot write", e))?;
        file.commit()?;
        if let Err(e) = sync_dir(&dir) {
            // Not known to be durable: taken back, nothing applied (the new files go
            // with `files`). If even that fails, the journal and its files stay.
            if std::fs::remove_file(&journal_path).is_err() {
                files.into_iter().for_each(TempFile::keep);
            }
            return Err(e);
        }
        // Committed: from here the temporary files are the journal's, never removed.
        files.into_iter().for_each(TempFile::keep);
        apply(&dir, &journal, stop).map_err(|e| {
            Error::State(format!(
                "{}: the new results are committed, but not all could be put in place ({e}); \
                 the next pieval that reads the folder completes it",
                dir.display()
            ))
        })
    }
}

/// The folder's commit lock, released when dropped (the descriptor closed); `None`
/// where the file system has no lock to give.
pub(super) struct DirLock(#[allow(dead_code)] Option<std::fs::File>);

/// The lock file used where a folder itself cannot be locked (NFS emulates `flock` with
/// write locks, which a folder opened for reading cannot take).
pub const LOCK_FILE: &str = ".pieval-commit.lock";

/// Wait for the exclusive lock on `dir`: `flock` on the folder itself (nothing is
/// created, so a folder that cannot be written can still be locked and read); where the
/// file system refuses that, on [`LOCK_FILE`] in it; where that cannot be made either (a
/// read-only folder on such a file system), no lock — the journal's steps can all be
/// repeated, so two processes applying one journal at once still agree; only a reader
/// replaying a journal another process has just applied and replaced could undo a newer
/// commit's removal.
pub(super) fn lock(dir: &Path) -> Result<DirLock> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::File::open(dir).map_err(|e| Error::io(dir, "cannot open", e))?;
    let refused = match file.lock() {
        Ok(()) => return Ok(DirLock(Some(file))),
        Err(e) => e,
    };
    let unsupported = matches!(
        refused.raw_os_error(),
        Some(libc::EBADF | libc::ENOLCK | libc::EOPNOTSUPP | libc::EINVAL)
    ) || refused.kind() == std::io::ErrorKind::Unsupported;
    if !unsupported {
        return Err(Error::io(dir, "cannot lock", refused));
    }
    let path = dir.join(LOCK_FILE);
    let Ok(file) = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
    else {
        return Ok(DirLock(None));
    };
    match file.lock() {
        Ok(()) => Ok(DirLock(Some(file))),
        Err(_) => Ok(DirLock(None)),
    }
}

/// Apply the journal a killed process left in `dir`, if there is one: `true` when one
/// was applied. An error names the journal and what stops it (a read-only folder, a file
/// removed by hand): the folder's files are then neither run's until it is applied.
pub fn finish(dir: &Path) -> Result<bool> {
    if !exists(&dir.join(JOURNAL))? {
        return Ok(false);
    }
    let _lock = lock(dir)?;
    finish_locked(dir)
}

/// [`finish`], the folder's lock held.
pub(super) fn finish_locked(dir: &Path) -> Result<bool> {
    let path = dir.join(JOURNAL);
    if !exists(&path)? {
        return Ok(false);
    }
    let unfinished = |why: String| {
        Error::State(format!(
            "{}: an unfinished commit (a scoring killed while it replaced this folder's \
             results) that cannot be completed: {why}. Until it is, the folder's results \
             are not read; to keep them as they are instead, remove this file and the \
             temporary files it names",
            path.display()
        ))
    };
    let text = crate::files::read_bounded(&path, crate::files::Links::Refuse, MAX_JOURNAL_BYTES)
        .map_err(|e| unfinished(e.to_string()))?;
    let journal: Journal = serde_json::from_slice(&text)
        .map_err(|e| unfinished(format!("the journal does not parse: {e}")))?;
    check(&journal).map_err(|e| unfinished(e.to_string()))?;
    apply(dir, &journal, &mut |_| false).map_err(|e| unfinished(e.to_string()))?;
    Ok(true)
}

fn exists(path: &Path) -> Result<bool> {
    match std::fs::symlink_metadata(path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Error::io(path, "cannot read", e)),
    }
}

/// Whether `put` is still to be renamed (`true`: its temporary file is there, the length
/// recorded) or was already (`false`: its target is there at that length). Anything else
/// is an error, before the journal changes anything.
fn pending(dir: &Path, put: &Put) -> Result<bool> {
    let tmp = dir.join(&put.tmp);
    let target = dir.join(&put.name);
    match std::fs::symlink_metadata(&tmp) {
        Ok(m) if m.is_file() && m.len() == put.bytes => Ok(true),
        Ok(m) => Err(Error::State(format!(
            "{}: a {} of {} bytes, not the file of {} bytes the commit wrote",
            tmp.display(),
            if m.is_file() { "file" } else { "non-file" },
            m.len(),
            put.bytes
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let done = std::fs::symlink_metadata(&target)
                .is_ok_and(|m| m.is_file() && m.len() == put.bytes);
            if done {
                Ok(false)
            } else {
                Err(Error::State(format!(
                    "neither {} nor the {} it was written as is there",
                    target.display(),
                    tmp.display()
                )))
            }
        }
        Err(e) => Err(Error::io(&tmp, "cannot read", e)),
    }
}

/// Every file checked, then: the last file's target removed (while files change, a
/// reader that looks for the summary first finds none), the removals, the renames in
/// order, the journal removed. Every step can be done again.
fn apply(dir: &Path, journal: &Journal, stop: &mut dyn FnMut(usize) -> bool) -> Result<()> {
    let todo = journal
        .put
        .iter()
        .map(|p| pending(dir, p))
        .collect::<Result<Vec<bool>>>()?;
    let mut step = 0;
    if stop(step) {
        return Ok(());
    }
    let remove = |name: &str| {
        let path = dir.join(name);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(&path, "cannot remove", e)),
        }
    };
    let last = journal.put.last().filter(|_| todo.last() == Some(&true));
    for name in last
        .map(|p| p.name.as_str())
        .into_iter()
        .chain(journal.remove.iter().map(String::as_str))
    {
        remove(name)?;
        step += 1;
        if stop(step) {
            return Ok(());
        }
    }
    for (put, todo) in journal.put.iter().zip(todo) {
        if todo {
            let target = dir.join(&put.name);
            std::fs::rename(dir.join(&put.tmp), &target)
                .map_err(|e| Error::io(&target, "cannot replace", e))?;
        }
        step += 1;
        if stop(step) {
            return Ok(());
        }
    }
    sync_dir(dir)?;
    remove(JOURNAL)?;
    sync_dir(dir)
}

/// A journal read from disk names only the files a commit may write, each once, and
/// temporary names made for them.
fn check(journal: &Journal) -> Result<()> {
    if journal.pieval_commit != VERSION {
        return Err(Error::State(format!(
            "journal version {}, not {VERSION}",
            journal.pieval_commit
        )));
    }
    let mut names = std::collections::BTreeSet::new();
    for put in &journal.put {
        check_put(&put.name, &put.tmp)?;
        if !names.insert(put.name.as_str()) {
            return Err(Error::State(format!("{} named twice", put.name)));
        }
    }
    for name in &journal.remove {
        check_name(name)?;
        if names.contains(name.as_str()) {
            return Err(Error::State(format!("{name} both written and removed")));
        }
    }
    Ok(())
}

/// One of the files a commit may write ([`COMMITTED_FILES`]).
fn check_name(name: &str) -> Result<()> {
    if !COMMITTED_FILES.contains(&name) {
        return Err(Error::State(format!(
            "{:?}: not a file a commit writes",
            crate::text::excerpt(name, 80)
        )));
    }
    Ok(())
}

/// `tmp` is a temporary name made for `name` by [`super::temp_path`]:
/// `.NAME.PID-RANDOM.tmp`, RANDOM 16 hexadecimal digits.
fn check_put(name: &str, tmp: &str) -> Result<()> {
    check_name(name)?;
    let made_for = tmp
        .strip_prefix('.')
        .and_then(|t| t.strip_prefix(name))
        .and_then(|t| t.strip_prefix('.'))
        .and_then(|t| t.strip_suffix(".tmp"))
        .and_then(|t| t.split_once('-'))
        .is_some_and(|(pid, random)| {
            !pid.is_empty()
                && pid.bytes().all(|b| b.is_ascii_digit())
                && random.len() == 16
                && random.bytes().all(|b| b.is_ascii_hexdigit())
        });
    if !made_for {
        return Err(Error::State(format!(
            "{:?}: not a temporary name of {name}",
            crate::text::excerpt(tmp, 80)
        )));
    }
    Ok(())
}

/// Make the folder's renames durable (its entries synced).
fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(dir, "cannot sync", e))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn read(dir: &Path, name: &str) -> Option<String> {
        std::fs::read_to_string(dir.join(name)).ok()
    }

    fn new_file(dir: &Path, name: &str, text: &str) -> TempFile {
        let mut f = TempFile::create(&dir.join(name)).unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f
    }

    /// Everything but the folder's visible files.
    fn leftovers(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect();
        names.sort();
        names
    }

    /// An earlier scoring: results, judgements, summary.
    fn old_run(dir: &Path) {
        for (name, text) in [
            ("case_results.parquet", "old results"),
            ("judgements.parquet", "old verdicts"),
            ("summary.json", "old summary"),
        ] {
            std::fs::write(dir.join(name), text).unwrap();
        }
    }

    /// A new scoring's commit: new results and summary, no judgements.
    fn new_run(dir: &Path) -> FolderCommit {
        let mut c = FolderCommit::new(dir);
        c.put(new_file(dir, "case_results.parquet", "new results, longer"))
            .unwrap();
        c.put(new_file(dir, "findings.parquet", "new findings"))
            .unwrap();
        c.remove("judgements.parquet").unwrap();
        c.put(new_file(dir, "summary.json", "new summary")).unwrap();
        c
    }

    /// The earlier scoring's summary and judgements, untouched.
    fn is_old(dir: &Path) {
        assert_eq!(read(dir, "summary.json").as_deref(), Some("old summary"));
        assert_eq!(
            read(dir, "judgements.parquet").as_deref(),
            Some("old verdicts")
        );
    }

    fn is_new(dir: &Path) {
        assert_eq!(
            read(dir, "case_results.parquet").as_deref(),
            Some("new results, longer")
        );
        assert_eq!(
            read(dir, "findings.parquet").as_deref(),
            Some("new findings")
        );
        assert_eq!(read(dir, "summary.json").as_deref(), Some("new summary"));
        assert_eq!(read(dir, "judgements.parquet"), None);
        assert!(leftovers(dir).is_empty(), "{:?}", leftovers(dir));
    }

    #[test]
    fn a_commit_replaces_and_removes_together_and_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        old_run(dir.path());
        new_run(dir.path()).commit().unwrap();
        is_new(dir.path());
    }

    #[test]
    fn a_commit_dropped_before_its_journal_leaves_the_old_files() {
        let dir = tempfile::tempdir().unwrap();
        old_run(dir.path());
        drop(new_run(dir.path()));
        is_old(dir.path());
        assert_eq!(read(dir.path(), "findings.parquet"), None);
        assert!(leftovers(dir.path()).is_empty());
    }

    #[test]
    fn a_commit_killed_after_any_step_is_read_as_the_new_files() {
        // The journal (0), the summary and the judgements removed (1, 2), three renames
        // (3..=5, the summary's last); then the journal is removed.
        for kill_at in 0..=5 {
            let dir = tempfile::tempdir().unwrap();
            old_run(dir.path());
            new_run(dir.path())
                .commit_with(&mut |step| step == kill_at)
                .unwrap();
            assert!(dir.path().join(JOURNAL).exists(), "killed at {kill_at}");
            if (1..5).contains(&kill_at) {
                // What readers that do not know the journal see meanwhile: no summary.
                assert_eq!(
                    read(dir.path(), "summary.json"),
                    None,
                    "killed at {kill_at}"
                );
            }
            // The next reader applies the journal before it reads.
            assert!(finish(dir.path()).unwrap());
            is_new(dir.path());
        }
        // The next scoring, a run listing or a writer's clean-up apply it too.
        let dir = tempfile::tempdir().unwrap();
        old_run(dir.path());
        new_run(dir.path())
            .commit_with(&mut |step| step == 2)
            .unwrap();
        super::super::clean_stale(dir.path());
        is_new(dir.path());
        // A second commit over an unfinished one finishes it first.
        let dir = tempfile::tempdir().unwrap();
        old_run(dir.path());
        new_run(dir.path())
            .commit_with(&mut |step| step == 1)
            .unwrap();
        let mut again = FolderCommit::new(dir.path());
        again
            .put(new_file(dir.path(), "summary.json", "third summary"))
            .unwrap();
        again.commit().unwrap();
        assert_eq!(
            read(dir.path(), "summary.json").as_deref(),
            Some("third summary")
        );
        assert_eq!(
            read(dir.path(), "findings.parquet").as_deref(),
            Some("new findings")
        );
        assert!(leftovers(dir.path()).is_empty());
    }

    #[test]
    fn a_journal_from_a_killed_process_is_applied_not_cleaned_away() {
        let dir = tempfile::tempdir().unwrap();
        old_run(dir.path());
        // A process that is gone (its id above the kernel's pid_max) left its journal.
        let tmp = ".summary.json.4194305-00000000deadbeef.tmp";
        std::fs::write(dir.path().join(tmp), "new summary").unwrap();
        std::fs::write(
            dir.path().join(JOURNAL),
            format!(
                r#"{{"pieval_commit":1,"remove":["judgements.parquet"],"put":[{{"name":"summary.json","tmp":"{tmp}","bytes":11}}]}}"#
            ),
        )
        .unwrap();
        // A writer in the folder cleans what dead processes left: this is applied.
        TempFile::create(&dir.path().join("other.txt"))
            .unwrap()
            .commit()
            .unwrap();
        assert_eq!(
            read(dir.path(), "summary.json").as_deref(),
            Some("new summary")
        );
        assert_eq!(read(dir.path(), "judgements.parquet"), None);
        assert!(leftovers(dir.path()).is_empty());
    }

    #[test]
    fn a_planted_or_damaged_journal_is_refused_and_changes_nothing() {
        let tmp = ".summary.json.4194305-00000000deadbeef.tmp";
        let cases: Vec<(&str, String)> = vec![
            ("does not parse", "{not json".to_owned()),
            (
                "journal version",
                r#"{"pieval_commit":2,"remove":[],"put":[]}"#.to_owned(),
            ),
            (
                "not a file a commit writes",
                r#"{"pieval_commit":1,"remove":["../outside"],"put":[]}"#.to_owned(),
            ),
            (
                "not a file a commit writes",
                r#"{"pieval_commit":1,"remove":[".run.lock"],"put":[]}"#.to_owned(),
            ),
            (
                "not a file a commit writes",
                r#"{"pieval_commit":1,"remove":["manifest.json"],"put":[]}"#.to_owned(),
            ),
            (
                "not a temporary name of summary.json",
                r#"{"pieval_commit":1,"remove":[],"put":[{"name":"summary.json","tmp":".pieval-commit.json","bytes":11}]}"#.to_owned(),
            ),
            (
                "not a temporary name of summary.json",
                r#"{"pieval_commit":1,"remove":[],"put":[{"name":"summary.json","tmp":".summary.json.tmp-77-00000000deadbeef","bytes":11}]}"#.to_owned(),
            ),
            (
                // A removal before a put that does not check: nothing is removed.
                "not the file of 12 bytes",
                format!(
                    r#"{{"pieval_commit":1,"remove":["judgements.parquet"],"put":[{{"name":"summary.json","tmp":"{tmp}","bytes":12}}]}}"#
                ),
            ),
            (
                "not a file a commit writes",
                format!(
                    r#"{{"pieval_commit":1,"remove":[],"put":[{{"name":"manifest.json","tmp":"{tmp}","bytes":11}}]}}"#
                ),
            ),
            (
                "not a temporary name of summary.json",
                r#"{"pieval_commit":1,"remove":[],"put":[{"name":"summary.json","tmp":"case_results.parquet","bytes":11}]}"#.to_owned(),
            ),
            (
                "not the file of 12 bytes",
                format!(
                    r#"{{"pieval_commit":1,"remove":[],"put":[{{"name":"summary.json","tmp":"{tmp}","bytes":12}}]}}"#
                ),
            ),
            (
                "both written and removed",
                format!(
                    r#"{{"pieval_commit":1,"remove":["summary.json"],"put":[{{"name":"summary.json","tmp":"{tmp}","bytes":11}}]}}"#
                ),
            ),
            (
                "unknown field",
                r#"{"pieval_commit":1,"remove":[],"put":[],"exec":"rm -rf /"}"#.to_owned(),
            ),
        ];
        for (expected, journal) in cases {
            let dir = tempfile::tempdir().unwrap();
            old_run(dir.path());
            std::fs::write(dir.path().join(tmp), "new summary").unwrap();
            std::fs::write(dir.path().join(JOURNAL), &journal).unwrap();
            let err = finish(dir.path()).unwrap_err().to_string();
            assert!(
                err.contains(".pieval-commit.json: an unfinished commit") && err.contains(expected),
                "{journal}: {err}"
            );
            is_old(dir.path());
            // Nor does a writer's clean-up remove the files it names.
            super::super::clean_stale(dir.path());
            assert!(dir.path().join(tmp).exists());
        }
        // A journal that is a symbolic link, or whose temporary file is one, is refused.
        #[cfg(unix)]
        {
            let dir = tempfile::tempdir().unwrap();
            old_run(dir.path());
            let outside = tempfile::NamedTempFile::new().unwrap();
            std::fs::write(outside.path(), "secret text").unwrap();
            std::os::unix::fs::symlink(outside.path(), dir.path().join(tmp)).unwrap();
            std::fs::write(
                dir.path().join(JOURNAL),
                format!(
                    r#"{{"pieval_commit":1,"remove":[],"put":[{{"name":"summary.json","tmp":"{tmp}","bytes":11}}]}}"#
                ),
            )
            .unwrap();
            let err = finish(dir.path()).unwrap_err().to_string();
            assert!(err.contains("non-file"), "{err}");
            assert_eq!(
                read(dir.path(), "summary.json").as_deref(),
                Some("old summary")
            );
            std::fs::remove_file(dir.path().join(JOURNAL)).unwrap();
            std::os::unix::fs::symlink(outside.path(), dir.path().join(JOURNAL)).unwrap();
            assert!(finish(dir.path()).is_err());
        }
    }

    #[test]
    fn only_new_files_of_the_folder_can_be_put() {
        let dir = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        let mut c = FolderCommit::new(dir.path());
        assert!(c.put(new_file(other.path(), "summary.json", "x")).is_err());
        c.put(new_file(dir.path(), "summary.json", "x")).unwrap();
        assert!(c.put(new_file(dir.path(), "summary.json", "y")).is_err());
        assert!(c.remove("../x").is_err());
        assert!(c.remove(JOURNAL).is_err());
    }
}
