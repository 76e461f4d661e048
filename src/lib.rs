//! # pieval
//!
//! A prompt-injection evaluation framework on Arrow, Parquet and DataFusion.
//!
//! ## Layout
//!
//! - [`contract`]: the user's schema contract in code (fields, vocabularies, success
//!   criteria, Arrow schemas, per-record rules). Everything else depends on it.
//! - [`corpus`]: streaming corpus reader (JSONL / Parquet → Arrow + sha256), the
//!   synthetic generator and statistics.
//! - [`ingest`]: adapters from public corpora (and mapped files) to attack cases.
//! - [`taxonomy`]: enrichment of cases with categories, severity and success definitions.
//! - [`detect`], [`engine`]: the detector UDFs and the DataFusion scoring engine.
//! - [`judge`]: the model judge for `judge` criteria (`pi_judge`, an async UDF), its
//!   verdict cache and its calibration against human labels.
//! - [`experiment`]: experiment configs and seeded selection.
//! - [`attack`]: adaptive attacks: converters on the payload, multi-turn attacker
//!   strategies (Crescendo, PAIR, TAP) and their replay.
//! - [`mitigation`]: request assembly and prompt-injection defences (pure functions).
//! - [`provider`]: model clients (OpenAI-compatible HTTP, replay).
//! - [`runner`]: select → mitigate → call → checkpoint → score → artifacts; the run
//!   catalogue.
//! - [`evidence`]: the SQL control catalogue, DSSE / in-toto envelopes, verification.
//! - [`export`]: the warehouse layouts (Hive-partitioned Parquet, SQLite).
//! - [`cli`]: the command surface; the only module that prints.
//!
//! Modules depend downward only: `cli` → `runner` → (`provider`, `mitigation`,
//! `engine`) → `detect` → `contract`.

pub mod atomic;
pub mod attack;
pub mod cli;
pub mod cluster;
pub mod config_errors;
pub mod contract;
pub mod corpus;
pub mod detect;
pub mod digest;
pub mod engine;
pub mod error;
pub mod evidence;
pub mod experiment;
pub mod export;
pub mod files;
pub mod ingest;
pub mod judge;
pub mod mitigation;
pub mod model;
pub mod params;
pub mod provider;
pub mod report;
pub mod review;
pub mod rundir;
pub mod runner;
pub mod stats;
pub mod taxonomy;
pub mod text;

pub use error::{Error, Result};

/// The commit pieval was built from (empty when built outside a checkout).
pub const GIT_COMMIT: &str = env!("PIEVAL_GIT_COMMIT");
