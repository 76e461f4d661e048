//! Every query the binary runs, in one registry: each is a file under `queries/`,
//! compiled in with `include_str!`, so the binary needs no data files and a query's
//! digest (recorded in evidence) is the file's. tests/it/sql.rs checks that every file
//! under `queries/` is registered here and plans.

/// A query file and its text.
#[derive(Clone, Copy, Debug)]
pub struct Query {
    /// Relative to `queries/`.
    pub path: &'static str,
    pub sql: &'static str,
}

macro_rules! query {
    ($path:literal) => {
        Query {
            path: $path,
            sql: include_str!(concat!("../../queries/", $path)),
        }
    };
}

/// `pieval corpus stats`.
pub const CORPUS_STATS: Query = query!("corpus_stats.sql");
/// Scoring: one row per prediction with every detector's verdict.
pub const SCORE_CASES: Query = query!("score_cases.sql");
/// Scoring: the spans behind each verdict.
pub const FINDINGS: Query = query!("findings.sql");
/// Scoring: the partial aggregates of a slice of case_results that [`SUMMARY`] and
/// [`TOTALS`] read (the table `summary_partial`).
pub const SUMMARY_PARTIAL: Query = query!("summary_partial.sql");
/// Scoring: the latencies of a slice of case_results with their counts, what [`TOTALS`]'
/// percentiles read (the table `summary_latency`).
pub const SUMMARY_LATENCY: Query = query!("summary_latency.sql");
/// Scoring: rates with their Wilson intervals, overall and per dimension.
pub const SUMMARY: Query = query!("summary.sql");
/// Scoring: the totals of `summary.json`.
pub const TOTALS: Query = query!("metrics/totals.sql");
/// `pieval runs diff`: the cases whose verdicts differ between two runs.
pub const RUNS_DIFF: Query = query!("runs/diff.sql");
/// `pieval judge calibrate`.
pub const CALIBRATE: Query = query!("judge/calibrate.sql");
pub const CALIBRATION_METRICS: Query = query!("judge/calibration_metrics.sql");
pub const DISAGREEMENTS: Query = query!("judge/disagreements.sql");
pub const DETECTOR_EVALUATE: Query = query!("detectors/evaluate.sql");
pub const DETECTOR_METRICS: Query = query!("detectors/metrics.sql");
pub const DETECTOR_DISAGREEMENTS: Query = query!("detectors/disagreements.sql");

/// `pieval report`: the run's overview, successful attacks, leakage examples with the
/// leaked span, the case table and the controls (the rates come from [`SUMMARY`]).
pub const REPORT_OVERVIEW: Query = query!("report/overview.sql");
pub const REPORT_SUCCESSES: Query = query!("report/successes.sql");
pub const REPORT_LEAKS: Query = query!("report/leaks.sql");
pub const REPORT_CASES: Query = query!("report/cases.sql");
pub const REPORT_CONTROLS: Query = query!("report/controls.sql");
/// `pieval report` of a guardrail run: its curves' points.
pub const REPORT_GUARD_CURVE: Query = query!("report/guard_curve.sql");

/// `pieval sql`: the views over imported runs (`pieval import`).
pub const VERDICT_AGREEMENT: Query = query!("import/agreement.sql");
pub const VERDICT_DISAGREEMENTS: Query = query!("import/disagreements.sql");

/// Guardrail runs (src/guard): their case_results, and the figures over `guard_results`
/// (`summary.json`'s `guardrail` block, `pieval sql`, the report).
pub const GUARD_CASE_RESULTS: Query = query!("guardrail/case_results.sql");
pub const GUARD_DETECTION: Query = query!("guardrail/detection.sql");
/// The view `guard_roc`, which [`GUARD_AREAS`] and [`GUARD_AT_FPR`] read.
pub const GUARD_ROC: Query = query!("guardrail/roc.sql");
pub const GUARD_AREAS: Query = query!("guardrail/areas.sql");
pub const GUARD_AT_FPR: Query = query!("guardrail/at_fpr.sql");
pub const GUARD_OVER_DEFENCE: Query = query!("guardrail/over_defence.sql");
pub const GUARD_LATENCY: Query = query!("guardrail/latency.sql");
pub const GUARD_WORST: Query = query!("guardrail/worst.sql");

/// `pieval review`: the cases a person should decide.
pub const REVIEW_QUEUE: Query = query!("review/queue.sql");

/// The built-in control catalogue (`pieval controls`), in id order.
pub const CONTROLS: [Query; 16] = [
    query!("controls/01_asr_critical.sql"),
    query!("controls/02_asr_overall.sql"),
    query!("controls/03_canary_leak.sql"),
    query!("controls/04_system_prompt_leakage.sql"),
    query!("controls/05_indirect_per_carrier.sql"),
    query!("controls/06_asr_per_family.sql"),
    query!("controls/07_over_refusal.sql"),
    query!("controls/08_review_backlog.sql"),
    query!("controls/09_provider_errors.sql"),
    query!("controls/10_coverage.sql"),
    query!("controls/11_asr_per_attack.sql"),
    query!("controls/12_agent_asr.sql"),
    query!("controls/13_agent_utility.sql"),
    // guardrail runs (`-- runs: guardrail`)
    query!("controls/14_guard_recall.sql"),
    query!("controls/15_guard_fpr.sql"),
    query!("controls/16_guard_over_defence.sql"),
];

/// Every registered query.
pub fn all() -> Vec<Query> {
    let mut all = vec![
        CORPUS_STATS,
        SCORE_CASES,
        FINDINGS,
        SUMMARY_PARTIAL,
        SUMMARY_LATENCY,
        SUMMARY,
        TOTALS,
        RUNS_DIFF,
        CALIBRATE,
        CALIBRATION_METRICS,
        DISAGREEMENTS,
        DETECTOR_EVALUATE,
        DETECTOR_METRICS,
        DETECTOR_DISAGREEMENTS,
        REPORT_OVERVIEW,
        REPORT_SUCCESSES,
        REPORT_LEAKS,
        REPORT_CASES,
        REPORT_CONTROLS,
        REPORT_GUARD_CURVE,
        REVIEW_QUEUE,
        VERDICT_AGREEMENT,
        VERDICT_DISAGREEMENTS,
        GUARD_CASE_RESULTS,
        GUARD_DETECTION,
        GUARD_ROC,
        GUARD_AREAS,
        GUARD_AT_FPR,
        GUARD_OVER_DEFENCE,
        GUARD_LATENCY,
        GUARD_WORST,
    ];
    all.extend(CONTROLS);
    all
}
