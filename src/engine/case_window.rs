//! Scoring's join of the corpus and the predictions, streamed in the order both were
//! written, where that order is known: an import writes each case just before its first
//! row, and knows the line of each case's last row ([`CaseLives`]). Then the join need
//! not hold every case (DataFusion's hash join collects its whole build side: over a
//! garak report of 65,310 distinct prompts, 213 MB of cases.jsonl, that was most of
//! scoring's memory). [`CaseWindowJoinExec`] reads the corpus as far as the predictions
//! need, keeps the cases that a row still to come may ask for, and drops a case once
//! every partition has read past its last row.
//!
//! It stands in for the one hash join of `score_cases.sql` that it can replace exactly
//! ([`rewrite`]): `attack_cases RIGHT JOIN predictions ON case_id`, collected left, one
//! key, no filter. Its rows are the hash join's: each prediction with its case's columns,
//! or nulls where the corpus has no such case. A case asked for after it was dropped
//! (predictions out of the order [`CaseLives`] describes) is an error, never a row
//! without its case.
//!
//! Why dropping is safe: within each partition of the predictions the lines increase
//! (the partitions of scoring's predictions table take batches in turn from one reader
//! of the file), so a partition's next batch starts after the last line it read. A line
//! still to be read by any partition is therefore at least the smallest of (each
//! partition's last line read) + 1; a case whose last row lies before that is never
//! asked for again. A partition that has not read a batch yet holds that bound at its
//! lowest, so nothing is dropped before every partition has read one.
//!
//! Memory: the cases of the corpus batches that still hold a live case (the corpus is
//! read 8,192 cases a batch), and a 64-bit fingerprint of each case dropped. A case asked
//! for again far later (Inspect's epochs) stays until then: at worst, every case, as the
//! hash join held them.

use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch, new_null_array};
use datafusion::arrow::compute::interleave;
use datafusion::arrow::datatypes::{DataType, Int64Type, SchemaRef};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DataFusionError, JoinType, NullEquality};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
    SendableRecordBatchStream,
};
use futures::StreamExt;

type DfResult<T> = datafusion::error::Result<T>;

/// Each case's last row in the predictions, by `source_line` (the line of
/// predictions.jsonl its prediction is on): what the writer of both files knows.
#[derive(Debug, Default)]
pub struct CaseLives {
    last: HashMap<String, i64>,
}

impl CaseLives {
    /// The case of a prediction on line `line` (lines come in increasing order).
    pub fn saw(&mut self, case_id: &str, line: i64) {
        match self.last.get_mut(case_id) {
            Some(last) => *last = line,
            None => {
                self.last.insert(case_id.to_owned(), line);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.last.len()
    }

    pub fn is_empty(&self) -> bool {
        self.last.is_empty()
    }
}

/// `plan` with its case join streamed ([`CaseWindowJoinExec`]), and whether it was: a
/// plan without exactly one join of that shape is given back as it was.
pub fn rewrite(
    plan: Arc<dyn ExecutionPlan>,
    lives: &Arc<CaseLives>,
) -> DfResult<(Arc<dyn ExecutionPlan>, bool)> {
    let mut found = 0;
    plan.apply(|node| {
        if replaceable(node.as_ref()).is_some() {
            found += 1;
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    if found != 1 {
        return Ok((plan, false));
    }
    let out = plan.transform_up(|node| {
        let Some(shape) = replaceable(node.as_ref()) else {
            return Ok(Transformed::no(node));
        };
        Ok(Transformed::yes(
            Arc::new(CaseWindowJoinExec::new(shape, Arc::clone(lives))) as Arc<dyn ExecutionPlan>,
        ))
    })?;
    Ok((out.data, true))
}

/// The most cases the window of a plan [`rewrite`] gave held at once, once it ran.
pub fn cases_held_most(plan: &Arc<dyn ExecutionPlan>) -> Option<usize> {
    let mut most = None;
    plan.apply(|node| {
        if let Some(w) = node.downcast_ref::<CaseWindowJoinExec>() {
            most = w.most_cases_held();
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .ok()?;
    most
}

/// What a hash join must be for the window to replace it, read off it.
struct Shape {
    left: Arc<dyn ExecutionPlan>,
    right: Arc<dyn ExecutionPlan>,
    left_key: usize,
    right_key: usize,
    right_line: usize,
    projection: Option<Vec<usize>>,
    properties: Arc<PlanProperties>,
}

fn replaceable(node: &dyn ExecutionPlan) -> Option<Shape> {
    let join = node.downcast_ref::<HashJoinExec>()?;
    if *join.join_type() != JoinType::Right
        || *join.partition_mode() != PartitionMode::CollectLeft
        || join.filter().is_some()
        || join.null_equality() != NullEquality::NullEqualsNothing
        || join.on().len() != 1
        || join.left().output_partitioning().partition_count() != 1
    {
        return None;
    }
    let column = |e: &Arc<dyn PhysicalExpr>| e.downcast_ref::<Column>().map(Column::index);
    let (l, r) = &join.on()[0];
    let (left_key, right_key) = (column(l)?, column(r)?);
    let (left_schema, right_schema) = (join.left().schema(), join.right().schema());
    let utf8 = |s: &SchemaRef, i: usize, name: &str| {
        let f = s.field(i);
        f.name() == name && *f.data_type() == DataType::Utf8
    };
    if !utf8(&left_schema, left_key, "case_id") || !utf8(&right_schema, right_key, "case_id") {
        return None;
    }
    let right_line = right_schema.index_of("source_line").ok()?;
    if *right_schema.field(right_line).data_type() != DataType::Int64 {
        return None;
    }
    Some(Shape {
        left: Arc::clone(join.left()),
        right: Arc::clone(join.right()),
        left_key,
        right_key,
        right_line,
        projection: join.projection.as_ref().map(|p| p.to_vec()),
        properties: Arc::clone(join.properties()),
    })
}

/// The case join, streamed (module docs).
pub struct CaseWindowJoinExec {
    shape: Shape,
    lives: Arc<CaseLives>,
    /// The window all partitions share, made when the first of them starts.
    window: Mutex<Option<Arc<tokio::sync::Mutex<Window>>>>,
}

impl std::fmt::Debug for CaseWindowJoinExec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaseWindowJoinExec").finish_non_exhaustive()
    }
}

impl CaseWindowJoinExec {
    fn new(shape: Shape, lives: Arc<CaseLives>) -> Self {
        Self {
            shape,
            lives,
            window: Mutex::new(None),
        }
    }

    fn window(&self, context: &Arc<TaskContext>) -> DfResult<Arc<tokio::sync::Mutex<Window>>> {
        let mut slot = self
            .window
            .lock()
            .map_err(|_| DataFusionError::Internal("the case window's lock".into()))?;
        if let Some(w) = slot.as_ref() {
            return Ok(Arc::clone(w));
        }
        let left = self.shape.left.execute(0, Arc::clone(context))?;
        // the corpus's fields, nullable as the join's output has them
        let fields: Vec<_> = self
            .shape
            .left
            .schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect();
        let columns = fields
            .iter()
            .map(|f| new_null_array(f.data_type(), 1))
            .collect();
        let null_row = RecordBatch::try_new(
            Arc::new(datafusion::arrow::datatypes::Schema::new(fields)),
            columns,
        )?;
        let partitions = self.shape.right.output_partitioning().partition_count();
        let w = Arc::new(tokio::sync::Mutex::new(Window {
            left,
            left_done: false,
            key: self.shape.left_key,
            lives: Arc::clone(&self.lives),
            batches: Vec::new(),
            live: Vec::new(),
            index: HashMap::new(),
            by_last: BinaryHeap::new(),
            dropped: HashSet::new(),
            low: vec![i64::MIN; partitions],
            null_row,
            held_most: 0,
        }));
        *slot = Some(Arc::clone(&w));
        Ok(w)
    }
}

impl CaseWindowJoinExec {
    /// The most cases the window held at once, once executed.
    pub fn most_cases_held(&self) -> Option<usize> {
        let slot = self.window.lock().ok()?;
        let w = slot.as_ref()?.try_lock().ok()?;
        Some(w.held_most)
    }
}

impl DisplayAs for CaseWindowJoinExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(
            f,
            "CaseWindowJoinExec: the corpus read in the predictions' order"
        )
    }
}

impl ExecutionPlan for CaseWindowJoinExec {
    fn name(&self) -> &str {
        "CaseWindowJoinExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.shape.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.shape.left, &self.shape.right]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let [left, right]: [Arc<dyn ExecutionPlan>; 2] = children.try_into().map_err(|_| {
            DataFusionError::Internal("CaseWindowJoinExec takes two children".into())
        })?;
        let shape = Shape {
            left,
            right,
            left_key: self.shape.left_key,
            right_key: self.shape.right_key,
            right_line: self.shape.right_line,
            projection: self.shape.projection.clone(),
            properties: Arc::clone(&self.shape.properties),
        };
        Ok(Arc::new(Self::new(shape, Arc::clone(&self.lives))))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let window = self.window(&context)?;
        let right = self.shape.right.execute(partition, context)?;
        let schema = self.schema();
        let probe = Probe {
            partition,
            right_key: self.shape.right_key,
            right_line: self.shape.right_line,
            projection: self.shape.projection.clone(),
            schema: Arc::clone(&schema),
        };
        let stream = futures::stream::try_unfold(
            (right, window, probe),
            |(mut right, window, probe)| async move {
                // The batch is taken before the window is locked: partitions read and
                // score in parallel, and meet only here. Meanwhile another may drop
                // cases, but only those whose last row lies before this partition's
                // previous batch ended (module docs).
                let next = right.next().await;
                let mut w = window.lock().await;
                match next {
                    None => {
                        w.finished(probe.partition);
                        Ok(None)
                    }
                    Some(batch) => {
                        let out = w.probe(&probe, &batch?).await?;
                        drop(w);
                        Ok(Some((out, (right, window, probe))))
                    }
                }
            },
        );
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

/// One partition's side of the join.
struct Probe {
    partition: usize,
    right_key: usize,
    right_line: usize,
    projection: Option<Vec<usize>>,
    schema: SchemaRef,
}

/// The cases read and not yet dropped.
struct Window {
    left: SendableRecordBatchStream,
    left_done: bool,
    key: usize,
    lives: Arc<CaseLives>,
    /// The corpus's batches in the order read; `None` once all their cases are dropped.
    batches: Vec<Option<RecordBatch>>,
    /// Cases not dropped, per batch.
    live: Vec<usize>,
    /// case id → (batch, row).
    index: HashMap<String, (usize, usize)>,
    /// (−last line, case id): the case whose last row comes first on top.
    by_last: BinaryHeap<(std::cmp::Reverse<i64>, String)>,
    /// Cases dropped, or never held (no row of theirs, said the writer): a fingerprint of
    /// each id. Asked for once the corpus is read, they are an error, not a row without
    /// its case.
    dropped: HashSet<u64>,
    /// Per partition of the predictions: the last line it read, plus one (`i64::MAX`
    /// once it ended).
    low: Vec<i64>,
    /// One row of nulls in the corpus's schema: a prediction without its case.
    null_row: RecordBatch,
    /// The most cases held at once (for tests and the docs' figures).
    held_most: usize,
}

impl Window {
    /// Read the corpus's next batch; false at its end.
    async fn read(&mut self) -> DfResult<bool> {
        if self.left_done {
            return Ok(false);
        }
        let Some(batch) = self.left.next().await else {
            self.left_done = true;
            return Ok(false);
        };
        let batch = batch?;
        let b = self.batches.len();
        let ids = batch.column(self.key).as_string::<i32>();
        let mut live = 0;
        for row in 0..batch.num_rows() {
            if ids.is_null(row) {
                continue;
            }
            let id = ids.value(row);
            // A case the writer saw no row of (garak's attempt without an output) is
            // never asked for: not held, and an error if it is.
            let Some(&last) = self.lives.last.get(id) else {
                self.dropped.insert(fingerprint(id));
                continue;
            };
            if self.index.insert(id.to_owned(), (b, row)).is_some() {
                return Err(DataFusionError::Execution(format!(
                    "case {id} is twice in the corpus"
                )));
            }
            self.by_last.push((std::cmp::Reverse(last), id.to_owned()));
            live += 1;
        }
        self.batches.push((live > 0).then_some(batch));
        self.live.push(live);
        self.held_most = self.held_most.max(self.index.len());
        Ok(true)
    }

    /// The join's rows for one batch of predictions.
    async fn probe(&mut self, p: &Probe, batch: &RecordBatch) -> DfResult<RecordBatch> {
        let ids = batch.column(p.right_key).as_string::<i32>();
        // no case: the null row, placed after every batch once all are read
        const NONE: usize = usize::MAX;
        let mut at: Vec<(usize, usize)> = Vec::with_capacity(batch.num_rows());
        for row in 0..batch.num_rows() {
            if ids.is_null(row) {
                at.push((NONE, 0));
                continue;
            }
            let id = ids.value(row);
            loop {
                if let Some(&place) = self.index.get(id) {
                    at.push(place);
                    break;
                }
                if self.read().await? {
                    continue;
                }
                // The whole corpus read: a fingerprint that matches is a case let go
                // (a fingerprint shared by chance with an id still to be read cannot
                // stop the reading before it).
                if self.dropped.contains(&fingerprint(id)) {
                    return Err(DataFusionError::Execution(format!(
                        "case {id} was asked for after its last prediction, or without one: \
                         the predictions are not in the order their writer said"
                    )));
                }
                at.push((NONE, 0));
                break;
            }
        }
        let null_at = self.batches.len();
        for place in &mut at {
            if place.0 == NONE {
                *place = (null_at, 0);
            }
        }
        // Every place in `at` is a batch still held: cases are dropped only below.
        let sources: Vec<&RecordBatch> = self
            .batches
            .iter()
            .map(|b| b.as_ref().unwrap_or(&self.null_row))
            .chain(std::iter::once(&self.null_row))
            .collect();
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(p.schema.fields().len());
        let width = self.null_row.num_columns();
        for c in 0..width {
            let arrays: Vec<&dyn Array> = sources.iter().map(|b| b.column(c).as_ref()).collect();
            columns.push(interleave(&arrays, &at)?);
        }
        columns.extend(batch.columns().iter().cloned());
        let columns = match &p.projection {
            Some(keep) => keep.iter().map(|&i| Arc::clone(&columns[i])).collect(),
            None => columns,
        };
        let out = RecordBatch::try_new(Arc::clone(&p.schema), columns)?;
        let lines = batch.column(p.right_line).as_primitive::<Int64Type>();
        if let Some(last) = datafusion::arrow::compute::max(lines) {
            self.low[p.partition] = self.low[p.partition].max(last.saturating_add(1));
        }
        self.drop_past();
        Ok(out)
    }

    /// A partition ended: it asks for nothing more.
    fn finished(&mut self, partition: usize) {
        self.low[partition] = i64::MAX;
        self.drop_past();
    }

    /// Drop every case whose last row lies before every line still to be read.
    fn drop_past(&mut self) {
        let Some(&bound) = self.low.iter().min() else {
            return;
        };
        while let Some((std::cmp::Reverse(last), _)) = self.by_last.peek() {
            if *last >= bound {
                break;
            }
            let Some((_, id)) = self.by_last.pop() else {
                break;
            };
            if let Some((b, _)) = self.index.remove(&id) {
                self.live[b] -= 1;
                if self.live[b] == 0 {
                    self.batches[b] = None;
                }
            }
            self.dropped.insert(fingerprint(&id));
        }
    }
}

/// A case id's 64-bit fingerprint (SipHash with fixed keys).
fn fingerprint(id: &str) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{Field, Schema};
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::physical_plan::collect;

    fn cases(n: usize, per_batch: usize) -> (SchemaRef, Vec<RecordBatch>) {
        let schema = Arc::new(Schema::new(vec![
            Field::new("case_id", DataType::Utf8, false),
            Field::new("prompt", DataType::Utf8, false),
        ]));
        let batches = (0..n)
            .step_by(per_batch)
            .map(|from| {
                let ids: Vec<String> = (from..(from + per_batch).min(n))
                    .map(|i| format!("c{i}"))
                    .collect();
                let prompts: Vec<String> =
                    ids.iter().map(|id| format!("the prompt of {id}")).collect();
                RecordBatch::try_new(
                    Arc::clone(&schema),
                    vec![
                        Arc::new(StringArray::from(ids)),
                        Arc::new(StringArray::from(prompts)),
                    ],
                )
                .unwrap()
            })
            .collect();
        (schema, batches)
    }

    /// Predictions: `ids` on lines 1, 2, … in batches of `per_batch`.
    fn predictions(ids: &[String], per_batch: usize) -> (SchemaRef, Vec<RecordBatch>) {
        let schema = Arc::new(Schema::new(vec![
            Field::new("case_id", DataType::Utf8, false),
            Field::new("response_text", DataType::Utf8, false),
            Field::new("source_line", DataType::Int64, false),
        ]));
        let batches = ids
            .chunks(per_batch)
            .enumerate()
            .map(|(b, chunk)| {
                let lines: Vec<i64> = (0..chunk.len())
                    .map(|i| (b * per_batch + i) as i64 + 1)
                    .collect();
                let texts: Vec<String> = lines.iter().map(|l| format!("answer {l}")).collect();
                RecordBatch::try_new(
                    Arc::clone(&schema),
                    vec![
                        Arc::new(StringArray::from(chunk.to_vec())),
                        Arc::new(StringArray::from(texts)),
                        Arc::new(Int64Array::from(lines)),
                    ],
                )
                .unwrap()
            })
            .collect();
        (schema, batches)
    }

    fn lives_of(ids: &[String]) -> Arc<CaseLives> {
        let mut lives = CaseLives::default();
        for (i, id) in ids.iter().enumerate() {
            lives.saw(id, i as i64 + 1);
        }
        Arc::new(lives)
    }

    /// The hash join scoring plans, over `partitions` of the predictions' batches.
    fn hash_join(
        cases: (SchemaRef, Vec<RecordBatch>),
        predictions: (SchemaRef, Vec<Vec<RecordBatch>>),
        projection: Option<Vec<usize>>,
    ) -> Arc<dyn ExecutionPlan> {
        let left = MemorySourceConfig::try_new_exec(&[cases.1], cases.0, None).unwrap();
        let right = MemorySourceConfig::try_new_exec(&predictions.1, predictions.0, None).unwrap();
        let on = vec![(
            Arc::new(Column::new("case_id", 0)) as Arc<dyn PhysicalExpr>,
            Arc::new(Column::new("case_id", 0)) as Arc<dyn PhysicalExpr>,
        )];
        Arc::new(
            HashJoinExec::try_new(
                left,
                right,
                on,
                None,
                &JoinType::Right,
                projection,
                PartitionMode::CollectLeft,
                NullEquality::NullEqualsNothing,
                false,
            )
            .unwrap(),
        )
    }

    /// Every row as text, sorted by its line (the last column of `source_line`'s).
    fn rows(batches: &[RecordBatch]) -> Vec<String> {
        let mut out: Vec<String> = batches
            .iter()
            .flat_map(|b| {
                (0..b.num_rows()).map(move |r| {
                    b.columns()
                        .iter()
                        .map(|c| {
                            datafusion::arrow::util::display::array_value_to_string(c, r).unwrap()
                        })
                        .collect::<Vec<_>>()
                        .join("|")
                })
            })
            .collect();
        out.sort_by_key(|r| {
            r.split('|')
                .find_map(|f| f.parse::<i64>().ok())
                .unwrap_or_default()
        });
        out
    }

    fn run(plan: Arc<dyn ExecutionPlan>) -> datafusion::error::Result<Vec<RecordBatch>> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        rt.block_on(collect(plan, Arc::new(TaskContext::default())))
    }

    /// Cases used three rows each in the order of their first rows, then a row of a case
    /// the corpus does not have (last: to find that out, the window reads the rest of
    /// the corpus).
    fn in_order(n: usize) -> Vec<String> {
        let mut ids: Vec<String> = (0..n)
            .flat_map(|i| std::iter::repeat_n(format!("c{i}"), 3))
            .collect();
        ids.push("not-in-the-corpus".into());
        ids
    }

    #[test]
    fn the_window_gives_the_hash_joins_rows_holding_few_cases() {
        let ids = in_order(200);
        for (partitions, projection) in [(1, None), (2, None), (3, Some(vec![4, 1, 0]))] {
            let (schema, batches) = predictions(&ids, 25);
            // batch k to partition k mod n: the lines increase within each
            let mut parts = vec![Vec::new(); partitions];
            for (k, b) in batches.into_iter().enumerate() {
                parts[k % partitions].push(b);
            }
            let plan = hash_join(cases(200, 10), (schema, parts), projection.clone());
            let expected = rows(&run(Arc::clone(&plan)).unwrap());
            let (window, rewritten) = rewrite(plan, &lives_of(&ids)).unwrap();
            assert!(rewritten);
            let got = run(Arc::clone(&window)).unwrap();
            assert_eq!(rows(&got), expected, "{partitions} partitions");
            assert_eq!(expected.len(), ids.len());
            // the row without its case: nulls for the corpus's columns
            let unmatched = if projection.is_none() {
                "||not-in-the-corpus|"
            } else {
                "||"
            };
            assert!(expected.last().unwrap().contains(unmatched), "{expected:?}");
            let held = window
                .downcast_ref::<CaseWindowJoinExec>()
                .and_then(CaseWindowJoinExec::most_cases_held)
                .unwrap();
            // One partition: 200 cases, held a few corpus batches (of 10) at a time. With
            // more, one memory partition may run to its end before another starts (the
            // window then holds on for it); scoring's partitions share one reader.
            if partitions == 1 {
                assert!(held <= 30, "{held} cases held at once");
            }
        }
    }

    #[test]
    fn a_case_asked_for_after_its_last_row_is_an_error() {
        let mut ids = in_order(50);
        // c0's last row by the writer's account is line 3; it comes again at the end
        let lives = lives_of(&ids);
        ids.insert(ids.len() - 1, "c0".into());
        let (schema, batches) = predictions(&ids, 25);
        let plan = hash_join(cases(50, 10), (schema, vec![batches]), None);
        let (window, rewritten) = rewrite(plan, &lives).unwrap();
        assert!(rewritten);
        let err = run(window).unwrap_err().to_string();
        assert!(
            err.contains("case c0 was asked for after its last prediction"),
            "{err}"
        );
    }

    #[test]
    fn cases_the_writer_saw_no_row_of_are_not_held() {
        // garak writes a case for an attempt whose outputs are all empty, and no row: every
        // other case of the corpus has none, spread through all its batches
        let ids: Vec<String> = (0..400)
            .step_by(2)
            .flat_map(|i| std::iter::repeat_n(format!("c{i}"), 2))
            .collect();
        let (schema, batches) = predictions(&ids, 20);
        let plan = hash_join(cases(400, 10), (schema, vec![batches]), None);
        let expected = rows(&run(Arc::clone(&plan)).unwrap());
        let (window, rewritten) = rewrite(plan, &lives_of(&ids)).unwrap();
        assert!(rewritten);
        assert_eq!(rows(&run(Arc::clone(&window)).unwrap()), expected);
        let held = window
            .downcast_ref::<CaseWindowJoinExec>()
            .and_then(CaseWindowJoinExec::most_cases_held)
            .unwrap();
        assert!(held <= 30, "{held} cases held at once");

        // and one asked for all the same is an error, not a row without its case
        let mut asked = ids.clone();
        asked.push("c7".into());
        let (schema, batches) = predictions(&asked, 20);
        let plan = hash_join(cases(400, 10), (schema, vec![batches]), None);
        let (window, _) = rewrite(plan, &lives_of(&ids)).unwrap();
        let err = run(window).unwrap_err().to_string();
        assert!(err.contains("case c7 was asked for"), "{err}");
    }

    #[test]
    fn a_join_of_another_shape_is_left_as_it_is() {
        let ids = in_order(20);
        let (schema, batches) = predictions(&ids, 25);
        let left =
            MemorySourceConfig::try_new_exec(&[cases(20, 10).1], cases(20, 10).0, None).unwrap();
        let right = MemorySourceConfig::try_new_exec(&[batches], schema, None).unwrap();
        let on = vec![(
            Arc::new(Column::new("case_id", 0)) as Arc<dyn PhysicalExpr>,
            Arc::new(Column::new("case_id", 0)) as Arc<dyn PhysicalExpr>,
        )];
        let inner: Arc<dyn ExecutionPlan> = Arc::new(
            HashJoinExec::try_new(
                left,
                right,
                on,
                None,
                &JoinType::Inner,
                None,
                PartitionMode::CollectLeft,
                NullEquality::NullEqualsNothing,
                false,
            )
            .unwrap(),
        );
        let (_, rewritten) = rewrite(inner, &lives_of(&ids)).unwrap();
        assert!(!rewritten);
    }
}
