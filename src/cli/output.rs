//! Writing command output — the one place text reaches a terminal: stdout with broken
//! pipes mapped to an `Io` error (which `main` treats as success), stderr, JSON
//! documents, and aligned tables. Every string printed here goes through
//! [`crate::text::terminal`] / [`crate::text::escape_control`]: attack text, responses,
//! column names, model and file names can hold ESC sequences and bidi overrides, and
//! are shown escaped. JSON escapes control characters itself; `sql --format csv/json`
//! and `--output` files are written byte-exact, not through here.

use std::io::Write;

use crate::error::{Error, Result};

pub fn stdout_line(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{}",
        crate::text::terminal(&crate::secrets::redact(text).0)
    )
    .map_err(|e| Error::io("<stdout>", "cannot write", e))
}

/// A line to stderr, escaped for the terminal (a registered secret redacted in any
/// spelling, as on stdout).
pub fn stderr_line(text: &str) {
    eprintln!("{}", crate::text::terminal(&crate::secrets::redact(text).0));
}

pub fn json<T: serde::Serialize>(value: &T) -> Result<()> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| Error::Internal(format!("cannot encode JSON: {e}")))?;
    stdout_line(&text)
}

/// A left-aligned text table: first column left, the rest right-aligned.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let esc = |s: &str| crate::text::escape_control(s).into_owned();
    let headers: Vec<String> = headers.iter().map(|h| esc(h)).collect();
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().map(|c| esc(c)).collect())
        .collect();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |cells: &mut dyn Iterator<Item = &str>, out: &mut String| {
        let parts: Vec<String> = cells
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, w))| {
                if i == 0 {
                    format!("{c:<w$}")
                } else {
                    format!("{c:>w$}")
                }
            })
            .collect();
        out.push_str(parts.join("  ").trim_end());
        out.push('\n');
    };
    line(&mut headers.iter().map(String::as_str), &mut out);
    line(
        &mut widths
            .iter()
            .map(|w| "-".repeat(*w))
            .collect::<Vec<_>>()
            .iter()
            .map(String::as_str),
        &mut out,
    );
    for row in &rows {
        line(&mut row.iter().map(String::as_str), &mut out);
    }
    out
}

/// Lines about setup (a model being pulled or loaded), to stderr.
pub fn notes() -> crate::judge::Notes {
    std::sync::Arc::new(|line: &str| stderr_line(line))
}

/// Query results as a bordered text table (the look of Arrow's pretty printer) with every
/// column name and value escaped for the terminal ([`crate::text::escape_control`]).
pub fn sanitized_batches(batches: &[datafusion::arrow::array::RecordBatch]) -> Result<String> {
    use datafusion::arrow::array::{ArrayRef, RecordBatch, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
    let Some(first) = batches.first() else {
        return Ok(datafusion::arrow::util::pretty::pretty_format_batches(batches)?.to_string());
    };
    let schema = std::sync::Arc::new(Schema::new(
        first
            .schema()
            .fields()
            .iter()
            .map(|f| Field::new(crate::text::escape_control(f.name()), DataType::Utf8, true))
            .collect::<Vec<_>>(),
    ));
    let options = FormatOptions::default().with_display_error(true);
    let mut text = Vec::with_capacity(batches.len());
    for batch in batches {
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(batch.num_columns());
        for column in batch.columns() {
            let formatter = ArrayFormatter::try_new(column.as_ref(), &options)?;
            let values: StringArray = (0..column.len())
                .map(|i| {
                    (!column.is_null(i)).then(|| {
                        crate::text::escape_control(&formatter.value(i).to_string()).into_owned()
                    })
                })
                .collect();
            columns.push(std::sync::Arc::new(values));
        }
        text.push(RecordBatch::try_new(schema.clone(), columns)?);
    }
    Ok(datafusion::arrow::util::pretty::pretty_format_batches(&text)?.to_string())
}

/// A writer that escapes what it passes on for a terminal ([`crate::text::terminal`]),
/// for `sql --format csv/json` when stdout is a terminal: the bytes stay exact when they
/// go to a file or a pipe, and hostile values cannot drive the terminal when shown.
pub struct TerminalWriter<W: Write> {
    inner: W,
    /// An incomplete UTF-8 sequence carried to the next write.
    pending: Vec<u8>,
}

impl<W: Write> TerminalWriter<W> {
    pub fn new(inner: W) -> Self {
        Self {
            inner,
            pending: Vec::new(),
        }
    }
}

impl<W: Write> Write for TerminalWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.pending.extend_from_slice(buf);
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            // A sequence cut at the end of this write: keep it for the next one.
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => self.pending.len(),
        };
        let text = String::from_utf8_lossy(&self.pending[..valid]).into_owned();
        self.inner
            .write_all(crate::text::terminal(&text).as_bytes())?;
        self.pending.drain(..valid);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if !self.pending.is_empty() {
            let text = String::from_utf8_lossy(&self.pending).into_owned();
            self.inner
                .write_all(crate::text::terminal(&text).as_bytes())?;
            self.pending.clear();
        }
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_terminal_writer_escapes_across_writes() {
        let mut w = TerminalWriter::new(Vec::new());
        let text = "a\u{1b}]0;x\u{7}é\u{9b}\u{202e}z\n";
        let bytes = text.as_bytes();
        // Cut inside the two-byte é.
        let cut = text.find('é').unwrap() + 1;
        w.write_all(&bytes[..cut]).unwrap();
        w.write_all(&bytes[cut..]).unwrap();
        w.flush().unwrap();
        let out = String::from_utf8(w.inner).unwrap();
        assert_eq!(out, "a\\u{1b}]0;x\\u{7}é\\u{9b}\\u{202e}z\n");
    }
}
