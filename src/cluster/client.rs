//! `--cluster df://HOST:PORT`: a DataFusion session whose queries run on a Ballista
//! cluster, after checking that the scheduler holds this process's functions and rule
//! packs.

use ballista_core::extension::SessionStateExt;
use datafusion::prelude::{SessionConfig, SessionContext};

use super::{ClusterInfo, parse_url, process::fetch_info};
use crate::error::{Error, Result};

/// A session on a cluster, and what the scheduler said of it.
pub struct ClusterSession {
    pub ctx: SessionContext,
    /// The scheduler's description (executors and task slots when connected).
    pub info: ClusterInfo,
    /// `df://HOST:PORT`.
    pub url: String,
    /// The scheduler's gRPC address (`http://HOST:PORT`).
    scheduler: String,
}

/// Connect to the scheduler at `url`. `config` is the session's configuration (what a
/// local run of the same query would use); its target partitions become the cluster's
/// task slots, so a scan is split across every executor.
pub async fn connect(url: &str, config: SessionConfig) -> Result<ClusterSession> {
    let (host, port) = parse_url(url)?;
    let info = fetch_info(&host, port).await?;
    if let Some(why) = ClusterInfo::local().mismatch(&info, "client") {
        return Err(Error::Usage(format!("query not submitted: {why}")));
    }
    if info.foreign_executors > 0 {
        return Err(Error::Usage(format!(
            "query not submitted: the scheduler at df://{host}:{port} has {} executor(s) \
             with other rule packs than its own, or not pieval's (restart them with the \
             scheduler's --rules, or stop them)",
            info.foreign_executors
        )));
    }
    if info.executors == 0 {
        return Err(Error::Usage(format!(
            "the scheduler at df://{host}:{port} has no executor: start one with \
             `pieval cluster executor --scheduler df://{host}:{port}`"
        )));
    }
    let config = config.with_target_partitions(info.task_slots.max(1));
    let state = SessionContext::new_with_config(config)
        .state()
        .upgrade_for_ballista(format!("http://{host}:{port}"))?;
    // After the upgrade, which sets Ballista's function lists.
    let ctx = SessionContext::new_with_state(state);
    // Plans this session's queries would ship hold only DataFusion's nodes; physical
    // plans submitted by `submitter` hold pieval's too.
    crate::engine::register_functions(&ctx);
    Ok(ClusterSession {
        ctx,
        info,
        url: format!("df://{host}:{port}"),
        scheduler: format!("http://{host}:{port}"),
    })
}

/// Submits physical plans planned in this process (pieval's nodes encoded by
/// [`super::codec`]) to `session`'s scheduler, under its session id and configuration;
/// the rows of the plan's one output partition stream back.
pub fn submitter(session: &ClusterSession) -> crate::cluster::score::SubmitPlan {
    use ballista_core::extension::SessionConfigExt;
    let scheduler = session.scheduler.clone();
    let session_id = session.ctx.session_id();
    let config = session.ctx.copied_config();
    std::sync::Arc::new(move |plan| {
        let scheduler = scheduler.clone();
        let session_id = session_id.clone();
        let config = config.clone();
        Box::pin(async move {
            let codec = super::codec::physical();
            let stream = ballista_core::execution_plans::execute_physical_plan::<
                datafusion_proto::protobuf::PhysicalPlanNode,
            >(
                scheduler,
                &config.ballista_config(),
                plan,
                codec.as_ref(),
                session_id,
                config,
            )
            .await?;
            Ok(stream)
        })
    })
}
