"""Helpers shared by the peer-comparison scripts in benches/."""
import os, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_pieval():
    """Build the release binary and return its path."""
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
    return os.path.join(target, "release", "pieval")


def run_child(cmd, ok=(0,)):
    """Run cmd; return (wall s, cpu s, peak RSS MiB, stdout) of exactly that child.

    Note: on Linux a child's ru_maxrss includes the RSS of the parent it was forked from,
    so the calling process must stay small for the RSS figure to mean anything."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
        code = os.waitstatus_to_exitcode(status)
        if code not in ok:
            err.seek(0)
            sys.exit(f"{cmd[0]} failed ({code}): {err.read()[-2000:]}")
        out.seek(0)
        return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, out.read()
