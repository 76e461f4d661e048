//! A line reader for JSONL that never holds more than one bounded line, and computes
//! the sha256 of every byte it reads in the same pass.
//!
//! A line longer than the limit is not buffered: its bytes are hashed and skipped and
//! the line is reported as [`Line::TooLong`], so a multi-gigabyte line cannot exhaust
//! memory and the lines after it are still checked.

use std::io::{self, Read};
use std::sync::mpsc::{SyncSender, sync_channel};
use std::thread::JoinHandle;

use sha2::{Digest, Sha256};

/// Default longest accepted line (`--max-line-bytes`).
pub const DEFAULT_MAX_LINE_BYTES: usize = 1 << 20;
const READ_CHUNK: usize = 1 << 20;

pub enum Line<'a> {
    /// The line without its `\n` (and without a trailing `\r`).
    Bytes(&'a [u8]),
    /// The line exceeded the limit; `len` is its full length in bytes.
    TooLong { len: u64 },
}

pub struct LineReader<R> {
    src: R,
    buf: Vec<u8>,
    /// Unconsumed bytes are `buf[start..end]`; `scanned` marks where the newline search
    /// resumes, so a long partial line is never scanned twice.
    start: usize,
    end: usize,
    scanned: usize,
    eof: bool,
    max_line: usize,
    /// Length so far of an over-long line being skipped.
    skipping: Option<u64>,
    hasher: BackgroundSha256,
    bytes_read: u64,
    line_no: u64,
}

impl<R: Read> LineReader<R> {
    /// A reader that hashes on a helper thread (for callers that parse on this one).
    pub fn new(src: R, max_line: usize) -> Self {
        Self::with_hasher(src, max_line, BackgroundSha256::spawn())
    }

    /// A reader that hashes on the calling thread (for a thread that only reads).
    pub fn with_inline_hash(src: R, max_line: usize) -> Self {
        Self::with_hasher(
            src,
            max_line,
            BackgroundSha256::Inline(Box::new(Sha256::new())),
        )
    }

    /// A reader that does not hash (a slice of a file, whose digest is taken whole
    /// elsewhere).
    pub fn without_hash(src: R, max_line: usize) -> Self {
        Self::with_hasher(src, max_line, BackgroundSha256::Off)
    }

    fn with_hasher(src: R, max_line: usize, hasher: BackgroundSha256) -> Self {
        // The buffer starts small and grows (doubling) only as a long line needs it: a
        // generous --max-line-bytes costs nothing until a line that long comes.
        let cap = (max_line.min(16 << 20).saturating_add(READ_CHUNK)).max(4 * READ_CHUNK);
        Self {
            src,
            buf: vec![0; cap],
            start: 0,
            end: 0,
            scanned: 0,
            eof: false,
            max_line,
            skipping: None,
            hasher,
            bytes_read: 0,
            line_no: 0,
        }
    }

    /// 1-based number of the line last returned.
    pub fn line_no(&self) -> u64 {
        self.line_no
    }

    pub fn bytes_read(&self) -> u64 {
        self.bytes_read
    }

    /// Bytes consumed: read and returned as lines (with their newlines), or skipped.
    /// Past the last line returned, this is where the next line starts.
    pub fn consumed(&self) -> u64 {
        self.bytes_read - (self.end - self.start) as u64
    }

    /// The sha256 of the whole input; call once `next_line` gave `None`.
    pub fn sha256_hex(&mut self) -> String {
        self.hasher.finish()
    }

    pub fn next_line(&mut self) -> io::Result<Option<Line<'_>>> {
        let (s, e) = loop {
            if let Some(i) = memchr::memchr(b'\n', &self.buf[self.scanned..self.end]) {
                let nl = self.scanned + i;
                let (s, e) = (self.start, nl);
                self.start = nl + 1;
                self.scanned = self.start;
                let skipped = self.skipping.take();
                let len = skipped.unwrap_or(0) + (e - s) as u64;
                if skipped.is_some() || len > self.max_line as u64 {
                    self.line_no += 1;
                    return Ok(Some(Line::TooLong { len }));
                }
                break (s, e);
            }
            self.scanned = self.end;
            let pending = self.end - self.start;
            if pending > self.max_line {
                // Drop the partial over-long line; keep counting its length.
                *self.skipping.get_or_insert(0) += pending as u64;
                self.start = self.end;
                self.scanned = self.end;
            }
            if self.eof {
                if let Some(skipped) = self.skipping.take() {
                    self.line_no += 1;
                    let len = skipped + (self.end - self.start) as u64;
                    self.start = self.end;
                    return Ok(Some(Line::TooLong { len }));
                }
                if self.start < self.end {
                    let (s, e) = (self.start, self.end);
                    if e - s > self.max_line {
                        self.start = self.end;
                        self.line_no += 1;
                        return Ok(Some(Line::TooLong {
                            len: (e - s) as u64,
                        }));
                    }
                    self.start = self.end;
                    self.scanned = self.end;
                    break (s, e);
                }
                return Ok(None);
            }
            self.fill()?;
        };
        self.line_no += 1;
        let mut line = &self.buf[s..e];
        if let [rest @ .., b'\r'] = line {
            line = rest;
        }
        Ok(Some(Line::Bytes(line)))
    }

    /// Move the unconsumed tail to the front and read another chunk after it.
    fn fill(&mut self) -> io::Result<()> {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.scanned -= self.start;
            self.start = 0;
        }
        if self.end == self.buf.len() {
            // A line longer than the buffer and within max_line: grow (doubling).
            self.buf.resize(self.buf.len().saturating_mul(2), 0);
        }
        let n = loop {
            match self.src.read(&mut self.buf[self.end..]) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        };
        if n > 0 {
            self.hasher.update(&self.buf[self.end..self.end + n])?;
        }
        self.bytes_read += n as u64;
        self.end += n;
        if n == 0 {
            self.eof = true;
        }
        Ok(())
    }
}

/// sha256 computed on a helper thread, so hashing overlaps parsing. The channel is
/// bounded: at most `QUEUED_CHUNKS` read chunks wait to be hashed. If no thread can be
/// started, hashing happens inline.
enum BackgroundSha256 {
    Thread {
        tx: Option<SyncSender<Vec<u8>>>,
        worker: Option<JoinHandle<String>>,
    },
    Inline(Box<Sha256>),
    Done(String),
    /// Not hashing ([`LineReader::without_hash`]).
    Off,
}

const QUEUED_CHUNKS: usize = 8;

impl BackgroundSha256 {
    fn spawn() -> Self {
        let (tx, rx) = sync_channel::<Vec<u8>>(QUEUED_CHUNKS);
        let worker = std::thread::Builder::new()
            .name("pieval-sha256".into())
            .spawn(move || {
                let mut h = Sha256::new();
                for chunk in rx {
                    h.update(&chunk);
                }
                hex::encode(h.finalize())
            });
        match worker {
            Ok(worker) => BackgroundSha256::Thread {
                tx: Some(tx),
                worker: Some(worker),
            },
            Err(_) => BackgroundSha256::Inline(Box::new(Sha256::new())),
        }
    }

    fn update(&mut self, data: &[u8]) -> io::Result<()> {
        match self {
            BackgroundSha256::Thread { tx: Some(tx), .. } => tx
                .send(data.to_vec())
                .map_err(|_| io::Error::other("the sha256 thread stopped")),
            BackgroundSha256::Inline(h) => {
                h.update(data);
                Ok(())
            }
            BackgroundSha256::Off => Ok(()),
            _ => Err(io::Error::other("sha256 already finished")),
        }
    }

    fn finish(&mut self) -> String {
        let digest = match self {
            BackgroundSha256::Done(d) => return d.clone(),
            BackgroundSha256::Off => return String::new(),
            BackgroundSha256::Inline(h) => hex::encode(h.clone().finalize()),
            BackgroundSha256::Thread { tx, worker } => {
                tx.take();
                // The worker only hashes; it cannot fail short of a panic in sha2.
                worker
                    .take()
                    .and_then(|w| w.join().ok())
                    .unwrap_or_default()
            }
        };
        *self = BackgroundSha256::Done(digest.clone());
        digest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8], max: usize) -> Vec<String> {
        let mut r = LineReader::new(input, max);
        let mut out = Vec::new();
        while let Some(l) = r.next_line().unwrap() {
            out.push(match l {
                Line::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
                Line::TooLong { len } => format!("<too long: {len}>"),
            });
        }
        assert_eq!(r.sha256_hex(), hex::encode(Sha256::digest(input)));
        out
    }

    #[test]
    fn splits_lines_and_hashes_everything() {
        assert_eq!(lines(b"a\nbb\r\n\nccc", 10), ["a", "bb", "", "ccc"]);
        assert_eq!(lines(b"a\n", 10), ["a"]);
        assert!(lines(b"", 10).is_empty());
    }

    #[test]
    fn over_long_lines_are_skipped_not_buffered() {
        let mut input = b"ok\n".to_vec();
        input.extend(std::iter::repeat_n(b'x', 9 * READ_CHUNK + 7));
        input.extend(b"\nafter\n");
        input.extend(std::iter::repeat_n(b'y', 5 * READ_CHUNK));
        let got = lines(&input, 100);
        assert_eq!(
            got,
            [
                "ok".to_owned(),
                format!("<too long: {}>", 9 * READ_CHUNK + 7),
                "after".to_owned(),
                format!("<too long: {}>", 5 * READ_CHUNK)
            ]
        );
    }

    #[test]
    fn a_line_at_the_limit_is_kept() {
        let mut input = vec![b'z'; 100];
        input.push(b'\n');
        assert_eq!(lines(&input, 100), ["z".repeat(100)]);
        input.insert(0, b'z');
        assert_eq!(lines(&input, 100), ["<too long: 101>"]);
    }
}
