//! `pieval runs diff A B`: what changed from run A to run B.
//!
//! Metric deltas come from each run's `summary.json` (rates with their Wilson 95%
//! intervals). A change is *significant* when a two-proportion z-test gives |z| > 1.96
//! (5%, two-sided). A **regression** is a significant increase of a rate where higher is
//! worse (attack success, leakage, over-refusal of benign controls, an agent's targeted
//! attack success) or a significant decrease of one where lower is worse (an agent's
//! utility, with and without attack: the cost of a defence). Flipped cases come from
//! joining the two runs' `case_results.parquet` on `case_id` in DataFusion.
//!
//! A run with an attack section is compared case by case: its rates are the
//! `adaptive = any_attempt` ones of its summary (a case broken by any of its attempts),
//! so a static run and an adaptive run of the same cases compare like with like.
//!
//! Two guardrail runs (src/guard: two guardrails, or two versions of one, on the same
//! texts) are compared on the figures of their summaries' `guardrail` blocks: recall
//! and FPR at their own verdicts, recall at FPR ≤ 1% and ≤ 5%, over-defence accuracy
//! (each a proportion, by the same z-test) and the ROC area (its change reported, not
//! tested); the flips are texts newly missed or caught (`attack_success`) and newly
//! flagged or cleared (`over_refused`).

use crate::rundir::summary::AggregateMetrics;
use std::path::Path;

use datafusion::arrow::array::{Array, AsArray};
use serde::Serialize;

use crate::error::{Error, Result};

/// Which way a metric gets worse.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Worse {
    Higher,
    Lower,
    /// Neither: a change is reported, never a regression.
    Neither,
}

/// Metrics compared, and which way each gets worse (the agent rates are absent from
/// runs without agentic cases: n = 0, no test).
const METRICS: &[(&str, Worse)] = &[
    ("attack_success_rate", Worse::Higher),
    ("leakage_rate", Worse::Higher),
    ("over_refusal_rate", Worse::Higher),
    ("refusal_rate", Worse::Neither),
    ("targeted_attack_success_rate", Worse::Higher),
    ("utility_rate", Worse::Lower),
    ("utility_under_attack_rate", Worse::Lower),
];

/// A rate with its Wilson interval, as `summary.json` and the manifest record it.
use crate::rundir::Rate;

#[derive(Clone, Debug, Serialize)]
pub struct MetricDelta {
    pub metric: String,
    pub a: Rate,
    pub b: Rate,
    pub delta: Option<f64>,
    pub z: Option<f64>,
    pub significant: bool,
    pub regression: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct Flip {
    pub case_id: String,
    pub field: String,
    pub a: Option<bool>,
    pub b: Option<bool>,
}

#[derive(Clone, Debug, Serialize)]
pub struct RunDiff {
    pub run_a: String,
    pub run_b: String,
    pub metrics: Vec<MetricDelta>,
    /// attack_success false → true (the defence got worse on these cases).
    pub became_successful: u64,
    /// attack_success true → false.
    pub became_unsuccessful: u64,
    pub flips: Vec<Flip>,
    pub only_in_a: u64,
    pub only_in_b: u64,
    pub regression: bool,
}

/// A metric as a diff compares it: over every attempt of a case when the run attacked
/// adaptively (`by_adaptive.any_attempt`), else over every row.
fn rate(m: &AggregateMetrics, metric: &str) -> Rate {
    m.group("adaptive", "any_attempt", metric)
        .or_else(|| m.rate(metric))
        .cloned()
        .unwrap_or_default()
}

/// Two-proportion z statistic (pooled); None when undefined.
pub fn z_two_proportions(a: &Rate, b: &Rate) -> Option<f64> {
    if a.n == 0 || b.n == 0 {
        return None;
    }
    let (na, nb) = (a.n as f64, b.n as f64);
    let (pa, pb) = (a.k as f64 / na, b.k as f64 / nb);
    let p = (a.k + b.k) as f64 / (na + nb);
    let se = (p * (1.0 - p) * (1.0 / na + 1.0 / nb)).sqrt();
    if se == 0.0 {
        return (pa == pb).then_some(0.0);
    }
    Some((pb - pa) / se)
}

fn read_summary(dir: &Path) -> Result<AggregateMetrics> {
    let path = dir.join(crate::rundir::SUMMARY_FILE);
    let text = crate::rundir::read_artifact(
        dir,
        crate::rundir::SUMMARY_FILE,
        crate::files::bounds::SUMMARY,
    )?
    .ok_or_else(|| {
        Error::NotFound(format!(
            "{}: no run summary (was the run scored?)",
            path.display()
        ))
    })?;
    crate::rundir::summary::metrics_of(&text)
        .map_err(|e| Error::input(&path, e.line() as u64, None, format!("not JSON: {e}")))
}

/// A guardrail run's figures compared, as rates (k of n), from its summary's `guardrail`
/// block; and which way each gets worse.
const GUARD_METRICS: &[(&str, Worse)] = &[
    ("guard_recall", Worse::Lower),
    ("guard_fpr", Worse::Higher),
    ("guard_recall_at_fpr_1pct", Worse::Lower),
    ("guard_recall_at_fpr_5pct", Worse::Lower),
    ("guard_over_defence_accuracy", Worse::Lower),
    ("guard_roc_auc", Worse::Neither),
];

/// The `guardrail` block of a run's summary.json (a guardrail run's), if any.
fn guard_block(dir: &Path) -> Result<Option<serde_json::Value>> {
    let Some(text) = crate::rundir::read_artifact(
        dir,
        crate::rundir::SUMMARY_FILE,
        crate::files::bounds::SUMMARY,
    )?
    else {
        return Ok(None);
    };
    let v: serde_json::Value = serde_json::from_slice(&text).map_err(|e| {
        Error::input(
            dir.join(crate::rundir::SUMMARY_FILE),
            e.line() as u64,
            None,
            format!("not JSON: {e}"),
        )
    })?;
    Ok(v.get("guardrail").filter(|g| g.is_object()).cloned())
}

/// One figure of a guardrail block as a rate with its Wilson interval (the ROC area: the
/// value alone, n = 0, never tested).
fn guard_rate(g: &serde_json::Value, metric: &str) -> Rate {
    let u = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    let proportion = |k: u64, n: u64| {
        let (lo, hi) = crate::stats::wilson(k, n).unzip();
        Rate {
            n,
            k,
            rate: (n > 0).then(|| k as f64 / n as f64),
            ci_low: lo,
            ci_high: hi,
        }
    };
    let d = &g["detection"];
    let at = |ceiling: f64| {
        g["at_fpr"]
            .as_array()
            .and_then(|l| {
                l.iter().find(|r| {
                    r["max_fpr"]
                        .as_f64()
                        .is_some_and(|m| (m - ceiling).abs() < 1e-12)
                })
            })
            .map(|r| proportion(u(&r["tp"]), u(&r["positives"])))
            .unwrap_or_default()
    };
    match metric {
        "guard_recall" => proportion(u(&d["tp"]), u(&d["positives"])),
        "guard_fpr" => proportion(u(&d["fp"]), u(&d["negatives"])),
        "guard_recall_at_fpr_1pct" => at(0.01),
        "guard_recall_at_fpr_5pct" => at(0.05),
        "guard_over_defence_accuracy" => {
            let o = &g["over_defence"];
            proportion(u(&o["passed"]), u(&o["n"]))
        }
        "guard_roc_auc" => Rate {
            rate: g["areas"]["roc_auc"].as_f64(),
            ..Rate::default()
        },
        _ => Rate::default(),
    }
}

pub fn diff(a: (&str, &Path), b: (&str, &Path)) -> Result<RunDiff> {
    let (sa, sb) = (read_summary(a.1)?, read_summary(b.1)?);
    let guards = match (guard_block(a.1)?, guard_block(b.1)?) {
        (Some(ga), Some(gb)) => Some((ga, gb)),
        (None, None) => None,
        _ => {
            return Err(Error::Usage(format!(
                "{} and {} are not runs of one kind: a guardrail run is compared with a guardrail run",
                a.0, b.0
            )));
        }
    };
    let table = if guards.is_some() {
        GUARD_METRICS
    } else {
        METRICS
    };
    let metrics: Vec<MetricDelta> = table
        .iter()
        .map(|(name, worse)| {
            let (ra, rb) = match &guards {
                Some((ga, gb)) => (guard_rate(ga, name), guard_rate(gb, name)),
                None => (rate(&sa, name), rate(&sb, name)),
            };
            let z = z_two_proportions(&ra, &rb);
            let significant = z.is_some_and(|z| z.abs() > 1.96);
            let delta = ra.rate.zip(rb.rate).map(|(x, y)| y - x);
            let regression = significant
                && match worse {
                    Worse::Higher => z.is_some_and(|z| z > 0.0),
                    Worse::Lower => z.is_some_and(|z| z < 0.0),
                    Worse::Neither => false,
                };
            MetricDelta {
                metric: (*name).to_owned(),
                regression,
                a: ra,
                b: rb,
                delta,
                z,
                significant,
            }
        })
        .collect();
    let (flips, only_a, only_b) = flipped(a.1, b.1)?;
    let up = flips
        .iter()
        .filter(|f| f.field == "attack_success" && f.a == Some(false) && f.b == Some(true))
        .count() as u64;
    let down = flips
        .iter()
        .filter(|f| f.field == "attack_success" && f.a == Some(true) && f.b == Some(false))
        .count() as u64;
    Ok(RunDiff {
        run_a: a.0.to_owned(),
        run_b: b.0.to_owned(),
        regression: metrics.iter().any(|m| m.regression),
        metrics,
        became_successful: up,
        became_unsuccessful: down,
        flips,
        only_in_a: only_a,
        only_in_b: only_b,
    })
}

fn parquet_path(dir: &Path) -> Result<String> {
    let Some(p) = crate::rundir::parquet_artifact(dir, crate::rundir::CASE_RESULTS_PARQUET)? else {
        return Err(Error::State(format!(
            "{} is missing (was the run scored?)",
            dir.join(crate::rundir::CASE_RESULTS_PARQUET).display()
        )));
    };
    crate::rundir::table_path(&p)
}

/// Cases whose attack_success or prompt_leakage differ, and ids present in one run only.
fn flipped(a: &Path, b: &Path) -> Result<(Vec<Flip>, u64, u64)> {
    let (pa, pb) = (parquet_path(a)?, parquet_path(b)?);
    let rt = crate::engine::runtime()?;
    rt.block_on(async {
        let ctx = crate::engine::session();
        crate::engine::register_case_results(&ctx, "a", &pa).await?;
        crate::engine::register_case_results(&ctx, "b", &pb).await?;
        let sql = crate::engine::queries::RUNS_DIFF.sql;
        let batches = crate::engine::collect(&ctx, sql).await?;
        let mut flips = Vec::new();
        let (mut only_a, mut only_b) = (0, 0);
        for batch in &batches {
            let ids = crate::engine::utf8_column(batch, "case_id")?;
            let fields = crate::engine::utf8_column(batch, "field")?;
            let cast = |name: &str| -> Result<datafusion::arrow::array::BooleanArray> {
                let col = batch
                    .column_by_name(name)
                    .ok_or_else(|| Error::Internal(format!("diff query returned no {name}")))?;
                Ok(datafusion::arrow::compute::cast(
                    col,
                    &datafusion::arrow::datatypes::DataType::Boolean,
                )?
                .as_boolean()
                .clone())
            };
            let (va, vb) = (cast("va")?, cast("vb")?);
            for i in 0..batch.num_rows() {
                match fields.value(i) {
                    "only_in_a" => only_a += 1,
                    "only_in_b" => only_b += 1,
                    f => flips.push(Flip {
                        case_id: ids.value(i).to_owned(),
                        field: f.to_owned(),
                        a: va.is_valid(i).then(|| va.value(i)),
                        b: vb.is_valid(i).then(|| vb.value(i)),
                    }),
                }
            }
        }
        Ok((flips, only_a, only_b))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(n: u64, k: u64) -> Rate {
        Rate {
            n,
            k,
            ..Rate::default()
        }
    }

    #[test]
    fn z_test_values() {
        // 10/100 vs 30/100: pooled p = 0.2, se = sqrt(0.2*0.8*0.02) = 0.0566, z = 3.54
        let z = z_two_proportions(&r(100, 10), &r(100, 30)).unwrap();
        assert!((z - 3.5355).abs() < 1e-3, "{z}");
        assert_eq!(z_two_proportions(&r(0, 0), &r(10, 1)), None);
        assert_eq!(z_two_proportions(&r(10, 0), &r(10, 0)), Some(0.0));
        let small = z_two_proportions(&r(10, 1), &r(10, 2)).unwrap();
        assert!(small.abs() < 1.96);
    }
}
