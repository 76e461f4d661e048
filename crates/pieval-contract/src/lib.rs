//! # pieval-contract
//!
//! What every part of pieval agrees on: the user's schema contract in code (fields,
//! vocabularies, success criteria, Arrow schemas, per-record rules), the error type, and
//! the text helpers (escaping, excerpts, "did you mean"). A crate of its own so that Cargo
//! holds the boundary: it depends on no other part of pieval.

pub mod contract;
pub mod error;
pub mod text;

pub use error::{Error, Result};
