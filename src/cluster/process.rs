//! `pieval cluster scheduler` and `pieval cluster executor`: Ballista's scheduler and
//! executor with pieval's functions registered, configured from the rule packs in
//! effect.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::routing::get;
use ballista_core::registry::BallistaFunctionRegistry;
use ballista_core::serde::protobuf::scheduler_grpc_server::SchedulerGrpcServer;
use ballista_executor::executor_process::{ExecutorProcessConfig, start_executor_process};
use ballista_scheduler::cluster::BallistaCluster;
use ballista_scheduler::config::SchedulerConfig;
use ballista_scheduler::scheduler_process::create_scheduler;
use ballista_scheduler::scheduler_server::SessionBuilder;
use datafusion::execution::SessionState;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_proto::protobuf::{LogicalPlanNode, PhysicalPlanNode};

use super::{ClusterInfo, INFO_PATH};
use crate::error::{Error, Result};

/// `pieval cluster scheduler`.
#[derive(Clone, Debug)]
pub struct SchedulerOptions {
    /// Where the scheduler listens (gRPC and [`INFO_PATH`]).
    pub bind: SocketAddr,
    /// The host executors and clients reach it at (default: the bind host).
    pub external_host: Option<String>,
}

/// `pieval cluster executor`.
#[derive(Clone, Debug)]
pub struct ExecutorOptions {
    /// The scheduler: host and port.
    pub scheduler: (String, u16),
    /// Where the executor serves its results (Arrow Flight); gRPC listens on the next
    /// port.
    pub bind: SocketAddr,
    /// The host the scheduler and clients reach it at (default: the bind host).
    pub external_host: Option<String>,
    /// Partitions it runs at once (default: its cores).
    pub concurrency: Option<usize>,
    /// Where it keeps shuffle files (default: a temporary folder).
    pub work_dir: Option<std::path::PathBuf>,
}

/// A DataFusion session state with pieval's functions, from Ballista's own builder
/// (its optimizer rules and functions) and `config`.
fn pieval_state(config: SessionConfig) -> datafusion::common::Result<SessionState> {
    let state = ballista_core::utils::default_session_builder(config)?;
    // A plan that reads a staged `s3://` file names its store, which decoding the plan
    // looks up (no request is made here: the executors read).
    let env = datafusion::execution::runtime_env::RuntimeEnvBuilder::from_runtime_env(
        state.runtime_env(),
    )
    .with_object_store_registry(Arc::new(crate::objstore::EnvRegistry::default()))
    .build_arc()?;
    let state = datafusion::execution::SessionStateBuilder::new_from_existing(state)
        .with_runtime_env(env)
        .build();
    let ctx = SessionContext::new_with_state(state);
    crate::engine::register_functions(&ctx);
    Ok(ctx.state())
}

fn ballista(e: impl std::fmt::Display) -> Error {
    Error::Query(format!("ballista: {e}"))
}

/// Run a scheduler until the process is stopped.
pub async fn run_scheduler(opts: SchedulerOptions) -> Result<()> {
    ipv4_only(opts.bind)?;
    let mut config = SchedulerConfig {
        bind_host: opts.bind.ip().to_string(),
        bind_port: opts.bind.port(),
        external_host: opts
            .external_host
            .clone()
            .unwrap_or_else(|| opts.bind.ip().to_string()),
        // A killed executor is noticed within ~20 s (its heartbeat is every 5 s), and
        // its tasks are run elsewhere, not after Ballista's default 3 minutes.
        executor_timeout_seconds: 20,
        expire_dead_executor_interval_seconds: 5,
        no_executors_grace_period_seconds: 20,
        ..SchedulerConfig::default()
    };
    // Queries are planned here: every session the scheduler builds holds pieval's
    // functions, or a plan naming one would not decode.
    let builder: SessionBuilder = Arc::new(pieval_state);
    config.override_session_builder = Some(builder);
    // Decodes the plans clients submit (pieval's part writers among them) and encodes
    // the stages it hands out.
    config.override_physical_codec = Some(super::codec::physical());
    config.validate().map_err(ballista)?;
    let listener = tokio::net::TcpListener::bind(opts.bind)
        .await
        .map_err(|e| Error::io(opts.bind.to_string(), "cannot listen", e))?;
    let cluster = BallistaCluster::new_from_config(&config)
        .await
        .map_err(ballista)?;
    let config = Arc::new(config);
    let scheduler =
        create_scheduler::<LogicalPlanNode, PhysicalPlanNode>(cluster, Arc::clone(&config))
            .await
            .map_err(ballista)?;
    let grpc = SchedulerGrpcServer::new(scheduler.clone())
        .max_encoding_message_size(config.grpc_server_max_encoding_message_size as usize)
        .max_decoding_message_size(config.grpc_server_max_decoding_message_size as usize);
    let mut routes = tonic::service::RoutesBuilder::default();
    routes.add_service(grpc);
    let state = Arc::clone(&scheduler.state);
    // Computed once: the answer to every request is this plus the executors.
    let local = ClusterInfo::local();
    let ours = super::executor_id_prefix(&local.rulepack_digest);
    let info = move || {
        let state = Arc::clone(&state);
        let mut info = local.clone();
        let ours = ours.clone();
        async move {
            if let Ok(executors) = state.executor_manager.get_executors_state().await {
                info.executors = executors.len();
                info.task_slots = executors
                    .iter()
                    .map(|(m, _, _)| m.specification.vcores as usize)
                    .sum();
                info.foreign_executors = executors
                    .iter()
                    .filter(|(m, _, _)| !m.id.starts_with(&ours))
                    .count();
            }
            axum::Json(info)
        }
    };
    let router = routes
        .routes()
        .into_axum_router()
        .route(INFO_PATH, get(info));
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
    .map_err(|e| Error::io(opts.bind.to_string(), "scheduler stopped", e))
}

/// Ballista's addresses are HOST:PORT strings, which an IPv6 address breaks.
fn ipv4_only(bind: SocketAddr) -> Result<()> {
    if bind.is_ipv6() {
        return Err(Error::Usage(format!(
            "--bind {bind}: IPv6 addresses are not supported; give an IPv4 address"
        )));
    }
    Ok(())
}

/// The largest description a scheduler may send.
const MAX_INFO_BYTES: usize = 1 << 20;

/// The scheduler's description, fetched from [`INFO_PATH`]: what this process must
/// match. An error names the address when the scheduler cannot be reached or is not
/// pieval's. A hostile answer is bounded: 20 s, 1 MiB, no redirect.
pub async fn fetch_info(host: &str, port: u16) -> Result<ClusterInfo> {
    let url = format!("http://{host}:{port}{INFO_PATH}");
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(20))
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .build()
        .map_err(|e| Error::Internal(format!("http client: {e}")))?;
    let unreachable = |why: String| {
        Error::Usage(format!(
            "cannot reach a pieval scheduler at df://{host}:{port}: {why} \
             (start one with `pieval cluster scheduler --bind HOST:PORT`)"
        ))
    };
    let mut response = client
        .get(&url)
        .send()
        .await
        .map_err(|e| unreachable(crate::text::error_chain(&e)))?;
    if !response.status().is_success() {
        return Err(unreachable(format!(
            "{url} answered {} (a Ballista scheduler without pieval's functions?)",
            response.status()
        )));
    }
    let mut body: Vec<u8> = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| unreachable(crate::text::error_chain(&e)))?
    {
        if body.len() + chunk.len() > MAX_INFO_BYTES {
            return Err(unreachable(format!("{url}: an answer over 1 MiB")));
        }
        body.extend_from_slice(&chunk);
    }
    let mut info: ClusterInfo = serde_json::from_slice(&body)
        .map_err(|e| unreachable(format!("{url} did not answer a pieval description: {e}")))?;
    // A partition count, later: bounded whatever the answer says.
    info.task_slots = info.task_slots.min(MAX_TASK_SLOTS);
    Ok(info)
}

/// The most task slots a description may claim (they become a query's partitions).
const MAX_TASK_SLOTS: usize = 1 << 16;

/// Run an executor until the process is stopped; refuses to start when the scheduler's
/// rule packs or functions differ from this process's.
pub async fn run_executor(opts: ExecutorOptions) -> Result<()> {
    ipv4_only(opts.bind)?;
    let (host, port) = &opts.scheduler;
    // The scheduler may be starting too: its address is tried for 20 s.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let scheduler = loop {
        match fetch_info(host, *port).await {
            Ok(info) => break info,
            Err(e) if std::time::Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e),
        }
    };
    if let Some(why) = ClusterInfo::local().mismatch(&scheduler, "executor") {
        return Err(Error::Usage(format!("executor not started: {why}")));
    }
    let grpc_port = opts.bind.port().checked_add(1).ok_or_else(|| {
        Error::Usage(format!(
            "--bind {}: the executor needs the next port too (gRPC)",
            opts.bind
        ))
    })?;
    let state = pieval_state(ballista_core::utils::default_config_producer())?;
    let mut config = ExecutorProcessConfig {
        // Names this executor's rule packs: the scheduler tells clients about an
        // executor it took back without this check (see ClusterInfo::foreign_executors).
        executor_id: super::executor_id(),
        bind_host: opts.bind.ip().to_string(),
        external_host: opts.external_host.clone(),
        port: opts.bind.port(),
        grpc_port,
        scheduler_host: host.clone(),
        scheduler_port: *port,
        scheduler_connect_timeout_seconds: 20,
        work_dir: opts.work_dir.as_ref().map(|p| p.display().to_string()),
        print_thread_info: false,
        // Ballista's own heartbeat: a dead executor is noticed within the scheduler's
        // expiry (its tasks are then run elsewhere).
        executor_heartbeat_interval_seconds: 5,
        ..ExecutorProcessConfig::default()
    };
    if let Some(n) = opts.concurrency {
        config.vcores = n;
    }
    // Plans name functions; this registry resolves them.
    config.override_function_registry = Some(Arc::new(BallistaFunctionRegistry::from(&state)));
    // Decodes its tasks' plans, pieval's part writers among them.
    config.override_physical_codec = Some(super::codec::physical());
    // A staged input or a parts folder on object storage (`--staging s3://…`) is reached
    // through a store this executor opens from its own environment: credentials never
    // travel in a plan.
    let stores: Arc<dyn datafusion::execution::object_store::ObjectStoreRegistry> =
        Arc::new(crate::objstore::EnvRegistry::default());
    let work_dir = opts.work_dir.clone();
    config.override_runtime_producer = Some(Arc::new(move |_| {
        let mut env = datafusion::execution::runtime_env::RuntimeEnvBuilder::new()
            .with_object_store_registry(Arc::clone(&stores));
        if let Some(dir) = &work_dir {
            env = env.with_temp_file_path(dir.clone());
        }
        Ok(Arc::new(env.build()?))
    }));
    start_executor_process(Arc::new(config))
        .await
        .map_err(ballista)
}
