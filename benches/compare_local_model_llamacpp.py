#!/usr/bin/env python3
"""pieval's embedded decoder beside llama.cpp: the same GGUF, the same prompt tokens, the
same number of threads, greedy, in the same run (docs/performance.md#embedded-local-model).

For each of ``--runs`` rounds, in turn:

1. pieval: ``cargo bench --bench local_model -- --cases N --max-tokens M --prompt-ids FILE``
   (one model on every core; the first round also writes the requests' prompts as token
   ids); its printed prompt and generation tokens/s are taken;
2. llama.cpp, through its Python binding ``llama-cpp-python`` (PyPI; ``pip install
   llama-cpp-python`` builds llama.cpp from source), with ``n_threads`` = this machine's
   cores: for each prompt, its ids evaluated as one batch, then up to M tokens chosen
   greedily one at a time, stopping at ``<|im_end|>`` as pieval does; the rates are
   llama.cpp's own counters (``llama_perf_context``: prompt-eval and eval times), which,
   like pieval's, leave out loading and tokenizing.

Prints each round, the medians and the ratios pieval / llama.cpp.

Usage: python3 benches/compare_local_model_llamacpp.py [--cases 8] [--max-tokens 64]
       [--runs 3] [--profile dev]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import ROOT  # noqa: E402

LINE = re.compile(
    r"prompt (\d+) tokens at ([\d.]+) tok/s per model; generation (\d+) tokens at ([\d.]+) tok/s"
)


def run_pieval(cases: int, max_tokens: int, ids_file: str, profile: str | None) -> tuple[float, float]:
    cmd = ["cargo", "bench", "--quiet"] + (["--profile", profile] if profile else []) + [
        "--bench", "local_model", "--",
        "--cases", str(cases), "--max-tokens", str(max_tokens), "--prompt-ids", ids_file,
    ]
    out = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    m = LINE.search(out)
    if not m:
        sys.exit(f"unexpected output of the pieval bench: {out!r}")
    return float(m.group(2)), float(m.group(4))


def run_llamacpp(llm, prompts: list[list[int]], max_tokens: int, end: int) -> tuple[float, float]:
    import llama_cpp

    p_ms = g_ms = 0.0
    p_n = g_n = 0
    for ids in prompts:
        llm.reset()
        llama_cpp.llama_perf_context_reset(llm.ctx)
        made = 0
        for tok in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
            if tok == end:
                break
            made += 1
            if made == max_tokens:
                break
        perf = llama_cpp.llama_perf_context(llm.ctx)
        p_ms += perf.t_p_eval_ms
        p_n += perf.n_p_eval
        g_ms += perf.t_eval_ms
        g_n += perf.n_eval
    return p_n / (p_ms / 1000), g_n / (g_ms / 1000)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument(
        "--profile",
        help="cargo profile of the pieval bench (default: cargo bench's; `dev` shares the "
        "test build, and the decoder's crate is optimized in every profile)",
    )
    args = ap.parse_args()
    try:
        import llama_cpp
    except ImportError:
        sys.exit("needs llama.cpp's Python binding: pip install llama-cpp-python")
    threads = os.cpu_count() or 1
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ids_file = os.path.join(tmp, "prompt_ids.jsonl")
        llm = None
        for r in range(args.runs):
            ours = run_pieval(args.cases, args.max_tokens, ids_file, args.profile)
            if llm is None:
                lines = [json.loads(line) for line in open(ids_file, encoding="utf-8")]
                prompts = [line["prompt_ids"] for line in lines]
                gguf = lines[0]["gguf"]
                llm = llama_cpp.Llama(
                    model_path=gguf,
                    n_ctx=2048,
                    n_batch=512,
                    n_threads=threads,
                    n_threads_batch=threads,
                    verbose=False,
                )
                end = llm.tokenize(b"<|im_end|>", add_bos=False, special=True)[0]
            theirs = run_llamacpp(llm, prompts, args.max_tokens, end)
            rows.append((ours, theirs))
            print(
                f"round {r + 1}: pieval prompt {ours[0]:.0f} tok/s, generation {ours[1]:.0f} tok/s; "
                f"llama.cpp {llama_cpp.__version__} prompt {theirs[0]:.0f} tok/s, "
                f"generation {theirs[1]:.0f} tok/s"
            )
    med = lambda xs: statistics.median(xs)  # noqa: E731
    ours_p, ours_g = med([r[0][0] for r in rows]), med([r[0][1] for r in rows])
    their_p, their_g = med([r[1][0] for r in rows]), med([r[1][1] for r in rows])
    print(
        f"median of {len(rows)} ({args.cases} cases, {args.max_tokens} new tokens max, "
        f"{threads} threads, greedy): pieval prompt {ours_p:.0f}, generation {ours_g:.0f} tok/s; "
        f"llama.cpp prompt {their_p:.0f}, generation {their_g:.0f} tok/s; "
        f"ratio pieval/llama.cpp prompt {ours_p / their_p:.2f}, generation {ours_g / their_g:.2f}"
    )


if __name__ == "__main__":
    main()
