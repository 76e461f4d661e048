//! The cluster's scoring plan nodes (docs/cluster.md): the predictions' scan by slices
//! ([`slices`]), each executor's part writer ([`parts`]), and the two ways executors put
//! the parts together — on a shared file system ([`assemble`]) and on object storage
//! ([`upload`]). They write through the scored stream's own room ([`crate::scoring`]),
//! as scoring in this process does; `ops::score` plans and submits them.

use std::sync::Arc;

use crate::error::Result;

pub(crate) mod assemble;
pub(crate) mod parts;
pub(crate) mod slices;
pub(crate) mod upload;

pub use assemble::{AssembleExec, AssembleSpec};
pub use parts::PartWriterExec;
pub use slices::{PredictionsScanExec, ScanSpec, Stamp};
pub use upload::{UploadExec, UploadSpec};

/// Submits a physical plan (planned in this process, with the cluster session's
/// configuration) to a cluster; the rows of its one output partition stream back.
pub type SubmitPlan = Arc<
    dyn Fn(
            Arc<dyn datafusion::physical_plan::ExecutionPlan>,
        ) -> futures::future::BoxFuture<
            'static,
            Result<datafusion::physical_plan::SendableRecordBatchStream>,
        > + Send
        + Sync,
>;

/// A session on a cluster, as scoring uses it.
pub struct ClusterScoring {
    /// Queries through it run on the cluster (the scheduler plans them), with pieval's
    /// functions registered; scoring plans with its configuration.
    pub ctx: datafusion::prelude::SessionContext,
    /// Where it runs.
    pub engine: crate::scoring::ScoringEngine,
    /// Runs a physical plan on the cluster: how scoring ships its part writers.
    pub submit: SubmitPlan,
}

/// Opens a session on a cluster from the scoring configuration. The cluster module
/// builds it (it sits above the engine); scoring only calls it.
pub type ClusterConnect = Arc<
    dyn Fn(
            datafusion::prelude::SessionConfig,
        ) -> futures::future::BoxFuture<'static, Result<ClusterScoring>>
        + Send
        + Sync,
>;
