//! Writing files so that a failure never leaves a half-written artifact: everything is
//! written to a temporary name in the same folder, synced, then renamed over the target.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::basic::{Compression, ZstdLevel};
use datafusion::parquet::file::properties::WriterProperties;
use futures::StreamExt;

use crate::error::{Error, Result};

mod commit;
pub use commit::{CRASH_ENV, FolderCommit, JOURNAL, finish as finish_commit};

/// The temporary name used while `path` is being written: `.NAME.PID-RANDOM.tmp`. The
/// random part makes it unpredictable, and it is created with `create_new`, so a file or
/// symbolic link planted under that name is never written through; the PID lets a later
/// run remove what a killed one left ([`clean_stale`]).
pub fn temp_path(path: &Path) -> Result<PathBuf> {
    let file_name = path
        .file_name()
        .ok_or_else(|| Error::Usage(format!("{}: not a file path", path.display())))?;
    Ok(path.with_file_name(format!(
        ".{}.{}-{:016x}.tmp",
        file_name.to_string_lossy(),
        std::process::id(),
        fastrand::u64(..)
    )))
}

/// Whether `name` is a temporary name made by [`temp_path`], [`TempDir`] or a staging
/// folder (what a reader or a publisher leaves out).
pub fn is_temporary(name: &str) -> bool {
    name == JOURNAL || name == commit::LOCK_FILE || temp_owner(name).is_some()
}

/// The process id in a temporary name made here (`.NAME.PID-RANDOM.tmp`,
/// `.NAME.tmp-PID-RANDOM`, `.NAME.old-PID-RANDOM`).
fn temp_owner(name: &str) -> Option<u32> {
    let name = name.strip_prefix('.')?;
    let rest = if let Some(stem) = name.strip_suffix(".tmp") {
        stem.rsplit_once('.')?.1
    } else {
        name.rsplit_once(".tmp-")
            .or_else(|| name.rsplit_once(".old-"))?
            .1
    };
    let (pid, random) = rest.split_once('-')?;
    (random.len() == 16 && random.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| pid.parse().ok())
        .flatten()
}

/// Remove the folder `dir` and everything in it, also while others still write in it (a
/// cluster's executors finishing a task into a staging folder whose client gave up).
/// The folder is first renamed to a temporary name of this process: on a local file
/// system a file put by its path after that finds no folder (parts are written into an
/// existing folder, never one made for them — [`TempFile::create_shared`]), so nothing is
/// added to what is removed and nothing comes back at `dir`. On a network mount another
/// machine may still reach the renamed folder through its cached lookup for a few
/// seconds, and where the rename is refused, nothing stops a writer: a removal that finds
/// a file put in meanwhile (`ENOTEMPTY`, or NFS's busy `.nfs…` files) is made again, for
/// at most `patience`. On failure, the path left and why; what is left under the
/// temporary name, [`clean_stale`] removes once this process has ended. A folder that is
/// not there is removed already.
pub fn remove_tree(
    dir: &Path,
    patience: std::time::Duration,
) -> std::result::Result<(), (PathBuf, std::io::Error)> {
    use std::io::ErrorKind;
    let aside = dir.with_file_name(format!(
        ".pieval-removed.tmp-{}-{:016x}",
        std::process::id(),
        fastrand::u64(..)
    ));
    let target = match std::fs::rename(dir, &aside) {
        Ok(()) => aside,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(_) => dir.to_path_buf(),
    };
    let deadline = std::time::Instant::now() + patience;
    loop {
        match std::fs::remove_dir_all(&target) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::DirectoryNotEmpty | ErrorKind::ResourceBusy
                ) && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(e) => return Err((target, e)),
        }
    }
}

/// Remove what killed pieval processes left in `dir`: temporary files and folders whose
/// process is gone (Linux; elsewhere nothing is removed). A `.NAME.old-…` folder whose
/// `NAME` is missing is what a kill between [`TempDir::commit`]'s two renames left: it
/// is put back. Best effort: what cannot be removed stays.
pub fn clean_stale(dir: &Path) {
    // The temporary files a killed commit's journal names are that commit's new files:
    // it is applied first, and if it cannot be, nothing here is removed. The folder's
    // commit lock is held throughout, so no journal naming a file removed here is
    // written meanwhile.
    let Ok(_lock) = commit::lock(dir) else {
        return;
    };
    if commit::finish_locked(dir).is_err() || !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = temp_owner(&name) else {
            continue;
        };
        let path = entry.path();
        if pid == std::process::id() || !owner_is_gone(&path, pid) {
            continue;
        }
        if let Some((target, _)) = name.strip_prefix('.').and_then(|n| n.rsplit_once(".old-")) {
            let target = dir.join(target);
            if std::fs::symlink_metadata(&target).is_err() {
                let _ = std::fs::rename(&path, &target);
                continue;
            }
        }
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => {
                let _ = std::fs::remove_dir_all(&path);
            }
            Ok(_) => {
                let _ = std::fs::remove_file(&path);
            }
            Err(_) => {}
        }
    }
}

/// The file a [`TempDir`] holds naming the process that made it: its id, its start time
/// (in clock ticks since boot, `/proc/PID/stat`'s 22nd field) and the boot's id. A
/// process id alone may be given to another process after the first ended; the three
/// together name one process.
pub const OWNER_FILE: &str = ".pieval-owner";

/// This process, as [`OWNER_FILE`] names it (`None` where `/proc` cannot tell).
fn this_process() -> Option<String> {
    let pid = std::process::id();
    Some(format!("{pid} {} {}", start_time(pid)?, boot_id()?))
}

/// When process `pid` started (clock ticks since boot), if it is running.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: the fields
    // after its last ')' start at field 3.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

fn boot_id() -> Option<String> {
    Some(
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .ok()?
            .trim()
            .to_owned(),
    )
}

/// Whether the process that made the temporary `path` (whose name gives `pid`) has
/// ended. A folder that names its owner ([`OWNER_FILE`]) is its own proof: gone when the
/// machine has rebooted since, or no process with that id started at that time is
/// running (the id reused by another process does not keep it). Anything else is gone
/// when no process has that id.
fn owner_is_gone(path: &Path, pid: u32) -> bool {
    let alive = Path::new(&format!("/proc/{pid}")).exists();
    // A regular file, not followed through a link, read to at most 256 bytes: a FIFO or a
    // link to /dev/zero planted under the name neither hangs nor fills this.
    let owner = crate::files::open_regular(&path.join(OWNER_FILE), crate::files::Links::Refuse)
        .ok()
        .and_then(|f| {
            use std::io::Read;
            let mut s = String::new();
            f.take(256).read_to_string(&mut s).ok().map(|_| s)
        });
    let Some(owner) = owner else {
        return !alive;
    };
    let mut fields = owner.split_whitespace();
    let (Some(p), Some(started), Some(boot)) = (fields.next(), fields.next(), fields.next()) else {
        return !alive;
    };
    if p != pid.to_string() {
        // Not what the name says: not ours to judge.
        return false;
    }
    if boot_id().is_some_and(|b| b != boot) {
        return true;
    }
    !alive || start_time(pid).is_some_and(|t| t.to_string() != started)
}

/// Bytes buffered before a write reaches the kernel: scoring writes case_results.jsonl in
/// writes of a batch's few KiB at a time, so the default 8 KiB made one system call per
/// batch chunk (10 GB of JSONL at 4 GB of responses).
const WRITE_BUFFER: usize = 256 * 1024;

/// A file written under a temporary name in its target's folder, synced and renamed over
/// the target by [`TempFile::commit`]; dropped uncommitted (an error, a panic), it
/// removes its temporary file. Every artifact pieval writes goes through it.
pub struct TempFile {
    path: PathBuf,
    tmp: PathBuf,
    file: Option<std::io::BufWriter<File>>,
    /// What was written, hashed as it was (files in a shared folder: a cluster's parts).
    written: Option<crate::digest::Running>,
}

impl TempFile {
    /// Create the temporary file (the target's folder must exist: see
    /// [`create_parent`]).
    pub fn create(path: &Path) -> Result<Self> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            clean_stale(parent);
        }
        Self::open(path)
    }

    /// [`TempFile::create`] in a folder other machines write in too (a cluster's parts
    /// folder): what others left is not cleaned, since a process id names a process on
    /// one machine only — another executor's file being written would look abandoned.
    /// What is written is hashed as it is ([`TempFile::commit_hashed`]): a part's digest
    /// without reading it back.
    pub fn create_shared(path: &Path) -> Result<Self> {
        let mut file = Self::open(path)?;
        file.written = Some(crate::digest::Running::default());
        Ok(file)
    }

    /// A temporary file another process wrote at `tmp` (a cluster's executors put a run
    /// file together in the staging folder), committed as any other: synced and renamed
    /// over `path` (so on `path`'s file system), or removed when dropped uncommitted.
    pub fn adopt(tmp: PathBuf, path: &Path) -> Result<Self> {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&tmp)
            .map_err(|e| Error::io(&tmp, "cannot open", e))?;
        Ok(Self {
            path: path.to_path_buf(),
            tmp,
            file: Some(std::io::BufWriter::with_capacity(WRITE_BUFFER, file)),
            written: None,
        })
    }

    fn open(path: &Path) -> Result<Self> {
        let tmp = temp_path(path)?;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| Error::io(&tmp, "cannot create", e))?;
        Ok(Self {
            path: path.to_path_buf(),
            tmp,
            file: Some(std::io::BufWriter::with_capacity(WRITE_BUFFER, file)),
            written: None,
        })
    }

    /// The temporary file's path (what was written so far can be read back from it
    /// after a [`Write::flush`]).
    pub fn tmp_path(&self) -> &Path {
        &self.tmp
    }

    /// [`TempFile::commit`] of a file made by [`TempFile::create_shared`]: the SHA-256 and
    /// length of what was written.
    pub fn commit_hashed(mut self) -> Result<(String, u64)> {
        let written = self.written.take().ok_or_else(|| {
            Error::Internal(format!("{}: not hashed while written", self.path.display()))
        })?;
        self.commit()?;
        Ok(written.finish())
    }

    /// Flush and sync to disk, still under the temporary name; the length written.
    fn sync(&mut self) -> Result<u64> {
        let file = self.file.as_mut().expect("open until committed");
        file.flush()
            .map_err(|e| Error::io(&self.tmp, "cannot write", e))?;
        let file = file.get_ref();
        file.sync_all()
            .map_err(|e| Error::io(&self.tmp, "cannot sync", e))?;
        file.metadata()
            .map(|m| m.len())
            .map_err(|e| Error::io(&self.tmp, "cannot read", e))
    }

    /// Close, leaving the temporary file where it is (a commit journal names it).
    fn keep(mut self) {
        self.file = None;
    }

    /// The temporary name is still the file being written (not removed by another
    /// machine's clean-up, to which this process id means nothing, nor replaced).
    fn check_in_place(&self) -> Result<()> {
        use std::os::unix::fs::MetadataExt;
        let open = self
            .file
            .as_ref()
            .expect("open until committed")
            .get_ref()
            .metadata()
            .map_err(|e| Error::io(&self.tmp, "cannot read", e))?;
        match std::fs::symlink_metadata(&self.tmp) {
            Ok(m) if m.dev() == open.dev() && m.ino() == open.ino() => Ok(()),
            _ => Err(Error::State(format!(
                "{}: removed or replaced while it was written",
                self.tmp.display()
            ))),
        }
    }

    /// Flush, sync to disk and rename over the target.
    pub fn commit(mut self) -> Result<()> {
        let file = self
            .file
            .take()
            .expect("open until committed")
            .into_inner()
            .map_err(|e| Error::io(&self.tmp, "cannot write", e.into_error()))?;
        file.sync_all()
            .map_err(|e| Error::io(&self.tmp, "cannot sync", e))?;
        std::fs::rename(&self.tmp, &self.path)
            .map_err(|e| Error::io(&self.path, "cannot replace", e))
    }
}

impl Write for TempFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self
            .file
            .as_mut()
            .expect("open until committed")
            .write(buf)?;
        if let Some(w) = &mut self.written {
            w.update(&buf[..n]);
        }
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.file.as_mut().expect("open until committed").flush()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        // A committed file was renamed away; this only removes an abandoned one.
        if self.file.is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// A folder built under a temporary name next to its target and swapped in whole by
/// [`TempDir::commit`] (the old folder is moved aside, the new one renamed in, the old
/// one removed; if the rename fails the old one is put back). Dropped uncommitted, it
/// removes itself.
pub struct TempDir {
    target: PathBuf,
    tmp: PathBuf,
}

impl TempDir {
    pub fn create(target: &Path) -> Result<Self> {
        let name = target
            .file_name()
            .ok_or_else(|| Error::Usage(format!("{}: not a folder path", target.display())))?;
        if let Some(parent) = target.parent().filter(|p| !p.as_os_str().is_empty()) {
            clean_stale(parent);
        }
        let tmp = target.with_file_name(format!(
            ".{}.tmp-{}-{:016x}",
            name.to_string_lossy(),
            std::process::id(),
            fastrand::u64(..)
        ));
        // create_dir, not create_dir_all: a name planted in the way is an error.
        std::fs::create_dir(&tmp).map_err(|e| Error::io(&tmp, "cannot create folder", e))?;
        let dir = Self {
            target: target.to_path_buf(),
            tmp,
        };
        // Who made it: a later run removes it once this process is gone, and only then
        // (`clean_stale`); removed again before the folder is swapped in.
        if let Some(me) = this_process() {
            let owner = dir.tmp.join(OWNER_FILE);
            std::fs::write(&owner, me).map_err(|e| Error::io(&owner, "cannot write", e))?;
        }
        Ok(dir)
    }

    /// The folder being built.
    pub fn path(&self) -> &Path {
        &self.tmp
    }

    /// Swap the built folder in; its final path.
    pub fn commit(self) -> Result<PathBuf> {
        let owner = self.tmp.join(OWNER_FILE);
        match std::fs::remove_file(&owner) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Error::io(&owner, "cannot remove", e));
            }
            _ => {}
        }
        let dir = self.target.clone();
        let name = dir
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let old = dir.with_file_name(format!(
            ".{name}.old-{}-{:016x}",
            std::process::id(),
            fastrand::u64(..)
        ));
        if dir.exists() {
            std::fs::rename(&dir, &old).map_err(|e| Error::io(&dir, "cannot replace", e))?;
        }
        if let Err(e) = std::fs::rename(&self.tmp, &dir) {
            let _ = std::fs::rename(&old, &dir);
            return Err(Error::io(&dir, "cannot replace", e));
        }
        let _ = std::fs::remove_dir_all(&old);
        Ok(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        // After a commit the temporary name no longer exists.
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}

/// Create the folder `path` will be written in.
pub fn create_parent(path: &Path) -> Result<()> {
    match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, "cannot create folder", e))
        }
        None => Ok(()),
    }
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
    create_parent(path)?;
    let mut file = TempFile::create(path)?;
    let tmp = file.tmp_path().to_path_buf();
    produce(&mut |line: &str| {
        file.write_all(line.as_bytes())
            .and_then(|_| file.write_all(b"\n"))
            .map_err(|e| Error::io(&tmp, "cannot write", e))
    })?;
    file.commit()
}

/// Rows per Parquet row group. The writer holds a whole row group in memory before it
/// flushes it, so the default (about a million rows of ~1 KB responses) would make
/// memory follow the input; 64 Ki rows keeps it bounded.
const ROW_GROUP_ROWS: usize = 64 * 1024;

/// Bytes a row group being written may hold before [`ParquetFile::write`] ends it (after
/// the batch that passes it): the bound [`ROW_GROUP_ROWS`] sets for rows of ~1 KB, for
/// rows of any width.
const ROW_GROUP_BYTES: usize = 64 << 20;

/// zstd level 1: scoring writes every response again (case_results), and level 3's
/// compressor took 8% of scoring's CPU on distinct responses for files about 10%
/// smaller (docs/performance.md).
const ZSTD_LEVEL: i32 = 1;

/// Columns that carry the bulk of a table's bytes as text already written once
/// elsewhere (a response, kept in case_results.jsonl too): compressed with LZ4_RAW, the
/// cheaper codec. Over 557 MB of distinct responses, `response_text` is 162 MB under zstd
/// level 1 and 237 MB under LZ4_RAW, and scoring's CPU falls by 6% (docs/performance.md,
/// "Writing the text once"). Every other column stays zstd: they are small, repetitive,
/// and compress far better under it. The attempt tables' texts are the same kind: a tool
/// call's `arguments` and `output` (`tool_calls.parquet`), a turn's prompt and responses
/// (`turns.parquet`), each already in predictions.jsonl. Over the 1 GB Inspect import
/// (476,515 tool calls) zstd level 1 over them was 17% of the import's CPU
/// (docs/performance.md, "Importing other tools' results").
pub const BULK_TEXT_COLUMNS: &[&str] = &[
    "response_text",
    "arguments",
    "output",
    "attack_prompt",
    "attacker_response",
    "target_response",
];

pub fn writer_properties() -> Result<WriterProperties> {
    writer_properties_with(ROW_GROUP_ROWS)
}

/// [`writer_properties`] with row groups of at most `rows` rows.
pub fn writer_properties_with(rows: usize) -> Result<WriterProperties> {
    let b = WriterProperties::builder()
        .set_compression(Compression::ZSTD(
            ZstdLevel::try_new(ZSTD_LEVEL).map_err(Error::from)?,
        ))
        .set_max_row_group_row_count(Some(rows.max(1)));
    let b = BULK_TEXT_COLUMNS.iter().fold(b, |b, c| {
        b.set_column_compression(
            datafusion::parquet::schema::types::ColumnPath::from(*c),
            Compression::LZ4_RAW,
        )
    });
    Ok(b.build())
}

/// A Parquet file written under a temporary name (zstd, bounded row groups) and renamed
/// over its target by [`ParquetFile::commit`]; dropped uncommitted, it leaves nothing.
pub struct ParquetFile {
    writer: ArrowWriter<TempFile>,
    rows: u64,
}

impl ParquetFile {
    pub fn create(path: &Path, schema: SchemaRef) -> Result<Self> {
        Self::create_with(path, schema, writer_properties()?)
    }

    pub fn create_with(path: &Path, schema: SchemaRef, props: WriterProperties) -> Result<Self> {
        Self::from_temp(TempFile::create(path)?, schema, props)
    }

    /// [`ParquetFile::create`] through [`TempFile::create_shared`].
    pub fn create_shared(path: &Path, schema: SchemaRef) -> Result<Self> {
        Self::from_temp(TempFile::create_shared(path)?, schema, writer_properties()?)
    }

    fn from_temp(file: TempFile, schema: SchemaRef, props: WriterProperties) -> Result<Self> {
        Ok(Self {
            writer: ArrowWriter::try_new(file, schema, Some(props))?,
            rows: 0,
        })
    }

    pub fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        self.rows += batch.num_rows() as u64;
        self.writer.write(batch)?;
        // A row group is also ended by its size: the writer holds it in memory, and 64 Ki
        // rows of 5 KB responses (a garak report's) held 300 MB.
        if self.writer.in_progress_size() >= ROW_GROUP_BYTES {
            self.writer.flush()?;
        }
        Ok(())
    }

    /// End the row group being written: what it buffered goes to the file.
    pub fn end_row_group(&mut self) -> Result<()> {
        self.writer.flush()?;
        Ok(())
    }

    /// Close, sync to disk and rename into place; the number of rows written.
    pub fn commit(self) -> Result<u64> {
        // into_inner writes the footer (once) and hands the file back.
        self.writer.into_inner()?.commit()?;
        Ok(self.rows)
    }

    /// Close (the footer written), not yet renamed into place: for a
    /// [`FolderCommit`]. The file and the number of rows written.
    pub fn finish(self) -> Result<(TempFile, u64)> {
        Ok((self.writer.into_inner()?, self.rows))
    }

    /// [`ParquetFile::commit`] of a file made by [`ParquetFile::create_shared`]: the rows,
    /// and the SHA-256 and length of the file, hashed as it was written.
    pub fn commit_hashed(self) -> Result<(u64, String, u64)> {
        let (sha256, bytes) = self.writer.into_inner()?.commit_hashed()?;
        Ok((self.rows, sha256, bytes))
    }
}

/// Stream a query's result into a Parquet file, atomically ([`ParquetFile`]). Returns
/// the number of rows written.
pub async fn write_parquet(df: datafusion::dataframe::DataFrame, out: &Path) -> Result<u64> {
    let mut file = ParquetFile::create(out, Arc::new(df.schema().as_arrow().clone()))?;
    let mut stream = df.execute_stream().await?;
    while let Some(batch) = stream.next().await {
        file.write(&batch?)?;
    }
    file.commit()
}

/// Write record batches (all of `schema`) into a Parquet file, atomically.
pub fn write_batches(schema: SchemaRef, batches: &[RecordBatch], out: &Path) -> Result<()> {
    let mut file = ParquetFile::create(out, schema)?;
    for batch in batches {
        file.write(batch)?;
    }
    file.commit().map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_group_of_wide_rows_ends_at_its_byte_budget() {
        use datafusion::arrow::array::StringArray;
        use datafusion::arrow::datatypes::{DataType, Field, Schema};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wide.parquet");
        let schema = Arc::new(Schema::new(vec![Field::new(
            "response_text",
            DataType::Utf8,
            false,
        )]));
        let mut f = ParquetFile::create(&path, Arc::clone(&schema)).unwrap();
        // 96 distinct rows of 1 MiB of letters (little for LZ4 to take out), 8 a batch
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..12 {
            let rows: Vec<String> = (0..8)
                .map(|_| {
                    (0..1 << 20)
                        .map(|_| {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            (b'a' + (x % 26) as u8) as char
                        })
                        .collect()
                })
                .collect();
            let batch =
                RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(StringArray::from(rows))])
                    .unwrap();
            f.write(&batch).unwrap();
        }
        assert_eq!(f.commit().unwrap(), 96);
        let reader = datafusion::parquet::file::reader::SerializedFileReader::new(
            std::fs::File::open(&path).unwrap(),
        )
        .unwrap();
        use datafusion::parquet::file::reader::FileReader;
        let groups = reader.metadata().row_groups();
        // 96 MiB of text, far under 64 Ki rows: more than one row group, none far past
        // the budget (it ends after the batch that passes it)
        assert!(groups.len() >= 2, "{} row groups", groups.len());
        for g in groups {
            assert!(
                (g.compressed_size() as usize) < ROW_GROUP_BYTES + (16 << 20),
                "{}",
                g.compressed_size()
            );
        }
    }

    #[test]
    fn a_shared_folder_keeps_what_another_machines_process_is_writing() {
        let dir = tempfile::tempdir().unwrap();
        // A process id that is not this machine's: another executor's part in progress.
        let other = dir
            .path()
            .join(".part-a.case_results.jsonl.4194999-00000000000000aa.tmp");
        std::fs::write(&other, "half a part").unwrap();
        let part = dir.path().join("part-b.case_results.jsonl");
        let mut f = TempFile::create_shared(&part).unwrap();
        f.write_all(b"{}\n").unwrap();
        f.write_all(&[b'x'; 100_000]).unwrap();
        // Hashed as it was written: the digest of the file as it lies.
        let (sha256, bytes) = f.commit_hashed().unwrap();
        assert_eq!(bytes, 100_003);
        assert_eq!(sha256, crate::digest::sha256_file(&part).unwrap());
        assert!(
            other.exists(),
            "another machine's file in progress was removed"
        );
        // Where this machine's processes are the only writers, it is cleaned.
        TempFile::create(&dir.path().join("run.jsonl"))
            .unwrap()
            .commit()
            .unwrap();
        assert!(!other.exists());
        // A file of a private folder is not hashed: asking for its digest is an error.
        let f = TempFile::create(&dir.path().join("private.jsonl")).unwrap();
        assert!(f.commit_hashed().is_err());
    }

    #[test]
    fn stale_temporary_names_are_recognised_and_cleaned() {
        assert_eq!(
            temp_owner(".case_results.parquet.123-00000000deadbeef.tmp"),
            Some(123)
        );
        assert_eq!(temp_owner(".controls.tmp-77-00000000deadbeef"), Some(77));
        assert_eq!(temp_owner(".controls.old-77-00000000deadbeef"), Some(77));
        assert_eq!(temp_owner(".hidden"), None);
        assert_eq!(temp_owner("case_results.parquet"), None);
        assert_eq!(temp_owner(".x.123-nothex.tmp"), None);
        let dir = tempfile::tempdir().unwrap();
        // A process id that cannot be alive (above the kernel's pid_max).
        let dead = ".case_results.parquet.4194305-00000000deadbeef.tmp";
        std::fs::write(dir.path().join(dead), b"partial").unwrap();
        std::fs::create_dir(dir.path().join(".controls.old-4194305-00000000deadbeef")).unwrap();
        let mine = temp_path(&dir.path().join("summary.json")).unwrap();
        std::fs::write(&mine, b"in progress").unwrap();
        clean_stale(dir.path());
        if Path::new("/proc/self").exists() {
            assert!(!dir.path().join(dead).exists());
            assert!(
                dir.path().join("controls").is_dir(),
                "the old folder is put back"
            );
            assert!(mine.exists(), "this process's own file is kept");
        }
        // A folder that names its owner: gone when the id is now another process's
        // (here this test's own process, started at another time), kept while its
        // owner runs.
        if let Some(me) = this_process() {
            let pid = std::process::id();
            let reused = dir.path().join(format!(".run.tmp-{pid}-00000000deadbeef"));
            std::fs::create_dir(&reused).unwrap();
            let (_, rest) = me.split_once(' ').unwrap();
            let (started, boot) = rest.split_once(' ').unwrap();
            let other: u64 = started.parse::<u64>().unwrap() + 1;
            std::fs::write(reused.join(OWNER_FILE), format!("{pid} {other} {boot}")).unwrap();
            assert!(owner_is_gone(&reused, pid), "a reused id keeps the folder");
            std::fs::write(reused.join(OWNER_FILE), &me).unwrap();
            assert!(
                !owner_is_gone(&reused, pid),
                "the running owner's folder is removed"
            );
            std::fs::write(
                reused.join(OWNER_FILE),
                format!("{pid} {started} another-boot"),
            )
            .unwrap();
            assert!(
                owner_is_gone(&reused, pid),
                "a folder of another boot is kept"
            );
            // A temporary folder made here names this process, and goes on commit.
            let made = TempDir::create(&dir.path().join("made")).unwrap();
            assert_eq!(
                std::fs::read_to_string(made.path().join(OWNER_FILE)).unwrap(),
                me
            );
            let at = made.commit().unwrap();
            assert!(!at.join(OWNER_FILE).exists());
        }
        // An owner file planted as a FIFO (or a link to /dev/zero) is not read: the
        // cleaning goes on, and an id nobody has is gone.
        #[cfg(unix)]
        {
            let planted = dir.path().join(".planted.tmp-4194305-00000000deadbeef");
            std::fs::create_dir(&planted).unwrap();
            let fifo =
                std::ffi::CString::new(planted.join(OWNER_FILE).to_string_lossy().into_owned())
                    .unwrap();
            // SAFETY: a valid C string path.
            assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
            let zero = dir.path().join(".zero.tmp-4194305-00000000deadbeef");
            std::fs::create_dir(&zero).unwrap();
            std::os::unix::fs::symlink("/dev/zero", zero.join(OWNER_FILE)).unwrap();
            clean_stale(dir.path());
            if Path::new("/proc/self").exists() {
                assert!(!planted.exists() && !zero.exists());
            }
        }
        // A planted symbolic link under a temporary name is never written through.
        let target = dir.path().join("out.txt");
        let mut f = TempFile::create(&target).unwrap();
        f.write_all(b"x").unwrap();
        assert!(std::fs::symlink_metadata(f.tmp_path()).unwrap().is_file());
        f.commit().unwrap();
    }

    /// A folder removed while another thread keeps putting files into it (an executor
    /// still finishing a task in a staging folder) is gone in the end, and stays gone.
    #[test]
    fn a_folder_being_written_in_is_removed_whole() {
        for round in 0..20 {
            let dir = tempfile::tempdir().unwrap();
            let tree = dir.path().join("staging");
            let parts = tree.join("parts");
            std::fs::create_dir_all(&parts).unwrap();
            for i in 0..200 {
                std::fs::write(tree.join(format!("in-{i}")), "x").unwrap();
            }
            let (started, writing) = std::sync::mpsc::channel();
            let writer = {
                let parts = parts.clone();
                std::thread::spawn(move || {
                    // As a part is written: into the folder as it is, never one made anew.
                    let mut put = 0u32;
                    while std::fs::write(parts.join(format!("part-{put}")), "x").is_ok() {
                        if put == 0 {
                            let _ = started.send(());
                        }
                        put += 1;
                    }
                    put
                })
            };
            writing.recv().unwrap();
            remove_tree(&tree, std::time::Duration::from_secs(10))
                .unwrap_or_else(|(at, e)| panic!("round {round}: {}: {e}", at.display()));
            let put = writer.join().unwrap();
            assert!(put > 0, "round {round}: nothing was written meanwhile");
            assert!(!tree.exists(), "round {round}: the folder is back");
            let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
            assert!(left.is_empty(), "round {round}: left {left:?}");
        }
        // A folder that is not there is removed already.
        let dir = tempfile::tempdir().unwrap();
        remove_tree(&dir.path().join("gone"), std::time::Duration::ZERO).unwrap();
    }
}
