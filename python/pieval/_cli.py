"""The ``pieval`` command the wheel installs: the same program as the Rust binary."""

from __future__ import annotations

import signal
import sys


def main() -> None:
    from pieval import _native

    # Ctrl-C as the binary has it: a run answers it itself (it stops calling the model,
    # keeps what is done, marks the run interrupted); anything else ends.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.stdout.flush()
    code = _native.cli(["pieval", *sys.argv[1:]])
    sys.exit(code)


if __name__ == "__main__":
    main()
