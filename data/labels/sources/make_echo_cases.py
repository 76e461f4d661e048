#!/usr/bin/env python3
"""The generation corpus behind echo.jsonl's SmolLM2 rows, as it was made (2026-12-03):

    python3 data/labels/sources/make_echo_cases.py data/normalized/attack_cases.enriched.jsonl /var/tmp/echo/echo-cases.jsonl
    pieval run data/labels/sources/echo-gen.yaml      # (its paths point at /var/tmp/echo)

Every English attack case of the corpus whose success criteria look for text that the
request itself carries (a `contains` target in the prompt, context or task input, or a
`regex` that matches the request), then a seeded sample of 360 of them, as many from each
attack surface as it holds up to an equal share (the rest filled in seeded order). No case
is picked by hand.
"""
import json
import random
import re
import sys
import collections

src, dst = sys.argv[1], sys.argv[2]


def leaves(sc):
    if isinstance(sc, str):
        kind, _, value = sc.partition(":")
        return [(kind, value)] if kind in ("contains", "regex") else []
    t = sc.get("type")
    if t in ("contains", "regex"):
        return [(t, sc["value"])]
    if t in ("any", "all"):
        return [x for o in sc["of"] for x in leaves(o)]
    return []


def target_in_request(r):
    given = "\n".join(str(r.get(f) or "") for f in ("prompt", "context", "task_input"))
    for kind, value in leaves(r["success_criteria"]):
        if kind == "contains" and value.lower() in given.lower():
            return True
        if kind == "regex":
            try:
                if re.search(value, given) or re.search(value, given.lower()):
                    return True
            except re.error:
                pass
    return False


rows = [json.loads(l) for l in open(src)]
pool = [r for r in rows if r["language"] == "en" and r.get("label", "attack") == "attack" and target_in_request(r)]
by_surface = collections.defaultdict(list)
for r in pool:
    by_surface[r["attack_surface"]].append(r)
random.seed(2812)
share = 360 // len(by_surface)
picked, rest = [], []
for s in sorted(by_surface):
    rs = sorted(by_surface[s], key=lambda r: r["case_id"])
    random.shuffle(rs)
    picked += rs[:share]
    rest += rs[share:]
random.shuffle(rest)
picked += rest[: 360 - len(picked)]
picked.sort(key=lambda r: r["case_id"])
with open(dst, "w") as out:
    for r in picked:
        out.write(json.dumps(r, ensure_ascii=False) + "\n")
print(f"{len(pool)} cases carry their target; {len(picked)} written to {dst}")
print(collections.Counter(r["attack_surface"] for r in picked))
