//! Corpora on disk: the streaming reader (JSONL / Parquet → validated Arrow batches
//! with the file's sha256), the deterministic synthetic generator, and statistics.

pub(crate) mod batch;
pub mod includes;
mod jsonl;
pub mod lines;
pub mod predictions;
pub mod reader;

pub use reader::{
    CorpusReader, LoadedCorpus, ReadOptions, ValidationReport, load_corpus, validate_file,
};
pub mod obfuscate;
pub mod synth;
pub mod templates;
