#!/usr/bin/env python3
"""Scoring throughput on the repository's own texts, unlike the generator of
compare_score_duckdb.py (prose drawn from a 400-word vocabulary): real model responses
and attack texts from the labelled sets of data/labels/ (SmolLM2's answers to
CyberSecEval, spikee and handwritten cases, in a dozen languages; the responses of the
echo set; the injection set's attack texts), `pieval score` against DuckDB's rule queries
on the same file, in the same run.

Three shapes, each of --size-mb of response text, rows cycling through the committed
corpus's case ids:
- templated: the labelled responses as they are, repeated in order (a day of production
  traffic answering the same few prompts: per-text caches and Parquet's dictionary help);
- multilingual: the responses whose language is not English or that hold non-ASCII
  letters, each row two of them joined so rows are mostly distinct (folding's slow path:
  NFKC, look-alikes, non-ASCII case);
- long: responses of about 32 KB, each 30 to 60 labelled texts joined (a transcript, a
  document summarised at length: one row's detectors read far more text).

Usage:  python3 benches/score_fixtures.py [--size-mb 128] [--shape templated|multilingual|long] [--runs 1]
Needs:  cargo, `pip install duckdb`.
"""
import argparse, json, os, shutil, subprocess, sys, tempfile

from bench_common import ROOT, build_pieval
import compare_score_duckdb

SOURCES = ["refusal.jsonl", "leakage.jsonl", "criteria.jsonl", "echo.jsonl", "injection.jsonl"]


def texts():
    """(text, multilingual) of every labelled response, in file order, without repeats."""
    seen, out = set(), []
    for name in SOURCES:
        with open(os.path.join(ROOT, "data", "labels", name), encoding="utf-8") as f:
            for line in f:
                r = json.loads(line)
                t = r.get("response")
                if not t or t in seen:
                    continue
                seen.add(t)
                lang = r.get("language") or "en"
                out.append((t, lang != "en" or any(ord(c) > 127 and c.isalpha() for c in t)))
    return out


def generate(path, shape, size_mb):
    """Write the shape's predictions (Parquet, through DuckDB) and return (text bytes, rows)."""
    import duckdb
    all_texts = texts()
    pool = [t for t, multi in all_texts if multi] if shape == "multilingual" else [t for t, _ in all_texts]
    with open(os.path.join(ROOT, "data", "normalized", "attack_cases.jsonl"), encoding="utf-8") as f:
        ids = [json.loads(l)["case_id"] for l in f if l.strip()]
    budget, total, rows = size_mb * 1024 * 1024, 0, []
    n = len(pool)
    i = 0
    while total < budget:
        if shape == "templated":
            t = pool[i % n]
        elif shape == "multilingual":
            # the pair (i mod n, i div n + 31 i mod n) is distinct for i < n²
            t = pool[i % n] + "\n\n" + pool[(i // n + 31 * i) % n]
        else:
            parts, size, k = [], 0, 0
            want = 30 + (i * 31) % 31
            while k < want and size < 40_000:
                p = pool[(i * 104729 + k * 7919) % n]
                parts.append(p)
                size += len(p.encode())
                k += 1
            t = "\n\n".join(parts)
        rows.append({"case_id": ids[i % len(ids)], "response_text": t, "run_id": "bench",
                     "provider": "fixtures", "model_name": "labelled", "latency_ms": float(i % 2000)})
        total += len(t.encode())
        i += 1
    jsonl = path + ".jsonl"
    with open(jsonl, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    con = duckdb.connect()
    con.execute("SET enable_progress_bar=false")
    con.execute(f"""COPY (SELECT case_id, response_text, run_id, provider, model_name,
                           CAST(latency_ms AS DOUBLE) AS latency_ms
                    FROM read_json('{jsonl}', format='newline_delimited', maximum_object_size=1048576))
                    TO '{path}' (FORMAT parquet)""")
    os.remove(jsonl)
    return con.execute(f"SELECT sum(strlen(response_text)), count(*) FROM '{path}'").fetchone()


def generate_in_child(path, shape, size_mb):
    """In a child process, so this one stays small (a child's peak RSS counts its parent's)."""
    code = (f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
            f"import score_fixtures as m; print(*m.generate({path!r}, {shape!r}, {size_mb}))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    return int(out[0]), int(out[1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=128)
    ap.add_argument("--shape", choices=["templated", "multilingual", "long"], action="append",
                    help="one or more shapes (default: all three)")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the generated data and outputs")
    ap.add_argument("--pieval", help="a pieval binary (default: build the release one)")
    args = ap.parse_args()
    if subprocess.run([sys.executable, "-c", "import duckdb"], capture_output=True).returncode != 0:
        sys.exit("pip install duckdb")
    pieval = os.path.abspath(args.pieval) if args.pieval else build_pieval()
    os.chdir(ROOT)  # pieval score reads the committed corpus from here
    tmp = tempfile.mkdtemp(prefix="pieval-score-fixtures-")
    try:
        for shape in args.shape or ["templated", "multilingual", "long"]:
            print(f"== {shape}")
            preds = os.path.join(tmp, f"{shape}.parquet")
            text_bytes, rows = generate_in_child(preds, shape, args.size_mb)
            compare_score_duckdb.compare(pieval, preds, None, text_bytes, rows, tmp, args.runs)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
