//! The plan nodes pieval ships to a cluster besides DataFusion's and Ballista's: today
//! [`PartWriterExec`] (executors write the results of `score --cluster`). The client,
//! the scheduler and every executor encode and decode plans with this codec; what it does
//! not know goes to Ballista's own.

use std::sync::Arc;

use ballista_core::serde::BallistaPhysicalExtensionCodec;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};

use crate::ops::score::PartWriterExec;

/// What a [`PartWriterExec`] node's bytes start with (then its parts folder, UTF-8).
const PART_WRITER: &[u8] = b"pieval.part-writer/1\n";

/// pieval's nodes, then Ballista's.
#[derive(Debug, Default)]
pub struct PievalCodec {
    ballista: BallistaPhysicalExtensionCodec,
}

/// The codec every pieval cluster process uses.
pub fn physical() -> Arc<dyn PhysicalExtensionCodec> {
    Arc::new(PievalCodec::default())
}

impl PhysicalExtensionCodec for PievalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
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
}
