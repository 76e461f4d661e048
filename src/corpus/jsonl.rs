//! The parallel JSONL path of the corpus reader.
//!
//! ```text
//!  reader thread ──blocks of whole lines──▶ N check workers ──results──▶ consumer
//!  (LineReader: bounded lines,             (parse, contract check,        (reorders by
//!   sha256 on its own thread)               Arrow rows per block)          sequence, global
//!                                                                          duplicate ids, caps
//!                                                                          the report)
//! ```
//!
//! Blocks hold at most [`BLOCK_BYTES`] bytes or `batch_size` lines and the channels are
//! bounded, so memory stays bounded whatever the file size. Results are consumed in
//! file order, so reports are identical to a sequential read.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use datafusion::arrow::array::RecordBatch;

use super::batch::{CaseBatchBuilder, IdKeys, ReadOptions, json_error_message};
use super::includes::Includes;
use super::lines::{Line, LineReader};
use crate::contract::Level;
use crate::contract::record::{CriteriaCache, FieldValue, RawRecord, Violation, check_record};

/// Bytes of line data per block handed to a worker.
pub const BLOCK_BYTES: usize = 4 << 20;
/// Blocks (and results) in flight per channel.
const QUEUE: usize = 4;

pub struct Block {
    seq: u64,
    first_line: u64,
    data: Vec<u8>,
    items: Vec<Item>,
}

enum Item {
    /// A line: byte range in `data`.
    Line(usize, usize),
    /// An over-long line, skipped by the reader: its length.
    TooLong(u64),
}

/// A case id seen in a block, for the consumer's in-order duplicate check.
pub struct IdEntry {
    pub line: u64,
    pub hash: u128,
    /// Byte range of the id in [`BlockResult::id_text`] (one buffer per block, not an
    /// allocation per record).
    pub id: std::ops::Range<usize>,
    /// Whether the record was otherwise valid (it counts as valid until found a duplicate).
    pub valid: bool,
    /// Its row in the block's batch, when one was built for it.
    pub row: Option<usize>,
}

pub struct BlockResult {
    pub seq: u64,
    pub records: u64,
    pub valid: u64,
    pub violations: Vec<Violation>,
    pub ids: Vec<IdEntry>,
    pub id_text: String,
    pub batch: Option<datafusion::arrow::error::Result<RecordBatch>>,
}

pub struct Pipeline {
    /// The shared environment files its records included.
    includes: Arc<Includes>,
    results: Receiver<BlockResult>,
    reader: Option<JoinHandle<io::Result<(String, u64)>>>,
    pending: BTreeMap<u64, BlockResult>,
    next_seq: u64,
    /// With no check worker no block is ever checked: an error, not an empty report.
    workers_started: usize,
}

/// What the pipeline says when the input is exhausted.
pub enum Next {
    Block(BlockResult),
    /// All blocks consumed: sha256 and byte count of the file, and the digest of the
    /// shared environment files its records included (`None`: none).
    End {
        sha256: String,
        bytes: u64,
        includes_sha256: Option<String>,
    },
}

impl Pipeline {
    pub fn start(file: File, opts: &ReadOptions, keys: IdKeys) -> Self {
        let (block_tx, block_rx) = sync_channel::<Block>(QUEUE);
        let (result_tx, results) = sync_channel::<BlockResult>(QUEUE);
        let (max_line, batch_size) = (opts.max_line_bytes, opts.batch_size.max(1));
        let reader = std::thread::Builder::new()
            .name("pieval-read".into())
            .spawn(move || read_blocks(file, max_line, batch_size, block_tx))
            .ok();
        let block_rx = Arc::new(Mutex::new(block_rx));
        let workers = std::thread::available_parallelism()
            .map_or(2, |n| n.get())
            .clamp(1, 4);
        let mut workers_started = 0;
        let includes = Arc::new(Includes::new(opts.base_dir.clone()));
        for i in 0..workers {
            let (rx, tx, opts, keys, includes) = (
                Arc::clone(&block_rx),
                result_tx.clone(),
                opts.clone(),
                keys.clone(),
                Arc::clone(&includes),
            );
            let started = std::thread::Builder::new()
                .name(format!("pieval-check-{i}"))
                .spawn(move || check_worker(&rx, &tx, &opts, &keys, &includes));
            workers_started += usize::from(started.is_ok());
        }
        Pipeline {
            includes,
            results,
            reader,
            workers_started,
            pending: BTreeMap::new(),
            next_seq: 0,
        }
    }

    /// The next block's result in file order, or the end of input.
    pub fn next(&mut self) -> io::Result<Next> {
        loop {
            if let Some(r) = self.pending.remove(&self.next_seq) {
                self.next_seq += 1;
                return Ok(Next::Block(r));
            }
            match self.results.recv() {
                Ok(r) => {
                    self.pending.insert(r.seq, r);
                }
                Err(_) => break,
            }
        }
        // Every worker has exited: the reader has finished (or failed).
        if self.workers_started == 0 {
            return Err(io::Error::other("could not start any check worker thread"));
        }
        let outcome = match self.reader.take() {
            Some(handle) => handle.join().unwrap_or_else(|_| {
                Err(io::Error::other("the reader thread stopped unexpectedly"))
            })?,
            None => return Err(io::Error::other("could not start the reader thread")),
        };
        if !self.pending.is_empty() {
            return Err(io::Error::other("a check worker stopped unexpectedly"));
        }
        Ok(Next::End {
            sha256: outcome.0,
            bytes: outcome.1,
            includes_sha256: self.includes.digest(),
        })
    }
}

/// Reader thread: cut the file into blocks of whole lines.
fn read_blocks(
    file: File,
    max_line: usize,
    batch_size: usize,
    tx: SyncSender<Block>,
) -> io::Result<(String, u64)> {
    // This thread is the hashing thread: hash inline, no second copy of the bytes.
    let mut lines = LineReader::with_inline_hash(file, max_line);
    let new_block = |seq, first_line| Block {
        seq,
        first_line,
        data: Vec::with_capacity(BLOCK_BYTES + max_line.min(BLOCK_BYTES)),
        items: Vec::new(),
    };
    let mut block = new_block(0, 1);
    while let Some(line) = lines.next_line()? {
        match line {
            Line::Bytes(b) => {
                let start = block.data.len();
                block.data.extend_from_slice(b);
                block.items.push(Item::Line(start, block.data.len()));
            }
            Line::TooLong { len } => block.items.push(Item::TooLong(len)),
        }
        if block.data.len() >= BLOCK_BYTES || block.items.len() >= batch_size {
            let next = new_block(block.seq + 1, lines.line_no() + 1);
            if tx.send(std::mem::replace(&mut block, next)).is_err() {
                // The consumer went away: stop reading.
                return Ok((String::new(), lines.bytes_read()));
            }
        }
    }
    if !block.items.is_empty() {
        let _ = tx.send(block);
    }
    Ok((lines.sha256_hex(), lines.bytes_read()))
}

fn check_worker(
    rx: &Mutex<Receiver<Block>>,
    tx: &SyncSender<BlockResult>,
    opts: &ReadOptions,
    keys: &IdKeys,
    includes: &Includes,
) {
    let mut criteria = CriteriaCache::default();
    let mut builder = CaseBatchBuilder::new(opts);
    loop {
        let block = {
            let guard = rx.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            match guard.recv() {
                Ok(b) => b,
                Err(_) => return,
            }
        };
        let result = check_block(&block, opts, keys, includes, &mut criteria, &mut builder);
        if tx.send(result).is_err() {
            return;
        }
    }
}

fn env_index() -> usize {
    crate::contract::fields::case_field_index("environment")
        .expect("the contract has an environment field")
}

/// A record's environment with its `include` resolved: `None` when it has none.
fn resolve_include(
    rec: &RawRecord<'_>,
    includes: &Includes,
    max_bytes: usize,
) -> Result<Option<String>, String> {
    let Some(FieldValue::Object(text)) = rec.fields[env_index()].as_ref() else {
        return Ok(None);
    };
    if !text.contains("\"include\"") {
        return Ok(None);
    }
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let merged = crate::contract::environment::resolve_include(&value, |rel| includes.load(rel))
        .map_err(|e| e.to_string())?;
    // A resolved environment is bounded as a line is: a short line that names a large
    // file does not get past the reader's memory bound.
    match merged {
        Some(m) if m.len() > max_bytes => Err(format!(
            "include: the resolved environment is {} bytes, over the limit of {max_bytes} \
             (--max-line-bytes)",
            m.len()
        )),
        other => Ok(other),
    }
}

fn check_block(
    block: &Block,
    opts: &ReadOptions,
    keys: &IdKeys,
    includes: &Includes,
    criteria: &mut CriteriaCache,
    builder: &mut CaseBatchBuilder,
) -> BlockResult {
    let mut out = BlockResult {
        seq: block.seq,
        records: block.items.len() as u64,
        valid: 0,
        violations: Vec::new(),
        ids: Vec::new(),
        id_text: String::new(),
        batch: None,
    };
    let mut scratch = Vec::new();
    for (k, item) in block.items.iter().enumerate() {
        let no = block.first_line + k as u64;
        let mut bytes = match *item {
            Item::TooLong(len) => {
                let limit = opts.max_line_bytes;
                out.violations.push(Violation::error(
                    no,
                    None,
                    format!("line is {len} bytes, over the limit of {limit} (--max-line-bytes)"),
                ));
                continue;
            }
            Item::Line(s, e) => &block.data[s..e],
        };
        if no == 1 && bytes.starts_with(b"\xEF\xBB\xBF") {
            out.violations.push(Violation::error(
                no,
                None,
                "file starts with a UTF-8 byte-order mark (BOM); save it as UTF-8 without BOM",
            ));
            bytes = &bytes[3..];
        }
        let text = match std::str::from_utf8(bytes) {
            Ok(t) => t,
            Err(e) => {
                out.violations.push(Violation::error(
                    no,
                    None,
                    format!("invalid UTF-8 at byte {} of the line", e.valid_up_to() + 1),
                ));
                continue;
            }
        };
        if text.trim().is_empty() {
            out.violations.push(Violation::error(
                no,
                None,
                "blank line (every line must hold one JSON object)",
            ));
            continue;
        }
        let mut rec = match RawRecord::parse(text) {
            Ok(r) => r,
            Err(e) => {
                out.violations
                    .push(Violation::error(no, None, json_error_message(&e, text)));
                continue;
            }
        };
        scratch.clear();
        let mut include_ok = true;
        match resolve_include(&rec, includes, opts.max_line_bytes) {
            Ok(None) => {}
            Ok(Some(text)) => {
                rec.fields[env_index()] = Some(FieldValue::Object(text.into()));
            }
            Err(problem) => {
                scratch.push(Violation::error(no, Some("environment"), problem));
                rec.fields[env_index()] = None;
                include_ok = false;
            }
        }
        check_record(&rec, no, criteria, &mut scratch);
        let valid = include_ok && scratch.iter().all(|v| v.level == Level::Warning);
        out.violations.append(&mut scratch);
        let row = (valid && opts.build_batches).then(|| builder.len());
        if let Some(FieldValue::Str(id)) = rec.get("case_id") {
            let start = out.id_text.len();
            out.id_text.push_str(id);
            out.ids.push(IdEntry {
                line: no,
                hash: keys.hash(id),
                id: start..out.id_text.len(),
                valid,
                row,
            });
        }
        if valid {
            out.valid += 1;
            if opts.build_batches {
                builder.append(&rec, criteria);
            }
        }
    }
    if builder.len() > 0 {
        out.batch = Some(builder.finish_arrow());
    }
    out
}
