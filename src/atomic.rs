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
    path: PathBuf,
    tmp: PathBuf,
    writer: Option<ArrowWriter<File>>,
    rows: u64,
}

impl ParquetFile {
    pub fn create(path: &Path, schema: SchemaRef) -> Result<Self> {
        let tmp = temp_path(path)?;
        let file = File::create(&tmp).map_err(|e| Error::io(&tmp, "cannot create", e))?;
        let writer = ArrowWriter::try_new(file, schema, Some(writer_properties()?));
        let mut this = Self {
            path: path.to_path_buf(),
            tmp,
            writer: None,
            rows: 0,
        };
        this.writer = Some(writer?);
        Ok(this)
    }

    pub fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        self.rows += batch.num_rows() as u64;
        self.writer
            .as_mut()
            .expect("open until committed")
            .write(batch)?;
        Ok(())
    }

    /// Close, sync to disk and rename into place; the number of rows written.
    pub fn commit(mut self) -> Result<u64> {
        if let Some(w) = self.writer.take() {
            // into_inner writes the footer (once) and hands the file back.
            let file = w.into_inner()?;
            file.sync_all()
                .map_err(|e| Error::io(&self.tmp, "cannot sync", e))?;
        }
        std::fs::rename(&self.tmp, &self.path)
            .map_err(|e| Error::io(&self.path, "cannot replace", e))?;
        Ok(self.rows)
    }
}

impl Drop for ParquetFile {
    fn drop(&mut self) {
        // Committed files were renamed away; this only removes an abandoned one.
        let _ = std::fs::remove_file(&self.tmp);
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

