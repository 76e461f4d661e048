//! The plan nodes pieval ships to a cluster besides DataFusion's and Ballista's:
//! [`PartWriterExec`] (executors write the results of `score --cluster`),
//! [`PredictionsScanExec`] (executors read the predictions), [`AssembleExec`]
//! (executors put the run's files together) and [`UploadExec`] (the same on object
//! storage). The client,
//! the scheduler and every executor encode and decode plans with this codec; what it does
//! not know goes to Ballista's own.

use std::sync::Arc;

use ballista_core::serde::BallistaPhysicalExtensionCodec;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};

use crate::cluster::score::{
    AssembleExec, AssembleSpec, PartWriterExec, PredictionsScanExec, ScanSpec, UploadExec,
    UploadSpec,
};

/// What a [`PartWriterExec`] node's bytes start with (then its parts folder, UTF-8).
const PART_WRITER: &[u8] = b"pieval.part-writer/1\n";

/// What a [`PredictionsScanExec`] node's bytes start with (then its [`ScanSpec`], JSON).
const PREDICTIONS_SCAN: &[u8] = b"pieval.predictions-scan/1\n";

/// What an [`AssembleExec`] node's bytes start with (then its [`AssembleSpec`], JSON).
const ASSEMBLE: &[u8] = b"pieval.assemble/2\n";

/// What an [`UploadExec`] node's bytes start with (then its [`UploadSpec`], JSON).
const UPLOAD: &[u8] = b"pieval.upload/1\n";

/// pieval's nodes, then Ballista's.
#[derive(Debug, Default)]
pub struct PievalCodec {
    ballista: BallistaPhysicalExtensionCodec,
}

/// The codec every pieval cluster process uses.
pub fn physical() -> Arc<dyn PhysicalExtensionCodec> {
    Arc::new(PievalCodec::default())
}

/// A node's spec (JSON) and its one input.
fn spec_and_input<T: serde::de::DeserializeOwned>(
    node: &str,
    spec: &[u8],
    inputs: &[Arc<dyn ExecutionPlan>],
) -> Result<(T, Arc<dyn ExecutionPlan>)> {
    let spec = serde_json::from_slice(spec)
        .map_err(|e| DataFusionError::Internal(format!("a {node} that does not parse: {e}")))?;
    let [input] = inputs else {
        return Err(DataFusionError::Internal(format!(
            "a {node} with {} inputs",
            inputs.len()
        )));
    };
    Ok((spec, Arc::clone(input)))
}

impl PhysicalExtensionCodec for PievalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if let Some(spec) = buf.strip_prefix(ASSEMBLE) {
            let (spec, input) = spec_and_input::<AssembleSpec>("AssembleExec", spec, inputs)?;
            return Ok(Arc::new(AssembleExec::try_new(spec, input)?));
        }
        if let Some(spec) = buf.strip_prefix(UPLOAD) {
            let (spec, input) = spec_and_input::<UploadSpec>("UploadExec", spec, inputs)?;
            return Ok(Arc::new(UploadExec::try_new(spec, input)?));
        }
        if let Some(spec) = buf.strip_prefix(PREDICTIONS_SCAN) {
            let (spec, input) = spec_and_input::<ScanSpec>("PredictionsScanExec", spec, inputs)?;
            return Ok(Arc::new(PredictionsScanExec::try_new(spec, input)?));
        }
        let Some(dir) = buf.strip_prefix(PART_WRITER) else {
            return self.ballista.try_decode(buf, inputs, ctx, proto_converter);
        };
        let dir = std::str::from_utf8(dir).map_err(|_| {
            DataFusionError::Internal("a PartWriterExec whose folder is not UTF-8".into())
        })?;
        let [input] = inputs else {
            return Err(DataFusionError::Internal(format!(
                "a PartWriterExec with {} inputs",
                inputs.len()
            )));
        };
        Ok(Arc::new(PartWriterExec::try_new(Arc::clone(input), dir)?))
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        if let Some(assemble) = node.downcast_ref::<AssembleExec>() {
            buf.extend_from_slice(ASSEMBLE);
            serde_json::to_writer(&mut *buf, assemble.spec()).map_err(|e| {
                DataFusionError::Internal(format!("cannot encode an AssembleExec: {e}"))
            })?;
            return Ok(());
        }
        if let Some(upload) = node.downcast_ref::<UploadExec>() {
            buf.extend_from_slice(UPLOAD);
            serde_json::to_writer(&mut *buf, upload.spec()).map_err(|e| {
                DataFusionError::Internal(format!("cannot encode an UploadExec: {e}"))
            })?;
            return Ok(());
        }
        if let Some(scan) = node.downcast_ref::<PredictionsScanExec>() {
            buf.extend_from_slice(PREDICTIONS_SCAN);
            serde_json::to_writer(&mut *buf, scan.spec()).map_err(|e| {
                DataFusionError::Internal(format!("cannot encode a PredictionsScanExec: {e}"))
            })?;
            return Ok(());
        }
        if let Some(writer) = node.downcast_ref::<PartWriterExec>() {
            buf.extend_from_slice(PART_WRITER);
            buf.extend_from_slice(writer.dir().as_bytes());
            return Ok(());
        }
        self.ballista.try_encode(node, buf, proto_converter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::physical_plan::ExecutionPlanProperties;
    use datafusion::physical_plan::empty::EmptyExec;
    use datafusion_proto::physical_plan::{AsExecutionPlan, DefaultPhysicalProtoConverter};
    use datafusion_proto::protobuf::PhysicalPlanNode;

    #[test]
    fn a_part_writer_travels_with_its_folder_and_input() {
        let input: Arc<dyn ExecutionPlan> = Arc::new(EmptyExec::new(Arc::new(
            datafusion::arrow::datatypes::Schema::empty(),
        )));
        let plan: Arc<dyn ExecutionPlan> =
            Arc::new(PartWriterExec::try_new(input, "/shared/staging/parts").unwrap());
        let codec = PievalCodec::default();
        let node = PhysicalPlanNode::try_from_physical_plan(plan, &codec).unwrap();
        let ctx = datafusion::prelude::SessionContext::new();
        let back = node
            .try_into_physical_plan(&ctx.task_ctx(), &codec)
            .unwrap();
        let w = back
            .downcast_ref::<PartWriterExec>()
            .expect("a PartWriterExec");
        assert_eq!(w.dir(), "/shared/staging/parts");
        assert!(w.input().downcast_ref::<EmptyExec>().is_some());
        // A folder that is not absolute is refused when decoded, not written relative to
        // an executor's working folder.
        let mut buf = PART_WRITER.to_vec();
        buf.extend_from_slice(b"relative/parts");
        let input: Arc<dyn ExecutionPlan> = Arc::new(EmptyExec::new(Arc::new(
            datafusion::arrow::datatypes::Schema::empty(),
        )));
        let e = codec
            .try_decode(
                &buf,
                &[input],
                &ctx.task_ctx(),
                &DefaultPhysicalProtoConverter {},
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("not an absolute path"), "{e}");
    }

    /// A predictions scan travels with its slices, and a task given one partition by
    /// the scheduler (restricted, renumbered from 0) reads that partition's slice.
    #[test]
    fn a_predictions_scan_restricted_to_one_partition_reads_its_own_slice() {
        use crate::corpus::predictions::{Slice, Span};
        use datafusion::arrow::array::AsArray;
        use datafusion::arrow::datatypes::Int64Type;
        use futures::TryStreamExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.jsonl");
        let lines = [
            "{\"case_id\":\"a\"}\n",
            "{\"case_id\":\"b\"}\n",
            "{\"case_id\":\"a\"}\n",
        ];
        std::fs::write(&path, lines.concat()).unwrap();
        let mut at = 0u64;
        let slices: Vec<Slice> = lines
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let start = at;
                at += l.len() as u64;
                Slice {
                    span: Span::Bytes { start, end: at },
                    first_line: i as u64 + 1,
                    seen_before: if i == 2 { vec![[3, 3]] } else { Vec::new() },
                    runs_at: None,
                }
            })
            .collect();
        let plan: Arc<dyn ExecutionPlan> = Arc::new(
            PredictionsScanExec::scan(
                path.to_str().unwrap(),
                crate::cluster::score::Stamp::of(&path).unwrap(),
                slices,
                None,
                None,
            )
            .unwrap(),
        );
        let codec = PievalCodec::default();
        let node = PhysicalPlanNode::try_from_physical_plan(plan, &codec).unwrap();
        let ctx = datafusion::prelude::SessionContext::new();
        let back = node
            .try_into_physical_plan(&ctx.task_ctx(), &codec)
            .unwrap();
        assert_eq!(back.output_partitioning().partition_count(), 3);
        let rt = crate::engine::runtime().unwrap();
        for global in 0..3 {
            let task = ballista_scheduler::state::task_builder::restrict_plan_to_partitions(
                Arc::clone(&back),
                &[global],
            )
            .unwrap();
            assert_eq!(task.output_partitioning().partition_count(), 1);
            let batches: Vec<_> = rt
                .block_on(
                    task.execute(0, ctx.task_ctx())
                        .unwrap()
                        .try_collect::<Vec<_>>(),
                )
                .unwrap();
            let b = &batches[0];
            assert_eq!(b.num_rows(), 1);
            let line = b
                .column_by_name("source_line")
                .unwrap()
                .as_primitive::<Int64Type>();
            assert_eq!(line.value(0), global as i64 + 1);
            let dup = b
                .column_by_name("duplicate_prediction")
                .unwrap()
                .as_boolean();
            assert_eq!(dup.value(0), global == 2);
        }
    }
}
