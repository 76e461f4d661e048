//! `attack_cases` as a streaming DataFusion table: each scan runs the corpus reader
//! (validation included) on a blocking thread and feeds its batches to the query, so a
//! corpus larger than memory is queried in bounded memory. The reader's report (sha256,
//! counts, violations) is kept for the caller once the scan has finished.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::streaming::StreamingTable;
use datafusion::execution::TaskContext;
use datafusion::physical_plan::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchReceiverStream;
use datafusion::physical_plan::streaming::PartitionStream;

use crate::contract::arrow::enriched_case_schema;
use crate::corpus::{CorpusReader, ReadOptions, ValidationReport};
use crate::error::{Error, Result};

/// The table and where its last scan's validation report lands.
pub struct CorpusTable {
    pub table: Arc<StreamingTable>,
    pub report: Arc<Mutex<Option<ValidationReport>>>,
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
    let schema = enriched_case_schema();
    let report = Arc::new(Mutex::new(None));
    let partition = Arc::new(CorpusPartition {
        path: path.to_path_buf(),
        opts,
        schema: Arc::clone(&schema),
        report: Arc::clone(&report),
    });
    let table = StreamingTable::try_new(schema, vec![partition])?;
    Ok(CorpusTable {
        table: Arc::new(table),
        report,
    })
}
