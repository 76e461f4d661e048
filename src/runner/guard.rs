//! A guardrail run's calls, checkpoint, results and summary (the run folder, the lock,
//! the manifest and the resume checks are the runner's, as for any run).
//!
//! Files:
//! - `guard_items.jsonl`: every text given, written once before the first call;
//! - `guard_predictions.jsonl`: one line per answered item (`item_id`, `flagged`,
//!   `score`, `category`, `latency_ms`, `error`, `answer` cut to 4 KiB), appended as
//!   answers come; a resumed run calls only the items it lacks. A torn last line (a
//!   kill mid-write) is dropped and its item called again;
//! - `guard_results.parquet`: items and answers, one row each (what `queries/guardrail/`
//!   reads, the table `guard_results`);
//! - `case_results.parquet` / `.jsonl` in the contract's form, and `summary.json` with
//!   its `guardrail` block.

use std::collections::{HashMap, HashSet};
use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanBuilder, Float64Builder, RecordBatch, StringBuilder, new_null_array,
};
use futures::StreamExt as _;
use serde::{Deserialize, Serialize};

use super::{Progress, RunEvent};
use crate::contract::case::AttackCase;
use crate::error::{Error, Result};
use crate::experiment::config::Config;
use crate::guard::items::{self, Item};
use crate::guard::target::{self, Classifier};
use crate::guard::{AnswerMap, GuardSection, results_schema};

pub use crate::guard::{ITEMS_FILE, PREDICTIONS_FILE, RESULTS_FILE};

/// The longest answer kept in the checkpoint, in bytes.
const ANSWER_KEPT_BYTES: usize = 4 << 10;

/// One checkpoint line.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GuardLine {
    pub item_id: String,
    pub flagged: Option<bool>,
    pub score: Option<f64>,
    pub category: Option<String>,
    pub latency_ms: f64,
    pub error: Option<String>,
    pub answer: Option<String>,
}

/// What the run's calls did.
#[derive(Debug, Default, Clone, Serialize)]
pub struct GuardDone {
    pub interrupted: bool,
    pub items: usize,
    pub executed: usize,
    pub resumed: usize,
    pub errors: u64,
    pub flagged: u64,
    /// The `guardrail` block of summary.json (a finished run).
    pub summary: Option<serde_json::Value>,
    pub aggregate_metrics: Option<crate::rundir::summary::AggregateMetrics>,
    pub result_paths: std::collections::BTreeMap<String, std::path::PathBuf>,
}

/// The items of a run: read back from the run folder, or expanded and written there.
pub fn items_for(
    cfg: &Config,
    section: &GuardSection,
    cases: &[AttackCase],
    dir: &Path,
    rt: &tokio::runtime::Runtime,
) -> Result<Vec<Item>> {
    let path = dir.join(ITEMS_FILE);
    if path.exists() {
        return read_items(&path);
    }
    let mut list = items::from_cases(cases, &section.forms);
    let mut seen: HashMap<String, String> = list
        .iter()
        .map(|i| (i.item_id.clone(), "the corpus".to_owned()))
        .collect();
    for l in &section.labels {
        list.extend(items::from_labels(l, section.split, &mut seen)?);
    }
    if let Some(roles) = &section.roles {
        list.retain(|i| roles.contains(&i.role));
    }
    if let Some(attack) = &cfg.attack {
        let plan = crate::attack::AttackPlan::from_section(attack)
            .map_err(|(k, m)| Error::Usage(format!("attack.{k}: {m}")))?;
        let dry = cfg.model.execution_mode == crate::provider::config::ExecutionMode::DryRun;
        let translations = match (&attack.translator, dry) {
            (Some(t), false) if plan.pipelines.iter().any(|p| p.translation().is_some()) => rt
                .block_on(translate(
                    &list,
                    cases,
                    &plan.pipelines,
                    cfg.experiment.seed,
                    t,
                ))?,
            _ => HashMap::new(),
        };
        let converted = items::evasions(
            &list,
            cases,
            &plan.pipelines,
            cfg.experiment.seed,
            &translations,
        );
        if !plan.original {
            list.retain(|i| !i.label);
        }
        list.extend(converted);
    }
    if list.is_empty() {
        return Err(Error::Usage(
            "the guardrail run has no texts: select cases, or give guardrail.labels".into(),
        ));
    }
    crate::atomic::write_lines(
        &path,
        list.iter()
            .map(|i| serde_json::to_string(i).expect("an item serialises")),
    )?;
    Ok(list)
}

/// The translator's output for every positive through every translating pipeline.
async fn translate(
    list: &[Item],
    cases: &[AttackCase],
    pipelines: &[crate::attack::convert::Pipeline],
    seed: u64,
    model: &crate::provider::config::ModelSection,
) -> Result<HashMap<(String, usize, u64), String>> {
    let translator = crate::provider::build(model, seed, &mut |_| {})?;
    let mut asks = Vec::new();
    for item in list.iter().filter(|i| i.label) {
        for (pi, p) in pipelines.iter().enumerate() {
            for v in 0..p.variants() as u64 {
                if let Some((text, lang, target)) =
                    items::translation_input(item, cases, p, seed, v)
                {
                    asks.push((item.item_id.clone(), pi, v, text, lang, target));
                }
            }
        }
    }
    let translator = &translator;
    let done: Vec<Result<((String, usize, u64), String)>> =
        futures::stream::iter(asks.into_iter().map(|(id, pi, v, text, lang, target)| async move {
            let request =
                crate::attack::convert::translation_request(&text, &lang, target.as_deref());
            translator
                .complete(
                    &format!("{id}|translate"),
                    &[crate::provider::Message::user(request)],
                )
                .await
                .map(|c| ((id.clone(), pi, v), c.text))
                .map_err(|e| {
                    Error::Usage(format!(
                        "the translator failed on {id}: {} (the run has made no guardrail call yet)",
                        e.message
                    ))
                })
        }))
        .buffered(model.concurrency.max(1))
        .collect()
        .await;
    done.into_iter().collect()
}

fn read_items(path: &Path) -> Result<Vec<Item>> {
    let mut out = Vec::new();
    let mut ids = HashSet::new();
    crate::guard::each_line(path, crate::guard::RUN_LINE_BYTES, |l| {
        let item: Item = serde_json::from_slice(l.bytes)
            .map_err(|e| Error::input(path, l.number, None, format!("not an item: {e}")))?;
        if !ids.insert(item.item_id.clone()) {
            return Err(Error::input(path, l.number, Some("item_id"), "given twice"));
        }
        out.push(item);
        Ok(true)
    })?;
    Ok(out)
}

/// The answered items of a checkpoint, by id. A last line without its newline that does
/// not read is a kill mid-write: it is cut off (its item is called again). Any other
/// line that does not read, or names an item the run does not have, is an error.
pub fn read_checkpoint(path: &Path, known: &HashSet<&str>) -> Result<HashMap<String, GuardLine>> {
    let mut out = HashMap::new();
    if !path.exists() {
        return Ok(out);
    }
    let mut torn = None;
    // a whole last line whose line break was not written: the break is added, or the
    // next answer appended would be glued to it
    let mut unended = false;
    crate::guard::each_line(
        path,
        crate::guard::RUN_LINE_BYTES,
        |l| match serde_json::from_slice::<GuardLine>(l.bytes) {
            Ok(g) => {
                if !known.contains(g.item_id.as_str()) {
                    return Err(Error::input(
                        path,
                        l.number,
                        Some("item_id"),
                        format!("{:?} is not an item of this run", g.item_id),
                    ));
                }
                unended = l.unterminated;
                out.insert(g.item_id.clone(), g);
                Ok(true)
            }
            Err(_) if l.unterminated => {
                torn = Some(l.offset);
                Ok(false)
            }
            Err(e) => Err(Error::input(
                path,
                l.number,
                None,
                format!("not a guardrail answer: {e}"),
            )),
        },
    )?;
    if let Some(offset) = torn {
        // torn tail: cut it off
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(|e| Error::io(path, "cannot open", e))?;
        f.set_len(offset)
            .map_err(|e| Error::io(path, "cannot cut the torn last line", e))?;
    } else if unended {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .map_err(|e| Error::io(path, "cannot open", e))?;
        f.write_all(b"\n")
            .map_err(|e| Error::io(path, "cannot end the last line", e))?;
    }
    Ok(out)
}

fn cut(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// Call the classifier on every item not yet answered, then write the results and the
/// summary (unless interrupted).
pub fn execute(
    cfg: &Config,
    section: &GuardSection,
    run_id: &str,
    cases: &[AttackCase],
    dir: &Path,
    progress: Option<&Progress>,
) -> Result<GuardDone> {
    let rt = crate::engine::runtime()?;
    let items = items_for(cfg, section, cases, dir, &rt)?;
    let known: HashSet<&str> = items.iter().map(|i| i.item_id.as_str()).collect();
    let ckpt = dir.join(PREDICTIONS_FILE);
    let mut answers = read_checkpoint(&ckpt, &known)?;
    let resumed = answers.len();
    let pending: Vec<&Item> = items
        .iter()
        .filter(|i| !answers.contains_key(&i.item_id))
        .collect();
    let dry = cfg.model.execution_mode == crate::provider::config::ExecutionMode::DryRun;
    let classifier = if dry {
        None
    } else {
        Some(build(cfg, section)?)
    };
    let mut done = GuardDone {
        items: items.len(),
        resumed,
        ..GuardDone::default()
    };
    if let Some(p) = progress {
        p(RunEvent::Calling {
            pending: pending.len() as u64,
        });
    }
    // The calls run on one thread: each call's future and its connection's task (hyper
    // spawns one per connection) then wake each other without crossing threads — on the
    // shared multi-thread runtime, every call bounced between this thread and a worker
    // (futex and eventfd wake-ups were a sixth of the run's CPU; docs/performance.md,
    // "Guardrail runs"). A classifier's own work per text is small; the server's is not
    // pieval's to share.
    let calls_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_stack_size(crate::engine::THREAD_STACK_BYTES)
        .build()
        .map_err(|e| Error::io("<runtime>", "cannot start the async runtime", e))?;
    let interrupted = calls_rt.block_on(async {
        let Some(classifier) = &classifier else {
            return Ok::<bool, Error>(false);
        };
        let note: crate::provider::Notes = match progress {
            Some(p) => {
                let p = Arc::clone(p);
                Arc::new(move |line: &str| p(RunEvent::Note(line)))
            }
            None => Arc::new(|_: &str| {}),
        };
        classifier.open(dir, note).await?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&ckpt)
            .map_err(|e| Error::io(&ckpt, "cannot open the checkpoint", e))?;
        let mut out = std::io::BufWriter::with_capacity(1 << 16, file);
        let concurrency = cfg.model.concurrency.max(1);
        let stream = futures::stream::iter(pending.iter().map(|item| async move {
            let a = classifier.classify(item).await;
            (item, a)
        }))
        .buffer_unordered(concurrency)
        .ready_chunks(256);
        let mut stream = std::pin::pin!(stream);
        let mut ctrl_c = std::pin::pin!(tokio::signal::ctrl_c());
        let mut interrupted = false;
        let mut failed = 0u64;
        let mut flagged = 0u64;
        loop {
            let chunk = tokio::select! {
                c = stream.next() => c,
                _ = &mut ctrl_c => { interrupted = true; None }
            };
            let Some(chunk) = chunk else { break };
            for (item, a) in chunk {
                let (flag, score, category, error) = match a.verdict {
                    Ok(v) => (Some(v.flagged), v.score, v.category, None),
                    Err(e) => (None, None, None, Some(e)),
                };
                failed += u64::from(error.is_some());
                flagged += u64::from(flag == Some(true));
                let line = GuardLine {
                    item_id: item.item_id.clone(),
                    flagged: flag,
                    score,
                    category,
                    latency_ms: a.latency_ms,
                    error,
                    answer: a.raw.map(|r| cut(r, ANSWER_KEPT_BYTES)),
                };
                let mut text = serde_json::to_vec(&line).expect("a line serialises");
                text.push(b'\n');
                out.write_all(&text)
                    .map_err(|e| Error::io(&ckpt, "cannot write the checkpoint", e))?;
                answers.insert(line.item_id.clone(), line);
                if let Some(p) = progress {
                    p(RunEvent::CaseDone {
                        successes: flagged,
                        errors: failed,
                        blocked: 0,
                    });
                }
            }
            out.flush()
                .map_err(|e| Error::io(&ckpt, "cannot write the checkpoint", e))?;
        }
        out.flush()
            .map_err(|e| Error::io(&ckpt, "cannot write the checkpoint", e))?;
        out.get_ref()
            .sync_data()
            .map_err(|e| Error::io(&ckpt, "cannot write the checkpoint", e))?;
        if let Some(line) = classifier.close().await
            && let Some(p) = progress
        {
            p(RunEvent::Note(&line));
        }
        if interrupted {
            if let Some(p) = progress {
                p(RunEvent::Interrupted);
            }
        } else if let Some(p) = progress {
            p(RunEvent::CallsDone);
        }
        Ok(interrupted)
    })?;
    done.executed = answers.len() - resumed;
    done.interrupted = interrupted;
    done.errors = answers.values().filter(|a| a.error.is_some()).count() as u64;
    done.flagged = answers.values().filter(|a| a.flagged == Some(true)).count() as u64;
    if interrupted {
        return Ok(done);
    }
    let provider = classifier
        .as_ref()
        .map_or("dry_run".to_owned(), |c| c.provider_name().to_owned());
    let batch = results_batch(run_id, cfg, &provider, &items, &answers)?;
    rt.block_on(finish(cfg, run_id, dir, batch, &mut done))?;
    Ok(done)
}

fn results_batch(
    run_id: &str,
    cfg: &Config,
    provider: &str,
    items: &[Item],
    answers: &HashMap<String, GuardLine>,
) -> Result<RecordBatch> {
    let n = items.len();
    let mut s: Vec<StringBuilder> = (0..17)
        .map(|_| StringBuilder::with_capacity(n, 0))
        .collect();
    let mut b: Vec<BooleanBuilder> = (0..3).map(|_| BooleanBuilder::with_capacity(n)).collect();
    let mut f: Vec<Float64Builder> = (0..2).map(|_| Float64Builder::with_capacity(n)).collect();
    for it in items {
        let a = answers.get(&it.item_id);
        s[0].append_value(run_id);
        s[1].append_value(&it.item_id);
        s[2].append_option(it.case_id.as_deref());
        s[3].append_value(&it.text);
        s[4].append_value(it.role.as_str());
        b[0].append_value(it.label);
        b[1].append_value(it.hard_benign);
        s[5].append_value(&it.form);
        s[6].append_option(it.converter.as_deref());
        s[7].append_option(it.family.as_deref());
        s[8].append_option(it.surface.as_deref());
        s[9].append_option(it.language.as_deref());
        s[10].append_value(&it.source);
        s[11].append_option(it.split.as_deref());
        b[2].append_option(a.and_then(|a| a.flagged));
        f[0].append_option(a.and_then(|a| a.score));
        s[12].append_option(a.and_then(|a| a.category.as_deref()));
        f[1].append_option(a.map(|a| a.latency_ms));
        // an item with no answer (a dry run) is undecided: an error says so
        s[13].append_option(match a {
            Some(a) => a.error.clone(),
            None => Some("not called (dry run)".to_owned()),
        });
        s[14].append_option(a.and_then(|a| a.answer.as_deref()));
        s[15].append_value(provider);
        s[16].append_value(&cfg.model.name);
    }
    let mut s = s.into_iter().map(|mut x| Arc::new(x.finish()) as ArrayRef);
    let mut b = b.into_iter().map(|mut x| Arc::new(x.finish()) as ArrayRef);
    let mut f = f.into_iter().map(|mut x| Arc::new(x.finish()) as ArrayRef);
    let next = |v: &mut dyn Iterator<Item = ArrayRef>| v.next().expect("a column");
    let columns: Vec<ArrayRef> = vec![
        next(&mut s), // run_id
        next(&mut s), // item_id
        next(&mut s), // case_id
        next(&mut s), // text
        next(&mut s), // role
        next(&mut b), // label
        next(&mut b), // hard_benign
        next(&mut s), // form
        next(&mut s), // converter
        next(&mut s), // family
        next(&mut s), // surface
        next(&mut s), // language
        next(&mut s), // source
        next(&mut s), // split
        next(&mut b), // flagged
        next(&mut f), // score
        next(&mut s), // category
        next(&mut f), // latency_ms
        next(&mut s), // error
        next(&mut s), // answer
        next(&mut s), // provider
        next(&mut s), // model_name
    ];
    Ok(RecordBatch::try_new(results_schema(), columns)?)
}

/// `case_results` from `guard_results` (queries/guardrail/case_results.sql), in the
/// contract's schema: the columns the query does not give are null.
async fn case_results(
    ctx: &datafusion::prelude::SessionContext,
    cfg: &Config,
) -> Result<Vec<RecordBatch>> {
    let sql = crate::engine::queries::GUARD_CASE_RESULTS.sql.replace(
        "'${execution_mode}'",
        &format!("'{}'", cfg.model.execution_mode.as_str()),
    );
    let batches = ctx.sql(&sql).await?.collect().await?;
    let schema = crate::contract::arrow::case_results_schema();
    batches
        .iter()
        .map(|b| {
            let columns: Vec<ArrayRef> = schema
                .fields()
                .iter()
                .map(|f| match b.column_by_name(f.name()) {
                    Some(c) if c.data_type() == f.data_type() => Ok(Arc::clone(c)),
                    Some(c) => Ok(datafusion::arrow::compute::cast(c, f.data_type())?),
                    None => Ok(new_null_array(f.data_type(), b.num_rows())),
                })
                .collect::<Result<_>>()?;
            Ok(RecordBatch::try_new(Arc::clone(&schema), columns)?)
        })
        .collect()
}

/// A session with `guard_results` registered over `batch`.
pub fn session_over(batch: RecordBatch) -> Result<datafusion::prelude::SessionContext> {
    let ctx = crate::engine::session();
    let table = datafusion::datasource::MemTable::try_new(results_schema(), vec![vec![batch]])?;
    ctx.register_table("guard_results", Arc::new(table))?;
    crate::engine::tables::register_guard_views(&ctx)?;
    Ok(ctx)
}

/// The `guardrail` block of summary.json: the figures over every item (queries/guardrail).
pub async fn summary_block(ctx: &datafusion::prelude::SessionContext) -> Result<serde_json::Value> {
    use crate::engine::queries as q;
    let rows = |sql: &'static str| async move {
        let batches = ctx.sql(sql).await?.collect().await?;
        crate::report::rows(&batches)
    };
    let detection: Vec<serde_json::Value> = rows(q::GUARD_DETECTION.sql)
        .await?
        .into_iter()
        .filter(|r| r["dimension"] == "all")
        .collect();
    let areas = rows(q::GUARD_AREAS.sql).await?;
    let at_fpr = rows(q::GUARD_AT_FPR.sql).await?;
    let over = rows(q::GUARD_OVER_DEFENCE.sql).await?;
    let latency = rows(q::GUARD_LATENCY.sql).await?;
    let strip = |mut v: serde_json::Value| {
        if let Some(m) = v.as_object_mut() {
            m.remove("run_id");
            m.remove("dimension");
            m.remove("value");
        }
        v
    };
    let first = |v: Vec<serde_json::Value>| v.into_iter().next().map(strip).unwrap_or_default();
    Ok(serde_json::json!({
        "detection": first(detection),
        "areas": first(areas),
        "at_fpr": at_fpr.into_iter().map(strip).collect::<Vec<_>>(),
        "over_defence": first(over),
        "latency_ms": first(latency),
    }))
}

async fn finish(
    cfg: &Config,
    run_id: &str,
    dir: &Path,
    batch: RecordBatch,
    done: &mut GuardDone,
) -> Result<()> {
    let ctx = session_over(batch.clone())?;
    let results = case_results(&ctx, cfg).await?;
    let block = summary_block(&ctx).await?;
    let schema = crate::contract::arrow::case_results_schema();
    let mut partials = crate::scoring::summary::Partials::new(Arc::clone(&schema)).await?;
    for b in &results {
        partials.push(b).await?;
    }
    let mut metrics =
        crate::scoring::summary::from_partials(vec![partials.finish().await?]).await?;
    // Rogan–Gladen corrects a rate for the error of the detector that decided it; a
    // guardrail run's outcomes are read from its labels (a positive let through, a
    // negative flagged), so there is nothing to correct.
    metrics.corrected.method =
        "none: a guardrail run's outcomes are read from its labels, not decided by a detector"
            .into();
    for (_, r) in &mut metrics.corrected.rates.0 {
        *r = crate::rundir::summary::CorrectedRate {
            raw: r.raw,
            n: r.n,
            k: r.k,
            note: Some("exact: read from the labels".into()),
            ..Default::default()
        };
    }

    let mut commit = crate::atomic::FolderCommit::new(dir);
    let mut paths = std::collections::BTreeMap::new();
    let guard = {
        let mut pf = crate::atomic::ParquetFile::create(&dir.join(RESULTS_FILE), results_schema())?;
        pf.write(&batch)?;
        pf.finish()?.0
    };
    paths.insert("guard_results_parquet".to_owned(), commit.put(guard)?);
    let parquet = {
        let mut pf = crate::atomic::ParquetFile::create(
            &dir.join(crate::rundir::CASE_RESULTS_PARQUET),
            Arc::clone(&schema),
        )?;
        for b in &results {
            pf.write(b)?;
        }
        pf.finish()?.0
    };
    paths.insert("case_results_parquet".to_owned(), commit.put(parquet)?);
    let jsonl = {
        let path = dir.join(crate::rundir::CASE_RESULTS_JSONL);
        let mut w = datafusion::arrow::json::WriterBuilder::new()
            .with_explicit_nulls(true)
            .build::<_, datafusion::arrow::json::writer::LineDelimited>(
                crate::atomic::TempFile::create(&path)?,
            );
        for b in &results {
            w.write(b)?;
        }
        w.finish()?;
        w.into_inner()
    };
    paths.insert("case_results_jsonl".to_owned(), commit.put(jsonl)?);
    paths.insert("guard_items_jsonl".to_owned(), dir.join(ITEMS_FILE));
    paths.insert(
        "guard_predictions_jsonl".to_owned(),
        dir.join(PREDICTIONS_FILE),
    );
    let summary_path = dir.join(crate::rundir::SUMMARY_FILE);
    paths.insert("summary_json".to_owned(), summary_path.clone());
    let summary = serde_json::json!({
        "run_id": run_id,
        "experiment_name": cfg.experiment.name,
        "aggregate_metrics": metrics,
        "result_paths": paths,
        "guardrail": block,
    });
    commit.put_json(&summary_path, &summary)?;
    commit.commit()?;
    done.summary = Some(block);
    done.aggregate_metrics = Some(metrics);
    done.result_paths = paths;
    Ok(())
}

/// The classifier a guardrail run's config names.
fn build(cfg: &Config, section: &GuardSection) -> Result<Classifier> {
    use crate::provider::config::ProviderKind;
    if cfg.model.provider == ProviderKind::Builtin {
        return target::builtin(&cfg.model.name)
            .map_err(|m| Error::Usage(format!("model.name: {m}")));
    }
    let map = match &section.answer {
        Some(a) => AnswerMap::compile(a)
            .map_err(|(k, m)| Error::Usage(format!("guardrail.answer.{k}: {m}")))?,
        None => {
            return Err(Error::Usage(
                "guardrail.answer: a called guardrail needs its answer mapping (a preset, or flagged/score paths)".into(),
            ));
        }
    };
    let provider = crate::provider::build(&cfg.model, cfg.experiment.seed, &mut |_| {})?;
    Ok(Classifier::Call { provider, map })
}
