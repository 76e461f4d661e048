//! The scored stream's own room, below both ways of scoring: the writers of
//! case_results (Parquet and JSONL from the same batches) and findings, the tally of
//! outcomes and review reasons, the scored stream's schema and the summary's partial
//! aggregates ([`summary`]). `ops::score` (scoring in this process) and the cluster's
//! plan nodes (`cluster::score`, each executor's part) both write through it, so a part
//! and a local run write the same bytes the same way.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::json::WriterBuilder;
use datafusion::arrow::json::writer::LineDelimited;
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use crate::engine::session;
use crate::error::{Error, Result};

pub mod corrected;
pub mod summary;

/// `queries/findings.sql`.
pub const FINDINGS_SQL: &str = crate::engine::queries::FINDINGS.sql;
/// `queries/summary.sql`.
pub const SUMMARY_SQL: &str = crate::engine::queries::SUMMARY.sql;
/// `queries/metrics/totals.sql`.
pub const TOTALS_SQL: &str = crate::engine::queries::TOTALS.sql;

/// Examples kept per review reason.
pub(crate) const EXAMPLES: usize = 5;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReviewCount {
    pub count: u64,
    pub first_case_ids: Vec<String>,
}

/// Where a scoring ran: in this process, or on a Ballista cluster (`summary.json`'s
/// `scoring`, the run catalogue's scoring_engine and scoring_executors).
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct ScoringEngine {
    /// `local` or `ballista`.
    pub engine: String,
    /// The scheduler (`df://HOST:PORT`), on a cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler: Option<String>,
    /// Executors registered when the query was submitted, on a cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executors: Option<usize>,
    /// Their task slots in all, on a cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_slots: Option<usize>,
    /// The rule packs the detectors ran with (`crate::detect::packs::digest`: the
    /// shipped ones, or `--rules`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rulepack_digest: Option<String>,
    /// On a cluster: milliseconds staging the inputs and surveying the predictions (the
    /// executors validate them),
    /// from submitting the scoring to the last part reported (the executors score,
    /// write, and compute the summary's partial aggregates), and checking and splicing
    /// the parts here and adding up the partials (docs/cluster.md: the scaling model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staging_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit_ms: Option<u64>,
    /// On a cluster: the part files the executors wrote (one per partition of the scan).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parts: Option<usize>,
    /// On a cluster: the run's files the executors put together from the parts (the
    /// others the client spliced: docs/cluster.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assembled_by_executors: Option<Vec<String>>,
    /// In this process, when the corpus was read in the predictions' order (an import's
    /// scoring: `src/engine/case_window.rs`): the most cases the join held at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cases_held_most: Option<usize>,
}

impl ScoringEngine {
    pub fn local() -> Self {
        Self {
            engine: "local".into(),
            ..Self::default()
        }
    }
}

/// Writes both result files under temporary names; `commit` renames them (dropped
/// uncommitted, neither is left behind).
pub(crate) struct ResultWriters {
    parquet: (PathBuf, crate::atomic::ParquetFile),
    jsonl: (
        PathBuf,
        datafusion::arrow::json::Writer<crate::atomic::TempFile, LineDelimited>,
    ),
}

impl ResultWriters {
    pub(crate) fn create(dir: &Path, schema: Arc<Schema>) -> Result<Self> {
        let parquet = dir.join(crate::rundir::CASE_RESULTS_PARQUET);
        let jsonl = dir.join(crate::rundir::CASE_RESULTS_JSONL);
        let pw = crate::atomic::ParquetFile::create(&parquet, schema)?;
        let jw = WriterBuilder::new()
            .with_explicit_nulls(true)
            .build::<_, LineDelimited>(crate::atomic::TempFile::create(&jsonl)?);
        Ok(Self {
            parquet: (parquet, pw),
            jsonl: (jsonl, jw),
        })
    }

    /// Under other names, in a folder other machines write in too (a cluster's part
    /// files: [`crate::atomic::TempFile::create_shared`]).
    pub(crate) fn create_shared(parquet: &Path, jsonl: &Path, schema: Arc<Schema>) -> Result<Self> {
        let pw = crate::atomic::ParquetFile::create_shared(parquet, schema)?;
        let jw = WriterBuilder::new()
            .with_explicit_nulls(true)
            .build::<_, LineDelimited>(crate::atomic::TempFile::create_shared(jsonl)?);
        Ok(Self {
            parquet: (parquet.to_path_buf(), pw),
            jsonl: (jsonl.to_path_buf(), jw),
        })
    }

    pub(crate) fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        self.parquet.1.write(batch)?;
        self.jsonl.1.write(batch)?;
        Ok(())
    }

    /// Both [`ResultWriters::create_shared`] files closed and renamed into place: the
    /// Parquet file's and the JSONL file's SHA-256 and length, hashed as they were written.
    pub(crate) fn commit_hashed(self) -> Result<[(String, u64); 2]> {
        let (_, pw) = self.parquet;
        let (_, mut jw) = self.jsonl;
        jw.finish()?;
        let (_, sha256, bytes) = pw.commit_hashed()?;
        Ok([(sha256, bytes), jw.into_inner().commit_hashed()?])
    }

    /// Both files closed, under their temporary names (for the run's commit).
    pub(crate) fn finish(self) -> Result<Vec<(&'static str, crate::atomic::TempFile)>> {
        let (_, pw) = self.parquet;
        let (_, mut jw) = self.jsonl;
        jw.finish()?;
        Ok(vec![
            ("case_results_parquet", pw.finish()?.0),
            ("case_results_jsonl", jw.into_inner()),
        ])
    }
}

/// Rows per result batch from a cluster: its results arrive in Arrow Flight messages of a
/// few hundred rows, and findings.sql is planned once per batch (on 512 MB, 4,581
/// batches instead of 66 took the client 40 s instead of 10).
pub(crate) const RESULT_BATCH_ROWS: usize = 8192;

/// A stream's batches regrouped into batches of about `rows` rows.
pub(crate) fn coalesced(
    stream: datafusion::physical_plan::SendableRecordBatchStream,
    rows: usize,
) -> impl futures::Stream<Item = Result<RecordBatch>> {
    use datafusion::arrow::compute::BatchCoalescer;
    let coalescer = BatchCoalescer::new(stream.schema(), rows);
    futures::stream::unfold(
        (stream, coalescer, false),
        |(mut stream, mut coalescer, mut done)| async move {
            loop {
                if let Some(batch) = coalescer.next_completed_batch() {
                    return Some((Ok(batch), (stream, coalescer, done)));
                }
                if done {
                    return None;
                }
                let pushed = match stream.next().await {
                    Some(Ok(batch)) => coalescer.push_batch(batch).map_err(Error::from),
                    Some(Err(e)) => Err(Error::from(e)),
                    None => {
                        done = true;
                        coalescer.finish_buffered_batch().map_err(Error::from)
                    }
                };
                if let Err(e) = pushed {
                    return Some((Err(e), (stream, coalescer, true)));
                }
            }
        },
    )
}

/// Outcomes and review reasons counted over result rows (a run's, or one part's).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Tally {
    pub rows: u64,
    pub attack_success: u64,
    pub over_refused: u64,
    pub manual_review: u64,
    pub review: BTreeMap<String, ReviewCount>,
}

/// Count outcomes and review reasons of one result batch.
pub(crate) fn tally(batch: &RecordBatch, report: &mut Tally) -> Result<()> {
    let boolean = |name: &str| -> Result<datafusion::arrow::array::BooleanArray> {
        let col = batch
            .column_by_name(name)
            .ok_or_else(|| Error::Internal(format!("score_cases.sql returned no {name}")))?;
        Ok(datafusion::arrow::compute::cast(col, &DataType::Boolean)?
            .as_boolean()
            .clone())
    };
    let ids = crate::engine::utf8_column(batch, "case_id")?;
    let success = boolean("attack_success")?;
    let over_refused = boolean("over_refused")?;
    let review = boolean("manual_review")?;
    let reasons = crate::engine::utf8_column(batch, "review_reason")?;
    report.rows += batch.num_rows() as u64;
    for i in 0..batch.num_rows() {
        if success.is_valid(i) && success.value(i) {
            report.attack_success += 1;
        }
        if over_refused.is_valid(i) && over_refused.value(i) {
            report.over_refused += 1;
        }
        if review.is_valid(i) && review.value(i) {
            report.manual_review += 1;
        }
        if reasons.is_valid(i) {
            let listed = crate::contract::enums::ReviewReason::parse_list(reasons.value(i))
                .map_err(|e| Error::Internal(format!("score_cases.sql: {e}")))?;
            for reason in listed {
                let entry =
                    report
                        .review
                        .entry(reason.as_str().to_owned())
                        .or_insert(ReviewCount {
                            count: 0,
                            first_case_ids: Vec::new(),
                        });
                entry.count += 1;
                if entry.first_case_ids.len() < EXAMPLES {
                    entry
                        .first_case_ids
                        .push(crate::text::excerpt(ids.value(i), 80));
                }
            }
        }
    }
    Ok(())
}

/// The column of the scored stream that holds each response's injection-rule spans
/// (`queries/score_cases.sql`); findings read it, case_results does not hold it.
pub(crate) const RULE_SPANS: &str = "rule_spans";

/// The column of the scored stream that holds the prediction's line or row; case_results
/// does not hold it (a cluster's parts report what they cover with it).
pub(crate) const SOURCE_LINE: &str = "source_line";

/// The scored stream's columns that case_results holds (all but [`SOURCE_LINE`] and
/// [`RULE_SPANS`]).
pub(crate) fn results_columns(scored: &Schema) -> Vec<usize> {
    (0..scored.fields().len())
        .filter(|&i| ![RULE_SPANS, SOURCE_LINE].contains(&scored.field(i).name().as_str()))
        .collect()
}

/// The scored stream's schema, the table `queries/findings.sql` reads as `scored`:
/// case_results' fields, `source_line` and `rule_spans` (a list of `pi_rule_spans`
/// elements).
pub fn scored_schema() -> Arc<Schema> {
    let mut fields: Vec<Field> = crate::contract::arrow::case_results_schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new(SOURCE_LINE, DataType::Int64, true));
    fields.push(Field::new(
        RULE_SPANS,
        DataType::List(Arc::new(Field::new_list_field(
            DataType::Struct(crate::detect::udf::span_fields()),
            true,
        ))),
        true,
    ));
    Arc::new(Schema::new(fields))
}

/// `queries/findings.sql` over each batch of the scored stream, into `findings.parquet`
/// under a temporary name: findings come from the same pass as the results. The query
/// has no aggregate (a filter and an unnest per branch), so running it batch by batch
/// gives the rows it gives over the whole table.
pub(crate) struct FindingsWriter {
    ctx: datafusion::prelude::SessionContext,
    file: crate::atomic::ParquetFile,
}

impl FindingsWriter {
    pub(crate) async fn create(path: &Path, scored: Arc<Schema>) -> Result<Self> {
        Self::create_in(path, scored, false).await
    }

    /// With `shared`, in a folder other machines write in too
    /// ([`crate::atomic::TempFile::create_shared`]).
    pub(crate) async fn create_in(path: &Path, scored: Arc<Schema>, shared: bool) -> Result<Self> {
        let ctx = session();
        ctx.register_batch("scored", RecordBatch::new_empty(scored))?;
        let schema = Arc::new(ctx.sql(FINDINGS_SQL).await?.schema().as_arrow().clone());
        let file = if shared {
            crate::atomic::ParquetFile::create_shared(path, schema)?
        } else {
            crate::atomic::ParquetFile::create(path, schema)?
        };
        Ok(Self { ctx, file })
    }

    pub(crate) async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        self.ctx.deregister_table("scored")?;
        self.ctx.register_batch("scored", batch.clone())?;
        for found in self.ctx.sql(FINDINGS_SQL).await?.collect().await? {
            self.file.write(&found)?;
        }
        Ok(())
    }

    /// Closed, under its temporary name (for the run's commit).
    pub(crate) fn finish(self) -> Result<crate::atomic::TempFile> {
        Ok(self.file.finish()?.0)
    }

    /// Closed and renamed into place: a file made with `shared`: its rows, SHA-256 and
    /// length (hashed as it was written).
    pub(crate) fn commit_hashed(self) -> Result<(u64, String, u64)> {
        self.file.commit_hashed()
    }
}
