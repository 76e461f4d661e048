//! Experiment configs ([`config`]) and seeded case selection ([`selection`]).

pub mod config;
pub mod selection;
