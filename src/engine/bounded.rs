//! Run tables read with bounded decoding: the same-named Parquet file of one or more runs
//! as one table, each file read on its own and watched while it decodes.
//!
//! A received Parquet file can expand a million times (src/rundir/bounds.rs); its footer
//! is checked before anything reads it, but a writer need not declare the decoded size
//! of text columns, so the reading is bounded too:
//!
//! - text is decoded as Arrow views, which point into the (decompressed) pages and the
//!   dictionary instead of copying a value per row, so a dictionary of one 1 MiB value
//!   repeated for 8,192 rows costs 1 MiB, not 8 GiB;
//! - the table's text columns stay views (so a filter or a repartition that glues batches
//!   back together does not copy a value per row either);
//! - each batch is measured (the bytes its rows hold once decoded) and cut into pieces of
//!   at most [`BATCH_BYTES`], so an operator that does copy text (a cast, the export's
//!   Utf8 files) copies at most that much at a time;
//! - each file's decoded bytes are counted, and past
//!   [`ParquetLimits::max_decoded_bytes`] the query stops with an error naming the run
//!   and the file;
//! - any error while a file is read (damaged pages, a range outside the file) names the
//!   run and the file.
//!
//! Files are spread over the session's partitions and read one after the other within
//! each, as DataFusion reads a listing.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::Session;
use datafusion::datasource::listing::{ListingTable, ListingTableConfig, ListingTableUrl};
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::DataFusionError;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use datafusion::physical_plan::{
    ExecutionPlan, ExecutionPlanProperties, SendableRecordBatchStream,
};
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use futures::StreamExt;

use crate::error::Result;
use crate::rundir::bounds::{BATCH_BYTES, ParquetLimits, human};

/// One run's file: the run (its folder's name) and the file, for messages.
#[derive(Debug)]
struct RunFile {
    run: String,
    path: PathBuf,
    table: Arc<ListingTable>,
}

impl RunFile {
    fn context(&self, e: DataFusionError) -> DataFusionError {
        context(&self.run, &self.path, e)
    }
}

/// `e`, said of the run's file (unless it already is).
fn context(run: &str, path: &Path, e: DataFusionError) -> DataFusionError {
    match e {
        e @ DataFusionError::Context(..) => e,
        e => DataFusionError::Context(format!("run {run}: {}", path.display()), Box::new(e)),
    }
}

/// The run folder a run file belongs to (its folder, or its `controls/` folder's).
pub fn run_of(path: &Path) -> String {
    let mut dir = path.parent();
    if dir.and_then(Path::file_name) == Some(crate::rundir::CONTROLS_DIR.as_ref()) {
        dir = dir.and_then(Path::parent);
    }
    dir.and_then(Path::file_name)
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The watch on one reading of one run file: its decoded bytes so far, against the limit.
#[derive(Debug)]
pub struct FileGuard {
    run: String,
    path: PathBuf,
    decoded: AtomicU64,
    limits: ParquetLimits,
}

impl FileGuard {
    pub fn new(path: &Path, limits: ParquetLimits) -> Self {
        Self {
            run: run_of(path),
            path: path.to_path_buf(),
            decoded: AtomicU64::new(0),
            limits,
        }
    }

    /// `e`, said of this file.
    pub fn context(&self, e: DataFusionError) -> DataFusionError {
        context(&self.run, &self.path, e)
    }

    /// Count `batch` (read with text as views: [`as_views`]) against the file's limit and
    /// cut it into slices of at most [`BATCH_BYTES`] decoded (a larger single row stays
    /// whole). The slices still share the batch's buffers: turn each into the table's
    /// types ([`retype`]) only when it is consumed, one at a time.
    pub fn pieces(&self, batch: &RecordBatch) -> datafusion::error::Result<Vec<RecordBatch>> {
        bounded(batch, &self.decoded, &self.limits, &self.run, &self.path)
    }
}

/// The run tables' Parquet files as one table, read with bounded decoding.
pub struct BoundedRunTable {
    schema: SchemaRef,
    files: Vec<Arc<RunFile>>,
    limits: ParquetLimits,
}

impl fmt::Debug for BoundedRunTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoundedRunTable")
            .field("files", &self.files.len())
            .finish()
    }
}

/// `schema` with text read as views (Utf8 → Utf8View, Binary → BinaryView).
pub fn as_views(schema: &Schema) -> Schema {
    fn view(t: &DataType) -> DataType {
        match t {
            DataType::Utf8 | DataType::LargeUtf8 => DataType::Utf8View,
            DataType::Binary | DataType::LargeBinary => DataType::BinaryView,
            t => t.clone(),
        }
    }
    Schema::new_with_metadata(
        schema
            .fields()
            .iter()
            .map(|f| Field::new(f.name(), view(f.data_type()), f.is_nullable()))
            .collect::<Vec<_>>(),
        schema.metadata().clone(),
    )
}

impl BoundedRunTable {
    /// A table of `schema` over `files` (each a checked artifact: see
    /// [`crate::rundir::parquet_artifact`]), each named by its run folder. Columns a file
    /// lacks read as NULL.
    ///
    /// Its text columns are views (Utf8View, as DataFusion reads Parquet by default): a
    /// filter or a repartition glues batches back to 8,192 rows, and glued views still
    /// point into the file's dictionary and pages, where Utf8 would copy every value
    /// (8 GiB for 8,192 responses of 1 MiB). Sorts, joins and aggregates, which hold
    /// batches, are held to the session's memory limit.
    pub async fn try_new(
        ctx: &SessionContext,
        schema: SchemaRef,
        files: &[PathBuf],
    ) -> Result<Self> {
        let limits = ParquetLimits::from_env()?;
        let read = Arc::new(as_views(&schema));
        let options = {
            use datafusion::datasource::file_format::options::ReadOptions;
            ParquetReadOptions::default()
                .schema(&read)
                .to_listing_options(&ctx.copied_config(), ctx.copied_table_options())
        };
        let mut out = Vec::with_capacity(files.len());
        for path in files {
            let url = ListingTableUrl::parse(crate::rundir::table_path(path)?)?;
            let config = ListingTableConfig::new(url)
                .with_listing_options(options.clone())
                .with_schema(Arc::clone(&read));
            let run = run_of(path);
            out.push(Arc::new(RunFile {
                run,
                path: path.clone(),
                table: Arc::new(ListingTable::try_new(config)?),
            }));
        }
        Ok(Self {
            schema: read,
            files: out,
            limits,
        })
    }
}

#[async_trait::async_trait]
impl TableProvider for BoundedRunTable {
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
        let mut plans = Vec::with_capacity(self.files.len());
        for f in &self.files {
            let plan = f
                .table
                .scan(state, projection, &[], limit)
                .await
                .map_err(|e| f.context(e))?;
            plans.push((Arc::clone(f), plan));
        }
        let n = state.config().target_partitions().min(plans.len()).max(1);
        let mut groups: Vec<Vec<(Arc<RunFile>, Arc<dyn ExecutionPlan>)>> = vec![Vec::new(); n];
        for (i, p) in plans.into_iter().enumerate() {
            groups[i % n].push(p);
        }
        let partitions = groups
            .into_iter()
            .map(|files| {
                Arc::new(FilesPartition {
                    schema: Arc::clone(&schema),
                    files,
                    limits: self.limits,
                }) as Arc<dyn PartitionStream>
            })
            .collect();
        Ok(Arc::new(StreamingTableExec::try_new(
            schema,
            partitions,
            None,
            Vec::new(),
            false,
            limit,
        )?))
    }
}

/// Files read one after the other.
struct FilesPartition {
    schema: SchemaRef,
    files: Vec<(Arc<RunFile>, Arc<dyn ExecutionPlan>)>,
    limits: ParquetLimits,
}

impl fmt::Debug for FilesPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FilesPartition")
            .field("files", &self.files.len())
            .finish()
    }
}

impl PartitionStream for FilesPartition {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let schema = Arc::clone(&self.schema);
        let limits = self.limits;
        let files = self.files.clone();
        let out = Arc::clone(&schema);
        let stream = futures::stream::iter(files)
            .map(move |(file, plan)| {
                let parts = plan.output_partitioning().partition_count();
                let guard = Arc::new(FileGuard {
                    run: file.run.clone(),
                    path: file.path.clone(),
                    decoded: AtomicU64::new(0),
                    limits,
                });
                let ctx = Arc::clone(&ctx);
                let out = Arc::clone(&out);
                futures::stream::iter(0..parts)
                    .map(move |part| match plan.execute(part, Arc::clone(&ctx)) {
                        Ok(s) => s.boxed(),
                        Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
                    })
                    .flatten()
                    .map(move |batch| {
                        let pieces = match batch {
                            Ok(b) => guard.pieces(&b),
                            Err(e) => Err(file.context(e)),
                        };
                        let out = Arc::clone(&out);
                        // under the table's schema (the same types: nullability may differ)
                        futures::stream::iter(match pieces {
                            Ok(p) => p.into_iter().map(Ok).collect::<Vec<_>>(),
                            Err(e) => vec![Err(e)],
                        })
                        .map(move |piece| piece.and_then(|p| retype(&p, &out)))
                    })
                    .flatten()
            })
            .flatten();
        Box::pin(RecordBatchStreamAdapter::new(schema, stream))
    }
}

/// The decoded bytes of each row of `batch`: a text value's length (plus its view), a
/// fixed-width value's width; nested columns an even share of their buffers.
fn row_bytes(batch: &RecordBatch) -> Vec<u64> {
    let mut rows = vec![0u64; batch.num_rows()];
    for col in batch.columns() {
        match col.data_type() {
            DataType::Utf8View => {
                for (r, v) in rows.iter_mut().zip(col.as_string_view().views()) {
                    *r += 16 + u64::from(*v as u32);
                }
            }
            DataType::BinaryView => {
                for (r, v) in rows.iter_mut().zip(col.as_binary_view().views()) {
                    *r += 16 + u64::from(*v as u32);
                }
            }
            _ => {
                let share =
                    (col.get_array_memory_size() as u64).div_ceil(batch.num_rows().max(1) as u64);
                for r in rows.iter_mut() {
                    *r += share;
                }
            }
        }
    }
    rows
}

/// [`FileGuard::pieces`].
fn bounded(
    batch: &RecordBatch,
    decoded: &AtomicU64,
    limits: &ParquetLimits,
    run: &str,
    path: &Path,
) -> datafusion::error::Result<Vec<RecordBatch>> {
    let rows = row_bytes(batch);
    let total: u64 = rows.iter().sum();
    let so_far = decoded.fetch_add(total, Ordering::Relaxed) + total;
    if so_far > limits.max_decoded_bytes {
        return Err(DataFusionError::Context(
            format!("run {run}: {}", path.display()),
            Box::new(DataFusionError::ResourcesExhausted(format!(
                "decodes to more than {} (a decompression bomb, or a run larger than the limit; \
                 if the run is genuine, raise {})",
                human(limits.max_decoded_bytes),
                crate::rundir::bounds::MAX_DECODED_ENV
            ))),
        ));
    }
    let mut pieces = Vec::new();
    let (mut start, mut bytes) = (0usize, 0u64);
    for (i, b) in rows.iter().enumerate() {
        if i > start && bytes + b > BATCH_BYTES {
            pieces.push(batch.slice(start, i - start));
            (start, bytes) = (i, 0);
        }
        bytes += b;
    }
    if start < batch.num_rows() || pieces.is_empty() {
        pieces.push(batch.slice(start, batch.num_rows() - start));
    }
    Ok(pieces)
}

/// `batch` under `schema` (views cast back to the table's text types).
pub fn retype(batch: &RecordBatch, schema: &SchemaRef) -> datafusion::error::Result<RecordBatch> {
    let columns = batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(c, f)| {
            if c.data_type() == f.data_type() {
                Ok(Arc::clone(c))
            } else {
                datafusion::arrow::compute::cast(c, f.data_type())
                    as std::result::Result<ArrayRef, _>
            }
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(RecordBatch::try_new_with_options(
        Arc::clone(schema),
        columns,
        &datafusion::arrow::array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::builder::StringViewBuilder;

    /// `rows` rows of one `len`-byte value, as views into one buffer (a dictionary page).
    fn views(rows: usize, len: usize) -> RecordBatch {
        let mut b = StringViewBuilder::new();
        let block = b.append_block(vec![b'a'; len].into());
        for _ in 0..rows {
            b.try_append_view(block, 0, len as u32).unwrap();
        }
        let schema = Schema::new(vec![Field::new("t", DataType::Utf8View, false)]);
        RecordBatch::try_new(Arc::new(schema), vec![Arc::new(b.finish())]).unwrap()
    }

    fn guard(limit: u64) -> FileGuard {
        let limits = ParquetLimits {
            max_decoded_bytes: limit,
            max_columns: 8,
        };
        FileGuard::new(Path::new("/r/run-7/case_results.parquet"), limits)
    }

    #[test]
    fn batches_are_cut_by_decoded_bytes_and_cast_one_piece_at_a_time() {
        // 1,000 rows of 1 MiB: 1 MiB of memory as views, 1,000 MiB decoded
        let batch = views(1000, 1 << 20);
        let g = guard(u64::MAX);
        let pieces = g.pieces(&batch).unwrap();
        assert_eq!(
            pieces.len(),
            8,
            "127 rows of 1 MiB (and their views) per piece"
        );
        assert_eq!(
            pieces.iter().map(RecordBatch::num_rows).sum::<usize>(),
            1000
        );
        assert!(
            pieces
                .iter()
                .all(|p| row_bytes(p).iter().sum::<u64>() <= BATCH_BYTES)
        );
        let utf8 = Arc::new(Schema::new(vec![Field::new("t", DataType::Utf8, false)]));
        let first = retype(&pieces[0], &utf8).unwrap();
        assert_eq!(first.column(0).data_type(), &DataType::Utf8);
        // a row larger than a piece stays whole
        assert_eq!(
            guard(u64::MAX).pieces(&views(2, 200 << 20)).unwrap().len(),
            2
        );
    }

    #[test]
    fn a_file_past_its_limit_is_an_error_naming_the_run_and_the_file() {
        let g = guard(100 << 20);
        g.pieces(&views(50, 1 << 20)).unwrap();
        let e = g.pieces(&views(51, 1 << 20)).unwrap_err().to_string();
        assert!(
            e.contains("run run-7: /r/run-7/case_results.parquet")
                && e.contains("decodes to more than 100.0 MiB"),
            "{e}"
        );
        assert_eq!(
            run_of(Path::new("/r/run-7/controls/controls.parquet")),
            "run-7"
        );
    }
}
