#!/usr/bin/env python3
"""Runner overhead: `pieval run` against promptfoo (`promptfoo eval`) on the same cases, the
same zero-latency local chat-completions endpoint, the same concurrency, in the same run.

The endpoint is the test server of tests/it/common/chat_server.rs, started through
`cargo bench --bench runner_throughput -- --serve` in its own process. Both tools send one
chat request per case (system = the case's context, user = the prompt, with an indirect
case's untrusted text under a carrier header, as pieval assembles it) and check one
assertion per case (pieval: the case's success criteria and every detector; promptfoo:
`icontains` of the expected target, or `javascript: true`). Reported: wall time, cases per
second and peak RSS of each tool, and the ratio.

Usage:  python3 benches/compare_runner_promptfoo.py [--cases 2154] [--concurrency 64]
Needs:  cargo; promptfoo (`npm install promptfoo`), which needs Node >= 22: set PROMPTFOO to
        its launcher (e.g. node_modules/.bin/promptfoo) and put node 22 first on PATH.
"""
import argparse, json, os, shutil, signal, subprocess, sys, tempfile

from bench_common import ROOT, build_pieval, run_child

HEADERS = {"email": "Email", "web_page": "Web page", "tool_output": "Tool output",
           "code_comment": "Code", "table_cell": "Table"}
INDIRECT = {"retrieved_document", "email", "web_page", "tool_output", "code_comment", "table_cell"}


def user_turn(case):
    if case["attack_surface"] in INDIRECT and case.get("task_input") is not None:
        header = HEADERS.get(case["attack_surface"], "Document")
        return f"{case['prompt']}\n\n{header}:\n{case['task_input']}"
    return case["prompt"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=2154)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder (outputs)")
    args = ap.parse_args()
    promptfoo = os.environ.get("PROMPTFOO") or shutil.which("promptfoo")
    if not promptfoo:
        sys.exit("set PROMPTFOO to the promptfoo launcher (npm install promptfoo; Node >= 22)")
    pieval = build_pieval()
    server = subprocess.Popen(
        ["cargo", "bench", "--quiet", "--bench", "runner_throughput", "--", "--serve"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True)
    tmp = tempfile.mkdtemp(prefix="pieval-runner-bench-")
    try:
        url = server.stdout.readline().strip()
        if not url.startswith("http"):
            sys.exit(f"the bench server did not start: {url!r}")
        src = [json.loads(l) for l in open(os.path.join(ROOT, "data/normalized/attack_cases.enriched.jsonl"))]
        cases = []
        for i in range(args.cases):
            c = dict(src[i % len(src)])
            c["case_id"] = f"{c['case_id']}-r{i // len(src)}"
            cases.append(c)
        corpus = os.path.join(tmp, "cases.jsonl")
        with open(corpus, "w") as f:
            for c in cases:
                f.write(json.dumps(c, ensure_ascii=False) + "\n")
        cfg = os.path.join(tmp, "pieval.yaml")
        with open(cfg, "w") as f:
            f.write(f"""experiment: {{name: bench, seed: 1, output_dir: "{tmp}/results"}}
dataset: {{path: "{corpus}"}}
model: {{provider: openai, name: echo, base_url: "{url}", concurrency: {args.concurrency}, timeout_s: 30, max_retries: 2}}
mitigation: {{name: none}}
""")
        tests = os.path.join(tmp, "tests.jsonl")
        with open(tests, "w") as f:
            for c in cases:
                target = c.get("expected_target")
                assertion = {"type": "icontains", "value": target} if target else {"type": "javascript", "value": "true"}
                f.write(json.dumps({"vars": {"system": c.get("context") or "", "user": user_turn(c)},
                                    "assert": [assertion]}, ensure_ascii=False) + "\n")
        prompt = os.path.join(tmp, "prompt.json")
        with open(prompt, "w") as f:
            # `dump` JSON-encodes the variable, so hostile text cannot break the message list.
            f.write('[{"role": "system", "content": {{ system | dump }}}, '
                    '{"role": "user", "content": {{ user | dump }}}]')
        pf_cfg = os.path.join(tmp, "promptfooconfig.yaml")
        with open(pf_cfg, "w") as f:
            f.write(f"""description: pieval runner comparison
prompts: [file://{prompt}]
providers:
  - id: openai:chat:echo
    config: {{apiBaseUrl: "{url}", apiKey: "unused", max_tokens: 128, temperature: 0}}
tests: file://{tests}
""")
        env = dict(os.environ, PROMPTFOO_DISABLE_TELEMETRY="1", PROMPTFOO_DISABLE_UPDATE="1",
                   PROMPTFOO_CACHE_ENABLED="false", PROMPTFOO_DISABLE_SHARING="1",
                   PROMPTFOO_CONFIG_DIR=os.path.join(tmp, "pfhome"))
        os.environ.update(env)
        rows = []
        for name, cmd in [
            ("pieval run", [pieval, "run", cfg, "--json"]),
            ("promptfoo eval", [promptfoo, "eval", "-c", pf_cfg, "-j", str(args.concurrency),
                                "--no-cache", "--no-progress-bar", "--no-table", "-o", os.path.join(tmp, "pf.json")]),
        ]:
            wall, cpu, rss, _ = run_child(cmd, ok=(0, 100))
            rows.append((name, wall, rss))
            if name == "promptfoo eval":
                stats = json.load(open(os.path.join(tmp, "pf.json")))["results"]["stats"]
                if stats.get("errors", 0):
                    sys.exit(f"promptfoo reported {stats['errors']} errors: not a fair comparison")
            print(f"{name:16s} {args.cases} cases  {wall:7.2f} s  {args.cases / wall:8.0f} cases/s  peak RSS {rss:7.1f} MiB", flush=True)
        print(f"ratio: pieval is {rows[1][1] / rows[0][1]:.1f}x faster than promptfoo")
    finally:
        os.killpg(server.pid, signal.SIGKILL)  # cargo and the bench binary it started
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
