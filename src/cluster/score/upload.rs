//! The run's `case_results.jsonl`, `case_results.parquet` and `findings.parquet` put
//! together by the executors on object storage (docs/cluster.md, "Staging on object
//! storage"): what [`super::assemble`] does on a shared file system, with S3's multipart
//! upload in place of writes at offsets of one file.
//!
//! Once every part is reported, the client starts one multipart upload per file, at its
//! place in the run's new commit folder (`v/COMMIT_ID/`), and cuts the file's bytes into
//! groups of whole pieces ([`plan`]): each group one task, each task's bytes one or more
//! parts of the upload, every part but the file's last at least
//! [`crate::objstore::MIN_PART_BYTES`] (S3's rule). A task reads each of its pieces
//! whole from the staging prefix, checked as the client would check it (size, SHA-256,
//! and a JSONL part's whole lines and rows: [`super::parts::copy_part_from`]), and puts
//! its parts — a Parquet file's header in the first group, its footer (made by the
//! client from the parts' footers alone: [`super::parts::layout_of`]) in the last — and
//! answers with their entity tags. The client completes each upload (the object appears
//! whole, or, aborted, never), then one task per file reads it back for its SHA-256,
//! which the commit records. The parts' bytes never pass through the client.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use base64::Engine;
use datafusion::arrow::array::{AsArray, RecordBatch, StringArray, UInt32Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt32Type};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning,
    PlanProperties, SendableRecordBatchStream,
};
use serde::{Deserialize, Serialize};

use super::SubmitPlan;
use super::assemble::Piece;
use super::parts::{
    CASE_RESULTS_JSONL, KINDS, PARQUET_MAGIC, PartFile, PartReport, copy_part_from, copy_range_from,
};
use super::slices::{check_numbered, each_number, numbered};
use crate::engine::stream_table::{Batches, reader_stream};
use crate::error::{Error, Result};
use crate::objstore::{BlockingObject, FileEntry, Location, MIN_PART_BYTES, Store};

/// The usual size of a part a task puts (a part is held in memory while it is sent);
/// a group's last part takes the remainder, so up to twice this.
const CHUNK_BYTES: u64 = 16 << 20;

/// The size of the parts the client plans: [`CHUNK_BYTES`], or, in debug builds (the
/// tests'), smaller (`PIEVAL_TEST_UPLOAD_CHUNK_BYTES`, never under S3's smallest part:
/// several parts per task at the sizes of a test's files).
fn chunk_bytes() -> u64 {
    cfg!(debug_assertions)
        .then(|| std::env::var("PIEVAL_TEST_UPLOAD_CHUNK_BYTES").ok())
        .flatten()
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(CHUNK_BYTES, |c| c.clamp(MIN_PART_BYTES, CHUNK_BYTES))
}

/// S3's most parts in one upload.
const MAX_PARTS: usize = 10_000;

/// What the tasks of an [`UploadExec`] do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    /// Put each group's parts (one partition per group).
    Upload,
    /// Read each completed file back for its SHA-256 (one partition per file).
    Digest,
}

/// The plan of an [`UploadExec`] (JSON in pieval's plan codec).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct UploadSpec {
    pub step: Step,
    /// The parts prefix (`s3://…/parts`).
    pub parts: String,
    pub targets: Vec<UploadTarget>,
    pub groups: Vec<Group>,
}

/// A run file being uploaded.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct UploadTarget {
    /// Its place (`s3://…/v/COMMIT_ID/case_results.jsonl`).
    pub at: String,
    pub upload_id: String,
    /// Its length once whole.
    pub length: u64,
    /// Once completed: its entity tag (the digest is read on that condition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub e_tag: Option<String>,
}

/// Consecutive pieces of one file, put as the parts `first_part..` of its upload, of
/// the lengths `chunks`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Group {
    pub target: usize,
    /// A Parquet file's first group starts with its header.
    pub header: bool,
    pub pieces: Vec<Piece>,
    /// A Parquet file's last group ends with its footer (Base64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub footer: Option<String>,
    pub first_part: usize,
    pub chunks: Vec<u64>,
}

/// The groups of one file whose pieces have the lengths `pieces`, after a header of
/// `header` bytes and before a footer of `footer`: for each group, its pieces (a range
/// of indexes) and its parts' lengths. Groups take whole pieces until they hold
/// [`MIN_PART_BYTES`]; a short last group joins the one before. A group is cut into parts
/// of `chunk` bytes (between [`MIN_PART_BYTES`] and [`CHUNK_BYTES`]: [`chunk_bytes`]), its
/// last part taking the remainder: every part but the file's last holds at least
/// [`MIN_PART_BYTES`].
pub fn plan(
    pieces: &[u64],
    header: u64,
    footer: u64,
    chunk: u64,
) -> Vec<(std::ops::Range<usize>, Vec<u64>)> {
    let chunk = chunk.clamp(MIN_PART_BYTES, CHUNK_BYTES);
    let mut groups: Vec<(std::ops::Range<usize>, u64)> = Vec::new();
    let (mut start, mut bytes) = (0usize, header);
    for (i, len) in pieces.iter().enumerate() {
        bytes += len;
        if bytes >= MIN_PART_BYTES {
            groups.push((start..i + 1, bytes));
            (start, bytes) = (i + 1, 0);
        }
    }
    bytes += footer;
    if start < pieces.len() || groups.is_empty() || bytes > 0 {
        match groups.last_mut() {
            Some(last) if bytes < MIN_PART_BYTES => {
                last.0.end = pieces.len();
                last.1 += bytes;
            }
            _ => groups.push((start..pieces.len(), bytes)),
        }
    }
    groups
        .into_iter()
        .map(|(range, len)| {
            let n = (len / chunk).max(1);
            let mut chunks = vec![chunk; n as usize - 1];
            chunks.push(len - chunk * (n - 1));
            (range, chunks)
        })
        .collect()
}

/// Puts each group's parts, or reads each completed file back ([`Step`]); outputs
/// `(number, part, text)`: a group's part and its entity tag, or a file and its SHA-256.
pub struct UploadExec {
    spec: Arc<UploadSpec>,
    input: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
}

impl fmt::Debug for UploadExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UploadExec")
            .field("step", &self.spec.step)
            .field("targets", &self.spec.targets.len())
            .field("groups", &self.spec.groups.len())
            .finish()
    }
}

fn answer_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("number", DataType::UInt32, false),
        Field::new("part", DataType::UInt32, false),
        Field::new("text", DataType::Utf8, false),
    ]))
}

impl UploadExec {
    pub fn planned(spec: UploadSpec) -> Result<Self> {
        let n = match spec.step {
            Step::Upload => spec.groups.len(),
            Step::Digest => spec.targets.len(),
        };
        Self::try_new(spec, numbered(n)?)
    }

    /// Refuses locations that are not `s3://`, targets that are not run files, part names
    /// that are not plain names of their kind, ranges outside their parts, and groups
    /// whose parts do not add up or break S3's rules.
    pub fn try_new(spec: UploadSpec, input: Arc<dyn ExecutionPlan>) -> Result<Self> {
        check_numbered("UploadExec", &input)?;
        let bad = |what: String| Err(Error::Internal(format!("UploadExec: {what}")));
        Location::parse(&spec.parts)?;
        let mut next_part = vec![0usize; spec.targets.len()];
        for t in &spec.targets {
            let at = Location::parse(&t.at)?;
            if !KINDS[..3].contains(&at.name()) {
                return bad(format!("{} is not a run file", t.at));
            }
        }
        for g in &spec.groups {
            let Some(next) = next_part.get_mut(g.target) else {
                return bad(format!("no target {}", g.target));
            };
            let mut len = if g.header {
                PARQUET_MAGIC.len() as u64
            } else {
                0
            };
            for piece in &g.pieces {
                if !piece.is_plain() {
                    return bad(format!("a piece {:?}", piece.file.name));
                }
                len = len.saturating_add(piece.len());
            }
            if let Some(f) = &g.footer {
                let footer = base64::engine::general_purpose::STANDARD
                    .decode(f)
                    .map_err(|_| {
                        Error::Internal("UploadExec: a footer that is not Base64".into())
                    })?;
                len = len.saturating_add(footer.len() as u64);
            }
            // A part is held in memory while it is sent: none larger than `plan` makes.
            let sum = g
                .chunks
                .iter()
                .try_fold(0u64, |a, &c| (c <= 2 * CHUNK_BYTES).then(|| a + c));
            if g.first_part != *next || g.chunks.is_empty() || sum != Some(len) {
                return bad(format!(
                    "a group of {len} bytes from part {} (expected part {next}) in parts of {sum:?}",
                    g.first_part
                ));
            }
            *next += g.chunks.len();
            if *next > MAX_PARTS {
                return bad(format!("more than {MAX_PARTS} parts"));
            }
        }
        // Every part but a file's last at least S3's smallest.
        for (t, target) in spec.targets.iter().enumerate() {
            let chunks: Vec<u64> = spec
                .groups
                .iter()
                .filter(|g| g.target == t)
                .flat_map(|g| g.chunks.iter().copied())
                .collect();
            let small = chunks.iter().rev().skip(1).any(|&c| c < MIN_PART_BYTES);
            let total = chunks.iter().try_fold(0u64, |a, &c| a.checked_add(c));
            if spec.step == Step::Upload && (small || total != Some(target.length)) {
                return bad(format!("the parts of {} do not make it", target.at));
            }
        }
        let n = input.output_partitioning().partition_count();
        let properties = PlanProperties::new(
            EquivalenceProperties::new(answer_schema()),
            Partitioning::UnknownPartitioning(n),
            EmissionType::Final,
            Boundedness::Bounded,
        );
        Ok(Self {
            spec: Arc::new(spec),
            input,
            properties: Arc::new(properties),
        })
    }

    pub fn spec(&self) -> &UploadSpec {
        &self.spec
    }
}

impl DisplayAs for UploadExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "UploadExec: {:?} of {} groups into {} files",
            self.spec.step,
            self.spec.groups.len(),
            self.spec.targets.len()
        )
    }
}

impl ExecutionPlan for UploadExec {
    super::parts::single_input_node!("UploadExec", from_spec);

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> datafusion::error::Result<SendableRecordBatchStream> {
        let spec = Arc::clone(&self.spec);
        each_number(&self.input, partition, context, answer_schema(), move |i| {
            let spec = Arc::clone(&spec);
            Ok(reader_stream("upload".into(), answer_schema(), move || {
                let answers = match spec.step {
                    Step::Upload => put_group(&spec, i)?,
                    Step::Digest => vec![(0, digest_of(&spec, i)?)],
                };
                let batch = RecordBatch::try_new(
                    answer_schema(),
                    vec![
                        Arc::new(UInt32Array::from(vec![i as u32; answers.len()])),
                        Arc::new(UInt32Array::from_iter_values(
                            answers.iter().map(|(p, _)| *p as u32),
                        )),
                        Arc::new(StringArray::from_iter_values(
                            answers.iter().map(|(_, t)| t.as_str()),
                        )),
                    ],
                )?;
                Ok(Box::new(std::iter::once(Ok(batch))) as Batches)
            }))
        })
    }
}

/// How many of a task's parts are sent at once while it reads on: a part's request waits
/// on the network, the next part's bytes on the staging prefix's reads, and S3 takes one
/// upload's parts in parallel. A task holds at most this many parts of [`CHUNK_BYTES`]
/// being sent and the one being filled (up to twice that): under 64 MiB, for each task an
/// executor runs at once.
const IN_FLIGHT: usize = 2;

/// Bytes gathered into the parts of one group, each sent when it is whole.
struct Parts<'a> {
    store: &'a Store,
    at: &'a Location,
    upload_id: &'a str,
    handle: &'a tokio::runtime::Handle,
    chunks: &'a [u64],
    first: usize,
    next: usize,
    buf: Vec<u8>,
    /// The parts being sent, in order: each one's number and its request.
    sending: std::collections::VecDeque<(usize, tokio::task::JoinHandle<Result<String>>)>,
    tags: Vec<(usize, String)>,
}

impl Parts<'_> {
    fn push(&mut self, mut bytes: &[u8]) -> Result<()> {
        while !bytes.is_empty() {
            let Some(&want) = self.chunks.get(self.next) else {
                return Err(Error::State(format!(
                    "{}: more bytes than its parts hold",
                    self.at
                )));
            };
            let take = (want as usize - self.buf.len()).min(bytes.len());
            self.buf.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.buf.len() as u64 == want {
                self.put()?;
            }
        }
        Ok(())
    }

    /// Send the part just filled once fewer than [`IN_FLIGHT`] are being sent.
    fn put(&mut self) -> Result<()> {
        while self.sending.len() >= IN_FLIGHT {
            self.sent()?;
        }
        let index = self.first + self.next;
        let body = bytes::Bytes::from(std::mem::take(&mut self.buf));
        let (store, key, id) = (
            self.store.clone(),
            self.at.key.clone(),
            self.upload_id.to_owned(),
        );
        let request = self
            .handle
            .spawn(async move { store.put_part(&key, &id, index, body).await });
        self.sending.push_back((index, request));
        self.next += 1;
        let next = self.chunks.get(self.next).copied().unwrap_or(0);
        self.buf = Vec::with_capacity(next as usize);
        Ok(())
    }

    /// Wait for the oldest part being sent: its entity tag, or its error.
    fn sent(&mut self) -> Result<()> {
        let Some((index, request)) = self.sending.pop_front() else {
            return Ok(());
        };
        let tag = self.handle.block_on(request).map_err(|e| {
            Error::Internal(format!("{}: part {} was not sent: {e}", self.at, index + 1))
        })??;
        self.tags.push((index, tag));
        Ok(())
    }

    /// Every part's entity tag, in order, once all are sent.
    fn finish(mut self) -> Result<Vec<(usize, String)>> {
        while !self.sending.is_empty() {
            self.sent()?;
        }
        Ok(std::mem::take(&mut self.tags))
    }
}

impl Drop for Parts<'_> {
    /// A task that failed stops the parts it still sends, and waits until they have
    /// stopped: none is still on its way when the client aborts the upload or the task is
    /// tried again (a late copy of a part could replace the retry's).
    fn drop(&mut self) {
        for (_, request) in &self.sending {
            request.abort();
        }
        for (_, request) in self.sending.drain(..) {
            let _ = self.handle.block_on(request);
        }
    }
}

/// Put group `g`'s parts: its pieces read whole from the staging prefix, each checked
/// against its report as it is read; their entity tags.
fn put_group(spec: &UploadSpec, g: usize) -> Result<Vec<(usize, String)>> {
    let group = spec
        .groups
        .get(g)
        .ok_or_else(|| Error::Internal(format!("UploadExec: no group {g}")))?;
    let target = &spec.targets[group.target];
    let at = Location::parse(&target.at)?;
    let parts = Location::parse(&spec.parts)?;
    let store = Store::open(&at)?;
    // One connection to the staging prefix's bucket for every piece read.
    let source = Store::open(&parts)?;
    let handle = tokio::runtime::Handle::try_current()
        .map_err(|_| Error::Internal(format!("{at}: written outside an async runtime")))?;
    let mut out = Parts {
        store: &store,
        at: &at,
        upload_id: &target.upload_id,
        handle: &handle,
        chunks: &group.chunks,
        first: group.first_part,
        next: 0,
        buf: Vec::with_capacity(group.chunks[0].min(2 * CHUNK_BYTES) as usize),
        sending: Default::default(),
        tags: Vec::new(),
    };
    if group.header {
        out.push(PARQUET_MAGIC)?;
    }
    for piece in &group.pieces {
        let from = parts.child(&piece.file.name);
        let object = BlockingObject::open_in(
            source.clone(),
            &from,
            Some((piece.file.bytes, piece.e_tag.as_deref())),
        )?;
        let name = from.to_string();
        let reader = object.read_from(0);
        let write = |chunk: &[u8]| out.push(chunk);
        match piece.range {
            None => copy_part_from(reader, Path::new(&name), &piece.file, piece.rows, write)?,
            Some(range) => copy_range_from(reader, Path::new(&name), &piece.file, range, write)?,
        }
    }
    if let Some(footer) = &group.footer {
        let footer = base64::engine::general_purpose::STANDARD
            .decode(footer)
            .map_err(|_| Error::Internal("UploadExec: a footer that is not Base64".into()))?;
        out.push(&footer)?;
    }
    if out.next != group.chunks.len() || !out.buf.is_empty() {
        return Err(Error::State(format!(
            "{at}: fewer bytes than its parts hold (the parts changed after their reports)"
        )));
    }
    out.finish()
}

/// The SHA-256 of file `t`, completed, read back whole (and only if it has the length
/// planned).
fn digest_of(spec: &UploadSpec, t: usize) -> Result<String> {
    let target = spec
        .targets
        .get(t)
        .ok_or_else(|| Error::Internal(format!("UploadExec: no target {t}")))?;
    let at = Location::parse(&target.at)?;
    let object = BlockingObject::open(&at, Some((target.length, target.e_tag.as_deref())))?;
    let name = at.to_string();
    let (digest, bytes) =
        crate::digest::sha256_streamed(object.read_from(0), Path::new(&name), |_| Ok(()))?;
    if bytes != target.length {
        return Err(Error::State(format!(
            "{at}: {bytes} bytes read, {} planned",
            target.length
        )));
    }
    Ok(digest)
}

/// A file planned for the executors: its kind, its place, its length, its groups.
struct Planned {
    kind: &'static str,
    at: Location,
    length: u64,
    groups: Vec<Group>,
}

/// Have the executors put the run's files together into `dest` (the run's new commit
/// folder on object storage) from the reported parts under `parts` (the staging
/// prefix's parts): each file that is not empty and whose parts allow it (a Parquet
/// file's row groups end to end: [`super::parts::layout_of`]). The files put
/// there, by kind, as the commit records them; the others are left to the client's
/// splice. An upload is completed only once all its parts are in, and aborted on any
/// failure (nothing appears).
pub async fn assemble(
    submit: &SubmitPlan,
    reports: &[PartReport],
    parts: &Location,
    dest: &Location,
) -> Result<Vec<(&'static str, FileEntry)>> {
    let mut planned: Vec<Planned> = Vec::new();
    for (k, kind) in KINDS.into_iter().take(3).enumerate() {
        let list: Vec<(PartFile, u64)> = super::parts::part_list(reports, k)
            .into_iter()
            .map(|(f, rows)| (f.clone(), rows))
            .collect();
        let (list, ranges, tags, footer) = if kind == CASE_RESULTS_JSONL {
            let n = list.len();
            (list, vec![None; n], vec![None; n], None)
        } else {
            let prefix = parts.clone();
            let (layout, tags, list) = tokio::task::spawn_blocking(move || {
                let (layout, tags) = {
                    let refs: Vec<(&PartFile, u64)> = list.iter().map(|(f, r)| (f, *r)).collect();
                    let (footers, tags) = super::parts::remote_footers(&prefix, &refs)?;
                    (super::parts::layout_of(&footers, &refs)?, tags)
                };
                Ok::<_, Error>((layout, tags, list))
            })
            .await
            .map_err(|e| Error::Internal(format!("reading the parts' footers: {e}")))??;
            let Some(layout) = layout else {
                continue;
            };
            (
                list,
                layout.ranges.into_iter().map(Some).collect(),
                tags,
                Some(layout.footer),
            )
        };
        let pieces: Vec<Piece> = list
            .into_iter()
            .zip(ranges.into_iter().zip(tags))
            .map(|((file, rows), (range, e_tag))| Piece {
                file,
                rows,
                target: planned.len(),
                offset: 0,
                range,
                e_tag,
            })
            .collect();
        let header = if footer.is_some() {
            PARQUET_MAGIC.len() as u64
        } else {
            0
        };
        let footer_len = footer.as_ref().map_or(0, |f| f.len() as u64);
        let lengths: Vec<u64> = pieces.iter().map(Piece::len).collect();
        let length = header + lengths.iter().sum::<u64>() + footer_len;
        // An empty file (no rows of JSONL) is no upload; any other is, however small
        // (its one part is its last).
        if length == 0 {
            continue;
        }
        let cut = plan(&lengths, header, footer_len, chunk_bytes());
        // Past S3's most parts (files of some 50 GiB), the client splices.
        if cut.iter().map(|(_, chunks)| chunks.len()).sum::<usize>() > MAX_PARTS {
            continue;
        }
        let last = cut.len() - 1;
        let mut first_part = 0;
        let mut offset = header;
        let groups = cut
            .into_iter()
            .enumerate()
            .map(|(i, (range, chunks))| {
                let mut pieces = pieces[range].to_vec();
                for p in &mut pieces {
                    p.offset = offset;
                    offset += p.len();
                }
                let group = Group {
                    target: planned.len(),
                    header: i == 0 && header > 0,
                    pieces,
                    footer: (i == last)
                        .then(|| {
                            footer
                                .as_ref()
                                .map(|f| base64::engine::general_purpose::STANDARD.encode(f))
                        })
                        .flatten(),
                    first_part,
                    chunks,
                };
                first_part += group.chunks.len();
                group
            })
            .collect();
        planned.push(Planned {
            kind,
            at: dest.child(kind),
            length,
            groups,
        });
    }
    if planned.is_empty() {
        return Ok(Vec::new());
    }
    let store = Store::open(dest)?;
    let mut targets: Vec<UploadTarget> = Vec::new();
    let started: Result<()> = async {
        for p in &planned {
            targets.push(UploadTarget {
                at: p.at.to_string(),
                upload_id: store.create_upload(&p.at.key).await?,
                length: p.length,
                e_tag: None,
            });
        }
        Ok(())
    }
    .await;
    let abort = |targets: Vec<UploadTarget>| {
        let store = store.clone();
        let keys: Vec<_> = planned.iter().map(|p| p.at.key.clone()).collect();
        async move {
            for (key, t) in keys.iter().zip(&targets) {
                store.abort_upload(key, &t.upload_id).await;
            }
        }
    };
    if let Err(e) = started {
        abort(targets).await;
        return Err(e);
    }
    let spec = UploadSpec {
        step: Step::Upload,
        parts: parts.to_string(),
        targets,
        groups: planned.iter().flat_map(|p| p.groups.clone()).collect(),
    };
    let mut spec = spec;
    let completed = async {
        let answers = run(submit, spec.clone()).await?;
        // Each file's parts' tags, in order; every part in.
        let mut tags: Vec<Vec<Option<String>>> = planned
            .iter()
            .map(|p| vec![None; p.groups.iter().map(|g| g.chunks.len()).sum()])
            .collect();
        for (g, part, tag) in answers {
            let target = spec
                .groups
                .get(g)
                .map(|g| g.target)
                .ok_or_else(|| Error::Query(format!("the cluster put a part of group {g}")))?;
            let slot = tags[target]
                .get_mut(part)
                .ok_or_else(|| Error::Query(format!("the cluster put a part {part}")))?;
            *slot = Some(tag);
        }
        for (t, p) in planned.iter().enumerate() {
            let tags: Option<Vec<String>> = tags[t].iter().cloned().collect();
            let tags = tags.ok_or_else(|| {
                Error::Query(format!("the cluster did not put every part of {}", p.at))
            })?;
            let upload_id = spec.targets[t].upload_id.clone();
            spec.targets[t].e_tag = store.complete_upload(&p.at.key, &upload_id, tags).await?;
        }
        Ok::<_, Error>(())
    }
    .await;
    if let Err(e) = completed {
        // Completed uploads are no longer aborted: their objects stay in the commit
        // folder, unreferenced, until the caller removes it.
        abort(spec.targets.clone()).await;
        return Err(e);
    }
    let digests = run(
        submit,
        UploadSpec {
            step: Step::Digest,
            groups: Vec::new(),
            ..spec
        },
    )
    .await?;
    let mut out: Vec<Option<(&'static str, FileEntry)>> = vec![None; planned.len()];
    for (t, _, sha256) in digests {
        let p = planned
            .get(t)
            .ok_or_else(|| Error::Query(format!("the cluster read a file {t}")))?;
        out[t] = Some((
            p.kind,
            FileEntry {
                name: p.kind.to_owned(),
                bytes: p.length,
                sha256,
                multipart: true,
            },
        ));
    }
    out.into_iter()
        .enumerate()
        .map(|(t, e)| {
            e.ok_or_else(|| Error::Query(format!("the cluster did not read {}", planned[t].at)))
        })
        .collect()
}

/// Run an [`UploadExec`] on the cluster: its answers `(number, part, text)`.
async fn run(submit: &SubmitPlan, spec: UploadSpec) -> Result<Vec<(usize, usize, String)>> {
    use futures::TryStreamExt;
    let plan = Arc::new(UploadExec::planned(spec)?);
    let root =
        Arc::new(datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec::new(plan));
    let batches: Vec<RecordBatch> = submit(root).await?.try_collect().await?;
    let mut out = Vec::new();
    for b in &batches {
        let numbers = b.column(0).as_primitive::<UInt32Type>();
        let parts = b.column(1).as_primitive::<UInt32Type>();
        let texts = b.column(2).as_string::<i32>();
        for i in 0..b.num_rows() {
            out.push((
                numbers.value(i) as usize,
                parts.value(i) as usize,
                texts.value(i).to_owned(),
            ));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// Every part but the last at least S3's smallest; the parts add up to the file;
    /// groups take whole pieces, in order, each at least once.
    fn check(pieces: &[u64], header: u64, footer: u64) {
        for chunk in [CHUNK_BYTES, MIN_PART_BYTES, 7 * MIB + 3] {
            check_with(pieces, header, footer, chunk);
        }
    }

    fn check_with(pieces: &[u64], header: u64, footer: u64, chunk: u64) {
        let groups = plan(pieces, header, footer, chunk);
        let mut next = 0;
        let mut parts = Vec::new();
        for (range, chunks) in &groups {
            assert_eq!(range.start, next, "{pieces:?}");
            next = range.end;
            assert!(chunks.iter().all(|&c| c <= 2 * CHUNK_BYTES), "{chunks:?}");
            parts.extend(chunks.iter().copied());
        }
        assert_eq!(next, pieces.len(), "{pieces:?}");
        let total = header + pieces.iter().sum::<u64>() + footer;
        assert_eq!(parts.iter().sum::<u64>(), total, "{pieces:?}");
        let small = parts
            .iter()
            .rev()
            .skip(1)
            .filter(|&&c| c < MIN_PART_BYTES)
            .count();
        assert_eq!(small, 0, "{pieces:?} → {parts:?}");
    }

    #[test]
    fn the_parts_of_a_file_keep_to_s3s_sizes() {
        check(&[14 * MIB, 14 * MIB], 0, 0);
        check(&[MIB; 12], 4, 300);
        check(&[6 * MIB, MIB, 0, 2 * MIB], 4, 10);
        check(&[100 * MIB, 3 * MIB, 40 * MIB + 5], 0, 0);
        check(&[0, 0, 0], 0, 0);
        check(&[], 4, 100);
        check(&[MIB], 0, 0);
        // A pseudo-random mix of sizes around the limits.
        let mut x = 7u64;
        for _ in 0..200 {
            let n = (x % 9) as usize;
            let mut pieces = Vec::new();
            for _ in 0..n {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                pieces.push((x >> 33) % (40 * MIB));
            }
            check(&pieces, 4 * (x & 1), (x >> 7) % 4096);
        }
        // One group per 5 MiB of pieces, cut in 16 MiB parts.
        let g = plan(&[14 * MIB, 14 * MIB, MIB], 0, 0, CHUNK_BYTES);
        assert_eq!(g.len(), 2);
        assert_eq!(g[1].0, 1..3, "the short last piece joins the group before");
        assert_eq!(
            plan(&[40 * MIB], 0, 0, CHUNK_BYTES)[0].1,
            vec![16 * MIB, 24 * MIB]
        );
        // Smaller parts for the tests, never under S3's smallest.
        assert_eq!(
            plan(&[14 * MIB], 0, 0, 5 * MIB)[0].1,
            vec![5 * MIB, 9 * MIB]
        );
        assert_eq!(plan(&[14 * MIB], 0, 0, MIB)[0].1, vec![5 * MIB, 9 * MIB]);
    }
}
