#!/usr/bin/env python3
"""Guardrail runs (issue 55): `pieval run` with a guardrail section against a zero-latency
classifier over HTTP on 127.0.0.1 (benches/app_server.js's `POST /classify`, Node's http
module, in its own process on the same two cores), at concurrency 64; and, on the same
texts and the same server in the same run, a Python loop that does what a team's script
would: 64 threads, each with its own keep-alive connection (`http.client`), posting each
text and reading the verdict. The goal is ≥ 10,000 texts/s for pieval.

The texts are the labelled texts of data/labels/guardrail.jsonl (all splits), repeated
with fresh ids up to --texts. Reported: wall time and texts/s end to end (pieval: load,
expand, call, checkpoint, results, SQL figures, report), peak RSS, CPU; the server's
request count checks that every text was sent once.

Usage:  python3 benches/compare_guardrail_http.py [--texts 100000] [--concurrency 64] [--pieval BIN]
Needs:  cargo, node.
"""
import argparse, http.client, json, os, queue, shutil, signal, subprocess, sys, tempfile, threading, time, urllib.request

from bench_common import ROOT, build_pieval, run_child


def stats(base):
    with urllib.request.urlopen(base + "/stats") as r:
        return json.loads(r.read())


def python_loop(base, texts, concurrency):
    """The peer: `concurrency` threads, one keep-alive connection each."""
    host, port = base.removeprefix("http://").split(":")
    work = queue.Queue()
    for t in texts:
        work.put(t)
    flagged = [0] * concurrency

    def worker(i):
        conn = http.client.HTTPConnection(host, int(port))
        while True:
            try:
                t = work.get_nowait()
            except queue.Empty:
                return
            body = json.dumps({"text": t["text"], "role": t["role"]})
            conn.request("POST", "/classify", body, {"content-type": "application/json"})
            v = json.loads(conn.getresponse().read())
            flagged[i] += bool(v["flagged"])

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return time.perf_counter() - t0, sum(flagged)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--texts", type=int, default=100000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--pieval", help="a pieval binary to use (default: cargo build --release)")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    pieval = args.pieval or build_pieval()
    tmp = tempfile.mkdtemp(prefix="pieval-guard-bench-")
    server = subprocess.Popen(["node", os.path.join(ROOT, "benches", "app_server.js")], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        base = server.stdout.readline().strip()
        rows = [json.loads(l) for l in open(os.path.join(ROOT, "data", "labels", "guardrail.jsonl"), encoding="utf-8")]
        texts = []
        while len(texts) < args.texts:
            for r in rows:
                if len(texts) == args.texts:
                    break
                texts.append(dict(r, id=f"{r['id']}~{len(texts)}", split="test"))
        labels = os.path.join(tmp, "texts.jsonl")
        with open(labels, "w", encoding="utf-8") as f:
            for t in texts:
                f.write(json.dumps(t, ensure_ascii=False) + "\n")
        cfg = os.path.join(tmp, "guard.yaml")
        with open(cfg, "w") as f:
            f.write(f"""experiment: {{name: guard-bench, seed: 1, output_dir: "{tmp}/results"}}
dataset: {{path: "{ROOT}/data/normalized/attack_cases.enriched.jsonl"}}
model:
  provider: http
  name: zero-latency
  concurrency: {args.concurrency}
  timeout_s: 30
  http:
    request:
      url: {base}/classify
      body: {{text: "{{{{prompt}}}}", role: "{{{{role}}}}"}}
      answer: {{body: true}}
mitigation: {{name: none}}
guardrail:
  forms: []
  labels: ["{labels}"]
  answer: {{flagged: "$.flagged", score: "$.score", category: "$.category"}}
""")
        before = stats(base)["requests"]
        wall, cpu, rss, out = run_child([pieval, "run", "--json", cfg])
        sent = stats(base)["requests"] - before
        v = json.loads(out)
        g = v["guardrail"]
        assert g["items"] == args.texts and g["errors"] == 0, g
        assert sent == args.texts, f"the server saw {sent} requests for {args.texts} texts"
        print(f"pieval guardrail run      {args.texts} texts  {wall:7.2f} s  {args.texts / wall:8.0f} texts/s end to end  "
              f"peak RSS {rss:7.1f} MiB  CPU {cpu:6.2f} s  flagged {g['flagged']}", flush=True)
        before = stats(base)["requests"]
        pwall, pflagged = python_loop(base, texts, args.concurrency)
        assert stats(base)["requests"] - before == args.texts
        assert pflagged == g["flagged"], (pflagged, g["flagged"])
        print(f"python loop (64 threads)  {args.texts} texts  {pwall:7.2f} s  {args.texts / pwall:8.0f} texts/s", flush=True)
        print(f"ratio: pieval is {pwall / wall:.1f}x the Python loop; goal 10,000 texts/s: "
              f"{'met' if args.texts / wall >= 10000 else 'not met'}")
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
