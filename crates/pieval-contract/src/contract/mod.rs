//! The user's schema contract in code: field lists, vocabularies, the success-criteria
//! language, Arrow schemas, and the per-record rules the validator applies. The JSON
//! Schemas in `schemas/` mirror this module (a test keeps them in agreement).

pub mod arrow;
pub mod case;
pub mod criteria;
pub mod enums;
pub mod environment;
pub mod fields;
pub mod record;

pub use case::AttackCase;
pub use criteria::SuccessCriteria;
pub use enums::*;
pub use fields::{CASE_FIELDS, FieldKind, FieldSpec};
pub use record::{Level, RawRecord, Violation};
