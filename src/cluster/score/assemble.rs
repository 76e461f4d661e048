//! The run's `case_results.jsonl`, `case_results.parquet` and `findings.parquet` put
//! together by the executors, not the client (docs/cluster.md, "Score and query on it"):
//! once every part is reported, the client creates each file at its final length in the
//! staging folder and submits an [`AssembleExec`] — one partition per piece — whose tasks
//! each read their part once, check it as the client would (size, SHA-256, and a JSONL
//! part's whole lines and rows: [`super::parts::copy_part`]), write it (a Parquet part's
//! row groups: [`super::parts::copy_range`]) at the offset the client computed, and sync
//! it. For a Parquet file the client writes only the header and the footer
//! ([`super::parts::parquet_layout`]: the footer its own splice would write, made over
//! placeholders), having read each part's footer and checked its rows. The client checks
//! that every piece was placed and renames the files into the run (the staging folder and
//! the run on one file system); the parts' bytes never pass through it.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{AsArray, RecordBatch, UInt32Array};
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
use super::parts::{
    CASE_RESULTS_JSONL, CASE_RESULTS_PARQUET, FINDINGS_PARQUET, KINDS, PARQUET_MAGIC, PartFile,
    PartReport, copy_part, copy_range,
};
use super::slices::{check_numbered, each_number, numbered};
use crate::engine::stream_table::{Batches, reader_stream};
use crate::error::{Error, Result};

/// Where each piece goes (JSON in pieval's plan codec).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AssembleSpec {
    /// The parts folder (absolute; the same path on every executor).
    pub dir: String,
    /// The files, created at their lengths by the client, in the staging folder.
    pub targets: Vec<String>,
    pub pieces: Vec<Piece>,
}

/// One part: its file as reported, its rows, the target (an index of
/// [`AssembleSpec::targets`]) and where it starts there; for a Parquet part, the bytes of
/// it that are copied (its row groups), the whole part otherwise.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Piece {
    pub file: PartFile,
    pub rows: u64,
    pub target: usize,
    pub offset: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range: Option<[u64; 2]>,
    /// On object storage: the part's entity tag when the client read its footer (every
    /// read of it is made on that condition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub e_tag: Option<String>,
}

impl Piece {
    /// A plain part name of the parts folder, of the kind its range says (a Parquet
    /// part's row groups inside it; a JSONL part whole).
    pub(crate) fn is_plain(&self) -> bool {
        let name = &self.file.name;
        let kind_ok = match self.range {
            None => name.ends_with(&format!(".{CASE_RESULTS_JSONL}")),
            Some([a, b]) => {
                (name.ends_with(&format!(".{CASE_RESULTS_PARQUET}"))
                    || name.ends_with(&format!(".{FINDINGS_PARQUET}")))
                    && a <= b
                    && b <= self.file.bytes
            }
        };
        name.starts_with("part-")
            && !name.contains(['/', '\\', '\0'])
            && !name.contains("..")
            && kind_ok
    }

    /// The bytes it puts into its target.
    pub(crate) fn len(&self) -> u64 {
        match self.range {
            Some([a, b]) => b.saturating_sub(a),
            None => self.file.bytes,
        }
    }
}

/// Copies each partition's piece into its target at its offset; outputs the numbers of
/// the pieces placed.
pub struct AssembleExec {
    spec: Arc<AssembleSpec>,
    input: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
}

impl fmt::Debug for AssembleExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AssembleExec")
            .field("targets", &self.spec.targets)
            .field("pieces", &self.spec.pieces.len())
            .finish()
    }
}

fn placed_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new(
        "piece",
        DataType::UInt32,
        false,
    )]))
}

impl AssembleExec {
    pub fn planned(spec: AssembleSpec) -> Result<Self> {
        let n = spec.pieces.len();
        Self::try_new(spec, numbered(n)?)
    }

    /// Refuses folders and files that are not absolute, part names that are not plain
    /// names of their kind, ranges outside their parts, pieces of one target that overlap
    /// or do not follow each other.
    pub fn try_new(spec: AssembleSpec, input: Arc<dyn ExecutionPlan>) -> Result<Self> {
        check_numbered("AssembleExec", &input)?;
        for p in std::iter::once(&spec.dir).chain(&spec.targets) {
            if !Path::new(p).is_absolute() || p.contains('\0') {
                return Err(Error::Internal(format!(
                    "AssembleExec: {p:?} is not an absolute path"
                )));
            }
        }
        // The files a client makes in the staging folder, beside the parts folder: a plan
        // cannot have an executor write anywhere else.
        for t in &spec.targets {
            let t = Path::new(t);
            let named = t
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| KINDS[..3].contains(&n));
            if !named || t.parent() != Path::new(&spec.dir).parent() {
                return Err(Error::Internal(format!(
                    "AssembleExec: {} is not a run file beside the parts folder",
                    t.display()
                )));
            }
        }
        let mut ends: Vec<Option<u64>> = vec![None; spec.targets.len()];
        for piece in &spec.pieces {
            let name = &piece.file.name;
            // A JSONL file starts with its first part, a Parquet file after its header.
            let first = if piece.range.is_some() {
                PARQUET_MAGIC.len() as u64
            } else {
                0
            };
            let follows = ends
                .get(piece.target)
                .is_some_and(|end| end.unwrap_or(first) == piece.offset);
            if !piece.is_plain() || !follows {
                return Err(Error::Internal(format!(
                    "AssembleExec: a piece {name:?} at {} of target {} (expected at {:?})",
                    piece.offset,
                    piece.target,
                    ends.get(piece.target).copied().flatten()
                )));
            }
            ends[piece.target] = Some(piece.offset.saturating_add(piece.len()));
        }
        let properties = PlanProperties::new(
            EquivalenceProperties::new(placed_schema()),
            Partitioning::UnknownPartitioning(input.output_partitioning().partition_count()),
            EmissionType::Final,
            Boundedness::Bounded,
        );
        Ok(Self {
            spec: Arc::new(spec),
            input,
            properties: Arc::new(properties),
        })
    }

    pub fn spec(&self) -> &AssembleSpec {
        &self.spec
    }
}

impl DisplayAs for AssembleExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "AssembleExec: {} pieces into {}",
            self.spec.pieces.len(),
            self.spec.targets.join(", ")
        )
    }
}

impl ExecutionPlan for AssembleExec {
    super::parts::single_input_node!("AssembleExec", from_spec);

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> datafusion::error::Result<SendableRecordBatchStream> {
        let spec = Arc::clone(&self.spec);
        each_number(&self.input, partition, context, placed_schema(), move |i| {
            let spec = Arc::clone(&spec);
            Ok(reader_stream("parts".into(), placed_schema(), move || {
                place(&spec, i)?;
                let batch = RecordBatch::try_new(
                    placed_schema(),
                    vec![Arc::new(UInt32Array::from(vec![i as u32]))],
                )?;
                Ok(Box::new(std::iter::once(Ok(batch))) as Batches)
            }))
        })
    }
}

/// Copy piece `i` into its target at its offset, checked as it is read, and sync it.
fn place(spec: &AssembleSpec, i: usize) -> Result<()> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let piece = spec
        .pieces
        .get(i)
        .ok_or_else(|| Error::Internal(format!("AssembleExec: no piece {i}")))?;
    let target = Path::new(
        spec.targets
            .get(piece.target)
            .ok_or_else(|| Error::Internal(format!("AssembleExec: no target {}", piece.target)))?,
    );
    // The file the client made: never created here, never through a link.
    let out = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(target)
        .map_err(|e| Error::io(target, "cannot open", e))?;
    let mut at = piece.offset;
    let mut write = |chunk: &[u8]| {
        out.write_all_at(chunk, at)
            .map_err(|e| Error::io(target, "cannot write", e))?;
        at += chunk.len() as u64;
        Ok(())
    };
    let path = Path::new(&spec.dir).join(&piece.file.name);
    match piece.range {
        None => copy_part(&path, &piece.file, piece.rows, &mut write)?,
        Some(range) => copy_range(&path, &piece.file, range, &mut write)?,
    }
    out.sync_data()
        .map_err(|e| Error::io(target, "cannot sync", e))
}

/// Whether the executors can put the run's files together in `staging` for `output`: a
/// rename between them must work (one file system).
pub fn can_assemble(staging: &Path, output: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(staging), std::fs::metadata(output)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev(),
        _ => false,
    }
}

/// A file being put together in the staging folder.
struct Target {
    kind: &'static str,
    at: PathBuf,
    length: u64,
}

/// The files to put together, created in `staging` at their lengths (a Parquet file's
/// header and footer written), and the plan's spec.
fn prepare(
    reports: &[PartReport],
    parts: &Path,
    staging: &Path,
) -> Result<(Vec<Target>, AssembleSpec)> {
    use std::os::unix::fs::FileExt;
    let mut targets: Vec<Target> = Vec::new();
    let mut pieces = Vec::new();
    for (k, kind) in KINDS.into_iter().take(3).enumerate() {
        let list = super::parts::part_list(reports, k);
        let (layout, start) = if kind == CASE_RESULTS_JSONL {
            (None, 0)
        } else {
            match super::parts::parquet_layout(parts, &list)? {
                Some(l) => (Some(l), PARQUET_MAGIC.len() as u64),
                None => continue,
            }
        };
        let target = targets.len();
        let mut length = start;
        for (i, (file, rows)) in list.iter().enumerate() {
            let range = layout.as_ref().map(|l| l.ranges[i]);
            let piece = Piece {
                file: (*file).clone(),
                rows: *rows,
                target,
                offset: length,
                range,
                e_tag: None,
            };
            length = length.checked_add(piece.len()).ok_or_else(|| {
                Error::Query("the cluster reported parts of more than 2^64 bytes".into())
            })?;
            pieces.push(piece);
        }
        let at = staging.join(kind);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&at)
            .map_err(|e| Error::io(&at, "cannot create", e))?;
        if let Some(layout) = &layout {
            file.write_all_at(PARQUET_MAGIC, 0)
                .and_then(|()| file.write_all_at(&layout.footer, length))
                .map_err(|e| Error::io(&at, "cannot write", e))?;
            length += layout.footer.len() as u64;
        }
        file.set_len(length)
            .map_err(|e| Error::io(&at, "cannot size", e))?;
        targets.push(Target { kind, at, length });
    }
    let spec = AssembleSpec {
        dir: crate::rundir::table_path(parts)?,
        targets: targets
            .iter()
            .map(|t| crate::rundir::table_path(&t.at))
            .collect::<Result<_>>()?,
        pieces,
    };
    Ok((targets, spec))
}

/// Have the executors put the parts together into the staging folder — the JSONL whole,
/// each Parquet file whose parts' row groups lie end to end ([`super::parts::parquet_layout`])
/// between the header and footer written here — then check every piece was placed and
/// move each file beside its target in `output` under a temporary name: the files,
/// uncommitted, by kind. What is not among them (or all, when a rename from the staging
/// folder is refused) the client splices ([`super::parts::merge`]).
pub async fn assemble(
    submit: &SubmitPlan,
    reports: &[PartReport],
    parts: &Path,
    staging: &Path,
    output: &Path,
) -> Result<BTreeMap<&'static str, crate::atomic::TempFile>> {
    use futures::TryStreamExt;
    let (targets, spec) = prepare(reports, parts, staging)?;
    let n = spec.pieces.len();
    let names: Vec<String> = spec.pieces.iter().map(|p| p.file.name.clone()).collect();
    let plan = Arc::new(AssembleExec::planned(spec)?);
    let root =
        Arc::new(datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec::new(plan));
    let batches: Vec<RecordBatch> = submit(root).await?.try_collect().await?;
    // Every piece placed (a piece placed twice — a task run again — wrote the same bytes
    // at the same place).
    let mut placed = vec![false; n];
    for b in &batches {
        for &i in b.column(0).as_primitive::<UInt32Type>().values() {
            let slot = placed
                .get_mut(i as usize)
                .ok_or_else(|| Error::Query(format!("the cluster placed a piece {i} of {n}")))?;
            *slot = true;
        }
    }
    if let Some(missing) = placed.iter().position(|p| !p) {
        return Err(Error::Query(format!(
            "the cluster did not place the part {}",
            names[missing]
        )));
    }
    let mut out = BTreeMap::new();
    for t in &targets {
        let now = std::fs::metadata(&t.at)
            .map_err(|e| Error::io(&t.at, "cannot read", e))?
            .len();
        if now != t.length {
            return Err(Error::State(format!(
                "{}: {now} bytes once put together, not the parts' {}",
                t.at.display(),
                t.length
            )));
        }
        // Out of the staging folder (removed when scoring ends) to a temporary name
        // beside the target: renamed over it when the run is committed, removed if not.
        let target = output.join(t.kind);
        let tmp = crate::atomic::temp_path(&target)?;
        match std::fs::rename(&t.at, &tmp) {
            Ok(()) => {}
            // One device, yet no rename between them (two bind mounts of one file
            // system): the client splices instead.
            Err(e) if e.kind() == std::io::ErrorKind::CrossesDevices => {
                return Ok(BTreeMap::new());
            }
            Err(e) => return Err(Error::io(&tmp, "cannot move into place", e)),
        }
        match crate::atomic::TempFile::adopt(tmp.clone(), &target) {
            Ok(file) => {
                out.insert(t.kind, file);
            }
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::TryStreamExt;

    /// Every partition of `plan` run here, as executors would, last first.
    fn run(plan: &AssembleExec) -> Result<()> {
        let rt = crate::engine::runtime().unwrap();
        let ctx = datafusion::prelude::SessionContext::new();
        rt.block_on(async {
            for p in (0..plan.properties().partitioning.partition_count()).rev() {
                let s = plan.execute(p, ctx.task_ctx())?;
                s.try_collect::<Vec<_>>().await?;
            }
            Ok(())
        })
    }

    #[test]
    fn the_executors_files_are_the_clients_splice_byte_for_byte() {
        use super::super::parts::{merge, tests::part};
        let staging = tempfile::tempdir().unwrap();
        let parts = staging.path().join("parts");
        std::fs::create_dir(&parts).unwrap();
        let a = part(&parts, 1, &["a1", "a2", "a3"]);
        // A part with no rows: no row group.
        let empty = part(&parts, 9, &[]);
        let b = part(&parts, 4, &["b1", "b2", "b3", "b4", "b5"]);
        let reports = [a, empty, b];
        // What the client's splice writes.
        let spliced = tempfile::tempdir().unwrap();
        let mut commit = crate::atomic::FolderCommit::new(spliced.path());
        let merged = merge(
            &reports,
            &parts,
            spliced.path(),
            Default::default(),
            Vec::new(),
        )
        .unwrap();
        for (_, file) in merged.files().0 {
            commit.put(file).unwrap();
        }
        commit.commit().unwrap();
        // What the executors write: the three files, Parquet row groups between the
        // header and the footer the client wrote.
        let (targets, spec) = prepare(&reports, &parts, staging.path()).unwrap();
        assert_eq!(
            targets.len(),
            3,
            "every file is put together by the executors"
        );
        assert_eq!(spec.pieces.iter().filter(|p| p.range.is_some()).count(), 6);
        for _ in 0..2 {
            // Placed again (a task run twice): the same bytes.
            run(&AssembleExec::planned(spec.clone()).unwrap()).unwrap();
            for t in &targets {
                assert_eq!(
                    std::fs::read(&t.at).unwrap(),
                    std::fs::read(spliced.path().join(t.kind)).unwrap(),
                    "{}",
                    t.kind
                );
            }
        }
        // A part that changed after its report: refused, by name, whichever kind.
        for kind in [CASE_RESULTS_JSONL, FINDINGS_PARQUET] {
            let k = KINDS.iter().position(|x| *x == kind).unwrap();
            let path = parts.join(&reports[2].files[k].name);
            let good = std::fs::read(&path).unwrap();
            let mut bad = good.clone();
            let last = bad.len() - 10;
            bad[last] ^= 1;
            std::fs::write(&path, &bad).unwrap();
            let e = run(&AssembleExec::planned(spec.clone()).unwrap())
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&reports[2].files[k].name) && e.contains("changed"),
                "{e}"
            );
            std::fs::write(&path, &good).unwrap();
        }
        // Pieces that overlap, a range past its part, a Parquet range on a JSONL part, a
        // target that is not a run file beside the parts folder: refused when planned
        // (or decoded).
        let refused = |edit: &dyn Fn(&mut AssembleSpec)| {
            let mut bent = spec.clone();
            edit(&mut bent);
            AssembleExec::planned(bent).unwrap_err().to_string()
        };
        assert!(refused(&|s| s.pieces[1].offset -= 1).contains("expected at"));
        assert!(
            refused(&|s| {
                let p = s.pieces.iter_mut().find(|p| p.range.is_some()).unwrap();
                p.range = Some([4, p.file.bytes + 1]);
            })
            .contains("AssembleExec: a piece")
        );
        assert!(refused(&|s| s.pieces[0].range = Some([0, 1])).contains("AssembleExec: a piece"));
        assert!(refused(&|s| s.pieces[0].target = 9).contains("AssembleExec: a piece"));
        assert!(refused(&|s| s.targets[0] = "/etc/passwd".into()).contains("not a run file"));
        let summary = format!("{}/summary.json", staging.path().display());
        assert!(refused(&|s| s.targets[0] = summary.clone()).contains("not a run file"));
        // Only where a rename reaches the run.
        assert!(can_assemble(&parts, staging.path()));
        assert!(!can_assemble(&parts.join("missing"), &parts));
    }
}
