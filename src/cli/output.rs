//! Writing command output: stdout with broken pipes mapped to an `Io` error (which
//! `main` treats as success), JSON documents, and simple aligned tables.

use std::io::Write;

use crate::error::{Error, Result};

pub fn stdout_line(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}").map_err(|e| Error::io("<stdout>", "cannot write", e))
}

pub fn json<T: serde::Serialize>(value: &T) -> Result<()> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| Error::Internal(format!("cannot encode JSON: {e}")))?;
    stdout_line(&text)
}

/// A left-aligned text table: first column left, the rest right-aligned.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
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
    line(&mut headers.iter().copied(), &mut out);
    line(
        &mut widths
            .iter()
            .map(|w| "-".repeat(*w))
            .collect::<Vec<_>>()
            .iter()
            .map(String::as_str),
        &mut out,
    );
    for row in rows {
        line(&mut row.iter().map(String::as_str), &mut out);
    }
    out
}

/// Lines about setup (a model being pulled or loaded), to stderr.
pub fn notes() -> crate::judge::Notes {
    std::sync::Arc::new(|line: &str| eprintln!("{line}"))
}
