//! The `pieval` binary: parse, dispatch, map errors to exit codes (docs/cli.md).

use std::process::ExitCode;

fn main() -> ExitCode {
    let code = run();
    peak_memory_for_tests();
    code
}

/// In a debug build, `PIEVAL_TEST_PEAK_MEMORY_FILE=PATH` has the process write its peak
/// resident memory (`VmHWM`, bytes) to PATH as it ends: what a test of a memory bound
/// reads. (The kernel's accounting of a child, `wait4`'s `ru_maxrss`, also counts the
/// test process it was forked from.)
fn peak_memory_for_tests() {
    #[cfg(debug_assertions)]
    if let Ok(path) = std::env::var("PIEVAL_TEST_PEAK_MEMORY_FILE")
        && let Ok(status) = std::fs::read_to_string("/proc/self/status")
        && let Some(kib) = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    {
        let _ = std::fs::write(path, (kib * 1024).to_string());
    }
}

fn run() -> ExitCode {
    match pieval::cli::main() {
        Ok(status) => ExitCode::from(status.code()),
        Err(e) => {
            if is_broken_pipe(&e) {
                // `pieval validate | head` is not an error.
                return ExitCode::SUCCESS;
            }
            // Messages quote hostile input (attack text, names): escaped for the terminal.
            pieval::cli::output::stderr_line(&format!("error: {e}"));
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                pieval::cli::output::stderr_line(&format!("  caused by: {s}"));
                source = s.source();
            }
            ExitCode::from(e.exit_code() as u8)
        }
    }
}

fn is_broken_pipe(e: &pieval::Error) -> bool {
    matches!(e, pieval::Error::Io { source, .. } if source.kind() == std::io::ErrorKind::BrokenPipe)
}
