//! The SQL engine: one place that builds a DataFusion `SessionContext` with pieval's
//! tables registered, and runs the queries in `queries/`.
//!
//! SQL lives in `queries/` (compiled into the binary with `include_str!`, so the binary
//! works from any folder); Rust code registers tables and runs it, and never builds SQL
//! from user input.

pub mod bounded;
pub mod case_window;
pub mod predicates;
pub mod queries;
pub mod stream_table;
pub mod tables;
pub mod wilson;

pub use stream_table::{
    CorpusTable, PredictionsTable, StreamTable, corpus_table, predictions_table,
    predictions_table_of,
};

use datafusion::arrow::array::RecordBatch;
use datafusion::prelude::{SessionConfig, SessionContext};

use crate::error::{Error, Result};

/// `queries/corpus_stats.sql`.
pub const CORPUS_STATS_SQL: &str = queries::CORPUS_STATS.sql;

/// The session configuration pieval uses: sized for this machine, information schema on.
/// DataFusion's own `DATAFUSION_*` environment variables (for example
/// `DATAFUSION_EXECUTION_TARGET_PARTITIONS`) override it (docs/cli.md); when one does not
/// parse, none is applied and the warning hook ([`on_settings_warning`]; the CLI's
/// stderr) says why, each time a session is configured.
pub fn session_config() -> SessionConfig {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let base = SessionConfig::new().with_target_partitions(cores);
    let config = if tuned() {
        SessionConfig::from_env().unwrap_or_else(|e| {
            if let Some(warn) = SETTINGS_WARNING.get() {
                // Debug formatting escapes whatever the environment held.
                warn(&format!(
                    "warning: DATAFUSION_* settings ignored: {:?}",
                    crate::text::excerpt(&e.to_string(), 300)
                ));
            }
            base
        })
    } else {
        base
    };
    config.with_information_schema(true)
}

fn tuned() -> bool {
    std::env::vars_os().any(|(k, _)| k.as_encoded_bytes().starts_with(b"DATAFUSION_"))
}

static SETTINGS_WARNING: std::sync::OnceLock<fn(&str)> = std::sync::OnceLock::new();

/// Where the warning about ignored `DATAFUSION_*` settings goes (the CLI sets its stderr;
/// the library itself writes nothing). The first hook set stays.
pub fn on_settings_warning(warn: fn(&str)) {
    let _ = SETTINGS_WARNING.set(warn);
}

/// A session with the detector UDFs registered, and the judge's (`pi_judge` without a
/// judge: [`crate::judge::udf::register`] gives it one).
pub fn session_with(config: SessionConfig) -> SessionContext {
    let ctx = SessionContext::new_with_config(config);
    register_functions(&ctx);
    ctx
}

/// pieval's functions: the detectors, `pi_judge` (without a judge), the Wilson bounds,
/// `pi_sha256` and `pi_sha256_is`, and the shared row predicates (`pi_is_attack`,
/// `pi_is_baseline`).
pub fn register_functions(ctx: &SessionContext) {
    crate::detect::register_udfs(ctx);
    crate::judge::udf::register(ctx, None);
    wilson::register(ctx);
    wilson::register_sha256(ctx);
    predicates::register(ctx);
}

/// The names of the scalar functions [`register_functions`] adds to DataFusion's, sorted.
pub fn function_names() -> Vec<String> {
    let builtin = SessionContext::new().state().scalar_functions().clone();
    let mut names: Vec<String> = session_with(SessionConfig::new())
        .state()
        .scalar_functions()
        .keys()
        .filter(|k| !builtin.contains_key(*k))
        .cloned()
        .collect();
    names.sort();
    names
}

/// A session like [`session`] whose sorts, joins and aggregates may hold at most
/// `bytes` of memory (DataFusion's fair spill pool): beyond it a query fails with a
/// resources-exhausted error instead of exhausting the machine.
pub fn session_with_memory_limit(bytes: usize) -> Result<SessionContext> {
    session_with_config_and_memory_limit(session_config(), bytes)
}

/// The memory limit of the commands that read received runs without a `--memory-limit`
/// of their own (`report`, `export`): 4 GiB, `pieval sql`'s default.
pub const DEFAULT_MEMORY_LIMIT: usize = 4096 << 20;

/// [`session_with_memory_limit`] with another configuration.
pub fn session_with_config_and_memory_limit(
    config: SessionConfig,
    bytes: usize,
) -> Result<SessionContext> {
    let runtime = datafusion::execution::runtime_env::RuntimeEnvBuilder::new()
        .with_memory_limit(bytes, 1.0)
        .build_arc()?;
    let ctx = SessionContext::new_with_config_rt(config, runtime);
    register_functions(&ctx);
    Ok(ctx)
}

/// A session sized for this machine, with the information schema on and the detector
/// UDFs registered.
pub fn session() -> SessionContext {
    session_with(session_config())
}

/// Stack of each runtime thread: plans are walked recursively (DataFusion's optimizer,
/// Ballista's protobuf decoding of a scoring plan in the scheduler), and a debug build's
/// frames are large: 2 MiB (tokio's default) overflowed on the scoring plan.
pub const THREAD_STACK_BYTES: usize = 16 << 20;

/// A runtime for the synchronous CLI to drive DataFusion on.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(THREAD_STACK_BYTES)
        .build()
        .map_err(|e| Error::io("<runtime>", "cannot start the async runtime", e))
}

/// Run one query to completion (for small results: aggregates, reports).
pub async fn collect(ctx: &SessionContext, sql: &str) -> Result<Vec<RecordBatch>> {
    Ok(ctx.sql(sql).await?.collect().await?)
}

/// A result column as Utf8, whatever string type the plan produced (DataFusion reads
/// Parquet strings as Utf8View); an error, not a panic, when it is missing or not text.
pub fn utf8_column(
    batch: &RecordBatch,
    name: &str,
) -> Result<datafusion::arrow::array::StringArray> {
    use datafusion::arrow::array::AsArray;
    let col = batch
        .column_by_name(name)
        .ok_or_else(|| Error::Query(format!("query result has no column {name:?}")))?;
    let col = datafusion::arrow::compute::cast(col, &datafusion::arrow::datatypes::DataType::Utf8)?;
    Ok(col.as_string::<i32>().clone())
}

/// A result column cast to `T` (Int64, Float64, Boolean …).
pub fn typed_column<T: datafusion::arrow::datatypes::ArrowPrimitiveType>(
    batch: &RecordBatch,
    name: &str,
) -> Result<datafusion::arrow::array::PrimitiveArray<T>> {
    use datafusion::arrow::array::AsArray;
    let col = batch
        .column_by_name(name)
        .ok_or_else(|| Error::Query(format!("query result has no column {name:?}")))?;
    let col = datafusion::arrow::compute::cast(col, &T::DATA_TYPE)?;
    Ok(col.as_primitive::<T>().clone())
}

/// Register a run's `case_results.parquet` as `name`, read with the current
/// case_results schema: columns added since the file was written (the adaptive-attack
/// fields, over_refused, response_class) read as NULL, and older runs' benign controls
/// are read with today's meaning ([`case_results_as_read`]), so every query runs on
/// older runs too. Read with bounded decoding ([`bounded`]): errors name the file.
pub async fn register_case_results(
    ctx: &datafusion::prelude::SessionContext,
    name: &str,
    path: &str,
) -> Result<()> {
    let schema = crate::contract::arrow::case_results_schema();
    let table = bounded::BoundedRunTable::try_new(ctx, schema, &[path.into()]).await?;
    let df = ctx.read_table(std::sync::Arc::new(table))?;
    ctx.register_table(name, case_results_as_read(df)?.into_view())?;
    Ok(())
}

/// The tables [`queries::SUMMARY`] and [`queries::TOTALS`] read: the partial aggregates
/// of case_results (`queries/summary_partial.sql`) and their latencies
/// (`queries/summary_latency.sql`).
pub const SUMMARY_PARTIAL_TABLE: &str = "summary_partial";
pub const SUMMARY_LATENCY_TABLE: &str = "summary_latency";

/// [`SUMMARY_PARTIAL_TABLE`] and [`SUMMARY_LATENCY_TABLE`] as views over the whole of the
/// registered `case_results` (a scoring computes the partials from its stream instead:
/// `scoring::summary`).
pub async fn register_summary_partial(ctx: &datafusion::prelude::SessionContext) -> Result<()> {
    for (table, query) in [
        (SUMMARY_PARTIAL_TABLE, queries::SUMMARY_PARTIAL),
        (SUMMARY_LATENCY_TABLE, queries::SUMMARY_LATENCY),
    ] {
        let df = ctx.sql(query.sql).await?;
        ctx.register_table(table, df.into_view())?;
    }
    Ok(())
}

/// case_results as every query reads them. Runs scored before benign controls had an
/// outcome of their own (before `over_refused`; docs/contract.md#benign-controls)
/// recorded an answered control as `attack_success = true`: such a row reads as
/// `attack_success` NULL and `over_refused = NOT` the stored value. Rows written since
/// already have that shape and read unchanged.
pub fn case_results_as_read(
    df: datafusion::dataframe::DataFrame,
) -> Result<datafusion::dataframe::DataFrame> {
    use datafusion::prelude::{coalesce, col, lit, not, when};
    use datafusion::scalar::ScalarValue;
    let benign = || col("label").eq(lit("benign"));
    let exprs = crate::contract::fields::CASE_RESULT_FIELDS
        .iter()
        .map(|f| {
            Ok(match *f {
                "attack_success" => when(benign(), lit(ScalarValue::Boolean(None)))
                    .otherwise(col("attack_success"))?
                    .alias("attack_success"),
                "over_refused" => coalesce(vec![
                    col("over_refused"),
                    when(benign(), not(col("attack_success"))).end()?,
                ])
                .alias("over_refused"),
                f => col(f),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(df.select(exprs)?)
}
