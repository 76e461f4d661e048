#!/usr/bin/env python3
"""`pieval import inspect` on hostile `.eval` archives: small files whose members inflate to
hundreds of megabytes or gigabytes (issue 52; docs/performance.md#importing-other-tools-results).

Each archive is the fixture's header and sample (tests/fixtures/import/inspect/injection.eval)
with one field made long — a run of one byte, which deflate packs about 1,000 to 1 — and is
imported under `os.wait4` accounting (wall time, CPU, peak RSS of exactly that child):

* message-600M   a sample whose user message is 600 MiB: refused at 64 MiB beside the
                 transcript (what an attempt pieval records may hold), as it streams;
* events-1500M   a sample whose event transcript is 1.5 GiB: read past, never held, and
                 the sample imported;
* events-3G      the same at 3 GiB: refused at 2 GiB inflated;
* header-200M    a header of 200 MiB: refused at 16 MiB;
* samples-8x60M  eight samples of 60 MiB each (under the bound): imported, one large
                 sample held at a time.

With `--inspect-python VENV/bin/python` (inspect-ai 0.3.285) Inspect's own
`read_eval_log(LOG)` reads each archive too, in the same run, and the ratios are printed.
Inspect's archives are zstd; these are deflate (Python's zipfile has no zstd), which both
readers read.

Usage: python3 benches/import_archive_bounds.py [--pieval PATH] [--work DIR] [--keep]
       [--inspect-python PY] [--only NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import build_pieval, run_child  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "tests" / "fixtures" / "import" / "inspect" / "injection.eval"
MIB = 1 << 20


def parts():
    """The fixture's header and one sample (its entries are zstd; read with a copy of the
    JSON log instead, which holds the same header fields and samples)."""
    log = json.loads((REPO / "tests" / "fixtures" / "import" / "inspect" / "injection.json").read_text())
    sample = log.pop("samples")[0]
    log.pop("reductions", None)
    return log, sample


def write_archive(path: Path, entries):
    """entries: (name, head bytes, long field's size in MiB, tail bytes)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as z:
        for name, head, mib, tail in entries:
            with z.open(name, "w", force_zip64=True) as f:
                f.write(head)
                block = b"A" * MIB
                for _ in range(mib):
                    f.write(block)
                f.write(tail)


def with_long(obj: dict, key: str, prefix: str, suffix: str):
    """`obj` as JSON with `key` last, its value `prefix` + the long run + `suffix`."""
    o = dict(obj)
    o.pop(key, None)
    text = json.dumps(o)
    return (text[:-1] + f', "{key}": {prefix}"').encode(), (f'"{suffix}}}').encode()


def archives(work: Path):
    header, sample = parts()
    h = json.dumps(header).encode()
    name = "samples/forward-3_epoch_1.json"
    out = {}

    def add(key, entries):
        p = work / f"{key}.eval"
        if not p.exists():
            write_archive(p, entries)
        out[key] = p

    head, tail = with_long(sample, "messages", '[{"role": "user", "content": ', "")
    add("message-600M", [("header.json", h, 0, b""), (name, head, 600, tail.replace(b'"}', b'"}]}'))])
    # An info event, whose data may be any JSON: the transcript is valid for Inspect too.
    head, tail = with_long(sample, "events", '[{"event": "info", "data": ', "")
    tail = tail.replace(b'"}', b'"}]}')
    add("events-1500M", [("header.json", h, 0, b""), (name, head, 1536, tail)])
    add("events-3G", [("header.json", h, 0, b""), (name, head, 3072, tail)])
    hh, ht = with_long(header, "plan", '{"name": "plan", "steps": [], "config": {}, "metadata": {"note": ', "}}")
    add("header-200M", [("header.json", hh, 200, ht), (name, json.dumps(sample).encode(), 0, b"")])
    entries = [("header.json", h, 0, b"")]
    for i in range(8):
        s = dict(sample, id=f"large-{i}")
        head, tail = with_long(s, "notes", "", "")
        entries.append((f"samples/large-{i}_epoch_1.json", head, 60, tail))
    add("samples-8x60M", entries)
    return out


INSPECT_READ = r'''
import sys
from inspect_ai.log import read_eval_log
try:
    log = read_eval_log(sys.argv[1])
    print("read", len(log.samples or []))
except Exception as e:
    print("error", type(e).__name__, " ".join(str(e).split())[:200])
'''


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pieval")
    ap.add_argument("--work")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--inspect-python")
    ap.add_argument("--only")
    a = ap.parse_args()
    pieval = a.pieval or build_pieval()
    work = Path(a.work or tempfile.mkdtemp(prefix="pieval-archive-bounds-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        made = archives(work)
        print(f"{'archive':<15} {'file':>9}  {'pieval':<44} {'peak RSS':>9}  outcome")
        for key, path in made.items():
            if a.only and key != a.only:
                continue
            out = work / f"run-{key}"
            shutil.rmtree(out, ignore_errors=True)
            wall, cpu, rss, _ = run_child([pieval, "import", "inspect", str(path), "--output", str(out), "--json"], ok=(0, 2))
            outcome = "imported" if out.exists() else "refused"
            size = path.stat().st_size
            print(f"{key:<15} {size / 1024:>7.0f} K  wall {wall:6.2f} s  cpu {cpu:6.2f} s{'':<14} {rss:>7.0f} MiB  {outcome}")
            if a.inspect_python:
                iw, ic, irss, iout = run_child([a.inspect_python, "-c", INSPECT_READ, str(path)], ok=(0, 1))
                print(f"{'  Inspect':<15} {'':>9}  wall {iw:6.2f} s  cpu {ic:6.2f} s{'':<14} {irss:>7.0f} MiB  {iout.strip()[:60]}"
                      f"  (memory {irss / max(rss, 1):.1f}x pieval's)")
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
