//! A DataFusion table over any streamed source of batches (a corpus, predictions):
//! each scan opens the source on a blocking thread with the scan's projection and feeds
//! its batches to the query, so inputs larger than memory are queried in bounded memory.
//! What the source learns while streaming (validation report, prediction counts) is
//! kept in a shared slot for the caller once the scan finishes.
//!
//! A table may offer several partitions over its one source (predictions do: one per
//! core): they share the source's bounded channel and each takes the next batch, so a
//! query runs its detectors on every core without a repartitioning step, whose queues
//! DataFusion does not bound (docs/performance.md: memory that grew with the input).

use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::Session;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::LexOrdering;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use datafusion::physical_plan::{ExecutionPlan, SendableRecordBatchStream};

use crate::contract::arrow::enriched_case_schema;
use crate::corpus::predictions::{PredictionStats, PredictionsReader, predictions_table_schema};
use crate::corpus::{CorpusReader, ReadOptions, ValidationReport};
use crate::error::{Error, Result};

pub type Batches = Box<dyn Iterator<Item = Result<RecordBatch>> + Send>;
/// Opens the source for one scan, building only the projected columns (or projecting).
type Open = Arc<dyn Fn(Option<Vec<usize>>) -> Result<Batches> + Send + Sync>;

pub struct StreamTable {
    name: String,
    schema: SchemaRef,
    open: Open,
    /// Partitions per scan: 1, or the session's target partitions (`None`).
    partitions: Option<usize>,
}

impl fmt::Debug for StreamTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamTable")
            .field("name", &self.name)
            .finish()
    }
}

#[async_trait::async_trait]
impl TableProvider for StreamTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        limit: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        let schema = match projection {
            Some(p) => Arc::new(self.schema.project(p)?),
            None => Arc::clone(&self.schema),
        };
        let source = Arc::new(SharedSource {
            name: self.name.clone(),
            open: Arc::clone(&self.open),
            projection: projection.cloned(),
            rx: tokio::sync::Mutex::new(None),
        });
        let n = self
            .partitions
            .unwrap_or_else(|| state.config().target_partitions())
            .max(1);
        let partitions: Vec<Arc<dyn PartitionStream>> = (0..n)
            .map(|_| {
                Arc::new(StreamPartition {
                    schema: Arc::clone(&schema),
                    source: Arc::clone(&source),
                }) as Arc<dyn PartitionStream>
            })
            .collect();
        Ok(Arc::new(StreamingTableExec::try_new(
            schema,
            partitions,
            None,
            Vec::<LexOrdering>::new(),
            false,
            limit,
        )?))
    }
}

/// One scan's source: opened by the first partition that runs, on a blocking thread,
/// feeding a channel of two batches that every partition of the scan reads from. A scan
/// reads its source once (each query plans its own scans); each partition stream must be
/// polled to its end or dropped, as DataFusion's operators do.
struct SharedSource {
    name: String,
    open: Open,
    projection: Option<Vec<usize>>,
    rx: tokio::sync::Mutex<Option<Receiver>>,
}

pub type Receiver = tokio::sync::mpsc::Receiver<datafusion::error::Result<RecordBatch>>;

impl SharedSource {
    /// The next batch of the source (`None` at its end), starting it on first use.
    async fn next(&self) -> Option<datafusion::error::Result<RecordBatch>> {
        let mut rx = self.rx.lock().await;
        if rx.is_none() {
            let (open, projection) = (Arc::clone(&self.open), self.projection.clone());
            *rx = Some(spawn_reader(self.name.clone(), move || open(projection)));
        }
        rx.as_mut()?.recv().await
    }
}

/// Run a blocking source of batches on a blocking thread, feeding a channel of two
/// batches; an error (or a panic) of the source is its last item, never a quiet end.
pub fn spawn_reader(
    name: String,
    open: impl FnOnce() -> Result<Batches> + Send + 'static,
) -> Receiver {
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    tokio::task::spawn_blocking(move || {
        // A panic in the reader must not look like the end of the input.
        let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            for batch in open()? {
                if tx.blocking_send(batch.map_err(Into::into)).is_err() {
                    break; // the query was cancelled
                }
            }
            Ok::<_, Error>(())
        }));
        let failed = match read {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.into()),
            Err(panic) => {
                let why = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                Some(datafusion::error::DataFusionError::Execution(format!(
                    "reading {name} failed (the reader panicked: {})",
                    crate::text::excerpt(&why, 200)
                )))
            }
        };
        if let Some(e) = failed {
            let _ = tx.blocking_send(Err(e));
        }
    });
    rx
}

/// [`spawn_reader`] as a query's stream.
pub fn reader_stream(
    name: String,
    schema: SchemaRef,
    open: impl FnOnce() -> Result<Batches> + Send + 'static,
) -> SendableRecordBatchStream {
    let rx = spawn_reader(name, open);
    let batches = futures::stream::unfold(rx, |mut rx| async move {
        let next = rx.recv().await?;
        Some((next, rx))
    });
    Box::pin(RecordBatchStreamAdapter::new(schema, batches))
}

struct StreamPartition {
    schema: SchemaRef,
    source: Arc<SharedSource>,
}

impl fmt::Debug for StreamPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamPartition")
            .field("name", &self.source.name)
            .finish()
    }
}

impl PartitionStream for StreamPartition {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let batches = futures::stream::unfold(Arc::clone(&self.source), |source| async move {
            let next = source.next().await?;
            Some((next, source))
        });
        Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            batches,
        ))
    }
}

/// Slot for what a scan learned, filled when the scan reaches the end of its source.
pub type FinishSlot<T> = Arc<Mutex<Option<T>>>;

/// Runs `finish` on the source when its iterator is exhausted and stores the result.
struct Finishing<I, T> {
    inner: Option<I>,
    finish: fn(I) -> Result<T>,
    slot: FinishSlot<T>,
}

impl<I: Iterator<Item = Result<RecordBatch>>, T> Iterator for Finishing<I, T> {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        let inner = self.inner.as_mut()?;
        match inner.next() {
            Some(b) => Some(b),
            None => {
                let inner = self.inner.take()?;
                match (self.finish)(inner) {
                    Ok(v) => {
                        *self.slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(v);
                        None
                    }
                    Err(e) => Some(Err(e)),
                }
            }
        }
    }
}

/// The corpus as a table, and where its last scan's validation report lands.
pub struct CorpusTable {
    pub table: Arc<StreamTable>,
    pub report: FinishSlot<ValidationReport>,
}

/// `attack_cases` over a corpus file (JSONL or Parquet), in the enriched-case schema.
/// Scans push their projection into the reader. The file is opened once here so a
/// missing file is a clear error before any query.
pub fn corpus_table(path: impl AsRef<Path>, opts: ReadOptions) -> Result<CorpusTable> {
    let path = path.as_ref().to_path_buf();
    crate::files::open_input(&path, "cannot open corpus")?;
    let report: FinishSlot<ValidationReport> = Arc::new(Mutex::new(None));
    let slot = Arc::clone(&report);
    let open: Open = Arc::new(move |projection| {
        let reader = CorpusReader::open(
            &path,
            ReadOptions {
                projection,
                ..opts.clone()
            },
        )?;
        Ok(Box::new(Finishing {
            inner: Some(reader),
            finish: CorpusReader::finish,
            slot: Arc::clone(&slot),
        }) as Batches)
    });
    let table = Arc::new(StreamTable {
        name: "attack_cases".into(),
        schema: enriched_case_schema(),
        open,
        // a join's build side is collected whole: one reader is enough
        partitions: Some(1),
    });
    Ok(CorpusTable { table, report })
}

/// Predictions as a table, and where its last scan's counts land.
pub struct PredictionsTable {
    pub table: Arc<StreamTable>,
    pub stats: FinishSlot<PredictionStats>,
}

/// `predictions` over a JSONL or Parquet file (schema: [`predictions_table_schema`]).
pub fn predictions_table(path: impl AsRef<Path>, batch_size: usize) -> Result<PredictionsTable> {
    let path = path.as_ref().to_path_buf();
    crate::files::open_input(&path, "cannot open predictions")?;
    Ok(predictions_over(move || {
        PredictionsReader::open(&path, batch_size)
    }))
}

/// `predictions` over Arrow batches read once (a caller's table in memory: the Python
/// package's `pieval.score`), checked as a Parquet file's rows are; `name` stands for the
/// file in messages. A second scan is an error: the batches are gone.
pub fn predictions_table_of(
    name: impl AsRef<Path>,
    batches: crate::corpus::predictions::Batches,
    batch_size: usize,
) -> PredictionsTable {
    let name = name.as_ref().to_path_buf();
    let batches = Mutex::new(Some(batches));
    predictions_over(move || {
        let taken = batches.lock().unwrap_or_else(|p| p.into_inner()).take();
        let batches =
            taken.ok_or_else(|| Error::State(format!("{}: read once already", name.display())))?;
        Ok(PredictionsReader::from_batches(&name, batches, batch_size))
    })
}

fn predictions_over(
    reader: impl Fn() -> Result<PredictionsReader> + Send + Sync + 'static,
) -> PredictionsTable {
    let stats: FinishSlot<PredictionStats> = Arc::new(Mutex::new(None));
    let slot = Arc::clone(&stats);
    let open: Open = Arc::new(move |projection: Option<Vec<usize>>| {
        let reader = reader()?;
        let finishing = Finishing {
            inner: Some(reader),
            finish: |r: PredictionsReader| Ok(r.stats().clone()),
            slot: Arc::clone(&slot),
        };
        Ok(Box::new(finishing.map(move |b| match (&projection, b) {
            (Some(p), Ok(b)) => Ok(b.project(p)?),
            (_, b) => b,
        })) as Batches)
    });
    let table = Arc::new(StreamTable {
        name: "predictions".into(),
        schema: predictions_table_schema(),
        open,
        // the probe side: one partition per core, sharing the reader
        partitions: None,
    });
    PredictionsTable { table, stats }
}
