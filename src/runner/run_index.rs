//! `results/catalog.sqlite`: one row per run (id, status, times, config and corpus
//! sha256, model, mitigation, headline metrics), for `pieval runs list | show | diff`.
//! The manifests stay the source of truth: a run folder missing from the catalogue is
//! added back from its manifest by [`Catalog::sync`].

use std::path::{Path, PathBuf};

use crate::rundir::Manifest;
use rusqlite::{Connection, params};
use serde::Serialize;

use crate::error::{Error, Result};

use crate::rundir::CATALOG_FILE;

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
-- Where each run was scored: a table of its own, so a catalogue stays writable by the
-- pieval versions before it (their insert gives runs' 23 columns).
CREATE TABLE IF NOT EXISTS run_scoring (
    run_id              TEXT PRIMARY KEY,
    scoring_engine      TEXT,
    scoring_executors   INTEGER
);
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
    /// Where the scoring ran: `local` or `ballista` (a cluster); null before it was
    /// recorded.
    pub scoring_engine: Option<String>,
    /// The cluster's executors when it was scored on one.
    pub scoring_executors: Option<i64>,
}

impl RunRow {
    pub fn from_manifest(m: &Manifest, dir: &Path) -> Self {
        let r = m.results.as_ref();
        let int = |v: u64| i64::try_from(v).ok();
        let asr = r.and_then(|r| r.attack_success_rate.as_ref());
        let scoring = r.and_then(|r| r.scoring.clone());
        RunRow {
            run_id: m.run_id.clone(),
            experiment: m.experiment_name().unwrap_or_default().to_owned(),
            status: m.status.map_or("unknown", |s| s.as_str()).to_owned(),
            started_at: m.timestamp.clone(),
            finished_at: m.finished_at.clone(),
            config_path: m.config_source_path.clone(),
            config_sha256: Some(m.replay_hints.config_sha256.clone()),
            corpus_path: Some(m.dataset_snapshot.path.clone()),
            corpus_sha256: Some(m.dataset_snapshot.sha256.clone()),
            provider: Some(m.model_snapshot.provider.clone()),
            model: Some(m.model_snapshot.name.clone()),
            mitigation: Some(m.mitigation_snapshot.name.clone()),
            selected: Some(m.dataset_snapshot.selected_case_ids.len() as i64),
            rows: r.and_then(|r| int(r.rows)),
            attack_success: r.and_then(|r| int(r.attack_success)),
            attack_success_rate: asr.and_then(|a| a.rate),
            asr_ci_low: asr.and_then(|a| a.ci_low),
            asr_ci_high: asr.and_then(|a| a.ci_high),
            leakage_rate: r.and_then(|r| r.leakage_rate.as_ref()).and_then(|a| a.rate),
            over_refusal_rate: r
                .and_then(|r| r.over_refusal_rate.as_ref())
                .and_then(|a| a.rate),
            manual_review: r.and_then(|r| int(r.manual_review)),
            provider_errors: r.and_then(|r| int(r.provider_errors)),
            run_dir: dir.display().to_string(),
            scoring_engine: scoring
                .as_ref()
                .and_then(|s| s.get("engine"))
                .and_then(|v| v.as_str())
                .map(str::to_owned),
            scoring_executors: scoring
                .as_ref()
                .and_then(|s| s.get("executors"))
                .and_then(|v| v.as_i64()),
        }
    }
}

/// SQLite's "this is not a database" family (a file damaged or replaced).
fn is_corrupt(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::NotADatabase | rusqlite::ErrorCode::DatabaseCorrupt)
    )
}

pub struct Catalog {
    conn: Connection,
    path: PathBuf,
}

/// The tables, where they are missing. A read-only catalogue (an archived results
/// folder) is still read, even one from before the run_scoring table (`query` reads it
/// as empty).
fn create_schema(conn: &Connection) -> rusqlite::Result<()> {
    match conn.execute_batch(SCHEMA) {
        Err(e) if e.sqlite_error_code() == Some(rusqlite::ErrorCode::ReadOnly) => Ok(()),
        other => other,
    }
}

impl Catalog {
    /// Open (creating) `<results>/catalog.sqlite`.
    pub fn open(results: &Path) -> Result<Self> {
        std::fs::create_dir_all(results)
            .map_err(|e| Error::io(results, "cannot create folder", e))?;
        let path = results.join(CATALOG_FILE);
        // The folder of runs may have come with a run: a catalogue that is a link (to a
        // database elsewhere, or to a file not yet made) is refused, and opened with
        // SQLITE_OPEN_NOFOLLOW so one swapped in after this check is refused too.
        if std::fs::symlink_metadata(&path).is_ok_and(|m| !m.is_file()) {
            return Err(Error::State(format!(
                "{}: not a regular file (a symbolic link or special file); the run catalogue is never opened through one",
                path.display()
            )));
        }
        let err = |e: rusqlite::Error| Error::config(&path, format!("run catalogue: {e}"));
        let connect = || -> std::result::Result<Connection, rusqlite::Error> {
            use rusqlite::OpenFlags;
            let conn = Connection::open_with_flags(
                &path,
                OpenFlags::SQLITE_OPEN_READ_WRITE
                    | OpenFlags::SQLITE_OPEN_CREATE
                    | OpenFlags::SQLITE_OPEN_URI
                    | OpenFlags::SQLITE_OPEN_NO_MUTEX
                    | OpenFlags::SQLITE_OPEN_NOFOLLOW,
            )?;
            conn.busy_timeout(std::time::Duration::from_secs(10))?;
            create_schema(&conn)?;
            Ok(conn)
        };
        match connect() {
            Ok(conn) => Ok(Self { conn, path }),
            // The catalogue is derived data: a corrupt one is set aside and rebuilt from
            // the run folders' manifests, so it never blocks a run.
            Err(e) if is_corrupt(&e) => {
                let aside = results.join(format!(
                    "{CATALOG_FILE}.corrupt-{}",
                    crate::text::utc_compact_now()
                ));
                std::fs::rename(&path, &aside)
                    .map_err(|e| Error::io(&path, "cannot set the corrupt catalogue aside", e))?;
                let catalog = Self {
                    conn: connect().map_err(err)?,
                    path: path.clone(),
                };
                catalog.sync(results)?;
                Ok(catalog)
            }
            Err(e) => Err(err(e)),
        }
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
            .map_err(|e| self.err(e))?;
        self.conn
            .execute(
                "INSERT OR REPLACE INTO run_scoring VALUES (?1, ?2, ?3)",
                params![r.run_id, r.scoring_engine, r.scoring_executors],
            )
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    /// Add run folders whose manifest is not catalogued (or changed status).
    pub fn sync(&self, results: &Path) -> Result<()> {
        for dir in crate::engine::tables::run_dirs(results) {
            if let Ok(m) = Manifest::read(&dir) {
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
        let has_scoring: bool = self
            .conn
            .query_row(
                "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'run_scoring'",
                [],
                |r| r.get(0),
            )
            .map_err(|e| self.err(e))?;
        let empty_scoring = if has_scoring {
            ""
        } else {
            "WITH run_scoring AS (SELECT NULL AS run_id, NULL AS scoring_engine, \
             NULL AS scoring_executors WHERE 0) "
        };
        let sql = format!(
            "{empty_scoring}SELECT run_id, experiment, status, started_at, finished_at, config_path, \
             config_sha256, corpus_path, corpus_sha256, provider, model, mitigation, selected, \
             rows, attack_success, attack_success_rate, asr_ci_low, asr_ci_high, leakage_rate, \
             over_refusal_rate, manual_review, provider_errors, run_dir, scoring_engine, \
             scoring_executors FROM runs LEFT JOIN run_scoring USING (run_id) {tail}"
        );
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
                    scoring_engine: r.get(23)?,
                    scoring_executors: r.get(24)?,
                })
            })
            .map_err(|e| self.err(e))?;
        rows.collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| self.err(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A catalogue written before the scoring table opens, keeps its rows, takes rows
    /// with a scoring, and stays writable by the older insert.
    #[test]
    fn an_older_catalogue_gains_the_scoring_table() {
        let dir = tempfile::tempdir().unwrap();
        let old_schema = &SCHEMA[..SCHEMA.find("-- Where each run was scored").unwrap()];
        {
            let conn = Connection::open(dir.path().join(CATALOG_FILE)).unwrap();
            conn.execute_batch(old_schema).unwrap();
            conn.execute(
                "INSERT INTO runs (run_id, experiment, status, started_at, run_dir) VALUES ('old', 'e', 'completed', 't', 'd')",
                [],
            )
            .unwrap();
        }
        let catalog = Catalog::open(dir.path()).unwrap();
        let old = catalog.get("old").unwrap().unwrap();
        assert_eq!((old.scoring_engine, old.scoring_executors), (None, None));
        let row = RunRow {
            run_id: "new".into(),
            scoring_engine: Some("ballista".into()),
            scoring_executors: Some(3),
            ..old
        };
        catalog.record(&row).unwrap();
        assert_eq!(catalog.get("new").unwrap().unwrap(), row);
        // Opened again (columns present): nothing to add.
        drop(catalog);
        let catalog = Catalog::open(dir.path()).unwrap();
        assert_eq!(catalog.list().unwrap().len(), 2);
        // What pieval before the scoring table inserted still goes in.
        catalog
            .conn
            .execute(
                "INSERT OR REPLACE INTO runs VALUES ('older', 'e', 'completed', 't', NULL, NULL, \
                 NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, \
                 NULL, NULL, NULL, 'd')",
                [],
            )
            .unwrap();
        assert_eq!(catalog.get("older").unwrap().unwrap().scoring_engine, None);
    }

    /// A read-only catalogue from before the scoring table is still read.
    #[test]
    fn a_read_only_older_catalogue_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(CATALOG_FILE);
        {
            let conn = Connection::open(&path).unwrap();
            let old_schema = &SCHEMA[..SCHEMA.find("-- Where each run was scored").unwrap()];
            conn.execute_batch(old_schema).unwrap();
            conn.execute(
                "INSERT INTO runs (run_id, experiment, status, started_at, run_dir) VALUES ('old', 'e', 'completed', 't', 'd')",
                [],
            )
            .unwrap();
        }
        // Opened read-only (as SQLite opens a file it cannot write): the schema cannot be
        // added, and the rows are still read.
        let conn =
            Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        create_schema(&conn).unwrap();
        let catalog = Catalog { conn, path };
        let rows = catalog.list().unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].scoring_engine, None);
    }
}
