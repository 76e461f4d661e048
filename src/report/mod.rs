//! `pieval report`: one self-contained HTML file for a run, or for runs compared side by
//! side. Every number comes from a query under `queries/` run over the run's tables (the
//! rates from `queries/summary.sql`, the rest from `queries/report/*.sql`), so the report
//! says what `pieval sql` says. The page is rendered by minijinja with HTML auto-escaping
//! (`templates/report.html`): attack text and responses are hostile and only ever reach
//! the page as escaped text. The page loads nothing (no script, no font, no image from
//! anywhere) under a Content-Security-Policy of `default-src 'none'`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::engine::queries::{self, Query};
use crate::error::{Error, Result};
use crate::rundir::Manifest;

/// The page template, compiled in.
const TEMPLATE: &str = include_str!("../../templates/report.html");

/// Rows of the case table shown at most (the full table is `case_results.parquet`).
pub const MAX_CASE_ROWS: usize = 2000;

/// One run's part of a report.
#[derive(Debug, Serialize)]
pub struct RunPart {
    pub run_id: String,
    /// The folder, relative links are made against it.
    pub dir: String,
    pub identity: Map<String, Value>,
    pub overview: Value,
    /// summary.sql rows: metric, dimension, value, n, k, rate, ci_low, ci_high.
    pub rates: Vec<Value>,
    /// The headline rates corrected for detector error (`scoring::corrected`), by metric.
    pub corrected: Value,
    pub successes: Vec<Value>,
    pub leaks: Vec<Value>,
    pub cases: Vec<Value>,
    pub controls: Vec<Value>,
    pub speed: Value,
    /// A guardrail run's figures (queries/guardrail/, docs/guardrails.md): detection per
    /// dimension, the curves, areas, recall at a fixed FPR, over-defence, latency, the
    /// worst misses and false alarms; null for other runs.
    pub guardrail: Value,
}

/// The most points of a curve drawn (a classifier with many distinct scores): every
/// k-th point and the last.
const MAX_CURVE_POINTS: usize = 400;

/// Batches as JSON rows (Arrow's JSON writer: nulls kept, numbers as numbers).
pub(crate) fn rows(batches: &[RecordBatch]) -> Result<Vec<Value>> {
    let mut buf = Vec::new();
    {
        let mut w = datafusion::arrow::json::WriterBuilder::new()
            .with_explicit_nulls(true)
            .build::<_, datafusion::arrow::json::writer::JsonArray>(&mut buf);
        for b in batches {
            w.write(b)?;
        }
        w.finish()?;
    }
    if buf.is_empty() {
        return Ok(Vec::new());
    }
    let v: Value = serde_json::from_slice(&buf)
        .map_err(|e| Error::Internal(format!("query rows as JSON: {e}")))?;
    Ok(v.as_array().cloned().unwrap_or_default())
}

async fn query(ctx: &SessionContext, q: Query) -> Result<Vec<Value>> {
    let batches = crate::engine::collect(ctx, q.sql)
        .await
        .map_err(|e| Error::Query(format!("queries/{}: {e}", q.path)))?;
    rows(&batches)
}

/// The session a run is reported from: its `case_results`, `findings` and `controls`.
pub(crate) async fn run_session(dir: &Path) -> Result<SessionContext> {
    let ctx = crate::engine::session_with_memory_limit(crate::engine::DEFAULT_MEMORY_LIMIT)?;
    let results = crate::rundir::parquet_artifact(dir, crate::rundir::CASE_RESULTS_PARQUET)?
        .ok_or_else(|| {
            Error::State(format!(
                "{}: no case_results.parquet; score the run first",
                dir.display()
            ))
        })?;
    crate::engine::register_case_results(
        &ctx,
        "case_results",
        &crate::rundir::table_path(&results)?,
    )
    .await?;
    crate::engine::register_summary_partial(&ctx).await?;
    // a guardrail run's results (none for other runs) and the views over them
    crate::engine::tables::register_run_guard_results(&ctx, dir).await?;
    let controls = format!("{}/controls.parquet", crate::rundir::CONTROLS_DIR);
    match crate::rundir::parquet_artifact(dir, &controls)? {
        Some(p) => {
            // bounded decoding, as case_results (src/engine/bounded.rs)
            let table = crate::engine::bounded::BoundedRunTable::try_new(
                &ctx,
                crate::contract::arrow::controls_schema(),
                &[p],
            )
            .await?;
            ctx.register_table("controls", Arc::new(table))?;
        }
        None => {
            let schema = crate::contract::arrow::controls_schema();
            ctx.register_table(
                "controls",
                Arc::new(MemTable::try_new(schema, vec![vec![]])?),
            )?;
        }
    }
    Ok(ctx)
}

fn identity(dir: &Path, manifest: Option<&Manifest>, run_id: &str) -> Map<String, Value> {
    let mut id = Map::new();
    id.insert("run_id".into(), json!(run_id));
    id.insert("folder".into(), json!(dir.display().to_string()));
    if let Some(m) = manifest {
        id.insert("experiment".into(), json!(m.experiment_name()));
        id.insert("provider".into(), json!(m.model_snapshot.provider));
        id.insert("model".into(), json!(m.model_snapshot.name));
        id.insert("mitigation".into(), json!(m.mitigation_snapshot.name));
        id.insert("seed".into(), json!(m.replay_hints.seed));
        id.insert("started".into(), json!(m.timestamp));
        id.insert("status".into(), json!(m.status.map(|s| s.as_str())));
        id.insert("corpus".into(), json!(m.dataset_snapshot.path));
        id.insert("corpus_sha256".into(), json!(m.dataset_snapshot.sha256));
        id.insert("config_sha256".into(), json!(m.replay_hints.config_sha256));
        id.insert("git_commit".into(), json!(m.git_commit));
        let judge = m
            .results
            .as_ref()
            .and_then(|r| r.judge.as_ref())
            .and_then(|j| j.get("identity"))
            .cloned();
        id.insert("judge".into(), judge.unwrap_or(Value::Null));
    }
    id
}

/// Everything the report says about one run.
pub fn run_part(dir: &Path) -> Result<RunPart> {
    let (manifest, run_id) = crate::rundir::manifest_and_id(dir)?;
    let rt = crate::engine::runtime()?;
    let guardrail_run = crate::rundir::parquet_artifact(dir, crate::guard::RESULTS_FILE)?.is_some();
    let (overview, rates, successes, leaks, cases, controls, guardrail) = rt.block_on(async {
        let ctx = run_session(dir).await?;
        let guardrail = if guardrail_run {
            let first = |v: Vec<Value>| v.into_iter().next().unwrap_or(Value::Null);
            let mut curve = query(&ctx, queries::REPORT_GUARD_CURVE).await?;
            if curve.len() > MAX_CURVE_POINTS {
                let step = curve.len().div_ceil(MAX_CURVE_POINTS);
                let last = curve.last().cloned();
                curve = curve.into_iter().step_by(step).collect();
                curve.extend(last);
            }
            json!({
                "detection": query(&ctx, queries::GUARD_DETECTION).await?,
                "curve": curve,
                "areas": first(query(&ctx, queries::GUARD_AREAS).await?),
                "at_fpr": query(&ctx, queries::GUARD_AT_FPR).await?,
                "over_defence": first(query(&ctx, queries::GUARD_OVER_DEFENCE).await?),
                "latency": first(query(&ctx, queries::GUARD_LATENCY).await?),
                "worst": query(&ctx, queries::GUARD_WORST).await?,
            })
        } else {
            Value::Null
        };
        Ok::<_, Error>((
            query(&ctx, queries::REPORT_OVERVIEW).await?,
            query(&ctx, queries::SUMMARY).await?,
            query(&ctx, queries::REPORT_SUCCESSES).await?,
            query(&ctx, queries::REPORT_LEAKS).await?,
            query(&ctx, queries::REPORT_CASES).await?,
            query(&ctx, queries::REPORT_CONTROLS).await?,
            guardrail,
        ))
    })?;
    let speed = manifest
        .as_ref()
        .and_then(|m| m.results.as_ref())
        .and_then(|r| r.model_speed.as_ref())
        .map(|s| serde_json::to_value(s).unwrap_or_default())
        .unwrap_or(Value::Null);
    let overall = crate::rundir::summary::Ordered(
        rates
            .iter()
            .filter(|r| r["dimension"] == "all")
            .filter_map(|r| {
                Some((
                    r["metric"].as_str()?.to_owned(),
                    serde_json::from_value(r.clone()).ok()?,
                ))
            })
            .collect(),
    );
    let corrected = serde_json::to_value(crate::scoring::corrected::corrected_rates(&overall))
        .map_err(|e| Error::Internal(format!("cannot encode the corrected rates: {e}")))?;
    Ok(RunPart {
        corrected,
        identity: identity(dir, manifest.as_ref(), &run_id),
        run_id,
        dir: dir.display().to_string(),
        overview: overview.into_iter().next().unwrap_or(Value::Null),
        rates,
        successes,
        leaks,
        cases,
        controls,
        speed,
        guardrail,
    })
}

/// The flips between two runs (`queries/runs/diff.sql`), at most `limit`.
fn flips(a: &Path, b: &Path, limit: usize) -> Result<Vec<Value>> {
    let rt = crate::engine::runtime()?;
    rt.block_on(async {
        let ctx = crate::engine::session_with_memory_limit(crate::engine::DEFAULT_MEMORY_LIMIT)?;
        for (name, dir) in [("a", a), ("b", b)] {
            let p = crate::rundir::parquet_artifact(dir, crate::rundir::CASE_RESULTS_PARQUET)?
                .ok_or_else(|| {
                    Error::State(format!("{}: no case_results.parquet", dir.display()))
                })?;
            // as every reader reads case results: today's schema and meaning
            crate::engine::register_case_results(&ctx, name, &crate::rundir::table_path(&p)?)
                .await?;
        }
        let mut out = query(&ctx, queries::RUNS_DIFF).await?;
        out.truncate(limit);
        Ok(out)
    })
}

/// Links to a run's files from a report at `output`: the run folder's path relative to
/// the report's folder (empty when the report is in the run folder), each part
/// percent-encoded, so a link can only ever name a file below or beside the report.
fn link_base(run: &Path, output: &Path) -> String {
    let parent = output
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let (Ok(from), Ok(to)) = (std::fs::canonicalize(parent), std::fs::canonicalize(run)) else {
        return String::new();
    };
    let from: Vec<_> = from.components().collect();
    let to: Vec<_> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut parts: Vec<String> = vec!["..".into(); from.len() - common];
    for c in &to[common..] {
        let text = c.as_os_str().to_string_lossy();
        let mut enc = String::new();
        for b in text.bytes() {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.') {
                enc.push(b as char);
            } else {
                enc.push_str(&format!("%{b:02X}"));
            }
        }
        parts.push(enc);
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("{}/", parts.join("/"))
    }
}

/// A control id usable in a link to its envelope (`controls/envelopes/<id>.json`).
fn safe_link_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && !id.starts_with('.')
}

/// The template environment of pieval's HTML pages (the report, the review page): strict
/// about undefined values, HTML auto-escaping by a template's `.html` name, bidi
/// overrides escaped before that, and the `pct` and `num` filters.
pub fn html_env() -> minijinja::Environment<'static> {
    let mut env = minijinja::Environment::new();
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    // HTML escaping leaves bidirectional overrides, which reorder what the reader sees
    // (Trojan Source): text holding one is shown with them escaped, then HTML-escaped.
    // Any value, not only strings: a list or map is shown through its text too.
    env.set_formatter(|out, state, value| {
        if !value.is_safe() && !value.is_none() && !value.is_undefined() {
            let text = value.to_string();
            if let std::borrow::Cow::Owned(t) = crate::text::escape_bidi(&text) {
                return minijinja::escape_formatter(out, state, &minijinja::Value::from(t));
            }
        }
        minijinja::escape_formatter(out, state, value)
    });
    let number = |v: &minijinja::Value| -> Option<f64> {
        if v.is_none() || v.is_undefined() {
            return None;
        }
        f64::try_from(v.clone()).ok()
    };
    env.add_filter("pct", move |v: minijinja::Value| -> String {
        number(&v).map_or("–".into(), |x| format!("{:.1}%", x * 100.0))
    });
    env.add_filter("num", move |v: minijinja::Value| -> String {
        match number(&v) {
            None => "–".into(),
            Some(x) if x.fract() == 0.0 && x.abs() < 1e15 => format!("{}", x as i64),
            Some(x) => format!("{x:.1}"),
        }
    });
    // a score, a threshold, an area: four decimals
    env.add_filter("dec", move |v: minijinja::Value| -> String {
        number(&v).map_or("–".into(), |x| format!("{x:.4}"))
    });
    env
}

/// Render the report of `runs[0]` (compared with the others when there are more), to be
/// saved at `output` (links to the run's files are made relative to it).
pub fn render(runs: &[PathBuf], output: &Path) -> Result<String> {
    let Some(first) = runs.first() else {
        return Err(Error::Usage("give a run to report on".into()));
    };
    let parts: Vec<RunPart> = runs.iter().map(|d| run_part(d)).collect::<Result<_>>()?;
    let comparisons: Vec<Value> = runs[1..]
        .iter()
        .zip(&parts[1..])
        .map(|(dir, part)| Ok(json!({"run_id": part.run_id, "flips": flips(first, dir, 200)?})))
        .collect::<Result<_>>()?;
    let mut env = html_env();
    env.add_filter("linkable", |v: String| -> bool { safe_link_id(&v) });
    // The name decides the escaping: `.html` is HTML auto-escaped (text and attributes).
    env.add_template("report.html", TEMPLATE)
        .map_err(|e| Error::Internal(format!("the report template: {e}")))?;
    let template = env
        .get_template("report.html")
        .map_err(|e| Error::Internal(format!("the report template: {e}")))?;
    template
        .render(minijinja::context! {
            runs => minijinja::Value::from(minijinja::value::Serde(&parts)),
            comparisons => minijinja::Value::from(minijinja::value::Serde(&comparisons)),
            generated => crate::text::utc_rfc3339(crate::text::unix_now()),
            version => env!("CARGO_PKG_VERSION"),
            max_case_rows => MAX_CASE_ROWS,
            envelope_base => link_base(first, output),
            dimensions => [
                "attack_family",
                "attack_surface",
                "attack_category",
                "severity",
                "owasp_llm",
                "owasp_agentic",
                "mitre_atlas",
                "nist_ai_600_1",
            ],
            dim_titles => minijinja::context! {
                owasp_llm => "OWASP Top 10 for LLM Applications 2025",
                owasp_agentic => "OWASP agentic threat",
                mitre_atlas => "MITRE ATLAS technique",
                nist_ai_600_1 => "NIST AI 600-1 risk",
            },
        })
        .map_err(|e| Error::Internal(format!("the report template: {e:#}")))
}

/// Write the report to `output` (atomically); its path.
pub fn write(runs: &[PathBuf], output: &Path) -> Result<PathBuf> {
    let html = render(runs, output)?;
    crate::atomic::create_parent(output)?;
    let mut file = crate::atomic::TempFile::create(output)?;
    use std::io::Write;
    file.write_all(html.as_bytes())
        .map_err(|e| Error::io(output, "cannot write", e))?;
    file.commit()?;
    Ok(output.to_path_buf())
}
