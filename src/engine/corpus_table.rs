//! `attack_cases` as a streaming DataFusion table: each scan runs the corpus reader
//! (validation included) on a blocking thread and feeds its batches to the query, so a
//! corpus larger than memory is queried in bounded memory. The reader's report (sha256,
//! counts, violations) is kept for the caller once the scan has finished.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::Session;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::LexOrdering;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchReceiverStream;
use datafusion::physical_plan::streaming::PartitionStream;
use datafusion::physical_plan::streaming::StreamingTableExec;

use crate::contract::arrow::enriched_case_schema;
use crate::corpus::{CorpusReader, ReadOptions, ValidationReport};
use crate::error::{Error, Result};

/// The table and where its last scan's validation report lands.
pub struct CorpusTable {
    pub table: Arc<CorpusTableProvider>,
    pub report: Arc<Mutex<Option<ValidationReport>>>,
}

/// `attack_cases` over a corpus file. Scans push their projection into the reader, so
/// a query that reads a few short columns never copies the prompts into Arrow.
#[derive(Debug)]
pub struct CorpusTableProvider {
    path: PathBuf,
    opts: ReadOptions,
    report: Arc<Mutex<Option<ValidationReport>>>,
}

#[async_trait::async_trait]
impl TableProvider for CorpusTableProvider {
    fn schema(&self) -> SchemaRef {
        enriched_case_schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        limit: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        let opts = ReadOptions {
            projection: projection.cloned(),
            ..self.opts.clone()
        };
        let schema = opts.output_schema();
        let partition = Arc::new(CorpusPartition {
            path: self.path.clone(),
            opts,
            schema: Arc::clone(&schema),
            report: Arc::clone(&self.report),
        });
        let exec = StreamingTableExec::try_new(
            schema,
            vec![partition],
            None,
            Vec::<LexOrdering>::new(),
            false,
            limit,
        )?;
        Ok(Arc::new(exec))
    }
}

#[derive(Debug)]
struct CorpusPartition {
    path: PathBuf,
    opts: ReadOptions,
    schema: SchemaRef,
    report: Arc<Mutex<Option<ValidationReport>>>,
}

impl PartitionStream for CorpusPartition {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let mut builder = RecordBatchReceiverStream::builder(Arc::clone(&self.schema), 2);
        let tx = builder.tx();
        let (path, opts, report) = (
            self.path.clone(),
            self.opts.clone(),
            Arc::clone(&self.report),
        );
        builder.spawn_blocking(move || {
            let mut reader = CorpusReader::open(&path, opts)?;
            for batch in reader.by_ref() {
                if tx.blocking_send(batch.map_err(Into::into)).is_err() {
                    return Ok(()); // the query was cancelled
                }
            }
            let finished = reader.finish()?;
            *report.lock().unwrap_or_else(|p| p.into_inner()) = Some(finished);
            Ok(())
        });
        builder.build()
    }
}

/// A streaming table over a corpus file (JSONL or Parquet), in the enriched-case schema.
/// The file is opened here once so a missing file is a clear error before any query.
pub fn corpus_table(path: impl AsRef<Path>, opts: ReadOptions) -> Result<CorpusTable> {
    let path = path.as_ref();
    std::fs::File::open(path).map_err(|e| Error::io(path, "cannot open corpus", e))?;
    let report = Arc::new(Mutex::new(None));
    let table = Arc::new(CorpusTableProvider {
        path: path.to_path_buf(),
        opts,
        report: Arc::clone(&report),
    });
    Ok(CorpusTable { table, report })
}
