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
    ExitCode::from(pieval::cli::entry(std::env::args_os()))
}
