#!/usr/bin/env python3
"""The PI-detector mitigation (`input_filter`) on AgentDojo's four suites with the scripted
agents (scripts/agentdojo/scripted_model.py): targeted attack success and utility under
attack with no mitigation, with the injection rules, and with pieval's injection model
deciding too (`model: true`), for an agent that obeys injections (`obey`) and one that
resists them (`resist`: what a detector costs in utility when the agent was safe anyway).

Usage: python3 scripts/agentdojo/measure_input_filter.py [--pieval BIN] [--suites banking,slack,travel,workspace]
Prints one row per (policy, mitigation): targeted attack success, utility under attack,
utility without attack (benign cases), each as k/n with its rate.
"""
import argparse, json, os, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MITIGATIONS = [
    ("none", "{name: none}"),
    ("input_filter (rules)", "{name: input_filter}"),
    ("input_filter (rules + model)", "{name: input_filter, params: {model: true}}"),
]


def scripted(policy):
    p = subprocess.Popen([sys.executable, os.path.join(ROOT, "scripts", "agentdojo", "scripted_model.py"),
                          "--script", os.path.join(ROOT, "data", "agentdojo", "script.json"), "--policy", policy],
                         stdout=subprocess.PIPE, text=True)
    port = int(p.stdout.readline().split()[-1])
    return p, port


def rate(m, key):
    r = m.get(key) or {}
    n, k = r.get("n", 0), r.get("k", 0)
    return f"{k}/{n} ({100 * k / n:.1f}%)" if n else "–"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pieval", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release", "pieval"))
    ap.add_argument("--suites", default="banking,slack,travel,workspace")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="pieval-adojo-filter-")
    corpus = os.path.join(tmp, "cases.jsonl")
    with open(corpus, "w") as out:
        for s in args.suites.split(","):
            # the cases name their suite's environment file beside them
            env = f"agentdojo-{s}.environments.json"
            with open(os.path.join(ROOT, "data", "agentdojo", env), "rb") as src, open(os.path.join(tmp, env), "wb") as dst:
                dst.write(src.read())
            with open(os.path.join(ROOT, "data", "agentdojo", f"agentdojo-{s}.jsonl")) as f:
                out.write(f.read())
    print(f"{'policy':8s} {'mitigation':30s} {'targeted attack success':26s} {'utility under attack':26s} utility (no attack)")
    for policy in ("obey", "resist"):
        server, port = scripted(policy)
        try:
            for label, mitigation in MITIGATIONS:
                cfg = os.path.join(tmp, f"{policy}-{len(label)}.yaml")
                with open(cfg, "w") as f:
                    f.write(f"experiment: {{name: adojo-{policy}, seed: 7, output_dir: \"{tmp}/results\"}}\n"
                            f"dataset: {{path: \"{corpus}\"}}\n"
                            f"model: {{provider: openai, name: {policy}, base_url: \"http://127.0.0.1:{port}/v1\", timeout_s: 30, max_retries: 2, concurrency: 16}}\n"
                            f"mitigation: {mitigation}\n")
                out = subprocess.run([args.pieval, "run", "--json", cfg], capture_output=True, text=True, cwd=ROOT)
                if out.returncode != 0:
                    sys.exit(out.stderr[-2000:])
                run_dir = json.loads(out.stdout)["dir"]
                m = json.load(open(os.path.join(run_dir, "summary.json")))["aggregate_metrics"]
                print(f"{policy:8s} {label:30s} {rate(m, 'targeted_attack_success_rate'):26s} "
                      f"{rate(m, 'utility_under_attack_rate'):26s} {rate(m, 'utility_rate')}", flush=True)
        finally:
            server.kill()


if __name__ == "__main__":
    main()
