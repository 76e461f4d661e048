//! # pieval
//!
//! A prompt-injection evaluation framework on Arrow, Parquet and DataFusion.
//!
//! ## Layout
//!
//! - [`contract`] (the crate `pieval-contract`): the user's schema contract in code (fields,
//!   vocabularies, success criteria, Arrow schemas, per-record rules), with [`error`] and
//!   [`text`]. Everything else depends on it.
//! - [`corpus`]: streaming corpus reader (JSONL / Parquet → Arrow + sha256), the
//!   synthetic generator and statistics.
//! - [`ingest`]: adapters from public corpora (and mapped files) to attack cases.
//! - [`taxonomy`]: enrichment of cases with categories, severity and success definitions.
//! - [`detect`] (the crate `pieval-detect`), [`engine`]: the detectors and their UDFs, and
//!   the DataFusion scoring engine.
//! - [`judge`]: the model judge for `judge` criteria (`pi_judge`, an async UDF), its
//!   verdict cache and its calibration against human labels.
//! - [`experiment`]: experiment configs and seeded selection.
//! - [`attack`]: adaptive attacks: converters on the payload, multi-turn attacker
//!   strategies (Crescendo, PAIR, TAP) and their replay.
//! - [`mitigation`]: request assembly and prompt-injection defences (pure functions).
//! - [`params`]: the parameters of converters and mitigations, declared as data.
//! - [`provider`]: model clients (OpenAI-compatible HTTP, replay).
//! - [`runner`]: select → mitigate → call → checkpoint → score → artifacts; the run
//!   catalogue.
//! - [`evidence`]: the SQL control catalogue, DSSE / in-toto envelopes, verification.
//! - [`export`]: the warehouse layouts (Hive-partitioned Parquet, SQLite).
//! - [`objstore`]: `s3://` locations: inputs fetched, run folders committed all or
//!   nothing, exports uploaded (the `object_store` crate DataFusion reads with).
//! - [`cli`]: the command surface; the only module that prints.
//!
//! Modules depend downward only: `cli` → `runner` → (`provider`, `mitigation`,
//! `engine`) → `detect` → `contract`.

pub mod agent;
pub mod atomic;
pub mod attack;
pub mod cli;
pub mod cluster;
pub mod config_errors;
pub mod corpus;
pub mod digest;
pub mod engine;
pub mod evidence;
pub mod experiment;
pub mod export;
pub mod files;
pub mod guard;
pub mod import;
pub mod ingest;
pub mod interrupt;
pub mod judge;
pub mod mitigation;
pub mod model;
pub mod objstore;
pub mod ops;
pub mod params;
pub mod provider;
pub mod report;
pub mod review;
pub mod rundir;
pub mod runner;
pub mod scoring;
pub mod secrets;
pub mod stats;
pub mod taxonomy;

// The contract and the detectors are crates of their own (crates/pieval-contract,
// crates/pieval-detect); this crate is their umbrella, as `datafusion` is for its crates.
pub use pieval_contract::{Error, Result, contract, error, text};
pub use pieval_detect as detect;

/// The commit pieval was built from (empty when built outside a checkout).
pub const GIT_COMMIT: &str = env!("PIEVAL_GIT_COMMIT");
