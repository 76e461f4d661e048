//! Bounds on what a received run table may make pieval decode. A run folder may come from
//! someone else, and a Parquet file is compressed: a 119 KB `case_results.parquet` can
//! declare a million-to-one expansion (one long value repeated through a dictionary, or a
//! run-length-encoded column of billions of rows). Before any query reads a run's Parquet
//! file, its footer is checked here against [`ParquetLimits`] — only the footer is read,
//! nothing is decoded — and a file that declares more is an error naming it, so a query
//! over every run leaves that run out with a warning (src/engine/tables.rs), and
//! `report` / `export` of it stop with the error. What the footer does not declare (a
//! writer need not record the decoded size of text columns) is bounded again while the
//! file is read (src/engine/bounded.rs): batches cut to [`BATCH_BYTES`] of decoded data,
//! the file's decoded bytes counted against the same limit.

use std::path::Path;

use datafusion::parquet::basic::Type as PhysicalType;
use datafusion::parquet::file::metadata::ParquetMetaData;

use crate::error::{Error, Result};

/// The variable that sets [`ParquetLimits::max_decoded_bytes`].
pub const MAX_DECODED_ENV: &str = "PIEVAL_MAX_DECODED_BYTES";
/// The variable that sets [`ParquetLimits::max_columns`].
pub const MAX_COLUMNS_ENV: &str = "PIEVAL_MAX_PARQUET_COLUMNS";

/// Default decoded bytes of one run file: 32 GiB (an honest run of a million cases with
/// 8 KB responses decodes to about 10 GB).
pub const DEFAULT_MAX_DECODED_BYTES: u64 = 32 << 30;
/// Default columns (leaves) of one run file: pieval's widest table has 45.
pub const DEFAULT_MAX_COLUMNS: usize = 1024;
/// Row groups of one run file at most (pieval writes one per 1M rows or so).
pub const MAX_ROW_GROUPS: usize = 1 << 16;
/// The footer (the file metadata) at most: 8 MiB. Decoded, a footer takes up to about 50
/// times its size; pieval's own are a few hundred KiB (a 500,000-row run: about 0.5 MiB).
pub const MAX_FOOTER_BYTES: u64 = 8 << 20;
/// One page's declared size once decompressed, at most: the reader reserves it from the
/// page header before decompressing, so a header that lies (a 244 KB file of 1 GiB pages)
/// must be refused before any page is read. pieval's pages are at most a few MiB (one
/// response is cut at 1 MiB).
pub const MAX_PAGE_BYTES: u64 = 256 << 20;
/// Pages of one file at most.
pub const MAX_PAGES: u64 = 1 << 22;
/// Decoded bytes of one batch handed to a query at most (a batch of 8,192 rows of 1 MiB
/// responses is cut into 64 pieces): memory follows this, not the file's declared sizes.
pub const BATCH_BYTES: u64 = 128 << 20;

/// The limits in effect (the environment variables, or the defaults).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParquetLimits {
    pub max_decoded_bytes: u64,
    pub max_columns: usize,
}

impl ParquetLimits {
    /// From `PIEVAL_MAX_DECODED_BYTES` (bytes, or with a K, M, G or T suffix: binary
    /// units) and `PIEVAL_MAX_PARQUET_COLUMNS`; a value that does not parse is an error.
    pub fn from_env() -> Result<Self> {
        let max_decoded_bytes = match std::env::var(MAX_DECODED_ENV) {
            Ok(v) => parse_bytes(&v).ok_or_else(|| {
                Error::Usage(format!(
                    "{MAX_DECODED_ENV}={:?}: give bytes, e.g. 68719476736 or 64G",
                    crate::text::excerpt(&v, 40)
                ))
            })?,
            Err(_) => DEFAULT_MAX_DECODED_BYTES,
        };
        let max_columns = match std::env::var(MAX_COLUMNS_ENV) {
            Ok(v) => v
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=1 << 20).contains(n))
                .ok_or_else(|| {
                    Error::Usage(format!(
                        "{MAX_COLUMNS_ENV}={:?}: give a number of columns from 1 to 1048576",
                        crate::text::excerpt(&v, 40)
                    ))
                })?,
            Err(_) => DEFAULT_MAX_COLUMNS,
        };
        Ok(Self {
            max_decoded_bytes,
            max_columns,
        })
    }
}

/// `123`, `64K`, `512M`, `32G`, `1T` (binary units; `KiB`, `MiB` … and `B` accepted too).
pub fn parse_bytes(text: &str) -> Option<u64> {
    let t = text.trim();
    let digits = t.bytes().take_while(u8::is_ascii_digit).count();
    let (num, unit) = t.split_at(digits);
    let n: u64 = num.parse().ok()?;
    let shift = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return None,
    };
    n.checked_mul(1u64 << shift).filter(|n| *n > 0)
}

/// Human bytes for messages: `103.0 GiB`.
pub fn human(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.1} GiB", b / (1u64 << 30) as f64)
    } else if b >= (1u64 << 20) as f64 {
        format!("{:.1} MiB", b / (1u64 << 20) as f64)
    } else {
        format!("{bytes} bytes")
    }
}

/// Read and check a Parquet file's footer: it parses, it is at most [`MAX_FOOTER_BYTES`],
/// every column chunk and page index lies inside the file, and the columns, row groups
/// and decoded bytes it declares are within `limits`. Only the footer is read.
pub fn check_parquet(path: &Path, limits: &ParquetLimits) -> Result<ParquetMetaData> {
    check_parquet_file(path, crate::files::Links::Refuse, limits)
}

/// A run-folder Parquet file pieval wrote itself (`what`: "judgements", "reviews"),
/// checked first ([`check_parquet_file`]), opened without following links and read
/// `batch` rows at a time. Errors name the file: "not a {what} file: …".
pub fn own_file_reader(
    path: &Path,
    links: crate::files::Links,
    what: &str,
    batch: usize,
) -> Result<datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReader> {
    use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let limits = ParquetLimits::from_env()?;
    let bad = |m: String| Error::config(path, format!("not a {what} file: {m}"));
    check_parquet_file(path, links, &limits).map_err(|e| match e {
        Error::Config { message, .. } => bad(message),
        other => other,
    })?;
    let file = crate::files::open_regular(path, links)?;
    ParquetRecordBatchReaderBuilder::try_new(file)
        .map_err(|e| bad(e.to_string()))?
        .with_batch_size(batch)
        .build()
        .map_err(|e| bad(e.to_string()))
}

/// [`check_parquet`] of a file that may be the user's own (a predictions file, labels, a
/// `--table`): `links` says whether its name may be a symbolic link.
pub fn check_parquet_file(
    path: &Path,
    links: crate::files::Links,
    limits: &ParquetLimits,
) -> Result<ParquetMetaData> {
    // Regular, and in a run folder never through a link (src/files.rs).
    let file = crate::files::open_regular(path, links)?;
    let len = file
        .metadata()
        .map_err(|e| Error::io(path, "cannot read", e))?
        .len();
    check_parquet_chunks(&file, len, path, limits)
}

/// [`check_parquet_file`] of a Parquet file already read, or open: `len` bytes that
/// `file` reads (a `File`, or the file's bytes in memory: what is checked is then what is
/// decoded); `path` names it in errors.
pub fn check_parquet_chunks<R: datafusion::parquet::file::reader::ChunkReader>(
    file: &R,
    len: u64,
    path: &Path,
    limits: &ParquetLimits,
) -> Result<ParquetMetaData> {
    check_parquet_groups(file, len, path, limits, None)
}

/// [`check_parquet_chunks`], with the page headers walked only in the row groups `groups`
/// names (sorted; `None`: all): what a reader of those groups alone decodes is bounded, and a
/// file on object storage is not read whole for its headers (`Some(&[])`: the footer's
/// checks only, for the process that cuts the file; each reader checks its own groups).
pub fn check_parquet_groups<R: datafusion::parquet::file::reader::ChunkReader>(
    file: &R,
    len: u64,
    path: &Path,
    limits: &ParquetLimits,
    groups: Option<&[usize]>,
) -> Result<ParquetMetaData> {
    let bad = |m: String| Error::config(path, m);
    if len < 12 {
        return Err(bad(
            "not a readable Parquet file: shorter than a footer".into()
        ));
    }
    let tail = file
        .get_bytes(len - 8, 8)
        .map_err(|e| bad(format!("not a readable Parquet file: {e}")))?;
    if tail.len() < 8 {
        return Err(bad(
            "not a readable Parquet file: shorter than a footer".into()
        ));
    }
    let footer = u32::from_le_bytes(tail[..4].try_into().expect("4 bytes")) as u64;
    if footer > MAX_FOOTER_BYTES {
        return Err(bad(format!(
            "not a readable Parquet file: a footer of {} (at most {})",
            human(footer),
            human(MAX_FOOTER_BYTES)
        )));
    }
    let meta = datafusion::parquet::file::metadata::ParquetMetaDataReader::new()
        .parse_and_finish(file)
        .map_err(|e| bad(format!("not a readable Parquet file: {e}")))?;
    // The data region: after the leading magic, before the footer.
    let data_end = len.saturating_sub(8 + footer);
    let columns = meta.file_metadata().schema_descr().num_columns();
    if columns > limits.max_columns {
        return Err(bad(format!(
            "{columns} columns, more than the {} a run table may have ({MAX_COLUMNS_ENV} raises it)",
            limits.max_columns
        )));
    }
    if meta.num_row_groups() > MAX_ROW_GROUPS {
        return Err(bad(format!(
            "{} row groups, more than {MAX_ROW_GROUPS}",
            meta.num_row_groups()
        )));
    }
    let mut decoded: u64 = 0;
    for (g, rg) in meta.row_groups().iter().enumerate() {
        let rows = u64::try_from(rg.num_rows())
            .map_err(|_| bad(format!("row group {g}: a negative row count")))?;
        for c in rg.columns() {
            let name = c.column_path().string();
            let name = crate::text::excerpt(&name, 60);
            let range = |what: &str, start: Option<i64>, length: Option<i64>| -> Result<()> {
                let (Some(start), Some(length)) = (start, length) else {
                    return Ok(());
                };
                let ok = start >= 0
                    && length >= 0
                    && (start as u64)
                        .checked_add(length as u64)
                        .is_some_and(|end| end <= data_end);
                if ok {
                    Ok(())
                } else {
                    Err(bad(format!(
                        "damaged: row group {g}, column {name}: its {what} (bytes {start} + {length}) lies outside the file's {data_end} bytes of data"
                    )))
                }
            };
            // (not ColumnChunkMetaData::byte_range, which panics on a negative offset)
            let start = c.dictionary_page_offset().unwrap_or(c.data_page_offset());
            range("pages", Some(start), Some(c.compressed_size()))?;
            if c.data_page_offset() < start {
                range("pages", Some(c.data_page_offset()), Some(-1))?;
            }
            range(
                "offset index",
                c.offset_index_offset(),
                c.offset_index_length().map(i64::from),
            )?;
            range(
                "column index",
                c.column_index_offset(),
                c.column_index_length().map(i64::from),
            )?;
            let values = u64::try_from(c.num_values()).unwrap_or(u64::MAX).max(rows);
            let width: u64 = match c.column_type() {
                PhysicalType::BOOLEAN => 1,
                PhysicalType::INT32 | PhysicalType::FLOAT => 4,
                PhysicalType::INT64 | PhysicalType::DOUBLE => 8,
                PhysicalType::INT96 => 12,
                PhysicalType::FIXED_LEN_BYTE_ARRAY => c.column_descr().type_length().max(0) as u64,
                // a view or offset of 4 to 16 bytes, plus the bytes below
                PhysicalType::BYTE_ARRAY => 4,
            };
            let text = c
                .unencoded_byte_array_data_bytes()
                .map_or(0, |b| b.max(0) as u64);
            let declared = c.uncompressed_size().max(0) as u64;
            let chunk = values
                .saturating_mul(width)
                .saturating_add(text)
                .max(declared);
            decoded = decoded.saturating_add(chunk);
        }
    }
    let indexed = meta.row_groups().iter().any(|rg| {
        rg.columns()
            .iter()
            .any(|c| c.offset_index_offset().is_some())
    });
    if indexed {
        // The page index, which a query reads to find pages: each page within its chunk.
        use datafusion::parquet::file::metadata::PageIndexPolicy;
        let with_index = datafusion::parquet::file::metadata::ParquetMetaDataReader::new()
            .with_page_index_policy(PageIndexPolicy::Optional)
            .parse_and_finish(file)
            .map_err(|e| bad(format!("damaged: its page index does not read: {e}")))?;
        if let Some(index) = with_index.offset_index() {
            for (g, (rg, cols)) in with_index.row_groups().iter().zip(index).enumerate() {
                for (c, oi) in rg.columns().iter().zip(cols) {
                    let start = c.dictionary_page_offset().unwrap_or(c.data_page_offset());
                    let end = start.saturating_add(c.compressed_size());
                    for p in oi.page_locations() {
                        let inside = p.offset >= start
                            && p.compressed_page_size >= 0
                            && p.offset.saturating_add(i64::from(p.compressed_page_size)) <= end;
                        if !inside {
                            return Err(bad(format!(
                                "damaged: row group {g}, column {}: the page index puts a page (bytes {} + {}) outside the column's bytes {start} to {end}",
                                crate::text::excerpt(&c.column_path().string(), 60),
                                p.offset,
                                p.compressed_page_size
                            )));
                        }
                    }
                }
            }
        }
    }
    // Every page header (the footer does not bind them): each page's declared size, and
    // their sum against the same limit.
    decoded = decoded.max(check_pages(file, path, &meta, groups)?);
    if decoded > limits.max_decoded_bytes {
        return Err(bad(format!(
            "declares {} of data once decoded ({} rows, {} on disk), more than the {} a run table may decode; \
             if the run is genuine, raise {MAX_DECODED_ENV}",
            human(decoded),
            meta.file_metadata().num_rows(),
            human(len),
            human(limits.max_decoded_bytes)
        )));
    }
    Ok(meta)
}

/// Walk every page header of every column chunk (a seek and a small read per page) and
/// return the sum of their declared decompressed sizes; a page over [`MAX_PAGE_BYTES`], a
/// header that does not parse, or a page that runs past its chunk is an error naming the
/// file. Parquet's `PageHeader` is Thrift's compact protocol: fields 2 and 3 are the
/// uncompressed and compressed sizes (parquet-format, `PageHeader`).
fn check_pages<R: datafusion::parquet::file::reader::ChunkReader>(
    file: &R,
    path: &Path,
    meta: &ParquetMetaData,
    groups: Option<&[usize]>,
) -> Result<u64> {
    let bad = |m: String| Error::config(path, format!("damaged: {m}"));
    let mut total: u64 = 0;
    let mut pages: u64 = 0;
    let mut buf = Vec::new();
    for (g, rg) in meta.row_groups().iter().enumerate() {
        if groups.is_some_and(|only| only.binary_search(&g).is_err()) {
            continue;
        }
        for c in rg.columns() {
            let start = c.dictionary_page_offset().unwrap_or(c.data_page_offset());
            let end = start.saturating_add(c.compressed_size());
            let mut pos = start;
            while pos < end {
                pages += 1;
                if pages > MAX_PAGES {
                    return Err(bad(format!("more than {MAX_PAGES} pages")));
                }
                // A header is small; statistics can make it longer: read more if needed.
                let mut header = None;
                for want in [4u64 << 10, 64 << 10, 1 << 20] {
                    let n = want.min((end - pos) as u64);
                    let read = file.get_bytes(pos as u64, n as usize).map_err(|e| {
                        bad(format!("cannot read a page header at byte {pos}: {e}"))
                    })?;
                    if (read.len() as u64) < n {
                        return Err(bad(format!(
                            "a page header at byte {pos} runs past the file"
                        )));
                    }
                    buf.clear();
                    buf.extend_from_slice(&read);
                    match page_header(&buf) {
                        Some(h) => {
                            header = Some(h);
                            break;
                        }
                        None if n < want => break,
                        None => {}
                    }
                }
                let name = || crate::text::excerpt(&c.column_path().string(), 60);
                let Some((len, uncompressed, compressed)) = header else {
                    return Err(bad(format!(
                        "row group {g}, column {}: a page header at byte {pos} does not read",
                        name()
                    )));
                };
                if uncompressed < 0 || compressed < 0 {
                    return Err(bad(format!(
                        "row group {g}, column {}: a page at byte {pos} declares a negative size",
                        name()
                    )));
                }
                if uncompressed as u64 > MAX_PAGE_BYTES {
                    return Err(Error::config(
                        path,
                        format!(
                            "row group {g}, column {}: a page at byte {pos} declares {} once decompressed, more than the {} a page may hold (a decompression bomb, or not a file pieval reads)",
                            name(),
                            human(uncompressed as u64),
                            human(MAX_PAGE_BYTES)
                        ),
                    ));
                }
                total = total.saturating_add(uncompressed as u64);
                pos = pos
                    .saturating_add(len as i64)
                    .saturating_add(i64::from(compressed));
            }
            if pos != end {
                return Err(bad(format!(
                    "row group {g}, column {}: its pages run past the column's bytes",
                    crate::text::excerpt(&c.column_path().string(), 60)
                )));
            }
        }
    }
    Ok(total)
}

/// A page header in Thrift's compact protocol: (its length in bytes, uncompressed size,
/// compressed size); `None` when `b` does not hold a whole, well-formed header.
fn page_header(b: &[u8]) -> Option<(usize, i32, i32)> {
    let mut r = Compact { b, at: 0 };
    let (mut uncompressed, mut compressed) = (None, None);
    let mut last = 0i16;
    loop {
        let byte = r.byte()?;
        if byte == 0 {
            break;
        }
        let kind = byte & 0x0f;
        let delta = i16::from(byte >> 4);
        let id = if delta == 0 {
            r.zigzag()? as i16
        } else {
            last.checked_add(delta)?
        };
        last = id;
        match (id, kind) {
            (2, 5) => uncompressed = Some(i32::try_from(r.zigzag()?).ok()?),
            (3, 5) => compressed = Some(i32::try_from(r.zigzag()?).ok()?),
            _ => r.skip(kind, 0)?,
        }
    }
    Some((r.at, uncompressed?, compressed?))
}

/// A reader of Thrift's compact protocol, enough to skip any value.
struct Compact<'a> {
    b: &'a [u8],
    at: usize,
}

impl Compact<'_> {
    fn byte(&mut self) -> Option<u8> {
        let v = *self.b.get(self.at)?;
        self.at += 1;
        Some(v)
    }
    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..70).step_by(7) {
            let byte = self.byte()?;
            v |= u64::from(byte & 0x7f).checked_shl(shift)?;
            if byte & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }
    fn zigzag(&mut self) -> Option<i64> {
        let v = self.varint()?;
        Some((v >> 1) as i64 ^ -((v & 1) as i64))
    }
    fn take(&mut self, n: u64) -> Option<()> {
        let end = self.at.checked_add(usize::try_from(n).ok()?)?;
        (end <= self.b.len()).then(|| self.at = end)
    }
    /// Skip one value of compact type `kind` (nesting at most 32 deep).
    fn skip(&mut self, kind: u8, depth: u8) -> Option<()> {
        if depth > 32 {
            return None;
        }
        match kind {
            1 | 2 => Some(()),
            3 => self.take(1),
            4..=6 => self.varint().map(|_| ()),
            7 => self.take(8),
            8 => {
                let n = self.varint()?;
                self.take(n)
            }
            9 | 10 => {
                let h = self.byte()?;
                let n = match h >> 4 {
                    15 => self.varint()?,
                    n => u64::from(n),
                };
                let elem = h & 0x0f;
                for _ in 0..n {
                    // a boolean in a list is one byte
                    if elem == 1 || elem == 2 {
                        self.take(1)?;
                    } else {
                        self.skip(elem, depth + 1)?;
                    }
                }
                Some(())
            }
            11 => {
                let n = self.varint()?;
                if n == 0 {
                    return Some(());
                }
                let types = self.byte()?;
                for _ in 0..n {
                    self.skip(types >> 4, depth + 1)?;
                    self.skip(types & 0x0f, depth + 1)?;
                }
                Some(())
            }
            12 => {
                let mut last = 0i16;
                loop {
                    let byte = self.byte()?;
                    if byte == 0 {
                        return Some(());
                    }
                    let delta = i16::from(byte >> 4);
                    last = if delta == 0 {
                        self.zigzag()? as i16
                    } else {
                        last.checked_add(delta)?
                    };
                    let _ = last;
                    self.skip(byte & 0x0f, depth + 1)?;
                }
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_parse_in_binary_units() {
        assert_eq!(parse_bytes("123"), Some(123));
        assert_eq!(parse_bytes("64K"), Some(64 << 10));
        assert_eq!(parse_bytes("32 GiB"), Some(32 << 30));
        assert_eq!(parse_bytes("1t"), Some(1 << 40));
        for bad in ["", "0", "-1", "1.5G", "12Q", "99999999999T"] {
            assert_eq!(parse_bytes(bad), None, "{bad}");
        }
        assert_eq!(human(110_595_407_872), "103.0 GiB");
    }

    /// A file whose pages decompress to more than a page may hold is refused from its page
    /// headers, before any page is read (the footer need not say so); an honest file of
    /// several pages and a dictionary passes, its pages summed.
    #[test]
    fn page_headers_are_checked_before_any_page_is_read() {
        use datafusion::arrow::array::{RecordBatch, StringArray};
        use datafusion::arrow::datatypes::{DataType, Field, Schema};
        use datafusion::parquet::arrow::ArrowWriter;
        use datafusion::parquet::basic::{Compression, ZstdLevel};
        use datafusion::parquet::file::properties::WriterProperties;
        use std::sync::Arc;
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, values: Vec<String>| {
            let path = dir.path().join(name);
            let schema = Arc::new(Schema::new(vec![Field::new("t", DataType::Utf8, false)]));
            let props = WriterProperties::builder()
                .set_compression(Compression::ZSTD(ZstdLevel::default()))
                .set_statistics_enabled(
                    datafusion::parquet::file::properties::EnabledStatistics::None,
                )
                .build();
            let file = std::fs::File::create(&path).unwrap();
            let mut w = ArrowWriter::try_new(file, Arc::clone(&schema), Some(props)).unwrap();
            let batch =
                RecordBatch::try_new(schema, vec![Arc::new(StringArray::from(values))]).unwrap();
            w.write(&batch).unwrap();
            w.close().unwrap();
            path
        };
        let limits = ParquetLimits {
            max_decoded_bytes: DEFAULT_MAX_DECODED_BYTES,
            max_columns: DEFAULT_MAX_COLUMNS,
        };
        // Honest: 20,000 rows over many pages, a dictionary among them.
        let honest = write(
            "honest.parquet",
            (0..20_000)
                .map(|i| format!("response {} {i}", i % 7))
                .collect(),
        );
        check_parquet(&honest, &limits).unwrap();
        let f = std::fs::File::open(&honest).unwrap();
        let meta = check_parquet(&honest, &limits).unwrap();
        let summed = check_pages(&f, &honest, &meta, None).unwrap();
        assert!(summed > 100_000, "{summed}");
        // A bomb: one value of 300 MiB, a few KiB on disk.
        let bomb = write("bomb.parquet", vec!["a".repeat(300 << 20)]);
        assert!(std::fs::metadata(&bomb).unwrap().len() < 1 << 20);
        let e = check_parquet(&bomb, &limits).unwrap_err().to_string();
        assert!(
            e.contains("bomb.parquet") && e.contains("more than the 256.0 MiB a page may hold"),
            "{e}"
        );
        // Headers that do not parse are not pages.
        assert_eq!(page_header(&[0x15]), None);
        assert_eq!(
            page_header(&[0x15, 0x00, 0x15, 0x04, 0x15, 0x02, 0x00]),
            Some((7, 2, 1))
        );
    }
}
