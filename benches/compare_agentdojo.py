#!/usr/bin/env python3
"""pieval's agent verdicts against AgentDojo's own, on the same model turns; and the wall time
of AgentDojo's runner beside pieval's on the same suites (docs/agents.md#agentdojo).

For each policy of the scripted agent (scripts/agentdojo/scripted_model.py: resist, obey,
obey_only), on 127.0.0.1:
  1. AgentDojo's benchmark script (``python -m agentdojo.scripts.benchmark --model VLLM_PARSED``,
     reaching the server through ``LOCAL_LLM_PORT``) runs the suites with the attack and
     without it, and writes its verdicts (``utility``, ``security``) per task pair;
  2. ``pieval run`` runs the exported cases (scripts/agentdojo/export.py) against the same
     server and decides them in SQL (``attack_success``, ``utility_success``);
  3. the verdicts are compared case by case: security on attacked pairs, utility on every
     case (attacked and benign). Each disagreement is listed with both sides' tool calls.

Prints the agreement per suite and policy, the totals against the targets (security 98%,
utility 95%), and each runner's wall time with the ratio; writes ``agreement.json``.

Usage: python benches/compare_agentdojo.py --python VENV/bin/python --pieval PATH/TO/pieval
       --out DIR [--suites banking,slack,travel,workspace] [--user-tasks user_task_0,...]
       [--policies resist,obey,obey_only] [--concurrency 64]
Exit status: 0 when both targets are met on the same cases, 1 when one is not (or a case
was judged by one side only), 2 on a failure to run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SCRIPTS = REPO / "scripts" / "agentdojo"
TARGETS = {"security": 0.98, "utility": 0.95}


def run(cmd, **kw):
    started = time.monotonic()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    took = time.monotonic() - started
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:])
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(map(str, cmd))}")
    return proc.stdout, took


def start_server(python, script, policy):
    proc = subprocess.Popen(
        [python, str(SCRIPTS / "scripted_model.py"), "--script", str(script), "--policy", policy],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        proc.kill()
        raise SystemExit(f"the scripted model did not start: {line!r}")
    return proc, int(line.split()[-1])


def agentdojo_verdicts(logdir: Path, version: str, attack: str):
    """{case_id: (utility, security, calls)} from AgentDojo's logs."""
    out = {}
    for path in logdir.glob("*/*/*/*/*.json"):
        d = json.loads(path.read_text())
        suite, uid, iid = d["suite_name"], d["user_task_id"], d["injection_task_id"]
        if not uid.startswith("user_task_"):
            continue  # an injection task run as a user task (AgentDojo's own check)
        kind = d.get("attack_type") or "none"
        if kind not in (attack, "none"):
            continue
        case = f"agentdojo-{version}-{suite}-{uid}-{iid or 'none'}"
        calls = [
            f"{c['function']}({json.dumps(c['args'], sort_keys=True)})"
            for m in d["messages"] if m["role"] == "assistant"
            for c in (m.get("tool_calls") or [])
        ]
        out[case] = (d.get("utility"), d.get("security") if iid else None, calls)
    return out


def pieval_verdicts(run_dir: Path):
    results = {}
    with open(run_dir / "case_results.jsonl", encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            results[r["case_id"]] = r
    calls = {}
    with open(run_dir / "predictions.jsonl", encoding="utf-8") as f:
        for line in f:
            p = json.loads(line)
            if p.get("pieval_record") == "turn":
                continue
            actions = json.loads(p.get("agent_actions") or "[]")
            calls[p["case_id"]] = [f"{a['name']}({a['arguments']})" for a in actions]
    return {
        cid: (r.get("utility_success"), r.get("attack_success") if r.get("label") != "benign" else None,
              calls.get(cid, []), r.get("matched_rule"))
        for cid, r in results.items()
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", required=True, help="a Python with agentdojo installed")
    p.add_argument("--pieval", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--suites", default="banking,slack,travel,workspace")
    p.add_argument("--user-tasks", default="")
    p.add_argument("--policies", default="resist,obey,obey_only")
    p.add_argument("--benchmark-version", default="v1.1.2")
    p.add_argument("--attack", default="important_instructions_no_model_name")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--reuse-agentdojo", action="store_true",
                   help="keep AgentDojo's logs of an earlier run in --out (its runner skips "
                        "the pairs it has): for re-checking the export; the wall times are "
                        "then not comparable")
    args = p.parse_args()
    out = Path(args.out)
    if out.is_symlink():
        raise SystemExit(f"{out}: a symbolic link; give a folder")
    out.mkdir(parents=True, exist_ok=True)
    suites = [s for s in args.suites.split(",") if s]
    user_tasks = [u for u in args.user_tasks.split(",") if u]

    cases = out / "cases"
    export = [args.python, str(SCRIPTS / "export.py"), "--out", str(cases),
              "--benchmark-version", args.benchmark_version, "--suites", ",".join(suites),
              "--attack", args.attack]
    if user_tasks:
        export += ["--user-tasks", ",".join(user_tasks)]
    text, export_s = run(export)
    print(text.strip())
    corpus = cases / "all.jsonl"  # beside the shared environment files its cases include
    with open(corpus, "w", encoding="utf-8") as f:
        for s in suites:
            f.write((cases / f"agentdojo-{s}.jsonl").read_text(encoding="utf-8"))

    report = {"agentdojo_attack": args.attack, "benchmark_version": args.benchmark_version,
              "suites": suites, "policies": {}, "disagreements": []}
    totals = {"security": [0, 0], "utility": [0, 0]}
    wall = {"agentdojo": 0.0, "pieval": 0.0}
    unmatched = 0
    for policy in [x for x in args.policies.split(",") if x]:
        server, port = start_server(args.python, cases / "script.json", policy)
        try:
            logdir = out / "agentdojo" / policy
            if not args.reuse_agentdojo:
                shutil.rmtree(logdir, ignore_errors=True)
            env = dict(os.environ, LOCAL_LLM_PORT=str(port))
            adojo_s = 0.0
            for attack in (args.attack, None):
                cmd = [args.python, "-m", "agentdojo.scripts.benchmark", "--model", "VLLM_PARSED",
                       "--benchmark-version", args.benchmark_version, "--logdir", str(logdir)]
                if attack:
                    cmd += ["--attack", attack]
                for s in suites:
                    cmd += ["-s", s]
                for u in user_tasks:
                    cmd += ["-ut", u]
                _, took = run(cmd, env=env, cwd=out)
                adojo_s += took
            config = out / f"pieval-{policy}.yaml"
            results = out / "pieval" / policy
            shutil.rmtree(results, ignore_errors=True)
            config.write_text(
                "experiment:\n"
                f"  name: agentdojo-{policy}\n  seed: 7\n  output_dir: {json.dumps(str(results))}\n"
                f"dataset:\n  path: {json.dumps(str(corpus))}\n"
                "model:\n  provider: openai\n"
                f"  name: {policy}\n  base_url: http://127.0.0.1:{port}/v1\n"
                f"  concurrency: {args.concurrency}\n  timeout_s: 60\n  max_retries: 2\n"
                "mitigation:\n  name: none\n"
            )
            _, pieval_s = run([args.pieval, "run", str(config)], cwd=REPO)
        finally:
            server.kill()
            server.wait()
        wall["agentdojo"] += adojo_s
        wall["pieval"] += pieval_s
        run_dir = next(d for d in results.iterdir() if d.is_dir())
        ours = pieval_verdicts(run_dir)
        theirs = agentdojo_verdicts(logdir, args.benchmark_version, args.attack)
        per_suite = {}
        for cid, (u_them, s_them, calls_them) in sorted(theirs.items()):
            suite = cid.split("-")[2]
            row = per_suite.setdefault(suite, {"security": [0, 0], "utility": [0, 0], "missing": 0})
            if cid not in ours:
                row["missing"] += 1
                unmatched += 1
                report["disagreements"].append({"policy": policy, "case_id": cid,
                                                "why": "no pieval case (not exported)"})
                continue
            u_us, s_us, calls_us, rule = ours[cid]
            for kind, them, us in (("security", s_them, s_us), ("utility", u_them, u_us)):
                if them is None:
                    continue
                row[kind][1] += 1
                totals[kind][1] += 1
                if bool(us) == bool(them) and us is not None:
                    row[kind][0] += 1
                    totals[kind][0] += 1
                else:
                    report["disagreements"].append({
                        "policy": policy, "case_id": cid, "verdict": kind,
                        "agentdojo": them, "pieval": us, "pieval_rule": rule,
                        "agentdojo_calls": calls_them, "pieval_calls": calls_us})
        # Both sides must have judged the same cases: a case only pieval ran is an export
        # AgentDojo does not have (or a log it did not write).
        extra = sorted(set(ours) - set(theirs))
        for cid in extra:
            report["disagreements"].append({"policy": policy, "case_id": cid,
                                            "why": "no AgentDojo verdict"})
        report["policies"][policy] = {"suites": per_suite, "agentdojo_s": adojo_s,
                                      "pieval_s": pieval_s, "pieval_only": len(extra)}
        if extra:
            print(f"{len(extra)} case(s) judged by pieval only, e.g. {extra[0]}")
            unmatched += len(extra)
        print(f"\npolicy {policy}: AgentDojo's runner {adojo_s:.1f} s, pieval {pieval_s:.1f} s")
        print(f"{'suite':10} {'security':>18} {'utility':>18}")
        for suite, row in per_suite.items():
            cells = []
            for kind in ("security", "utility"):
                ok, n = row[kind]
                cells.append(f"{ok}/{n} ({100 * ok / n:.1f}%)" if n else "-")
            print(f"{suite:10} {cells[0]:>18} {cells[1]:>18}"
                  + (f"  ({row['missing']} not exported)" if row["missing"] else ""))

    met = unmatched == 0
    print()
    if unmatched:
        print(f"{unmatched} case(s) judged by one side only: the comparison is not whole")
    for kind, (ok, n) in totals.items():
        rate = ok / n if n else 0.0
        met &= rate >= TARGETS[kind]
        print(f"{kind} agreement: {ok}/{n} = {100 * rate:.2f}% (target {100 * TARGETS[kind]:.0f}%)")
    ratio = wall["agentdojo"] / wall["pieval"] if wall["pieval"] else float("nan")
    if args.reuse_agentdojo:
        print("(AgentDojo's logs reused: its wall time below is not a measurement)")
    print(f"wall time, all policies: AgentDojo's runner {wall['agentdojo']:.1f} s, "
          f"pieval {wall['pieval']:.1f} s: pieval {ratio:.1f}x faster")
    for d in report["disagreements"][:20]:
        print("disagreement:", json.dumps(d)[:400])
    if len(report["disagreements"]) > 20:
        print(f"... {len(report['disagreements']) - 20} more in {out / 'agreement.json'}")
    report["totals"] = totals
    report["wall_s"] = wall
    (out / "agreement.json").write_text(json.dumps(report, indent=1))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
