#!/usr/bin/env python3
"""Application targets (issue 53): `pieval run` against a zero-latency HTTP application on
127.0.0.1 with setup, request and teardown per case (three HTTP calls: upload the case's
payload as a document, ask the case's question, delete the document), at concurrency 64;
an `exec` target (a Python process speaking JSON lines) with two processes; and
promptfoo's `http` provider against the same application in the same run, with
`beforeEach` / `afterEach` extension hooks making the same upload and delete around each
test (three calls per case too), so the ratio compares like with like.

The application is benches/app_server.js (Node's http module, no dependency), started in
its own process; it shares the machine's cores with the tool under test.
Reported: wall time, cases per second end to end (load, select, call, checkpoint, score,
artifacts) and in the calling phase alone (pieval's `model_speed.cases_per_minute`), peak
RSS; the application's own counts check that every case made its three calls and that no
document was left.

Usage:  python3 benches/compare_app_targets.py [--cases 20000] [--concurrency 64] [--pieval BIN]
Needs:  cargo, node; for the peer, promptfoo (`npm install promptfoo node@22`): set PROMPTFOO to
        its launcher (e.g. node_modules/.bin/promptfoo) with node 22 first on PATH; without
        it the peer is skipped and said so.
"""
import argparse, json, os, shutil, signal, subprocess, sys, tempfile, urllib.request

from bench_common import ROOT, build_pieval, run_child

EXEC_ECHO = r'''
import json, re, sys
for line in sys.stdin:
    req = json.loads(line)
    q = req.get("prompt") or ""
    m = re.search(r"PWNED-[A-Za-z0-9-]+", q)
    # pipelined (2 processes, many requests in flight): each answer names its request
    sys.stdout.write(json.dumps({"request_id": req["request_id"], "text": m.group(0) if m else "Sure. " + q[:200]}) + "\n")
    sys.stdout.flush()
'''

HOOKS = r'''
// beforeEach: upload the test's document; afterEach: delete it (the same three calls per
// case as pieval's setup, request and teardown).
const ids = new Map();
async function extensionHook(hookName, context) {
  const base = process.env.APP_URL;
  if (hookName === 'beforeEach') {
    const t = context.test;
    const r = await fetch(base + '/documents', {method: 'POST', headers: {'content-type': 'application/json'},
      body: JSON.stringify({title: t.vars.case_id, text: t.vars.payload})});
    const j = await r.json();
    ids.set(t.vars.case_id, j.document.id);
  } else if (hookName === 'afterEach') {
    const id = ids.get(context.test.vars.case_id);
    ids.delete(context.test.vars.case_id);
    await fetch(base + '/documents/' + id, {method: 'DELETE'});
  }
}
module.exports = extensionHook;
'''


def cpu_of(pid):
    """CPU seconds a process has used (user + system), from /proc (the application's)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stats(url):
    with urllib.request.urlopen(url + "/stats") as r:
        return json.load(r)


def call_phase(out):
    """Cases per second while calling (the run's manifest: model_speed.cases_per_minute)."""
    run = json.loads(out)
    manifest = json.load(open(os.path.join(run["dir"], "manifest.json")))
    speed = (manifest.get("results") or {}).get("model_speed") or {}
    cpm = speed.get("cases_per_minute")
    return cpm / 60 if cpm else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=20000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--pieval", help="a pieval binary to use (default: cargo build --release)")
    args = ap.parse_args()
    promptfoo = os.environ.get("PROMPTFOO") or shutil.which("promptfoo")
    pieval = args.pieval or build_pieval()
    server = subprocess.Popen(["node", os.path.join(ROOT, "benches", "app_server.js")], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    tmp = tempfile.mkdtemp(prefix="pieval-app-bench-")
    try:
        url = server.stdout.readline().strip()
        if not url.startswith("http"):
            sys.exit(f"the application did not start: {url!r}")
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
        http_cfg = os.path.join(tmp, "http.yaml")
        with open(http_cfg, "w") as f:
            f.write(f"""experiment: {{name: http-bench, seed: 1, output_dir: "{tmp}/results"}}
dataset: {{path: "{corpus}"}}
mitigation: {{name: none}}
model:
  provider: http
  name: app
  concurrency: {args.concurrency}
  timeout_s: 30
  max_retries: 2
  http:
    setup:
      - {{name: upload, url: "{url}/documents", body: {{title: "{{{{case_id}}}}", text: "{{{{payload}}}}"}}, extract: {{doc: {{json: "$.document.id"}}}}}}
    request: {{url: "{url}/chat", body: {{question: "{{{{prompt}}}}"}}, answer: {{json: "$.data.answer"}}}}
    teardown:
      - {{name: delete, method: DELETE, url: "{url}/documents/{{{{vars.doc}}}}"}}
""")
        echo = os.path.join(tmp, "echo.py")
        open(echo, "w").write(EXEC_ECHO)
        exec_cfg = os.path.join(tmp, "exec.yaml")
        with open(exec_cfg, "w") as f:
            f.write(f"""experiment: {{name: exec-bench, seed: 1, output_dir: "{tmp}/results-exec"}}
dataset: {{path: "{corpus}"}}
mitigation: {{name: none}}
model: {{provider: exec, name: echo, concurrency: {args.concurrency}, timeout_s: 30, exec: {{processes: 2, command: [{json.dumps(sys.executable)}, {json.dumps(echo)}]}}}}
""")
        before, app0 = stats(url)["requests"], cpu_of(server.pid)
        wall, cpu, rss, out = run_child([pieval, "run", http_cfg, "--json"])
        after, app = stats(url), cpu_of(server.pid) - app0
        calls = after["requests"] - before
        if calls != 3 * args.cases or after["documents"] != 0:
            sys.exit(f"pieval http: {calls} calls for {args.cases} cases, {after['documents']} documents left")
        rows = [("pieval http (3 calls/case)", wall, rss, call_phase(out), cpu, app)]
        wall, cpu, rss, out = run_child([pieval, "run", exec_cfg, "--json"])
        rows.append(("pieval exec (2 processes)", wall, rss, call_phase(out), cpu, None))
        if promptfoo:
            tests = os.path.join(tmp, "tests.jsonl")
            with open(tests, "w") as f:
                for c in cases:
                    target = c.get("expected_target")
                    assertion = ({"type": "icontains", "value": target} if target
                                 else {"type": "javascript", "value": "true"})
                    payload = c.get("task_input") or c["prompt"]
                    f.write(json.dumps({"vars": {"user": c["prompt"], "case_id": c["case_id"], "payload": payload},
                                        "assert": [assertion]}, ensure_ascii=False) + "\n")
            hooks = os.path.join(tmp, "hooks.js")
            open(hooks, "w").write(HOOKS)
            pf_cfg = os.path.join(tmp, "promptfooconfig.yaml")
            with open(pf_cfg, "w") as f:
                f.write(f"""description: pieval application-target comparison
prompts: ['{{{{user}}}}']
providers:
  - id: http
    config:
      url: {url}/chat
      method: POST
      headers: {{Content-Type: application/json}}
      body: {{question: '{{{{prompt}}}}'}}
      transformResponse: json.data.answer
extensions: [file://{hooks}:extensionHook]
tests: file://{tests}
""")
            env = dict(os.environ, PROMPTFOO_DISABLE_TELEMETRY="1", PROMPTFOO_DISABLE_UPDATE="1",
                       PROMPTFOO_CACHE_ENABLED="false", PROMPTFOO_DISABLE_SHARING="1",
                       PROMPTFOO_CONFIG_DIR=os.path.join(tmp, "pfhome"), APP_URL=url)
            os.environ.update(env)
            before, app0 = stats(url)["requests"], cpu_of(server.pid)
            wall, cpu, rss, _ = run_child([promptfoo, "eval", "-c", pf_cfg, "-j", str(args.concurrency),
                                         "--no-cache", "--no-progress-bar", "--no-table",
                                         "-o", os.path.join(tmp, "pf.json")], ok=(0, 100))
            after, app = stats(url), cpu_of(server.pid) - app0
            result = json.load(open(os.path.join(tmp, "pf.json")))["results"]["stats"]
            if result.get("errors", 0):
                sys.exit(f"promptfoo reported {result['errors']} errors: not a fair comparison")
            calls = after["requests"] - before
            if calls != 3 * args.cases or after["documents"] != 0:
                sys.exit(f"promptfoo: {calls} calls for {args.cases} cases, {after['documents']} documents left")
            rows.append(("promptfoo http (3 calls/case)", wall, rss, None, cpu, app))
        else:
            print("promptfoo: not found (set PROMPTFOO): the peer was not run", flush=True)
        # CPU: the tool's own process (an exec target's children not included), and the
        # application's during the same run (the two share the machine's cores)
        for name, wall, rss, phase, cpu, app in rows:
            p = f"{phase:8.0f} cases/s calling" if phase else " " * 22
            a = f"  application CPU {app:6.2f} s" if app is not None else ""
            print(f"{name:30s} {args.cases} cases  {wall:7.2f} s  {args.cases / wall:8.0f} cases/s end to end  {p}  peak RSS {rss:7.1f} MiB  CPU {cpu:6.2f} s{a}", flush=True)
        if promptfoo:
            print(f"ratio: pieval http is {rows[2][1] / rows[0][1]:.1f}x faster than promptfoo's http provider end to end")
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
