//! `results/catalog.sqlite`: one row per run (id, status, times, config and corpus
//! sha256, model, mitigation, headline metrics), for `pieval runs list | show | diff`.
//! The manifests stay the source of truth: a run folder missing from the catalogue is
//! added back from its manifest by [`Catalog::sync`].

use std::path::{Path, PathBuf};

use rusqlite::{Connection, params};
use serde::Serialize;
use serde_json::Value;

use crate::error::{Error, Result};

pub const CATALOG_FILE: &str = "catalog.sqlite";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS runs (
    run_id              TEXT PRIMARY KEY,
    experiment          TEXT NOT NULL,
    status              TEXT NOT NULL,
    started_at          TEXT NOT NULL,
    finished_at         TEXT,
    config_path         TEXT,
    config_sha256       TEXT,
    corpus_path         TEXT,
    corpus_sha256       TEXT,
    provider            TEXT,
    model               TEXT,
    mitigation          TEXT,
    selected            INTEGER,
    rows                INTEGER,
    attack_success      INTEGER,
    attack_success_rate REAL,
    asr_ci_low          REAL,
    asr_ci_high         REAL,
    leakage_rate        REAL,
    over_refusal_rate   REAL,
    manual_review       INTEGER,
    provider_errors     INTEGER,
    run_dir             TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_started ON runs(started_at);
CREATE INDEX IF NOT EXISTS runs_experiment ON runs(experiment);
";

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct RunRow {
    pub run_id: String,
    pub experiment: String,
    pub status: String,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub config_path: Option<String>,
    pub config_sha256: Option<String>,
    pub corpus_path: Option<String>,
    pub corpus_sha256: Option<String>,
    pub provider: Option<String>,
    pub model: Option<String>,
    pub mitigation: Option<String>,
    pub selected: Option<i64>,
    pub rows: Option<i64>,
    pub attack_success: Option<i64>,
    pub attack_success_rate: Option<f64>,
    pub asr_ci_low: Option<f64>,
    pub asr_ci_high: Option<f64>,
    pub leakage_rate: Option<f64>,
    pub over_refusal_rate: Option<f64>,
    pub manual_review: Option<i64>,
    pub provider_errors: Option<i64>,
    pub run_dir: String,
}

impl RunRow {
    pub fn from_manifest(m: &Value, dir: &Path) -> Self {
        let s = |p: &str| m.pointer(p).and_then(Value::as_str).map(str::to_owned);
        let i = |p: &str| m.pointer(p).and_then(Value::as_i64);
        let f = |p: &str| m.pointer(p).and_then(Value::as_f64);
        RunRow {
            run_id: s("/run_id").unwrap_or_default(),
            experiment: s("/config_snapshot/experiment/name").unwrap_or_default(),
            status: s("/status").unwrap_or_else(|| "unknown".into()),
            started_at: s("/timestamp").unwrap_or_default(),
            finished_at: s("/finished_at"),
            config_path: s("/config_source_path"),
            config_sha256: s("/replay_hints/config_sha256"),
            corpus_path: s("/dataset_snapshot/path"),
            corpus_sha256: s("/dataset_snapshot/sha256"),
            provider: s("/model_snapshot/provider"),
            model: s("/model_snapshot/name"),
            mitigation: s("/mitigation_snapshot/name"),
            selected: m
                .pointer("/dataset_snapshot/selected_case_ids")
                .and_then(Value::as_array)
                .map(|a| a.len() as i64),
            rows: i("/results/rows"),
            attack_success: i("/results/attack_success"),
            attack_success_rate: f("/results/attack_success_rate/rate"),
            asr_ci_low: f("/results/attack_success_rate/ci_low"),
            asr_ci_high: f("/results/attack_success_rate/ci_high"),
            leakage_rate: f("/results/leakage_rate/rate"),
            over_refusal_rate: f("/results/over_refusal_rate/rate"),
            manual_review: i("/results/manual_review"),
            provider_errors: i("/results/provider_errors"),
            run_dir: dir.display().to_string(),
        }
    }
}

pub struct Catalog {
    conn: Connection,
    path: PathBuf,
}

impl Catalog {
    /// Open (creating) `<results>/catalog.sqlite`.
    pub fn open(results: &Path) -> Result<Self> {
        std::fs::create_dir_all(results)
            .map_err(|e| Error::io(results, "cannot create folder", e))?;
        let path = results.join(CATALOG_FILE);
        let err = |e: rusqlite::Error| Error::config(&path, format!("run catalogue: {e}"));
        let conn = Connection::open(&path).map_err(err)?;
        conn.busy_timeout(std::time::Duration::from_secs(10))
            .map_err(err)?;
        conn.execute_batch(SCHEMA).map_err(err)?;
        Ok(Self { conn, path })
    }

    fn err(&self, e: rusqlite::Error) -> Error {
        Error::config(&self.path, format!("run catalogue: {e}"))
    }

    /// Insert or replace a run's row.
    pub fn record(&self, r: &RunRow) -> Result<()> {
        self.conn
            .execute(
                "INSERT OR REPLACE INTO runs VALUES
                 (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23)",
                params![
                    r.run_id,
                    r.experiment,
                    r.status,
                    r.started_at,
                    r.finished_at,
                    r.config_path,
                    r.config_sha256,
                    r.corpus_path,
                    r.corpus_sha256,
                    r.provider,
                    r.model,
                    r.mitigation,
                    r.selected,
                    r.rows,
                    r.attack_success,
                    r.attack_success_rate,
                    r.asr_ci_low,
                    r.asr_ci_high,
                    r.leakage_rate,
                    r.over_refusal_rate,
                    r.manual_review,
                    r.provider_errors,
                    r.run_dir,
                ],
            )
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    /// Add run folders whose manifest is not catalogued (or changed status).
    pub fn sync(&self, results: &Path) -> Result<()> {
        for dir in crate::engine::catalog::run_dirs(results) {
            if let Ok(m) = super::read_manifest(&dir) {
                let row = RunRow::from_manifest(&m, &dir);
                if row.run_id.is_empty() {
                    continue;
                }
                if self.get(&row.run_id)?.as_ref() != Some(&row) {
                    self.record(&row)?;
                }
            }
        }
        Ok(())
    }

    pub fn get(&self, run_id: &str) -> Result<Option<RunRow>> {
        let mut rows = self.query("WHERE run_id = ?1", &[&run_id])?;
        Ok(rows.pop())
    }

    /// Every run, newest first.
    pub fn list(&self) -> Result<Vec<RunRow>> {
        self.query("ORDER BY started_at DESC, run_id DESC", &[])
    }

    fn query(&self, tail: &str, args: &[&dyn rusqlite::ToSql]) -> Result<Vec<RunRow>> {
        let sql = format!("SELECT * FROM runs {tail}");
        let mut stmt = self.conn.prepare(&sql).map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map(args, |r| {
                Ok(RunRow {
                    run_id: r.get(0)?,
                    experiment: r.get(1)?,
                    status: r.get(2)?,
                    started_at: r.get(3)?,
                    finished_at: r.get(4)?,
                    config_path: r.get(5)?,
                    config_sha256: r.get(6)?,
                    corpus_path: r.get(7)?,
                    corpus_sha256: r.get(8)?,
                    provider: r.get(9)?,
                    model: r.get(10)?,
                    mitigation: r.get(11)?,
                    selected: r.get(12)?,
                    rows: r.get(13)?,
                    attack_success: r.get(14)?,
                    attack_success_rate: r.get(15)?,
                    asr_ci_low: r.get(16)?,
                    asr_ci_high: r.get(17)?,
                    leakage_rate: r.get(18)?,
                    over_refusal_rate: r.get(19)?,
                    manual_review: r.get(20)?,
                    provider_errors: r.get(21)?,
                    run_dir: r.get(22)?,
                })
            })
            .map_err(|e| self.err(e))?;
        rows.collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| self.err(e))
    }
}
