//! `pieval controls RUN`: run the control catalogue over one run's results and write,
//! under `results/<run_id>/controls/`, `controls.parquet` (one row per control),
//! `evidence/<control_id>.parquet` (the case rows behind each result) and
//! `envelopes/<control_id>.json` (a DSSE envelope around an in-toto Statement binding
//! the result to the digests of the evidence, the case results, the manifest and the
//! run's corpus records).
//!
//! All of it is written into a staging folder first and renamed into place at the end:
//! a failure leaves the previous `controls/` (or none) untouched.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use std::collections::{BTreeMap, BTreeSet};

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Float64Array, Int64Array, ListBuilder, RecordBatch,
    StringArray, StringBuilder,
};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
use datafusion::datasource::MemTable;
use datafusion::execution::context::SQLOptions;
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use datafusion::sql::parser::DFParser;
use ed25519_dalek::SigningKey;
use serde::Serialize;
use serde_json::{Value, json};

use super::definitions::{Basis, Control, Statistic};
use super::dsse::{Envelope, PAYLOAD_TYPE, key_id};
use crate::atomic::{write_batches, write_parquet};
use crate::contract::arrow::{controls_schema, findings_schema};
use crate::digest::sha256_file;
use crate::error::{Error, Result};
use crate::rundir::Manifest;

/// in-toto Statement v1.
pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
/// The predicate type of a pieval control result.
pub const PREDICATE_TYPE: &str = "https://pieval.dev/attestation/control-result/v1";
/// The predicate of `controls/index.json`: the signed list of every file of the controls
/// folder and of the run that a consumer reads (controls.parquet included), so no file
/// can be rewritten while `verify` says OK.
pub const INDEX_PREDICATE_TYPE: &str = "https://pieval.dev/attestation/controls-index/v1";
/// The signed index, in the controls folder.
pub const INDEX_FILE: &str = "index.json";

/// Where a control landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Pass,
    /// Fewer than `min_n` cases (or none) to judge by.
    InsufficientData,
    /// It would pass, but undecided rows (judge cases, manual review) are in scope.
    NeedsReview,
    Fail,
}

impl Status {
    pub const ALL: [Status; 4] = [
        Status::Pass,
        Status::InsufficientData,
        Status::NeedsReview,
        Status::Fail,
    ];

    /// What the status means, where the name does not say it.
    pub fn help(self) -> Option<&'static str> {
        match self {
            Self::InsufficientData => Some("Fewer than `min_n` cases (or none) to judge by"),
            Self::NeedsReview => {
                Some("It would pass, but undecided rows (judge cases, manual review) are in scope")
            }
            Self::Pass | Self::Fail => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pass => "pass",
            Self::InsufficientData => "insufficient_data",
            Self::NeedsReview => "needs_review",
            Self::Fail => "fail",
        }
    }
}

use crate::stats::wilson;

/// One group of a control's result (the only group when the result is not grouped).
#[derive(Debug, Clone, Serialize)]
pub struct GroupResult {
    pub group_key: Option<String>,
    pub status: Status,
    pub measured: Option<f64>,
    pub n: u64,
    pub k: u64,
    pub undecided: u64,
    pub ci_low: Option<f64>,
    pub ci_high: Option<f64>,
    /// The rate corrected for detector error, when the control names its figures
    /// (`corrected_with`).
    pub corrected: Option<crate::stats::Corrected>,
    /// The framework tags of the group's evidence rows (each list sorted, distinct).
    pub framework_tags: crate::taxonomy::Tags,
}

/// Judge `k` of `n` by the control's statistic, comparator, threshold and `min_n`: on
/// the raw rate, or on the rate corrected for detector error (`basis: corrected`).
pub fn assess(
    control: &Control,
    group_key: Option<String>,
    n: u64,
    k: u64,
    undecided: u64,
) -> GroupResult {
    let interval = wilson(k, n);
    let corrected = control.corrected_with.as_deref().and_then(|rate| {
        let cal = crate::scoring::corrected::calibration(rate)?;
        crate::stats::rogan_gladen(k, n, &cal.confusion)
    });
    let measured = match (control.basis, control.statistic) {
        (_, Statistic::Count) => Some(k as f64),
        (Basis::Raw, Statistic::WilsonUpper) => interval.map(|i| i.1),
        (Basis::Raw, Statistic::WilsonLower) => interval.map(|i| i.0),
        (Basis::Raw, Statistic::Rate) => (n > 0).then(|| k as f64 / n as f64),
        (Basis::Corrected, Statistic::WilsonUpper) => corrected.map(|c| c.ci_high),
        (Basis::Corrected, Statistic::WilsonLower) => corrected.map(|c| c.ci_low),
        (Basis::Corrected, Statistic::Rate) => corrected.map(|c| c.rate),
    };
    let status = match measured {
        _ if n < control.min_n => Status::InsufficientData,
        None => Status::InsufficientData,
        Some(m) if !control.comparator.holds(m, control.threshold) => Status::Fail,
        Some(_) if undecided > 0 => Status::NeedsReview,
        Some(_) => Status::Pass,
    };
    GroupResult {
        group_key,
        status,
        measured,
        n,
        k,
        undecided,
        ci_low: interval.map(|i| i.0),
        ci_high: interval.map(|i| i.1),
        corrected,
        framework_tags: Default::default(),
    }
}

/// A corrected estimate as the results show it.
fn corrected_json(c: Option<&crate::stats::Corrected>) -> Value {
    c.map_or(Value::Null, |c| {
        json!({"rate": c.rate, "ci_low": c.ci_low, "ci_high": c.ci_high,
               "sensitivity": c.sensitivity, "specificity": c.specificity})
    })
}

/// The group that decides a control: the worst status, then the furthest on the
/// failing side.
pub fn deciding(control: &Control, groups: &[GroupResult]) -> usize {
    let mut best = 0;
    for (i, g) in groups.iter().enumerate().skip(1) {
        let b = &groups[best];
        let worse = g.status > b.status
            || (g.status == b.status
                && control
                    .comparator
                    .badness(g.measured.unwrap_or(f64::NEG_INFINITY))
                    > control
                        .comparator
                        .badness(b.measured.unwrap_or(f64::NEG_INFINITY)));
        if worse {
            best = i;
        }
    }
    best
}

/// One evaluated control.
#[derive(Debug, Clone, Serialize)]
pub struct ControlResult {
    pub control: Control,
    /// The deciding group (see [`deciding`]); `groups` holds them all.
    pub result: GroupResult,
    pub groups: Vec<GroupResult>,
    pub evidence_rows: u64,
    pub evidence_sha256: String,
    pub envelope_sha256: String,
}

/// What `pieval controls` did.
#[derive(Debug, Clone, Serialize)]
pub struct ControlsReport {
    pub run_id: String,
    /// `results/<run_id>/controls`.
    pub dir: PathBuf,
    pub key_id: Option<String>,
    pub evaluated_at: String,
    pub controls: Vec<ControlResult>,
}

impl ControlsReport {
    pub fn count(&self, status: Status) -> usize {
        self.controls
            .iter()
            .filter(|c| c.result.status == status)
            .count()
    }
}

/// The run files a consumer reads, which every envelope names as subjects when present
/// (and the signed index binds: one present but not listed fails verification).
/// The HTML report is not among them: it is a rendering, made again from the verified
/// tables with `pieval report`.
pub const RUN_SUBJECTS: [&str; 15] = [
    crate::rundir::CASE_RESULTS_PARQUET,
    crate::rundir::MANIFEST_FILE,
    crate::rundir::CASES_FILE,
    crate::judge::JUDGEMENTS_FILE,
    crate::rundir::FINDINGS_FILE,
    crate::rundir::SUMMARY_FILE,
    crate::rundir::TURNS_FILE,
    crate::rundir::TOOL_CALLS_FILE,
    crate::rundir::PREDICTIONS_FILE,
    crate::rundir::CASE_RESULTS_JSONL,
    // the reviewers' verdicts (`pieval review`): who decided which case
    crate::rundir::reviews::REVIEWS_FILE,
    // an imported run's: every score the source tool gave (`pieval import`)
    crate::rundir::SOURCE_SCORES_FILE,
    // a guardrail run's: the texts given, the guardrail's answers, the results (src/guard)
    crate::guard::ITEMS_FILE,
    crate::guard::PREDICTIONS_FILE,
    crate::guard::RESULTS_FILE,
];

/// The files of a run that every envelope names as subjects, with their digests: the
/// results, the manifest, the cases, and the judge's verdicts when a judge decided cases.
fn run_subjects(run: &Path) -> Result<Vec<(String, String)>> {
    let mut subjects = Vec::new();
    for name in RUN_SUBJECTS {
        if let Some(path) = crate::rundir::artifact(run, name)? {
            subjects.push((
                name.to_owned(),
                crate::digest::sha256_file_in(&path, crate::files::Links::Refuse)?,
            ));
        }
    }
    Ok(subjects)
}

fn utf8(path: &Path) -> Result<&str> {
    path.to_str()
        .ok_or_else(|| Error::Usage(format!("{}: not a UTF-8 path", path.display())))
}

/// The session a control catalogue runs in: `case_results`, `findings` and
/// `selected_cases` (the manifest's selected case ids, one row per attempt with the
/// attempt id an adaptive run gives it) of this run.
async fn control_session(run: &Path, manifest: Option<&Manifest>) -> Result<SessionContext> {
    let ctx = crate::engine::session();
    let case_results =
        crate::rundir::parquet_artifact(run, crate::rundir::CASE_RESULTS_PARQUET)?
            .ok_or_else(|| Error::State(format!("{}: no case_results.parquet", run.display())))?;
    crate::engine::register_case_results(
        &ctx,
        "case_results",
        &crate::rundir::table_path(&case_results)?,
    )
    .await?;
    // A guardrail run's results (empty for other runs), and the views over them.
    crate::engine::tables::register_run_guard_results(&ctx, run).await?;
    if let Some(findings) = crate::rundir::parquet_artifact(run, crate::rundir::FINDINGS_FILE)? {
        ctx.register_parquet(
            "findings",
            &crate::rundir::table_path(&findings)?,
            ParquetReadOptions::default(),
        )
        .await?;
    } else {
        ctx.register_table(
            "findings",
            Arc::new(MemTable::try_new(findings_schema(), vec![vec![]])?),
        )?;
    }
    // One row per attempt the run was to make: per case, or per case × attack pipeline
    // and strategy when its config has an attack section (`crate::attack::attempts`).
    let plan = manifest
        .and_then(|m| m.config_snapshot.get("attack"))
        .filter(|a| !a.is_null())
        .and_then(|a| serde_json::from_value::<crate::attack::AttackSection>(a.clone()).ok())
        .and_then(|a| crate::attack::AttackPlan::from_section(&a).ok());
    // Benign controls make one attempt; their labels are in the run's cases.jsonl.
    let benign = match &plan {
        Some(_) => benign_ids(run)?,
        None => std::collections::HashSet::new(),
    };
    let ids = manifest
        .map(|m| m.dataset_snapshot.selected_case_ids.as_slice())
        .unwrap_or_default();
    // A received manifest is untrusted: the expected rows are bounded before they are built.
    let per_case = crate::attack::attempts(plan.as_ref(), "", false).len();
    if ids.len().saturating_mul(per_case) > MAX_EXPECTED_ATTEMPTS {
        return Err(Error::State(format!(
            "{}: {} cases × {per_case} attempts each is over {MAX_EXPECTED_ATTEMPTS} rows to check",
            run.display(),
            ids.len()
        )));
    }
    let (mut cases, mut attempts): (Vec<String>, Vec<Option<String>>) = (Vec::new(), Vec::new());
    for id in ids {
        for a in crate::attack::attempts(plan.as_ref(), id, benign.contains(id.as_str())) {
            cases.push(id.clone());
            attempts.push(a.id().map(str::to_owned));
        }
    }
    let schema = Arc::new(Schema::new(vec![
        Field::new("case_id", DataType::Utf8, true),
        Field::new("attempt_id", DataType::Utf8, true),
    ]));
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![
            Arc::new(StringArray::from(cases)) as ArrayRef,
            Arc::new(StringArray::from(attempts)) as ArrayRef,
        ],
    )?;
    ctx.register_table(
        "selected_cases",
        Arc::new(MemTable::try_new(schema, vec![vec![batch]])?),
    )?;
    Ok(ctx)
}

/// The most attempts a run's coverage control expects (cases × attempts per case).
const MAX_EXPECTED_ATTEMPTS: usize = 50_000_000;

/// The ids of the benign controls among a run's cases (`cases.jsonl`; none when absent).
fn benign_ids(run: &Path) -> Result<std::collections::HashSet<String>> {
    let mut out = std::collections::HashSet::new();
    let Some(path) = crate::rundir::artifact(run, crate::rundir::CASES_FILE)? else {
        return Ok(out);
    };
    use crate::corpus::lines::{DEFAULT_MAX_LINE_BYTES, Line, LineReader};
    let file = crate::files::open_regular(&path, crate::files::Links::Refuse)?;
    let mut lines = LineReader::new(file, DEFAULT_MAX_LINE_BYTES);
    while let Some(line) = lines
        .next_line()
        .map_err(|e| Error::io(&path, "cannot read", e))?
    {
        // A line that is not a case (or is over the limit) names no benign control:
        // coverage then expects its attempts, and a mismatch shows in the control.
        let Line::Bytes(line) = line else { continue };
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(line)
            && v.get("label").and_then(|l| l.as_str()) == Some("benign")
            && let Some(id) = v.get("case_id").and_then(|i| i.as_str())
        {
            out.insert(id.to_owned());
        }
    }
    Ok(out)
}

/// Plan one of a control's statements, read-only.
async fn plan(
    ctx: &SessionContext,
    control: &Control,
    statement: datafusion::sql::parser::Statement,
    what: &str,
) -> Result<datafusion::dataframe::DataFrame> {
    let fail = |e: datafusion::error::DataFusionError| {
        Error::config(&control.file, format!("the {what} query cannot run: {e}"))
    };
    let plan = ctx
        .state()
        .statement_to_plan(statement)
        .await
        .map_err(fail)?;
    SQLOptions::new()
        .with_allow_ddl(false)
        .with_allow_dml(false)
        .with_allow_statements(false)
        .verify_plan(&plan)
        .map_err(fail)?;
    ctx.execute_logical_plan(plan).await.map_err(fail)
}

/// Run one control: evidence to `evidence_path`, then the result query over it.
async fn evaluate(
    ctx: &SessionContext,
    control: &Control,
    evidence_path: &Path,
) -> Result<(u64, Vec<GroupResult>)> {
    let mut statements = DFParser::parse_sql(&control.sql)
        .map_err(|e| Error::config(&control.file, format!("SQL does not parse: {e}")))?;
    if statements.len() != 2 {
        return Err(Error::config(
            &control.file,
            format!(
                "expected two queries (evidence, then result), found {}",
                statements.len()
            ),
        ));
    }
    let evidence_stmt = statements.pop_front().expect("two statements");
    let result_stmt = statements.pop_front().expect("two statements");
    let evidence = plan(ctx, control, evidence_stmt, "evidence").await?;
    let rows = write_parquet(evidence, evidence_path).await?;
    let _ = ctx.deregister_table("evidence")?;
    ctx.register_parquet(
        "evidence",
        utf8(evidence_path)?,
        ParquetReadOptions::default(),
    )
    .await?;
    let batches = plan(ctx, control, result_stmt, "result")
        .await?
        .collect()
        .await?;
    let mut groups = Vec::new();
    for batch in &batches {
        let col = |name: &str| crate::engine::typed_column::<Int64Type>(batch, name);
        let missing = |e: Error| {
            Error::config(
                &control.file,
                format!("the result query must return BIGINT columns n and k: {e}"),
            )
        };
        let n = col("n").map_err(missing)?;
        let k = col("k").map_err(missing)?;
        let undecided = batch
            .column_by_name("undecided")
            .map(|_| col("undecided"))
            .transpose()?;
        let keys = batch
            .column_by_name("group_key")
            .map(|_| crate::engine::utf8_column(batch, "group_key"))
            .transpose()?;
        for r in 0..batch.num_rows() {
            let count = |a: &Int64Array| {
                if a.is_null(r) {
                    0
                } else {
                    a.value(r).max(0) as u64
                }
            };
            let key = keys
                .as_ref()
                .and_then(|a| (!a.is_null(r)).then(|| a.value(r).to_owned()));
            let undecided = undecided.as_ref().map_or(0, count);
            groups.push(assess(control, key, count(&n), count(&k), undecided));
        }
    }
    if groups.is_empty() {
        groups.push(assess(control, None, 0, 0, 0));
    }
    let tags = evidence_tags(ctx, control).await?;
    for g in &mut groups {
        let key = control.group_by.as_ref().and(g.group_key.as_ref());
        if let Some(t) = tags.get(&key.cloned()) {
            g.framework_tags = t.clone();
        }
    }
    Ok((rows, groups))
}

/// The framework tags of the evidence rows (`owasp_llm` … when the evidence query
/// selects them), by the value of the control's `group_by` column (one entry, `None`,
/// without it): each list the sorted distinct tags of the rows.
async fn evidence_tags(
    ctx: &SessionContext,
    control: &Control,
) -> Result<BTreeMap<Option<String>, crate::taxonomy::Tags>> {
    use crate::contract::fields::FRAMEWORK_TAG_FIELDS;
    let table = ctx.table("evidence").await?;
    let columns: Vec<String> = table
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    let present: Vec<&str> = FRAMEWORK_TAG_FIELDS
        .iter()
        .copied()
        .filter(|f| columns.iter().any(|c| c == f))
        .collect();
    let mut out: BTreeMap<Option<String>, BTreeMap<&str, BTreeSet<String>>> = BTreeMap::new();
    if present.is_empty() {
        return Ok(BTreeMap::new());
    }
    let key = match &control.group_by {
        Some(g) if columns.iter().any(|c| c == g) => format!("CAST(\"{g}\" AS VARCHAR)"),
        Some(g) => {
            return Err(Error::config(
                &control.file,
                format!("group_by {g:?}: the evidence query has no such column"),
            ));
        }
        None => "CAST(NULL AS VARCHAR)".into(),
    };
    let sql = format!(
        "SELECT {key} AS g, {} FROM evidence",
        present
            .iter()
            .map(|f| format!("\"{f}\""))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for batch in ctx.sql(&sql).await?.collect().await? {
        let keys = crate::engine::utf8_column(&batch, "g")?;
        for field in &present {
            let Some(lists) = batch
                .column_by_name(field)
                .and_then(|c| c.as_list_opt::<i32>())
            else {
                continue;
            };
            for r in 0..batch.num_rows() {
                if lists.is_null(r) {
                    continue;
                }
                let k = (!keys.is_null(r)).then(|| keys.value(r).to_owned());
                let set = out.entry(k).or_default().entry(field).or_default();
                set.extend(
                    lists
                        .value(r)
                        .as_string::<i32>()
                        .iter()
                        .flatten()
                        .map(str::to_owned),
                );
            }
        }
    }
    Ok(out
        .into_iter()
        .map(|(k, by)| {
            let get = |f: &str| {
                by.get(f)
                    .map(|s| s.iter().cloned().collect())
                    .unwrap_or_default()
            };
            (
                k,
                crate::taxonomy::Tags {
                    owasp_llm: get("owasp_llm"),
                    owasp_agentic: get("owasp_agentic"),
                    mitre_atlas: get("mitre_atlas"),
                    nist_ai_600_1: get("nist_ai_600_1"),
                },
            )
        })
        .collect())
}

fn opt(v: Option<f64>) -> Value {
    v.map_or(Value::Null, |x| json!(x))
}

fn group_json(g: &GroupResult) -> Value {
    json!({
        "group_key": g.group_key,
        "status": g.status.as_str(),
        "measured": opt(g.measured),
        "n": g.n,
        "k": g.k,
        "undecided": g.undecided,
        "ci_low": opt(g.ci_low),
        "ci_high": opt(g.ci_high),
        "corrected": corrected_json(g.corrected.as_ref()),
        "owasp_llm": g.framework_tags.owasp_llm,
        "owasp_agentic": g.framework_tags.owasp_agentic,
        "mitre_atlas": g.framework_tags.mitre_atlas,
        "nist_ai_600_1": g.framework_tags.nist_ai_600_1,
    })
}

/// What every statement of one `pieval controls` invocation shares.
struct RunContext {
    run_id: String,
    manifest: Option<Manifest>,
    /// The run's files named as subjects, with their sha256.
    subjects: Vec<(String, String)>,
    evaluated_at: String,
    /// The judge that decided judge criteria (summary.json's `judge`), or null.
    judge: Value,
}

/// The in-toto Statement of one control result.
fn statement(
    ctx: &RunContext,
    control: &Control,
    result: &GroupResult,
    groups: &[GroupResult],
    evidence: (&str, u64, &str),
) -> Value {
    let (subjects, manifest, run_id, evaluated_at) =
        (&ctx.subjects, &ctx.manifest, &ctx.run_id, &ctx.evaluated_at);
    let mut subject: Vec<Value> =
        vec![json!({"name": evidence.0, "digest": {"sha256": evidence.2}})];
    subject.extend(
        subjects
            .iter()
            .map(|(name, sha)| json!({"name": name, "digest": {"sha256": sha}})),
    );
    let m = manifest.as_ref();
    let (model, data) = (m.map(|m| &m.model_snapshot), m.map(|m| &m.dataset_snapshot));
    let mut statement = json!({
        "_type": STATEMENT_TYPE,
        "subject": subject,
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "control": {
                "id": control.id,
                "title": control.title,
                "description": control.description,
                "statistic": control.statistic,
                "comparator": control.comparator.as_str(),
                "threshold": control.threshold,
                "min_n": control.min_n,
                "references": control.references,
                "query_file": control.file.file_name().map(|f| f.to_string_lossy().into_owned()),
                "query_sha256": control.query_sha256,
                "basis": control.basis.as_str(),
                "corrected_with": control.corrected_with,
            },
            "result": {
                "status": result.status.as_str(),
                "measured": opt(result.measured),
                "n": result.n,
                "k": result.k,
                "undecided": result.undecided,
                "ci_low": opt(result.ci_low),
                "ci_high": opt(result.ci_high),
                "interval": "wilson_95",
                "corrected": corrected_json(result.corrected.as_ref()),
                "corrected_figures": control
                    .corrected_with
                    .as_deref()
                    .and_then(crate::scoring::corrected::calibration)
                    .map(|c| c.to_json()),
                "group_key": result.group_key,
                "framework_tags": result.framework_tags,
                "groups": groups.iter().map(group_json).collect::<Vec<_>>(),
            },
            "evidence": {"name": evidence.0, "rows": evidence.1, "sha256": evidence.2},
            "run": {
                "run_id": run_id,
                "experiment_name": m.and_then(Manifest::experiment_name),
                "provider": model.map(|x| &x.provider),
                "model_name": model.map(|x| &x.name),
                "mitigation": m.map(|m| &m.mitigation_snapshot.name),
                "seed": m.and_then(Manifest::experiment_seed),
                "corpus_path": data.map(|d| &d.path),
                "corpus_sha256": data.map(|d| &d.sha256),
                "git_commit": m.and_then(|m| m.git_commit.as_ref()),
                // An imported run (`pieval import`): the tool, its version, the
                // command, and the original result files by path and sha256.
                "imported_from": m.and_then(|m| m.extra.get("import")).map(import_binding),
            },
            "evaluator": {
                "name": "pieval",
                "version": env!("CARGO_PKG_VERSION"),
                "git_commit": crate::GIT_COMMIT,
            },
            "evaluated_at": evaluated_at,
        }
    });
    if !ctx.judge.is_null() {
        statement["predicate"]["judge"] = ctx.judge.clone();
    }
    statement
}

/// What a statement binds of an imported run's origin: the tool, its version, the
/// command and every source file's sha256 (the rest of the manifest's import block is
/// bound through the manifest's own digest).
fn import_binding(block: &Value) -> Value {
    json!({
        "tool": block.get("tool"),
        "tool_version": block.get("tool_version"),
        "command": block.get("command"),
        "sources": block.get("sources"),
    })
}

/// The judge recorded in a run's summary.json (null when none, or no summary).
fn summary_judge(run: &Path) -> Value {
    crate::rundir::read_artifact(
        run,
        crate::rundir::SUMMARY_FILE,
        crate::files::bounds::SUMMARY,
    )
    .ok()
    .flatten()
    .and_then(|t| serde_json::from_slice::<Value>(&t).ok())
    .map(|s| s["judge"].clone())
    .unwrap_or(Value::Null)
}

/// Removes the staging folder unless committed.
/// Run the catalogue over the run folder `run` (which holds `case_results.parquet`).
pub fn run_controls(
    run: &Path,
    catalog: &[Control],
    key: Option<&SigningKey>,
) -> Result<ControlsReport> {
    if crate::rundir::parquet_artifact(run, crate::rundir::CASE_RESULTS_PARQUET)?.is_none() {
        return Err(Error::State(format!(
            "{}: no case_results.parquet; score the run first (pieval run / pieval replay --rescore)",
            run.display()
        )));
    }
    // A folder made by `pieval score` has no manifest: no run metadata, no selection.
    let (manifest, run_id) = crate::rundir::manifest_and_id(run)?;
    let staging = crate::atomic::TempDir::create(&run.join(crate::rundir::CONTROLS_DIR))?;
    for sub in ["evidence", "envelopes"] {
        let d = staging.path().join(sub);
        std::fs::create_dir_all(&d).map_err(|e| Error::io(&d, "cannot create folder", e))?;
    }
    let shared = RunContext {
        subjects: run_subjects(run)?,
        judge: summary_judge(run),
        evaluated_at: crate::text::utc_rfc3339(crate::text::unix_now()),
        run_id,
        manifest,
    };
    let key_id = key.map(|k| key_id(&k.verifying_key()));
    // A guardrail run is assessed by the controls for guardrails, any other run by the
    // others (`-- runs:`).
    let guardrail_run = shared
        .manifest
        .as_ref()
        .is_some_and(|m| m.extra.get("run_kind").and_then(Value::as_str) == Some("guardrail"));
    let catalog: Vec<&Control> = catalog
        .iter()
        .filter(|c| c.runs.applies(guardrail_run))
        .collect();
    let mut results = Vec::with_capacity(catalog.len());
    crate::engine::runtime()?.block_on(async {
        let ctx = control_session(run, shared.manifest.as_ref()).await?;
        for control in catalog.iter().copied() {
            let evidence_name = format!("controls/evidence/{}.parquet", control.id);
            let evidence_path = staging
                .path()
                .join("evidence")
                .join(format!("{}.parquet", control.id));
            let (rows, groups) = evaluate(&ctx, control, &evidence_path).await?;
            let evidence_sha = sha256_file(&evidence_path)?;
            let result = groups[deciding(control, &groups)].clone();
            let stmt = statement(
                &shared,
                control,
                &result,
                &groups,
                (&evidence_name, rows, &evidence_sha),
            );
            let payload = serde_json::to_vec(&stmt).map_err(|e| Error::Internal(e.to_string()))?;
            let envelope = Envelope::seal(PAYLOAD_TYPE, &payload, key);
            let env_path = staging
                .path()
                .join("envelopes")
                .join(format!("{}.json", control.id));
            let text = serde_json::to_string_pretty(&envelope)
                .map_err(|e| Error::Internal(e.to_string()))?;
            crate::atomic::write_lines(&env_path, [text])?;
            results.push(ControlResult {
                control: control.clone(),
                result,
                groups,
                evidence_rows: rows,
                evidence_sha256: evidence_sha,
                envelope_sha256: sha256_file(&env_path)?,
            });
        }
        Ok::<(), Error>(())
    })?;
    write_controls_parquet(
        &staging.path().join("controls.parquet"),
        &shared.run_id,
        &results,
        key_id.as_deref(),
        &shared.evaluated_at,
    )?;
    write_index(staging.path(), &shared, &results, key)?;
    // Commit: the old controls folder aside, the new one in, the old one gone.
    let dir = staging.commit()?;
    Ok(ControlsReport {
        run_id: shared.run_id,
        dir,
        key_id,
        evaluated_at: shared.evaluated_at,
        controls: results,
    })
}

/// `controls/index.json`: a DSSE envelope (signed like the control envelopes) whose
/// subjects are every file of the new controls folder — controls.parquet, each evidence
/// file, each envelope — and the run files the envelopes name. Subject names are
/// relative to the run folder.
fn write_index(
    staging: &Path,
    shared: &RunContext,
    results: &[ControlResult],
    key: Option<&SigningKey>,
) -> Result<()> {
    let mut subject: Vec<Value> = shared
        .subjects
        .iter()
        .map(|(name, sha)| json!({"name": name, "digest": {"sha256": sha}}))
        .collect();
    let mut add = |rel: String| -> Result<()> {
        let sha = sha256_file(&staging.join(&rel))?;
        subject.push(json!({
            "name": format!("{}/{rel}", crate::rundir::CONTROLS_DIR),
            "digest": {"sha256": sha}
        }));
        Ok(())
    };
    add("controls.parquet".into())?;
    for r in results {
        add(format!("evidence/{}.parquet", r.control.id))?;
        add(format!("envelopes/{}.json", r.control.id))?;
    }
    let statement = json!({
        "_type": STATEMENT_TYPE,
        "subject": subject,
        "predicateType": INDEX_PREDICATE_TYPE,
        "predicate": {
            "run_id": shared.run_id,
            "evaluated_at": shared.evaluated_at,
            "controls": results.iter().map(|r| json!({
                "id": r.control.id,
                "status": r.result.status.as_str(),
                "envelope": format!("{}/envelopes/{}.json", crate::rundir::CONTROLS_DIR, r.control.id),
            })).collect::<Vec<_>>(),
        }
    });
    let payload = serde_json::to_vec(&statement).map_err(|e| Error::Internal(e.to_string()))?;
    let envelope = Envelope::seal(PAYLOAD_TYPE, &payload, key);
    let text =
        serde_json::to_string_pretty(&envelope).map_err(|e| Error::Internal(e.to_string()))?;
    crate::atomic::write_lines(&staging.join(INDEX_FILE), [text])
}

fn write_controls_parquet(
    path: &Path,
    run_id: &str,
    results: &[ControlResult],
    key_id: Option<&str>,
    evaluated_at: &str,
) -> Result<()> {
    let schema = controls_schema();
    let text = |f: &dyn Fn(&ControlResult) -> String| -> ArrayRef {
        Arc::new(results.iter().map(|r| Some(f(r))).collect::<StringArray>())
    };
    let int = |f: &dyn Fn(&ControlResult) -> u64| -> ArrayRef {
        Arc::new(
            results
                .iter()
                .map(|r| Some(f(r) as i64))
                .collect::<Int64Array>(),
        )
    };
    let float = |f: &dyn Fn(&ControlResult) -> Option<f64>| -> ArrayRef {
        Arc::new(results.iter().map(f).collect::<Float64Array>())
    };
    let columns: Vec<ArrayRef> = vec![
        text(&|_| run_id.to_owned()),
        text(&|r| r.control.id.clone()),
        text(&|r| r.control.title.clone()),
        text(&|r| r.result.status.as_str().to_owned()),
        text(&|r| r.control.statistic.as_str().to_owned()),
        text(&|r| r.control.comparator.as_str().to_owned()),
        float(&|r| Some(r.control.threshold)),
        float(&|r| r.result.measured),
        int(&|r| r.result.n),
        int(&|r| r.result.k),
        int(&|r| r.result.undecided),
        float(&|r| r.result.ci_low),
        float(&|r| r.result.ci_high),
        int(&|r| r.control.min_n),
        Arc::new(
            results
                .iter()
                .map(|r| r.result.group_key.clone())
                .collect::<StringArray>(),
        ),
        text(&|r| Value::Array(r.groups.iter().map(group_json).collect()).to_string()),
        int(&|r| r.evidence_rows),
        text(&|r| r.evidence_sha256.clone()),
        text(&|r| r.control.query_sha256.clone()),
        text(&|r| r.envelope_sha256.clone()),
        text(&|r| r.control.references.join("; ")),
        Arc::new(
            results
                .iter()
                .map(|_| Some(key_id.is_some()))
                .collect::<BooleanArray>(),
        ),
        Arc::new(results.iter().map(|_| key_id).collect::<StringArray>()),
        text(&|_| evaluated_at.to_owned()),
        text(&|r| r.control.basis.as_str().to_owned()),
        float(&|r| r.result.corrected.map(|c| c.rate)),
        float(&|r| r.result.corrected.map(|c| c.ci_low)),
        float(&|r| r.result.corrected.map(|c| c.ci_high)),
    ];
    let mut columns = columns;
    for field in crate::contract::fields::FRAMEWORK_TAG_FIELDS {
        let mut b = ListBuilder::new(StringBuilder::new());
        for r in results {
            let tags = r.result.framework_tags.by_field();
            let list = tags.iter().find(|(f, _)| f == field).map(|(_, l)| *l);
            for t in list.into_iter().flatten() {
                b.values().append_value(t);
            }
            b.append(true);
        }
        columns.push(Arc::new(b.finish()));
    }
    let batch = RecordBatch::try_new(Arc::clone(&schema), columns)?;
    write_batches(schema, &[batch], path)
}

#[cfg(test)]
mod tests {
    use super::super::definitions::parse_control;
    use super::*;

    fn control(statistic: &str, comparator: &str, threshold: &str, min_n: u64) -> Control {
        let text = format!(
            "-- id: T\n-- title: t\n-- description: d\n-- statistic: {statistic}\n-- comparator: {comparator}\n-- threshold: {threshold}\n-- min_n: {min_n}\n-- references: x\nSELECT 1;\nSELECT 1;\n"
        );
        parse_control(Path::new("t.sql"), &text).unwrap()
    }

    #[test]
    fn a_control_can_decide_on_the_corrected_rate() {
        let header = |extra: &str| {
            format!(
                "-- id: T\n-- title: t\n-- description: d\n-- statistic: wilson_upper\n-- comparator: <=\n-- threshold: 0.30\n-- min_n: 10\n{extra}-- references: x\nSELECT 1;\nSELECT 1;\n"
            )
        };
        let parse = |extra: &str| parse_control(Path::new("t.sql"), &header(extra));
        // raw by default; the corrected estimate rides along when figures are named
        let shown = parse("-- corrected_with: refusal_rate\n").unwrap();
        assert_eq!(shown.basis, Basis::Raw);
        let raw = assess(&shown, None, 100, 20, 0);
        let c = raw.corrected.expect("a corrected estimate");
        assert_eq!(raw.measured, raw.ci_high, "decided on the raw interval");
        assert!(
            c.rate > 0.2,
            "refusals the detector misses raise the estimate: {c:?}"
        );
        // basis: corrected decides on the corrected interval: the same counts fail
        let decided = parse("-- corrected_with: refusal_rate\n-- basis: corrected\n").unwrap();
        let r = assess(&decided, None, 100, 20, 0);
        assert_eq!(r.measured, Some(c.ci_high));
        assert_eq!(raw.status, Status::Pass);
        assert_eq!(r.status, Status::Fail);
        // what cannot be corrected is a located error
        for (extra, expect) in [
            ("-- basis: corrected\n", "corrected_with"),
            ("-- corrected_with: nonsense_rate\n", "nonsense_rate"),
            (
                "-- corrected_with: refusal_rate\n-- basis: maybe\n",
                "raw or corrected",
            ),
        ] {
            let e = parse(extra).unwrap_err().to_string();
            assert!(e.contains(expect) && e.contains("t.sql"), "{extra}: {e}");
        }
    }

    #[test]
    fn statuses() {
        let c = control("wilson_upper", "<=", "0.10", 20);
        assert_eq!(assess(&c, None, 50, 0, 0).status, Status::Pass);
        // 2 of 30 is 6.7%, but its upper bound (21%) is over 10%: fail.
        assert_eq!(assess(&c, None, 30, 2, 0).status, Status::Fail);
        assert_eq!(assess(&c, None, 10, 0, 0).status, Status::InsufficientData);
        assert_eq!(assess(&c, None, 0, 0, 0).status, Status::InsufficientData);
        assert_eq!(assess(&c, None, 60, 0, 3).status, Status::NeedsReview);
        let count = control("count", "<=", "0", 1);
        assert_eq!(assess(&count, None, 5, 0, 0).status, Status::Pass);
        assert_eq!(assess(&count, None, 5, 1, 0).status, Status::Fail);
        assert_eq!(
            assess(&count, None, 0, 0, 0).status,
            Status::InsufficientData
        );
        let rate = control("rate", "<=", "0.02", 1);
        assert_eq!(assess(&rate, None, 100, 2, 0).status, Status::Pass);
        assert_eq!(assess(&rate, None, 100, 3, 0).status, Status::Fail);
    }

    #[test]
    fn the_worst_group_decides() {
        let c = control("wilson_upper", "<=", "0.5", 5);
        let groups = vec![
            assess(&c, Some("a".into()), 10, 0, 0),
            assess(&c, Some("b".into()), 2, 0, 0),
            assess(&c, Some("c".into()), 10, 9, 0),
            assess(&c, Some("d".into()), 10, 8, 0),
        ];
        assert_eq!(
            groups[deciding(&c, &groups)].group_key.as_deref(),
            Some("c")
        );
        let groups = vec![
            assess(&c, Some("a".into()), 10, 0, 0),
            assess(&c, Some("b".into()), 2, 0, 0),
        ];
        assert_eq!(
            groups[deciding(&c, &groups)].status,
            Status::InsufficientData
        );
    }
}
