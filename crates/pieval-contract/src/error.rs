//! The one error type of pieval. Every variant says *where*: the file, the line (or
//! record), the field. The CLI maps [`Error::exit_code`] to the process exit status:
//! `1` when what was checked failed, `2` when the command could not do its work.

use std::path::{Path, PathBuf};

/// `Result` with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be opened, read or written.
    #[error("{path}: {action}: {source}")]
    Io {
        path: PathBuf,
        action: &'static str,
        #[source]
        source: std::io::Error,
    },

    /// A problem located at a line (or record) of an input file, optionally a field.
    #[error("{}:{line}: {}: {message}", path.display(), field.as_deref().unwrap_or("record"))]
    Input {
        path: PathBuf,
        line: u64,
        field: Option<String>,
        message: String,
    },

    /// A configuration or data file (templates, taxonomy, rules) that does not parse.
    #[error("{}: {message}", path.display())]
    Config { path: PathBuf, message: String },

    /// A corpus that failed validation; `first` locates the first violation
    /// (`line: field: problem`).
    #[error("{path}: {count} contract violation(s); the first: {path}:{first} (run pieval validate for all)", path = path.display())]
    Invalid {
        path: PathBuf,
        count: u64,
        first: String,
    },

    /// A command-line usage problem that clap cannot express.
    #[error("{0}")]
    Usage(String),

    /// Something named (a run, a model, a table, a control) that does not exist.
    #[error("{0}")]
    NotFound(String),

    /// A run (or another artifact) whose state does not allow the action: a completed
    /// run to resume, a changed corpus or config, a run folder that is not one.
    #[error("{0}")]
    State(String),

    /// An external program (pip, git, a browser) that could not be run or failed.
    #[error("{0}")]
    Process(String),

    /// Keys, signatures and envelopes: a key that does not parse, a signature that
    /// cannot be made, an envelope that is not one.
    #[error("{0}")]
    Crypto(String),

    /// A model or an endpoint that cannot serve: a model file, an unusable answer.
    #[error("{0}")]
    Model(String),

    /// A query that cannot be planned or run as asked.
    #[error("{0}")]
    Query(String),

    /// A broken invariant or an encoding that cannot fail in practice (a bug if seen).
    #[error("{0}")]
    Internal(String),

    #[error("arrow: {0}")]
    Arrow(#[from] datafusion::arrow::error::ArrowError),

    #[error("parquet: {0}")]
    Parquet(#[from] datafusion::parquet::errors::ParquetError),

    #[error("datafusion: {0}")]
    DataFusion(Box<datafusion::error::DataFusionError>),
}

impl From<datafusion::error::DataFusionError> for Error {
    /// pieval's own error, carried through a query (a reader's `file:line: field`), comes
    /// back as itself rather than wrapped as DataFusion's.
    fn from(e: datafusion::error::DataFusionError) -> Self {
        match e {
            datafusion::error::DataFusionError::External(inner) => {
                match inner.downcast::<Error>() {
                    Ok(ours) => *ours,
                    Err(other) => Error::DataFusion(Box::new(
                        datafusion::error::DataFusionError::External(other),
                    )),
                }
            }
            other => Error::DataFusion(Box::new(other)),
        }
    }
}

impl From<Error> for datafusion::error::DataFusionError {
    fn from(e: Error) -> Self {
        match e {
            Error::DataFusion(inner) => *inner,
            other => datafusion::error::DataFusionError::External(Box::new(other)),
        }
    }
}

impl Error {
    pub fn io(path: impl AsRef<Path>, action: &'static str, source: std::io::Error) -> Self {
        Error::Io {
            path: path.as_ref().to_path_buf(),
            action,
            source,
        }
    }

    pub fn config(path: impl AsRef<Path>, message: impl Into<String>) -> Self {
        Error::Config {
            path: path.as_ref().to_path_buf(),
            message: message.into(),
        }
    }

    pub fn input(
        path: impl AsRef<Path>,
        line: u64,
        field: Option<&str>,
        message: impl Into<String>,
    ) -> Self {
        Error::Input {
            path: path.as_ref().to_path_buf(),
            line,
            field: field.map(str::to_owned),
            message: message.into(),
        }
    }

    /// `1`: the thing checked is wrong (invalid corpus). `2`: the command could not run.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Invalid { .. } => 1,
            _ => 2,
        }
    }
}
