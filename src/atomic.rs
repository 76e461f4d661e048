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

/// A file written under a temporary name in its target's folder, synced and renamed over
/// the target by [`TempFile::commit`]; dropped uncommitted (an error, a panic), it
/// removes its temporary file. Every artifact pieval writes goes through it.
pub struct TempFile {
    path: PathBuf,
    tmp: PathBuf,
    file: Option<std::io::BufWriter<File>>,
}

impl TempFile {
    /// Create the temporary file (the target's folder must exist: see
    /// [`create_parent`]).
    pub fn create(path: &Path) -> Result<Self> {
        let tmp = temp_path(path)?;
        let file = File::create(&tmp).map_err(|e| Error::io(&tmp, "cannot create", e))?;
        Ok(Self {
            path: path.to_path_buf(),
            tmp,
            file: Some(std::io::BufWriter::new(file)),
        })
    }

    /// The temporary file's path (what was written so far can be read back from it
    /// after a [`Write::flush`]).
    pub fn tmp_path(&self) -> &Path {
        &self.tmp
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
        self.file.as_mut().expect("open until committed").write(buf)
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
        let tmp = target.with_file_name(format!(
            ".{}.tmp-{}",
            name.to_string_lossy(),
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).map_err(|e| Error::io(&tmp, "cannot create folder", e))?;
        Ok(Self {
            target: target.to_path_buf(),
            tmp,
        })
    }

    /// The folder being built.
    pub fn path(&self) -> &Path {
        &self.tmp
    }

    /// Swap the built folder in; its final path.
    pub fn commit(self) -> Result<PathBuf> {
        let dir = self.target.clone();
        let name = dir
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let old = dir.with_file_name(format!(".{name}.old-{}", std::process::id()));
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

pub fn writer_properties() -> Result<WriterProperties> {
    Ok(WriterProperties::builder()
        .set_compression(Compression::ZSTD(
            ZstdLevel::try_new(3).map_err(Error::from)?,
        ))
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .build())
}

/// A Parquet file written under a temporary name (zstd, bounded row groups) and renamed
/// over its target by [`ParquetFile::commit`]; dropped uncommitted, it leaves nothing.
pub struct ParquetFile {
    writer: ArrowWriter<TempFile>,
    rows: u64,
}

impl ParquetFile {
    pub fn create(path: &Path, schema: SchemaRef) -> Result<Self> {
        let file = TempFile::create(path)?;
        Ok(Self {
            writer: ArrowWriter::try_new(file, schema, Some(writer_properties()?))?,
            rows: 0,
        })
    }

    pub fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        self.rows += batch.num_rows() as u64;
        self.writer.write(batch)?;
        Ok(())
    }

    /// Close, sync to disk and rename into place; the number of rows written.
    pub fn commit(self) -> Result<u64> {
        // into_inner writes the footer (once) and hands the file back.
        self.writer.into_inner()?.commit()?;
        Ok(self.rows)
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
