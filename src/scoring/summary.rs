//! `summary.json`'s aggregate_metrics from partial aggregates of the scored stream: a
//! scoring computes `queries/summary_partial.sql` and `queries/summary_latency.sql` over
//! slices of its results as it writes them (here, or each executor over its own part on a cluster), and
//! `queries/summary.sql` and `queries/metrics/totals.sql` add the partials of every slice
//! up. The written results are never read back for their summary, and the figures are
//! those of the two queries over the whole table (the views `summary_partial` and
//! `summary_latency`; the tests
//! below hold the two equal, and equal to the queries as they were written over
//! case_results before partials).

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, RecordBatch};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::datasource::MemTable;
use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::SessionContext;

use super::{SUMMARY_SQL, TOTALS_SQL};
use crate::engine::queries::{SUMMARY_LATENCY, SUMMARY_PARTIAL};
use crate::engine::{SUMMARY_LATENCY_TABLE, SUMMARY_PARTIAL_TABLE, session};
use crate::error::{Error, Result};
use crate::rundir::Rate;
use crate::rundir::summary::{AggregateMetrics, Latency, Ordered, Rates};

/// Result rows per slice: the partial queries are planned once per slice, and a slice
/// holds only the columns they read (a few hundred bytes a row).
const SLICE_ROWS: usize = 128 * 1024;

/// The two partial queries, with the tables their rows make.
const QUERIES: [(&str, crate::engine::queries::Query); 2] = [
    (SUMMARY_PARTIAL_TABLE, SUMMARY_PARTIAL),
    (SUMMARY_LATENCY_TABLE, SUMMARY_LATENCY),
];

/// Rows of one partial table, and their schema.
#[derive(Clone, Debug)]
pub struct Table {
    pub schema: SchemaRef,
    pub batches: Vec<RecordBatch>,
}

/// The partial aggregates of some results: `summary_partial` rows and `summary_latency`
/// rows (in [`QUERIES`]' order).
#[derive(Clone, Debug)]
pub struct Partial {
    pub tables: [Table; 2],
}

impl Partial {
    /// No rows, the same schemas.
    fn clone_schemas(&self) -> Partial {
        let table = |t: &Table| Table {
            schema: Arc::clone(&t.schema),
            batches: Vec::new(),
        };
        Partial {
            tables: [table(&self.tables[0]), table(&self.tables[1])],
        }
    }
}

/// The partial aggregates of a stream of case_results batches.
pub struct Partials {
    ctx: SessionContext,
    /// The case_results columns the partial queries read, by index.
    columns: Vec<usize>,
    slice_rows: usize,
    buffered: Vec<RecordBatch>,
    rows: usize,
    out: [Table; 2],
}

impl Partials {
    /// For batches of `results` (case_results' schema as the scored stream gives it).
    pub async fn new(results: SchemaRef) -> Result<Self> {
        Self::with_slice_rows(results, SLICE_ROWS).await
    }

    async fn with_slice_rows(results: SchemaRef, slice_rows: usize) -> Result<Self> {
        let ctx = session();
        ctx.register_batch("case_results", RecordBatch::new_empty(Arc::clone(&results)))?;
        let mut read = std::collections::BTreeSet::new();
        let mut schemas = Vec::new();
        for (_, query) in QUERIES {
            let plan = ctx.sql(query.sql).await?.into_optimized_plan()?;
            read.extend(scanned_columns(&plan, results.fields().len()));
            schemas.push(Arc::new(plan.schema().as_arrow().clone()));
        }
        ctx.deregister_table("case_results")?;
        let table = |schema: &SchemaRef| Table {
            schema: Arc::clone(schema),
            batches: Vec::new(),
        };
        Ok(Self {
            ctx,
            columns: read.into_iter().collect(),
            slice_rows: slice_rows.max(1),
            buffered: Vec::new(),
            rows: 0,
            out: [table(&schemas[0]), table(&schemas[1])],
        })
    }

    /// Add a batch of results.
    pub async fn push(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        self.rows += batch.num_rows();
        self.buffered.push(batch.project(&self.columns)?);
        if self.rows >= self.slice_rows {
            self.flush().await?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<()> {
        let Some(first) = self.buffered.first() else {
            return Ok(());
        };
        let table = MemTable::try_new(first.schema(), vec![std::mem::take(&mut self.buffered)])?;
        self.rows = 0;
        self.ctx.register_table("case_results", Arc::new(table))?;
        let collected = self.run_queries().await;
        // The slice goes whatever the queries answered.
        self.ctx.deregister_table("case_results")?;
        for (out, batches) in self.out.iter_mut().zip(collected?) {
            out.batches.extend(batches);
        }
        Ok(())
    }

    /// Both partial queries over the registered slice.
    async fn run_queries(&self) -> Result<Vec<Vec<RecordBatch>>> {
        let mut collected = Vec::with_capacity(QUERIES.len());
        for (_, query) in QUERIES {
            collected.push(self.ctx.sql(query.sql).await?.collect().await?);
        }
        Ok(collected)
    }

    /// The partial aggregates of every batch pushed.
    pub async fn finish(mut self) -> Result<Partial> {
        self.flush().await?;
        Ok(Partial { tables: self.out })
    }
}

/// The columns of a table of `width` columns that a plan's scans read (all of them when
/// a scan reads every column).
fn scanned_columns(plan: &LogicalPlan, width: usize) -> Vec<usize> {
    use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
    let mut read = std::collections::BTreeSet::new();
    let _ = plan.apply(|node| {
        if let LogicalPlan::TableScan(scan) = node {
            match &scan.projection {
                Some(p) => read.extend(p.iter().copied()),
                None => read.extend(0..width),
            }
        }
        Ok(TreeNodeRecursion::Continue)
    });
    read.into_iter().collect()
}

/// summary.json's aggregate_metrics from partial aggregates (of one stream or of many
/// parts, in any order).
pub async fn from_partials(partials: Vec<Partial>) -> Result<AggregateMetrics> {
    let ctx = session();
    let empty = match partials.first() {
        Some(p) => p.clone_schemas(),
        None => empty_partial().await?,
    };
    for (i, (name, _)) in QUERIES.iter().enumerate() {
        let schema = Arc::clone(&empty.tables[i].schema);
        let batches: Vec<RecordBatch> = partials
            .iter()
            .flat_map(|p| p.tables[i].batches.iter().cloned())
            .collect();
        let table = MemTable::try_new(schema, vec![batches])?;
        ctx.register_table(*name, Arc::new(table))?;
    }
    metrics(&ctx).await
}

/// The partial aggregates of no results: the tables' schemas.
pub async fn empty_partial() -> Result<Partial> {
    Partials::new(crate::contract::arrow::case_results_schema())
        .await?
        .finish()
        .await
}

/// Check the partial aggregates of `rows` result rows received from elsewhere (a
/// cluster's part): every count between 0 and its group's rows, the groups' rows adding
/// up to `rows`, each latency counted at least once and at most `rows` in all. A part
/// that is otherwise whole but whose summary would not be its rows' is refused, and no
/// count can make the totals' expansion of latencies unbounded.
pub fn check_received(partial: &Partial, rows: u64, what: &str) -> Result<()> {
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::{DataType, Int64Type};
    let bad = |m: String| Error::State(format!("{what}: {m}"));
    for (i, (name, _)) in QUERIES.iter().enumerate() {
        let mut total: u64 = 0;
        for batch in &partial.tables[i].batches {
            let group = batch
                .column_by_name("rows")
                .ok_or_else(|| bad(format!("{name} without rows")))?
                .as_primitive::<Int64Type>();
            for r in 0..batch.num_rows() {
                let n = if group.is_valid(r) {
                    group.value(r)
                } else {
                    -1
                };
                if n < 1 {
                    return Err(bad(format!("{name}: a group of {n} rows")));
                }
                total = total.saturating_add(n as u64);
                for (f, column) in batch.schema().fields().iter().zip(batch.columns()) {
                    if f.name() == "rows" || f.data_type() != &DataType::Int64 {
                        continue;
                    }
                    let c = column.as_primitive::<Int64Type>();
                    let v = if c.is_valid(r) { c.value(r) } else { -1 };
                    if !(0..=n).contains(&v) {
                        return Err(bad(format!(
                            "{name}: {} = {v} in a group of {n} rows",
                            f.name()
                        )));
                    }
                }
            }
        }
        // Every row is in one group; only rows with a latency have one.
        let ok = if i == 0 { total == rows } else { total <= rows };
        if !ok {
            return Err(bad(format!(
                "{name} counts {total} rows, but the part holds {rows}"
            )));
        }
    }
    Ok(())
}

/// `queries/summary.sql` and `queries/metrics/totals.sql` over the registered
/// `summary_partial` → summary.json's aggregate_metrics.
async fn metrics(ctx: &SessionContext) -> Result<AggregateMetrics> {
    metrics_with(ctx, SUMMARY_SQL, TOTALS_SQL).await
}

/// aggregate_metrics from the rows of a summary query and a totals query.
async fn metrics_with(
    ctx: &SessionContext,
    summary_sql: &str,
    totals_sql: &str,
) -> Result<AggregateMetrics> {
    use datafusion::arrow::datatypes::{Float64Type, Int64Type};
    let mut by: BTreeMap<String, Ordered<Ordered<Rate>>> = BTreeMap::new();
    let mut overall: Ordered<Rate> = Ordered::default();
    for batch in crate::engine::collect(ctx, summary_sql).await? {
        let s = |name: &str| crate::engine::utf8_column(&batch, name);
        let i = |name: &str| crate::engine::typed_column::<Int64Type>(&batch, name);
        let f = |name: &str| crate::engine::typed_column::<Float64Type>(&batch, name);
        let (metric, dimension, value) = (s("metric")?, s("dimension")?, s("value")?);
        let (n, k, rate, lo, hi) = (i("n")?, i("k")?, f("rate")?, f("ci_low")?, f("ci_high")?);
        for r in 0..batch.num_rows() {
            let opt =
                |a: &datafusion::arrow::array::Float64Array| (!a.is_null(r)).then(|| a.value(r));
            let entry = Rate {
                n: n.value(r).max(0) as u64,
                k: k.value(r).max(0) as u64,
                rate: opt(&rate),
                ci_low: opt(&lo),
                ci_high: opt(&hi),
            };
            if dimension.value(r) == "all" {
                *overall.entry(metric.value(r)) = entry;
            } else {
                let group = by.entry(format!("by_{}", dimension.value(r))).or_default();
                *group.entry(value.value(r)).entry(metric.value(r)) = entry;
            }
        }
    }
    let totals = crate::engine::collect(ctx, totals_sql).await?;
    let t = totals
        .first()
        .ok_or_else(|| Error::Internal("totals query returned nothing".into()))?;
    let count = |name: &str| -> Result<u64> {
        Ok(crate::engine::typed_column::<Int64Type>(t, name)?
            .value(0)
            .max(0) as u64)
    };
    let float = |name: &str| -> Result<Option<f64>> {
        let a = crate::engine::typed_column::<Float64Type>(t, name)?;
        Ok((!a.is_null(0)).then(|| a.value(0)))
    };
    Ok(AggregateMetrics {
        total: count("total")?,
        attack_cases: count("attack_cases")?,
        benign_cases: count("benign_cases")?,
        errors: count("errors")?,
        manual_review: count("manual_review")?,
        judged: count("judged")?,
        judge_errors: count("judge_errors")?,
        echoes: count("echoes")?,
        decided_by_human: count("decided_by_human")?,
        decided_by_judge: count("decided_by_judge")?,
        decided_by_rules: count("decided_by_rules")?,
        corrected: crate::scoring::corrected::corrected_rates(&overall),
        rates: Rates {
            overall,
            by: Ordered(by.into_iter().collect()),
        },
        latency_ms: Latency {
            p50: float("latency_p50")?,
            p95: float("latency_p95")?,
            max: float("latency_max")?,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// case_results of every shape the summary distinguishes: plain rows, attempts of a
    /// trial (some decided, some not), trials under pipelines and strategies (adaptive),
    /// agents, benign controls, framework tags, NULL outcomes, errors, reasons and
    /// latencies (repeated and missing). Only the columns the queries read.
    const CASES: &str = "
        SELECT
            'c' || CAST(i % 41 AS VARCHAR) AS case_id,
            CASE WHEN i % 7 < 3 THEN 'att' || CAST(i % 3 AS VARCHAR) END AS attempt_id,
            CASE WHEN (i % 41) % 4 = 0 THEN 'benign' ELSE 'attack' END AS label,
            CASE (i % 41) % 3 WHEN 0 THEN 'fam_a' WHEN 1 THEN 'fam_b' END AS attack_family,
            CASE WHEN i % 5 = 0 THEN NULL ELSE 'surf' || CAST(i % 2 AS VARCHAR) END
                AS attack_surface,
            CASE WHEN (i % 41) % 2 = 0 THEN 'cat' END AS attack_category,
            CASE (i % 41) % 3 WHEN 0 THEN 'high' WHEN 1 THEN 'low' END AS severity,
            CASE WHEN i % 11 < 4 THEN NULL ELSE 'p' || CAST(i % 2 AS VARCHAR) END
                AS attack_pipeline,
            CASE WHEN i % 13 < 9 THEN NULL ELSE 'best_of_n' END AS attack_strategy,
            CASE i % 3 WHEN 1 THEN make_array('LLM01:2025')
                       WHEN 2 THEN make_array('LLM01:2025', 'LLM07:2025') END AS owasp_llm,
            CASE WHEN i % 4 = 1 THEN make_array('ASI01') END AS owasp_agentic,
            CASE WHEN i % 5 = 2 THEN make_array('AML.T0051', 'AML.T0054') END AS mitre_atlas,
            CAST(NULL AS VARCHAR[]) AS nist_ai_600_1,
            CASE WHEN i % 6 = 0 THEN 'done' END AS agent_stop,
            CASE i % 3 WHEN 0 THEN true WHEN 1 THEN false END AS attack_success,
            CASE (i * 7) % 4 WHEN 0 THEN true WHEN 1 THEN NULL ELSE false END AS prompt_leakage,
            CASE (i * 5) % 3 WHEN 0 THEN NULL WHEN 1 THEN true ELSE false END AS refusal,
            CASE WHEN (i % 41) % 4 = 0 THEN (i % 2 = 0) END AS over_refused,
            CASE WHEN i % 6 = 0 THEN (i % 4 = 0) WHEN i % 6 = 3 THEN NULL END
                AS utility_success,
            CASE WHEN i % 6 = 0 AND i % 5 <> 0 THEN (i % 3 = 0) END AS injection_delivered,
            CASE WHEN i % 17 = 0 THEN 'timeout' WHEN i % 19 = 0 THEN ' ' END AS error,
            i % 5 = 1 AS manual_review,
            CASE WHEN i % 8 = 0 THEN 'yes' END AS judge_verdict,
            CASE i % 9 WHEN 0 THEN 'echo' WHEN 1 THEN 'judge_error' END AS review_reason,
            CASE i % 3 WHEN 0 THEN 'rules' WHEN 1 THEN 'judge' ELSE 'human' END AS decided_by,
            CASE WHEN i % 10 = 0 THEN NULL ELSE CAST((i * 37) % 101 AS DOUBLE) / 4 END
                AS latency_ms
        FROM (SELECT value AS i FROM generate_series(1, 1500))";

    fn json(m: &AggregateMetrics) -> String {
        serde_json::to_string_pretty(m).unwrap()
    }

    #[test]
    fn partials_of_any_slices_give_the_summary_of_the_whole_table() {
        let rt = crate::engine::runtime().unwrap();
        rt.block_on(async {
            let ctx = session();
            let batches = ctx.sql(CASES).await.unwrap().collect().await.unwrap();
            let schema = batches[0].schema();
            let table = MemTable::try_new(Arc::clone(&schema), vec![batches.clone()]).unwrap();
            ctx.register_table("case_results", Arc::new(table)).unwrap();

            // The queries as they were written over case_results, before partials.
            let direct = metrics_with(
                &ctx,
                include_str!("../../tests/fixtures/sql/summary_direct.sql"),
                include_str!("../../tests/fixtures/sql/totals_direct.sql"),
            )
            .await
            .unwrap();
            assert!(direct.rates.by.0.iter().any(|(k, _)| k == "by_adaptive"));
            assert!(
                direct
                    .rates
                    .overall
                    .0
                    .iter()
                    .any(|(k, _)| k == "utility_rate")
            );
            assert!(direct.latency_ms.p95.is_some() && direct.errors > 0 && direct.echoes > 0);

            // The view over the whole table.
            crate::engine::register_summary_partial(&ctx).await.unwrap();
            assert_eq!(json(&metrics(&ctx).await.unwrap()), json(&direct));

            // Streamed in slices of 7 rows, in reverse order, as two parts.
            let mut rows: Vec<RecordBatch> = Vec::new();
            for b in &batches {
                for i in (0..b.num_rows()).rev() {
                    rows.push(b.slice(i, 1));
                }
            }
            rows.reverse();
            rows.rotate_left(500);
            let (first, second) = rows.split_at(900);
            let mut all = Vec::new();
            for (part, rows) in [(first, 900), (second, 600)] {
                let mut p = Partials::with_slice_rows(Arc::clone(&schema), 7)
                    .await
                    .unwrap();
                for b in part.iter().rev() {
                    p.push(b).await.unwrap();
                }
                let partial = p.finish().await.unwrap();
                // What a client checks of a part's partials holds of true ones.
                check_received(&partial, rows, "part").unwrap();
                let e = check_received(&partial, rows + 1, "part").unwrap_err();
                assert!(
                    e.to_string().contains(&format!("counts {rows} rows")),
                    "{e}"
                );
                all.push(partial);
            }
            let streamed = from_partials(all).await.unwrap();
            assert_eq!(json(&streamed), json(&direct));

            // No rows at all.
            let empty = from_partials(Vec::new()).await.unwrap();
            let ctx = session();
            ctx.register_batch("case_results", RecordBatch::new_empty(Arc::clone(&schema)))
                .unwrap();
            let direct_empty = metrics_with(
                &ctx,
                include_str!("../../tests/fixtures/sql/summary_direct.sql"),
                include_str!("../../tests/fixtures/sql/totals_direct.sql"),
            )
            .await
            .unwrap();
            assert_eq!(json(&empty), json(&direct_empty));
        });
    }

    #[test]
    fn a_partial_slice_reads_only_the_columns_the_summary_needs() {
        let rt = crate::engine::runtime().unwrap();
        let p = rt
            .block_on(Partials::new(crate::contract::arrow::case_results_schema()))
            .unwrap();
        let schema = crate::contract::arrow::case_results_schema();
        let read: Vec<&str> = p
            .columns
            .iter()
            .map(|&i| schema.field(i).name().as_str())
            .collect();
        assert!(
            read.contains(&"attack_success") && read.contains(&"latency_ms"),
            "{read:?}"
        );
        for text in ["response_text", "request_prompt", "judge_rationale"] {
            assert!(!read.contains(&text), "{read:?}");
        }
    }
}
