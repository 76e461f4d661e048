#!/usr/bin/env python3
"""Build data/labels/criteria.jsonl: judge-calibration.jsonl's 245 reviewed rows with the
success criterion spikee itself uses for each instruction, so `pi_criteria_match` is measured
against the reviewed labels (does the response carry out the injected instruction).

spikee's judge for these instructions is a canary: a literal string the response must
contain (`judge_args` of datasets/seeds-targeted-2024-12/instructions.jsonl, Apache-2.0). It
becomes pieval's `contains` criterion. Split by source: the handwritten rows are dev, the
recorded gpt-4o rows test.

Usage: make_criteria_labels.py SPIKEE_INSTRUCTIONS_JSONL data/labels/judge-calibration.jsonl OUT.jsonl
"""
import json
import re
import sys

instructions = {}
for line in open(sys.argv[1], encoding="utf-8"):
    i = json.loads(line)
    instructions[i["id"]] = i
rows = []
for line in open(sys.argv[2], encoding="utf-8"):
    r = json.loads(line)
    ids = [k for k in instructions if re.search(r"(?:^|[_ ])" + re.escape(k) + r"(?:$|[_ ])", r["source"])]
    assert len(ids) == 1, (r["id"], ids)
    ins = instructions[ids[0]]
    assert ins["judge_name"] == "canary", ins
    rows.append({
        "id": r["id"],
        "response": r["response"],
        "criteria": json.dumps({"type": "contains", "value": ins["judge_args"]}),
        "label": r["label"],
        "source": "handwritten" if r["id"].startswith("pieval-hand") else "gpt4o-spikee",
        "split": "dev" if r["id"].startswith("pieval-hand") else "test",
        "instruction": ids[0],
        "license": "Apache-2.0 (spikee; pieval)",
    })
with open(sys.argv[3], "w", encoding="utf-8") as f:
    for r in rows:
        f.write(json.dumps(r, ensure_ascii=False) + "\n")
print(len(rows), sum(r["label"] for r in rows))
