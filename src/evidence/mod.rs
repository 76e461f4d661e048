//! Controls and evidence: the SQL control catalogue (`queries/controls/*.sql`) run over
//! a run's results, each result written as Parquet evidence and a DSSE envelope around
//! an in-toto Statement (Ed25519-signed when a key is given), and their verification.
//!
//! - [`catalog`]: control files (header + evidence query + result query).
//! - [`controls`]: evaluation, statuses, the artifacts under `results/<run>/controls/`.
//! - [`dsse`]: envelopes, the pre-authentication encoding, keys.
//! - [`verify`]: signature and subject-digest checks.

pub mod ci;
pub mod controls;
pub mod definitions;
pub mod dsse;
pub mod verify;
