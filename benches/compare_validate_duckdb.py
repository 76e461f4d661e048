#!/usr/bin/env python3
"""Load + validate throughput of `pieval validate` against DuckDB's read_json, on the same
generated corpus (>= 1 GB by default), in the same run.

The corpus is generated here (not committed) by repeating the committed canonical corpus
with fresh case ids. pieval streams the file through the full contract check (every
field, enum, criterion compile, duplicate ids, sha256); DuckDB parses the same
newline-delimited JSON into a table (`CREATE TABLE ... AS SELECT * FROM read_json(...)`),
which checks JSON syntax and types but no contract. Peak RSS of each is measured in a
child process (ru_maxrss).

Usage:  python3 benches/compare_validate_duckdb.py [--size-mb 1024] [--runs 3] [--keep]
Needs:  cargo (builds target/release/pieval), `pip install duckdb`.
"""
import argparse, json, os, subprocess, sys, tempfile, time

from bench_common import ROOT, build_pieval, run_child


def generate(path, size_mb):
    src = open(os.path.join(ROOT, "data/normalized/attack_cases.jsonl"), encoding="utf-8").read().splitlines()
    prefix = '{"case_id":"'
    target = size_mb * 1024 * 1024
    written, rep = 0, 0
    with open(path, "w", encoding="utf-8") as f:
        while written < target:
            chunk = "\n".join(l.replace(prefix, f'{prefix}r{rep}-', 1) for l in src) + "\n"
            f.write(chunk)
            written += len(chunk.encode("utf-8"))
            rep += 1
    return os.path.getsize(path), rep * len(src)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    try:
        import duckdb  # noqa: F401
    except ImportError:
        sys.exit("pip install duckdb")
    pieval = build_pieval()
    tmp = tempfile.mkdtemp(prefix="pieval-bench-")
    corpus = os.path.join(tmp, "corpus.jsonl")
    size, rows = generate(corpus, args.size_mb)
    mb = size / 1e6
    print(f"corpus: {corpus}: {size/2**20:.0f} MiB, {rows} cases")

    duck_script = (
        "import duckdb,sys; c=duckdb.connect(); c.execute('SET enable_progress_bar=false'); "
        "c.execute(\"CREATE TABLE t AS SELECT * FROM read_json(?, format='newline_delimited')\", [sys.argv[1]]); "
        "print(c.execute('SELECT count(*) FROM t').fetchone()[0])"
    )
    results = {}
    for name, cmd in [
        ("pieval validate", [pieval, "validate", corpus, "--json", "--max-errors", "5"]),
        # Loads every record into Arrow RecordBatches (26 columns) and aggregates them.
        ("pieval load+stats", [pieval, "corpus", "stats", corpus, "--json"]),
        ("duckdb read_json", [sys.executable, "-c", duck_script, corpus]),
    ]:
        times, peak, out = [], 0.0, ""
        for _ in range(args.runs):
            dt, _, peak, out = run_child(cmd, ok=(0, 1))
            times.append(dt)
        best = min(times)
        results[name] = (best, peak)
        check = ""
        if name == "pieval validate":
            rep = json.loads(out)[0]
            check = f"records={rep['records']} valid={rep['valid_records']} errors={rep['errors']}"
        elif name.startswith("pieval"):
            check = f"cases={json.loads(out)['total']}"
        else:
            check = f"rows={out.strip()}"
        print(f"{name:18s} best {best:6.2f} s  {mb/best:7.1f} MB/s  peak RSS {peak:7.1f} MiB  ({check}; runs: {', '.join(f'{t:.2f}' for t in times)})")
    dt = results["duckdb read_json"][0]
    for name in ("pieval validate", "pieval load+stats"):
        print(f"ratio: {name} is {dt/results[name][0]:.2f}x DuckDB's throughput")
    if not args.keep:
        os.remove(corpus)
        os.rmdir(tmp)


if __name__ == "__main__":
    main()
