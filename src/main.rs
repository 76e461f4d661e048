//! The `pieval` binary: parse, dispatch, map errors to exit codes (docs/cli.md).

use std::process::ExitCode;

fn main() -> ExitCode {
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
