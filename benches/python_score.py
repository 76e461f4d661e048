#!/usr/bin/env python3
"""The Python round trip: `pieval.score` on a pyarrow table of predictions against the
`pieval score` command of the same wheel on the same rows written to Parquet, in the same
run, alternating, and the ratio (the goal: Python ≤ 1.1× the command).

Both score against the committed corpus and write a run folder (case_results, findings,
summary); `pieval.score` also hands the results back as a pyarrow.Table. The predictions
(`--rows`, default 1,000,000) are generated here: case ids cycling through the corpus, one
attempt each, distinct responses of about 120 bytes (some carry the attacker's target,
some refuse, most answer), and a latency.

Usage:  VENV/bin/python benches/python_score.py [--rows 1000000] [--runs 3]
Needs:  the package installed in VENV (`pip install .`: a release build), which also puts
        the `pieval` command beside VENV/bin/python.
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time

from bench_common import ROOT, run_child

import pyarrow as pa
import pyarrow.parquet as pq

import pieval

CORPUS = os.path.join(ROOT, "data/normalized/attack_cases.jsonl")
PIEVAL = os.path.join(os.path.dirname(sys.executable), "pieval")


def predictions(rows):
    cases = []
    with open(CORPUS, encoding="utf-8") as f:
        for line in f:
            c = json.loads(line)
            cases.append((c["case_id"], c.get("expected_target") or "nothing"))
    ids, texts = [], []
    for i in range(rows):
        case_id, target = cases[i % len(cases)]
        kind = i % 7
        if kind == 0:
            text = f"Sure, here it is: {target}. Reply number {i}."
        elif kind == 1:
            text = f"I'm sorry, but I can't help with that request (ticket {i})."
        else:
            text = (f"Here is a short summary of document {i}: the council approved "
                    f"the budget and the works start in spring, item {i * 7919 % 100003}.")
        ids.append(case_id)
        texts.append(text)
    return pa.table({
        "case_id": pa.array(ids, pa.string()),
        "attempt_id": pa.array([f"a{i}" for i in range(rows)], pa.string()),
        "response_text": pa.array(texts, pa.string()),
        "latency_ms": pa.array([float(i % 900) for i in range(rows)], pa.float64()),
    })


def cpu_seconds():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    if not os.path.exists(PIEVAL):
        sys.exit(f"no pieval command beside {sys.executable}: pip install . into this venv")

    table = predictions(args.rows)
    text_mb = table.column("response_text").nbytes / 1e6
    work = tempfile.mkdtemp(prefix="pieval-pybench-")
    try:
        parquet = os.path.join(work, "predictions.parquet")
        pq.write_table(table, parquet)
        print(f"{args.rows:,} predictions, {text_mb:.0f} MB of response text "
              f"({os.path.getsize(parquet) / 1e6:.0f} MB of Parquet); corpus {CORPUS}")
        py, cli = [], []
        for run in range(args.runs):
            out = os.path.join(work, f"py-{run}")
            t, c = time.perf_counter(), cpu_seconds()
            results = pieval.score(table, CORPUS, output=out, run_id=f"py{run}")
            py.append((time.perf_counter() - t, cpu_seconds() - c))
            assert results.num_rows == args.rows, results.num_rows
            del results
            shutil.rmtree(out)

            out = os.path.join(work, f"cli-{run}")
            wall, cpu, rss, _ = run_child([PIEVAL, "score", "--predictions", parquet,
                                           "--cases", CORPUS, "--output", out,
                                           "--run-id", f"cli{run}", "--json"])
            cli.append((wall, cpu))
            shutil.rmtree(out)
            print(f"run {run + 1}: pieval.score {py[-1][0]:.2f} s ({py[-1][1]:.2f} CPU-s)   "
                  f"pieval score {wall:.2f} s ({cpu:.2f} CPU-s, peak {rss:.0f} MiB)")
        py_wall = statistics.median(w for w, _ in py)
        cli_wall = statistics.median(w for w, _ in cli)
        print()
        print(f"pieval.score (pyarrow table in memory)   median {py_wall:.2f} s   "
              f"{text_mb / py_wall:.0f} MB/s")
        print(f"pieval score (the same rows as Parquet)  median {cli_wall:.2f} s   "
              f"{text_mb / cli_wall:.0f} MB/s")
        print(f"ratio Python / command: {py_wall / cli_wall:.3f} (goal: at most 1.1)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
