//! A SQLite database another tool wrote — promptfoo's `promptfoo.db`, PyRIT's memory —
//! read as SQLite itself sees it, never written, and only as far as it is expected.
//!
//! **One moment, every committed row.** promptfoo keeps its database in WAL mode: rows it
//! committed may still be in `promptfoo.db-wal`, and the main file alone is an older
//! database (or none at all). pieval reads a snapshot made by SQLite's online backup in
//! one read transaction — every row committed before it began, nothing after, never a mix
//! of two moments — and reads that snapshot (a file of its own, in a scratch folder beside
//! the run being written), so the tool is held up for the copy only:
//!
//! - a WAL database with its `-wal` and `-shm` (a connection may be open: the tool still
//!   running) is read through SQLite's own locks: opened read-only, in place;
//! - any other WAL database, or a database beside a `-journal` (the files of a closed,
//!   crashed or copied connection; nothing can be writing without the `-shm`), is copied
//!   with its `-wal` or `-journal` (refused if they change meanwhile) and recovered in
//!   the copy, as SQLite would recover it (opened in place, SQLite would make a `-wal`
//!   and a `-shm` beside it);
//! - a database in rollback mode without a journal is read in place, read-only, under
//!   SQLite's shared lock.
//!
//! Nothing is created beside the source in any of these: no journal, no `-shm` (a `-shm`
//! that exists is used for its locks, as every reader of a WAL database uses it). The
//! manifest's digest is of the snapshot pieval read ([`Snapshot`]), with the files found
//! beside it.
//!
//! **Bounded work.** A database received from someone else may hold a view, a trigger,
//! a virtual table or a computed column under a table's name (a recursive view never
//! ends), values of gigabytes, or millions of rows. A table is read only when it is a
//! plain table with the columns the importer reads stored, not computed
//! ([`Database::expect_table`]); no value longer than `--max-line-bytes` is read (SQLite's
//! length limit); schema code cannot call functions with side effects (`trusted_schema`
//! off, defensive mode); and every query runs under a bound of SQLite's work proportional
//! to the database's size, past which it stops with an error naming the file and table.
//! The importers read each table in one pass, so the work they need grows with the file.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use rusqlite::{Connection, OpenFlags};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The first bytes of every SQLite database file.
const MAGIC: &[u8; 16] = b"SQLite format 3\0";

/// What pieval read of a database: the snapshot, and the files it was made from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// How it was made: `online backup` (read in place through SQLite's locks: the
    /// tool may have been writing), `recovered copy` (the files of a closed or crashed
    /// connection, copied and recovered), `in place` (a database without WAL or journal).
    pub how: String,
    /// The snapshot's size and SHA-256 (what was read).
    pub bytes: u64,
    pub sha256: String,
    /// The files found: the database and its `-wal` or `-journal`, with their sizes,
    /// and their digests when they were copied whole (a file being written has none).
    pub files: Vec<FoundFile>,
}

/// A file of a database as it was found.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FoundFile {
    pub path: String,
    pub bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// When it was last written, as found (what tells a change; not recorded).
    #[serde(skip)]
    pub modified: Option<std::time::SystemTime>,
}

/// Whether `path` is a SQLite database (its first bytes), or a `-wal`, `-shm` or
/// `-journal` file beside one: files whose digest is the snapshot's ([`Snapshot`]).
pub fn is_database_or_beside_one(path: &Path) -> bool {
    if is_database(path) {
        return true;
    }
    let name = path.to_string_lossy();
    ["-wal", "-shm", "-journal"].iter().any(|s| {
        name.strip_suffix(s)
            .is_some_and(|main| is_database(Path::new(main)))
    })
}

fn is_database(path: &Path) -> bool {
    use std::io::Read;
    let Ok(f) = crate::files::open_regular(path, crate::files::Links::Refuse) else {
        return false;
    };
    let mut head = [0u8; 16];
    f.take(16).read_exact(&mut head).is_ok() && &head == MAGIC
}

/// A database opened for an import: the snapshot, read-only, under the bounds.
pub struct Database {
    conn: Connection,
    /// The source file (errors name it).
    path: PathBuf,
    pub snapshot: Snapshot,
    work: Arc<Work>,
    /// The snapshot's file, removed when the database is dropped.
    file: PathBuf,
}

/// The work bound of one database: SQLite's steps counted by its progress handler.
struct Work {
    /// Steps so far, in units of [`STEPS_PER_CALL`].
    calls: AtomicU64,
    /// The most calls allowed, and the steps between two.
    budget: u64,
    per_call: u64,
    /// The most steps allowed (what the budget is in calls).
    steps: u64,
    /// The handler stopped a query.
    stopped: AtomicBool,
    /// The table being read (for the error).
    table: std::sync::Mutex<String>,
}

impl Work {
    fn new(steps: u64) -> Arc<Work> {
        let per_call = STEPS_PER_CALL.min(steps.max(1));
        Arc::new(Work {
            calls: AtomicU64::new(0),
            budget: steps.div_ceil(per_call),
            per_call,
            steps,
            stopped: AtomicBool::new(false),
            table: std::sync::Mutex::new(String::new()),
        })
    }

    /// Stop every query of `conn` past the bound.
    fn watch(self: &Arc<Self>, conn: &Connection) {
        let w = Arc::clone(self);
        conn.progress_handler(
            self.per_call as i32,
            Some(move || {
                let n = w.calls.fetch_add(1, Ordering::Relaxed) + 1;
                if n > w.budget {
                    w.stopped.store(true, Ordering::Relaxed);
                    true
                } else {
                    false
                }
            }),
        );
    }
}

/// SQLite's virtual-machine steps between two calls of the progress handler.
const STEPS_PER_CALL: u64 = 10_000;
/// The work allowed for a database of `bytes`: the steps a single pass over its tables,
/// sorted, takes many times over (a pass takes well under a thousand steps per row, a row
/// of these tools holds at least tens of bytes), and a floor for small files.
fn budget_steps(bytes: u64) -> u64 {
    let steps = 200_000_000u64.saturating_add(bytes.saturating_mul(2_000));
    #[cfg(debug_assertions)]
    if let Some(n) = std::env::var("PIEVAL_TEST_SQLITE_STEPS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    {
        return n;
    }
    steps
}

impl Database {
    /// Open `path` for reading: a snapshot in `scratch` (a folder of pieval's own), its
    /// values at most `max_value_bytes` each.
    pub fn open(path: &Path, scratch: &Path, max_value_bytes: usize) -> Result<Database> {
        let header = read_header(path)?;
        let wal_mode = header[18] == 2 && header[19] == 2;
        let beside = |suffix: &str| -> Result<Option<PathBuf>> {
            let p = PathBuf::from(format!("{}{suffix}", path.display()));
            match std::fs::symlink_metadata(&p) {
                Ok(m) if m.file_type().is_symlink() => Err(Error::State(format!(
                    "{}: a symbolic link beside the database is not followed (the folder may come from someone else)",
                    p.display()
                ))),
                Ok(m) if !m.is_file() => Err(Error::State(format!(
                    "{}: not a regular file beside the database",
                    p.display()
                ))),
                Ok(_) => Ok(Some(p)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(Error::io(&p, "cannot read", e)),
            }
        };
        let (wal, shm, journal) = (beside("-wal")?, beside("-shm")?, beside("-journal")?);
        let n = fastrand::u64(..);
        let file = scratch.join(format!("snapshot-{n:016x}.db"));
        let mut dst = Connection::open(&file)
            .map_err(|e| Error::io(&file, "cannot create", std::io::Error::other(e)))?;
        let cannot = |e: rusqlite::Error| {
            Error::input(
                path,
                0,
                None,
                format!("cannot read as a SQLite database (corrupt, or not one?): {e}"),
            )
        };
        // A connection's files copied and recovered in the copy (SQLite replays the WAL
        // or rolls the journal back there): for files nothing is writing.
        let recovered = |dst: &mut Connection,
                         side: Option<(&Path, &str)>|
         -> Result<Vec<FoundFile>> {
            let dir = scratch.join(format!("copy-{n:016x}"));
            std::fs::create_dir(&dir).map_err(|e| Error::io(&dir, "cannot create folder", e))?;
            let copy = dir.join("source.db");
            let mut files = vec![copy_whole(path, &copy)?];
            if let Some((s, suffix)) = side {
                files.push(copy_whole(s, &dir.join(format!("source.db{suffix}")))?);
            }
            // Nothing changed while both were copied: the two are of one moment.
            if stamp(path)? != (files[0].bytes, files[0].modified) {
                return Err(changed(path));
            }
            let src = Connection::open_with_flags(
                &copy,
                OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )
            .map_err(cannot)?;
            harden(&src).map_err(cannot)?;
            backup(&src, dst).map_err(cannot)?;
            drop(src);
            let _ = std::fs::remove_dir_all(&dir);
            Ok(files)
        };
        let (how, files) = if wal_mode
            && let (Some(w), Some(s)) = (&wal, &shm)
            && shm_in_use(s)
        {
            // A connection is open (the tool still running): read in place, through
            // SQLite's locks (its -shm, which that connection keeps), as every reader of a
            // WAL database reads.
            let src = open_source(path, "mode=ro").map_err(cannot)?;
            backup(&src, &mut dst).map_err(cannot)?;
            ("online backup", vec![found(path, None)?, found(w, None)?])
        } else if wal_mode {
            // A WAL database no connection has open (its files copied from a shared
            // drive, or left by a tool that crashed; or the main file alone): opened in
            // place, SQLite would make or rebuild a -wal and -shm beside it.
            let side = wal.as_deref().map(|w| (w, "-wal"));
            ("recovered copy", recovered(&mut dst, side)?)
        } else {
            // Rollback mode: read in place under SQLite's shared lock, which a writer
            // (its -journal in use) is waited for. A journal left by a writer that died
            // is hot: a reader may not roll it back in place, so the files are copied
            // and rolled back in the copy.
            let before = stamp(path)?;
            let src = open_source(path, "mode=ro").map_err(cannot)?;
            match backup(&src, &mut dst) {
                Ok(()) => {
                    drop(src);
                    // The file's own digest too, when it did not change around the copy
                    // (what `sha256sum` of a database nobody writes gives).
                    let (sha, len) = crate::digest::sha256_streamed(
                        crate::files::open_regular(path, crate::files::Links::Refuse)?,
                        path,
                        |_| Ok(()),
                    )?;
                    let unchanged = stamp(path)? == before && len == before.0;
                    ("in place", vec![found(path, unchanged.then_some(sha))?])
                }
                Err(e)
                    if e.sqlite_error().map(|x| x.extended_code)
                        == Some(rusqlite::ffi::SQLITE_READONLY_ROLLBACK) =>
                {
                    drop(src);
                    let side = journal.as_deref().map(|j| (j, "-journal"));
                    ("recovered copy", recovered(&mut dst, side)?)
                }
                Err(e) => return Err(cannot(e)),
            }
        };
        // The snapshot is a database of pieval's own: its indexes rebuilt from its tables
        // (an index a received file doctored would hide or reorder rows), under the same
        // bounds as every read; no WAL; then read-only.
        harden(&dst).map_err(cannot)?;
        dst.set_limit(
            rusqlite::limits::Limit::SQLITE_LIMIT_LENGTH,
            i32::try_from(max_value_bytes).unwrap_or(i32::MAX),
        )
        .map_err(cannot)?;
        let copied = std::fs::metadata(&file).map_or(0, |m| m.len());
        let rebuild = Work::new(budget_steps(copied));
        let tables: Vec<String> = dst
            .prepare("SELECT name FROM sqlite_schema WHERE type = 'table' AND rootpage > 0")
            .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
            .map_err(cannot)?;
        rebuild.watch(&dst);
        for table in tables {
            let quoted = format!("\"{}\"", table.replace('"', "\"\""));
            if let Err(e) = dst.execute_batch(&format!("REINDEX {quoted}")) {
                let why = if rebuild.stopped.load(Ordering::Relaxed) {
                    format!(
                        "rebuilding its indexes stopped after {} steps of SQLite's work, the bound for a database of {}",
                        rebuild.steps,
                        crate::files::human(copied)
                    )
                } else if e.sqlite_error_code() == Some(rusqlite::ErrorCode::TooBig) {
                    format!(
                        "a value longer than the limit of {} (--max-line-bytes): not read",
                        crate::files::human(max_value_bytes as u64)
                    )
                } else {
                    format!("its indexes cannot be rebuilt from the table: {e}")
                };
                return Err(Error::input(path, 0, Some(&table), why));
            }
        }
        dst.progress_handler(0, None::<fn() -> bool>);
        let encoding: String = dst
            .query_row("PRAGMA encoding", [], |r| r.get(0))
            .map_err(cannot)?;
        if encoding != "UTF-8" {
            return Err(Error::input(
                path,
                0,
                None,
                format!(
                    "its text is stored as {encoding}: pieval reads databases stored as UTF-8, as the tools write them"
                ),
            ));
        }
        dst.execute_batch("PRAGMA journal_mode = DELETE")
            .map_err(cannot)?;
        drop(dst);
        let (sha256, bytes) = crate::digest::sha256_streamed(
            crate::files::open_regular(&file, crate::files::Links::Refuse)?,
            &file,
            |_| Ok(()),
        )?;
        let conn = open_snapshot(&file).map_err(cannot)?;
        conn.set_limit(
            rusqlite::limits::Limit::SQLITE_LIMIT_LENGTH,
            i32::try_from(max_value_bytes).unwrap_or(i32::MAX),
        )
        .map_err(cannot)?;
        let work = Work::new(budget_steps(bytes));
        work.watch(&conn);
        Ok(Database {
            conn,
            path: path.to_path_buf(),
            snapshot: Snapshot {
                how: how.to_owned(),
                bytes,
                sha256,
                files,
            },
            work,
            file,
        })
    }

    /// The connection to the snapshot.
    pub fn conn(&self) -> &Connection {
        &self.conn
    }

    /// The source file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Say which table is being read (an error names it).
    pub fn reading(&self, table: &str) {
        if let Ok(mut t) = self.work.table.lock() {
            table.clone_into(&mut t);
        }
    }

    /// Whether the database has a table (of any shape) called `name`.
    pub fn has(&self, name: &str) -> Result<bool> {
        self.conn
            .query_row(
                "SELECT count(*) FROM sqlite_schema WHERE name = ?1 COLLATE NOCASE \
                 AND type IN ('table', 'view')",
                [name],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n > 0)
            .map_err(|e| self.error(e))
    }

    /// Check that `table` is a plain table that stores `columns` (a view, a virtual
    /// table, a missing or computed column is an error naming the file and table): what
    /// the importer reads and nothing else. `tool`: whose database it should be.
    pub fn expect_table(&self, table: &str, columns: &[&str], tool: &str) -> Result<()> {
        self.reading(table);
        let not = |why: String| {
            Error::input(
                &self.path,
                0,
                Some(table),
                format!("{why}: not a {tool} database as {tool} writes it; nothing of it was read"),
            )
        };
        // (A trigger or an index may share the name: only a table or view is it.)
        let row: Option<(String, Option<String>, i64)> = self
            .conn
            .query_row(
                "SELECT type, sql, rootpage FROM sqlite_schema WHERE name = ?1 COLLATE NOCASE \
                 AND type IN ('table', 'view') ORDER BY type = 'table' DESC LIMIT 1",
                [table],
                |r| {
                    Ok((
                        r.get(0)?,
                        r.get(1)?,
                        r.get::<_, Option<i64>>(2)?.unwrap_or(0),
                    ))
                },
            )
            .map(Some)
            .or_else(|e| match e {
                rusqlite::Error::QueryReturnedNoRows => Ok(None),
                e => Err(e),
            })
            .map_err(|e| self.error(e))?;
        let Some((kind, sql, rootpage)) = row else {
            return Err(not("no such table".into()));
        };
        if kind != "table" {
            return Err(not(format!(
                "a {kind}, not a table (pieval reads only stored tables)"
            )));
        }
        // A virtual table has no pages of its own (its SQL may say so in any spelling:
        // comments, case, a schema written by hand).
        let sql = sql.unwrap_or_default();
        if rootpage <= 0
            || sql
                .trim_start()
                .get(..20)
                .is_some_and(|s| s.eq_ignore_ascii_case("CREATE VIRTUAL TABLE"))
        {
            return Err(not(
                "a virtual table, not a stored one (pieval reads only stored tables)".into(),
            ));
        }
        let mut stmt = self
            .conn
            .prepare("SELECT name, hidden FROM pragma_table_xinfo(?1)")
            .map_err(|e| self.error(e))?;
        let cols: Vec<(String, i64)> = stmt
            .query_map([table], |r| Ok((r.get(0)?, r.get(1)?)))
            .and_then(|rows| rows.collect())
            .map_err(|e| self.error(e))?;
        for want in columns {
            match cols.iter().find(|(n, _)| n.eq_ignore_ascii_case(want)) {
                None => return Err(not(format!("no column {want}"))),
                Some((_, 0)) => {}
                Some(_) => {
                    return Err(not(format!(
                        "column {want} is computed (a generated column), not stored"
                    )));
                }
            }
        }
        Ok(())
    }

    /// An error of SQLite while reading: the file and the table, and for a query stopped
    /// by the bound or a value over the limit, which.
    pub fn error(&self, e: rusqlite::Error) -> Error {
        let table = self
            .work
            .table
            .lock()
            .map(|t| t.clone())
            .unwrap_or_default();
        let field = (!table.is_empty()).then_some(table.as_str());
        let code = e.sqlite_error_code();
        let message = if self.work.stopped.load(Ordering::Relaxed) {
            format!(
                "stopped after {} steps of SQLite's work, the bound for a database of {} (a table of this size is read in far fewer): nothing of the import was kept",
                self.work.steps,
                crate::files::human(self.snapshot.bytes),
            )
        } else if code == Some(rusqlite::ErrorCode::TooBig) {
            format!(
                "a value longer than the limit of {} (--max-line-bytes): not read",
                crate::files::human(
                    self.conn
                        .limit(rusqlite::limits::Limit::SQLITE_LIMIT_LENGTH)
                        .unwrap_or(0)
                        .max(0) as u64
                )
            )
        } else {
            format!("cannot be read: {e}")
        };
        Error::input(&self.path, 0, field, message)
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
        let _ = std::fs::remove_file(PathBuf::from(format!("{}-journal", self.file.display())));
    }
}

/// The first 100 bytes (SQLite's header), or an error: not a database.
fn read_header(path: &Path) -> Result<[u8; 100]> {
    use std::io::Read;
    let f = crate::files::open_regular(path, crate::files::Links::Refuse)?;
    let mut h = [0u8; 100];
    f.take(100).read_exact(&mut h).map_err(|_| {
        Error::input(
            path,
            0,
            None,
            "shorter than a SQLite header: not a SQLite database",
        )
    })?;
    if &h[..16] != MAGIC {
        return Err(Error::input(
            path,
            0,
            None,
            "not a SQLite database (its first bytes)",
        ));
    }
    Ok(h)
}

/// A URI for `path` with `query` (the path's `%`, `?` and `#` escaped).
fn uri(path: &Path, query: &str) -> String {
    format!(
        "file:{}?{query}",
        path.display()
            .to_string()
            .replace('%', "%25")
            .replace('?', "%3f")
            .replace('#', "%23")
    )
}

/// The source, read-only in place (SQLite's locks held while it is read).
fn open_source(path: &Path, query: &str) -> rusqlite::Result<Connection> {
    let c = Connection::open_with_flags(
        uri(path, query),
        OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    c.busy_timeout(std::time::Duration::from_secs(30))?;
    harden(&c)?;
    Ok(c)
}

/// The snapshot: pieval's own file, read-only and immutable.
fn open_snapshot(path: &Path) -> rusqlite::Result<Connection> {
    let c = Connection::open_with_flags(
        uri(path, "mode=ro&immutable=1"),
        OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    harden(&c)?;
    c.execute_batch("PRAGMA cell_size_check = ON")?;
    Ok(c)
}

/// SQLite's defences for a database from someone else: no schema code with side
/// effects, no writes to the schema or shadow tables.
fn harden(c: &Connection) -> rusqlite::Result<()> {
    use rusqlite::config::DbConfig;
    c.set_db_config(DbConfig::SQLITE_DBCONFIG_DEFENSIVE, true)?;
    c.set_db_config(DbConfig::SQLITE_DBCONFIG_TRUSTED_SCHEMA, false)?;
    Ok(())
}

/// Copy every page of `src` into `dst` in one step: one read transaction on `src`, so
/// the copy is one moment of it (a writer meanwhile is not seen; in WAL mode it is not
/// held up; otherwise the copy waits for it, up to the busy timeout).
fn backup(src: &Connection, dst: &mut Connection) -> rusqlite::Result<()> {
    use rusqlite::backup::{Backup, StepResult};
    let b = Backup::new(src, dst)?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match b.step(-1)? {
            StepResult::Done => return Ok(()),
            StepResult::More => {}
            StepResult::Busy | StepResult::Locked if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            _ => {
                return Err(rusqlite::Error::SqliteFailure(
                    rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
                    Some("the database stayed locked by its writer for 30 s".into()),
                ));
            }
        }
    }
}

/// A file's size and modification time (a change between two of them: it was written).
fn stamp(p: &Path) -> Result<(u64, Option<std::time::SystemTime>)> {
    let m = std::fs::symlink_metadata(p).map_err(|e| Error::io(p, "cannot read", e))?;
    Ok((m.len(), m.modified().ok()))
}

/// The error of a file that changed while it was copied.
fn changed(path: &Path) -> Error {
    Error::State(format!(
        "{}: changed while it was copied (something writes the database without holding it open as SQLite does); import it again when that has stopped",
        path.display()
    ))
}

/// Whether a connection has the WAL database of the shared-memory file `shm` open: every
/// connection holds a shared lock on its dead-man-switch byte (offset 128: SQLite's
/// `UNIX_SHM_DMS`) while it has the file mapped; a test of the lock, nothing written.
fn shm_in_use(shm: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::io::AsRawFd;
        let Ok(f) = crate::files::open_regular(shm, crate::files::Links::Refuse) else {
            return false;
        };
        // SAFETY: a zeroed flock is a valid value; F_GETLK fills it for this open file.
        let mut lock: libc::flock = unsafe { std::mem::zeroed() };
        lock.l_type = libc::F_WRLCK as _;
        lock.l_whence = libc::SEEK_SET as _;
        lock.l_start = 128;
        lock.l_len = 1;
        // SAFETY: the descriptor is open and the pointer valid for the call.
        let rc = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETLK, &mut lock) };
        rc == 0 && i32::from(lock.l_type) != libc::F_UNLCK
    }
    #[cfg(not(unix))]
    {
        let _ = shm;
        true
    }
}

/// A file found beside the snapshot: its size (and digest, when copied whole).
fn found(path: &Path, sha256: Option<String>) -> Result<FoundFile> {
    let m = std::fs::symlink_metadata(path).map_err(|e| Error::io(path, "cannot read", e))?;
    Ok(FoundFile {
        path: path.display().to_string(),
        bytes: m.len(),
        sha256,
        modified: m.modified().ok(),
    })
}

/// Copy `from` to `to` (a new file), hashed as copied; an error when `from` changed
/// meanwhile (its size or modification time).
fn copy_whole(from: &Path, to: &Path) -> Result<FoundFile> {
    let before = stamp(from)?;
    let src = crate::files::open_regular(from, crate::files::Links::Refuse)?;
    let dst = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(to)
        .map_err(|e| Error::io(to, "cannot create", e))?;
    let mut writer = std::io::BufWriter::with_capacity(1 << 20, dst);
    let (sha256, bytes) = crate::digest::sha256_streamed(src, from, |chunk| {
        std::io::Write::write_all(&mut writer, chunk).map_err(|e| Error::io(to, "cannot write", e))
    })?;
    std::io::Write::flush(&mut writer).map_err(|e| Error::io(to, "cannot write", e))?;
    if stamp(from)? != before || bytes != before.0 {
        return Err(changed(from));
    }
    Ok(FoundFile {
        path: from.display().to_string(),
        bytes,
        sha256: Some(sha256),
        modified: before.1,
    })
}
