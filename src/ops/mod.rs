//! The operations over runs and labelled sets, one file each (the shape of delta-rs's
//! `operations`): an options struct in, a typed report out, found by its name. They use
//! [`crate::engine`] for sessions, tables and the query registry and print nothing; the
//! CLI resolves settings, calls one, and prints its report.
//!
//! | operation | file | in | out |
//! |---|---|---|---|
//! | score a run's predictions; summary.json | [`score`] | `ScoreOptions` | `ScoreReport` (its `AggregateMetrics`) |
//! | calibrate the judge against labels | [`calibrate`] | `Labels` (`load_labels`), the judge | `Calibration` |
//! | a detector's figures on a labelled set | [`detector_eval`] | `Labels` (`load_labels`), the detector | `Evaluation` |
//! | corpus statistics | [`corpus_stats`] | a corpus path | `CorpusStats` |
//! | (shared by the two above: the column mapping, the file check, an estimate) | [`labels`] | | |
//!
//! Scoring's pieces below the operation live in rooms of their own: the scored stream's
//! writers, tally, summary partials and the rates corrected for detector error in
//! [`crate::scoring`], the cluster's plan nodes in [`crate::cluster::score`].
//!
//! The other operations are modules of their own: a run, its replay and rescore
//! (`runner`, `runner::replay`), the controls (`evidence::controls`), the export (`export`),
//! the report (`report`), the review (`review`).

pub mod calibrate;
pub mod corpus_stats;
pub mod detector_eval;
pub mod labels;
pub mod score;
pub mod train_injection;
