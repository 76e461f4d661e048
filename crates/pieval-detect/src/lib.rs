//! Detectors: the logic that decides whether an attack worked, and the DataFusion UDFs
//! that run it over whole batches (`pi_criteria_match`, `pi_matched_rule`,
//! `pi_refusal`). Every detector works on folded text ([`fold`]), so case, NFKC
//! forms, zero-width characters and look-alike letters do not hide a match.

pub mod criteria;
pub mod echo;
pub mod encodings;
pub mod fold;
pub mod judgements;
pub mod leak;
pub mod model;
pub mod packs;
pub mod refusal;
pub mod rules;
pub mod udf;

pub use udf::register_udfs;

/// Use the rule packs of `dir` (`--rules DIR`) for the rest of the process: read
/// ([`packs::read_dir`]), compiled here with their examples checked, so a bad pack is an
/// error naming its file before anything runs, then installed.
pub fn install_rules(dir: &std::path::Path) -> pieval_contract::error::Result<()> {
    let (injection, refusal) = packs::read_dir(dir)?;
    rules::RulePack::from_toml(&injection.text, &injection.origin)?;
    refusal::RefusalDetector::from_toml(&refusal.text, &refusal.origin)?;
    packs::install(injection, refusal)
}
