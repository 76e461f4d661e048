//! The run's `case_results.jsonl` put together by the executors, not the client
//! (docs/cluster.md, "Score and query on it"): once every part is reported, the client
//! creates the file at its final length in the staging folder and submits an
//! [`AssembleExec`] — one partition per part — whose tasks each read their part once,
//! check it as the client would (size, SHA-256, whole lines, its rows:
//! [`super::parts::copy_part`]), write it at the offset the client computed from the
//! reports, and sync it. The client checks that every part was placed and renames the
//! file into the run (the staging folder and the run on one file system); the JSONL,
//! 90% of the parts' bytes, never passes through it.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{AsArray, RecordBatch, UInt32Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt32Type};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning,
    PlanProperties, SendableRecordBatchStream,
};
use serde::{Deserialize, Serialize};

use super::SubmitPlan;
use super::parts::{CASE_RESULTS_JSONL, PartFile, PartReport, copy_part};
use super::slices::{check_numbered, each_number, numbered};
use crate::engine::stream_table::{Batches, reader_stream};
use crate::error::{Error, Result};

/// Where each part goes in the file (JSON in pieval's plan codec).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AssembleSpec {
    /// The parts folder (absolute; the same path on every executor).
    pub dir: String,
    /// The file, created at its length by the client, in the staging folder.
    pub target: String,
    pub pieces: Vec<Piece>,
}

/// One part: its file as reported, its rows, where it starts in the target.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Piece {
    pub file: PartFile,
    pub rows: u64,
    pub offset: u64,
}

/// Copies each partition's part into the target at its offset; outputs the numbers of
/// the pieces placed.
pub struct AssembleExec {
    spec: Arc<AssembleSpec>,
    input: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
}

impl fmt::Debug for AssembleExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AssembleExec")
            .field("target", &self.spec.target)
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
    /// names, pieces that overlap or do not follow each other.
    pub fn try_new(spec: AssembleSpec, input: Arc<dyn ExecutionPlan>) -> Result<Self> {
        check_numbered("AssembleExec", &input)?;
        for p in [&spec.dir, &spec.target] {
            if !Path::new(p).is_absolute() || p.contains('\0') {
                return Err(Error::Internal(format!(
                    "AssembleExec: {p:?} is not an absolute path"
                )));
            }
        }
        let mut end = 0u64;
        for piece in &spec.pieces {
            let name = &piece.file.name;
            if !name.starts_with("part-")
                || !name.ends_with(&format!(".{CASE_RESULTS_JSONL}"))
                || name.contains(['/', '\\', '\0'])
                || name.contains("..")
                || piece.offset != end
            {
                return Err(Error::Internal(format!(
                    "AssembleExec: a piece {name:?} at {} (expected at {end})",
                    piece.offset
                )));
            }
            end = piece.offset.saturating_add(piece.file.bytes);
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
            "AssembleExec: {} parts into {}",
            self.spec.pieces.len(),
            self.spec.target
        )
    }
}

impl ExecutionPlan for AssembleExec {
    fn name(&self) -> &str {
        "AssembleExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> datafusion::error::Result<TreeNodeRecursion>,
    ) -> datafusion::error::Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        let input = super::parts::only_child(self.name(), children)?;
        Ok(Arc::new(Self::try_new((*self.spec).clone(), input)?))
    }

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

/// Copy piece `i` into the target at its offset, checked as it is read, and sync it.
fn place(spec: &AssembleSpec, i: usize) -> Result<()> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let piece = spec
        .pieces
        .get(i)
        .ok_or_else(|| Error::Internal(format!("AssembleExec: no piece {i}")))?;
    let target = Path::new(&spec.target);
    // The file the client made: never created here, never through a link.
    let out = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(target)
        .map_err(|e| Error::io(target, "cannot open", e))?;
    let mut at = piece.offset;
    let path = Path::new(&spec.dir).join(&piece.file.name);
    copy_part(&path, &piece.file, piece.rows, |chunk| {
        out.write_all_at(chunk, at)
            .map_err(|e| Error::io(target, "cannot write", e))?;
        at += chunk.len() as u64;
        Ok(())
    })?;
    out.sync_data()
        .map_err(|e| Error::io(target, "cannot sync", e))
}

/// Whether the executors can put the run's JSONL together in `staging` for `output`: a
/// rename between them must work (one file system).
pub fn can_assemble(staging: &Path, output: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(staging), std::fs::metadata(output)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev(),
        _ => false,
    }
}

/// Have the executors put the parts' JSONL together into `staging/case_results.jsonl`
/// (reports in their order), then check every part was placed and move it beside
/// `target` under a temporary name: the file, uncommitted, to be renamed over `target`;
/// `None` when it cannot be moved there (the client splices then).
pub async fn assemble_jsonl(
    submit: &SubmitPlan,
    reports: &[PartReport],
    parts: &Path,
    staging: &Path,
    target: &Path,
) -> Result<Option<crate::atomic::TempFile>> {
    use futures::TryStreamExt;
    let kind = super::parts::KINDS
        .iter()
        .position(|k| *k == CASE_RESULTS_JSONL)
        .expect("a kind of part");
    let mut pieces = Vec::with_capacity(reports.len());
    let mut length = 0u64;
    for r in reports {
        let file = r.files[kind].clone();
        let bytes = file.bytes;
        pieces.push(Piece {
            file,
            rows: r.coverage.rows,
            offset: length,
        });
        length = length.checked_add(bytes).ok_or_else(|| {
            Error::Query("the cluster reported parts of more than 2^64 bytes".into())
        })?;
    }
    let at: PathBuf = staging.join(CASE_RESULTS_JSONL);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&at)
        .map_err(|e| Error::io(&at, "cannot create", e))?;
    file.set_len(length)
        .map_err(|e| Error::io(&at, "cannot size", e))?;
    drop(file);
    let n = pieces.len();
    let spec = AssembleSpec {
        dir: crate::rundir::table_path(parts)?,
        target: crate::rundir::table_path(&at)?,
        pieces,
    };
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
                .ok_or_else(|| Error::Query(format!("the cluster placed a part {i} of {n}")))?;
            *slot = true;
        }
    }
    if let Some(missing) = placed.iter().position(|p| !p) {
        return Err(Error::Query(format!(
            "the cluster did not place the part {} into {}",
            reports[missing].files[kind].name,
            at.display()
        )));
    }
    let now = std::fs::metadata(&at)
        .map_err(|e| Error::io(&at, "cannot read", e))?
        .len();
    if now != length {
        return Err(Error::State(format!(
            "{}: {now} bytes once put together, not the parts' {length}",
            at.display()
        )));
    }
    // Out of the staging folder (removed when scoring ends) to a temporary name beside
    // the target: renamed over it when the run is committed, removed if it is not.
    let tmp = crate::atomic::temp_path(target)?;
    match std::fs::rename(&at, &tmp) {
        Ok(()) => {}
        // One device, yet no rename between them (two bind mounts of one file system):
        // the client splices instead.
        Err(e) if e.kind() == std::io::ErrorKind::CrossesDevices => return Ok(None),
        Err(e) => return Err(Error::io(&tmp, "cannot move into place", e)),
    }
    match crate::atomic::TempFile::adopt(tmp.clone(), target) {
        Ok(file) => Ok(Some(file)),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::TryStreamExt;

    #[test]
    fn pieces_land_at_their_offsets_checked_in_any_order() {
        let parts = tempfile::tempdir().unwrap();
        let a = super::super::parts::tests::part(parts.path(), 1, &["a1", "a2"]);
        let b = super::super::parts::tests::part(parts.path(), 3, &["b1", "b2", "b3"]);
        let pieces: Vec<Piece> = [&a, &b]
            .iter()
            .scan(0u64, |at, r| {
                let f = r.files[1].clone();
                let p = Piece {
                    rows: r.coverage.rows,
                    offset: *at,
                    file: f.clone(),
                };
                *at += f.bytes;
                Some(p)
            })
            .collect();
        let total: u64 = pieces.iter().map(|p| p.file.bytes).sum();
        let target = parts.path().join("assembled.jsonl");
        let make = |pieces: Vec<Piece>| {
            std::fs::File::create(&target)
                .unwrap()
                .set_len(total)
                .unwrap();
            AssembleExec::planned(AssembleSpec {
                dir: parts.path().to_str().unwrap().into(),
                target: target.to_str().unwrap().into(),
                pieces,
            })
            .unwrap()
        };
        let run = |plan: &AssembleExec| -> Result<()> {
            let rt = crate::engine::runtime().unwrap();
            let ctx = datafusion::prelude::SessionContext::new();
            rt.block_on(async {
                for p in (0..plan.properties().partitioning.partition_count()).rev() {
                    let s = plan.execute(p, ctx.task_ctx())?;
                    s.try_collect::<Vec<_>>().await?;
                }
                Ok(())
            })
        };
        run(&make(pieces.clone())).unwrap();
        let read = |f: &PartFile| std::fs::read(parts.path().join(&f.name)).unwrap();
        let expected = [read(&a.files[1]), read(&b.files[1])].concat();
        assert_eq!(std::fs::read(&target).unwrap(), expected);
        // A part that changed after its report: refused, by name.
        std::fs::write(
            parts.path().join(&b.files[1].name),
            "{\"x\":1}\n{\"x\":2}\n{\"x\":3}\n",
        )
        .unwrap();
        let e = run(&make(pieces.clone())).unwrap_err().to_string();
        assert!(e.contains(&b.files[1].name) && e.contains("changed"), "{e}");
        // Pieces that overlap are refused when planned (or decoded).
        let mut bent = pieces;
        bent[1].offset -= 1;
        let e = AssembleExec::planned(AssembleSpec {
            dir: parts.path().to_str().unwrap().into(),
            target: target.to_str().unwrap().into(),
            pieces: bent,
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("expected at"), "{e}");
        // Only where a rename reaches the run.
        assert!(can_assemble(parts.path(), parts.path()));
        assert!(!can_assemble(&parts.path().join("missing"), parts.path()));
    }
}
