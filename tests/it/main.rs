//! The integration tests: one binary, so the suite links DataFusion and the model once.
//! Each module drives the real `pieval` binary (and the library where a test needs it);
//! `common` holds the helpers and the chat-completions server with fault modes.

mod common;

mod agentdojo;
mod agents;
mod applications;
mod attack;
mod benign;
mod ci_formats;
mod cli_validate;
#[cfg(feature = "distributed")]
mod cluster;
mod contract_schemas;
mod corpus;
mod detect_udfs;
mod detector_quality;
mod evidence;
mod fuzz;
mod guardrail;
mod hostile;
mod hostile_import;
mod hostile_keys;
mod import;
mod ingest;
mod judge;
mod layout;
mod local_model;
mod object_storage;
mod pinning;
mod report;
mod review;
mod rundir;
mod runner;
mod score;
mod served;
mod sql;
