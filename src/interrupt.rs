//! A request to stop, from whoever runs pieval inside its own process: the Python package
//! sets it on Ctrl-C (`crates/pieval-py`), and the long loops that read input (a
//! predictions stream, an import's sources) end with an error at their next check. Every
//! artifact is committed atomically (src/atomic.rs), so stopping there leaves nothing
//! half-written. The `pieval` binary has no need of it: a run answers SIGINT itself
//! (`tokio::signal::ctrl_c`), and any other command is ended by it.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{Error, Result};

static REQUESTED: AtomicBool = AtomicBool::new(false);

/// Ask the work under way to stop.
pub fn request() {
    REQUESTED.store(true, Ordering::Relaxed);
}

/// Forget the request (the interrupted work has ended).
pub fn clear() {
    REQUESTED.store(false, Ordering::Relaxed);
}

/// An error once a stop was requested.
pub fn check() -> Result<()> {
    if REQUESTED.load(Ordering::Relaxed) {
        return Err(Error::State("interrupted".into()));
    }
    Ok(())
}
