//! Running pieval as a child process and measuring exactly that child.

use std::path::Path;
use std::time::Instant;

/// Run the bench's pieval binary with `args` from `root` (stdout discarded); its wall
/// seconds and peak RSS in MiB. Panics when it fails: a bench of a failed run means nothing.
pub fn pieval(root: &Path, args: &[&str]) -> (f64, f64) {
    let start = Instant::now();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_pieval"))
        .current_dir(root)
        .args(args)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("pieval starts");
    let mut status = 0;
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 on our own child, writing into structs we own.
    unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage) };
    let wall = start.elapsed().as_secs_f64();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "pieval {args:?} failed"
    );
    (wall, usage.ru_maxrss as f64 / 1024.0)
}
