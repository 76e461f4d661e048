#!/usr/bin/env python3
"""The report at scale (issue 15): a run of 100,000 cases gives a report under 10 MB that
headless Chromium loads in under 3 s.

    python3 benches/report_scale.py [--cases 100000] [--pieval target/release/pieval]

Builds a corpus of N cases (the enriched corpus's cases repeated under new ids), N
predictions (a quarter of them successful attacks with long answers), scores them with
`pieval score`, writes the report with `pieval report`, and prints the report's size and
Chromium's time to load and lay it out (`--dump-dom`, the median of 3).
"""
import argparse, json, os, shutil, statistics, subprocess, sys, tempfile, time

ap = argparse.ArgumentParser()
ap.add_argument("--cases", type=int, default=100_000)
ap.add_argument("--pieval", default="target/debug/pieval")
args = ap.parse_args()
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pieval = os.path.join(root, args.pieval) if not os.path.isabs(args.pieval) else args.pieval
chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
if not chromium:
    sys.exit("needs chromium")
base = [json.loads(l) for l in open(os.path.join(root, "data/normalized/attack_cases.enriched.jsonl"))]
tmp = tempfile.mkdtemp()
cases_path, preds_path = os.path.join(tmp, "cases.jsonl"), os.path.join(tmp, "p.jsonl")
with open(cases_path, "w") as c, open(preds_path, "w") as p:
    for i in range(args.cases):
        case = dict(base[i % len(base)])
        case["case_id"] = f"{case['case_id']}-x{i}"
        c.write(json.dumps(case) + "\n")
        target = case.get("expected_target") or "PWNED"
        text = f"Sure: {target} " + "lorem ipsum " * 400 if i % 4 == 0 else "A short summary."
        p.write(json.dumps({"case_id": case["case_id"], "response_text": text, "latency_ms": float(i % 900)}) + "\n")
out = os.path.join(tmp, "results", "scale")
t = time.time()
subprocess.run([pieval, "score", "--cases", cases_path, "--predictions", preds_path, "--run-id", "scale", "--output", out], check=True, capture_output=True)
score_s = time.time() - t
t = time.time()
subprocess.run([pieval, "report", out], check=True, capture_output=True)
report_s = time.time() - t
page = os.path.join(out, "report.html")
size = os.path.getsize(page)
loads = []
for _ in range(3):
    profile = tempfile.mkdtemp()
    t = time.time()
    subprocess.run([chromium, "--headless=new", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
                    "--dump-dom", "file://" + page], check=True, capture_output=True)
    loads.append(time.time() - t)
    shutil.rmtree(profile, ignore_errors=True)
print(f"cases {args.cases}: score {score_s:.1f} s, report {report_s:.1f} s, report size {size/1e6:.2f} MB "
      f"(goal < 10 MB), Chromium load + layout median {statistics.median(loads):.2f} s of {['%.2f' % x for x in loads]} (goal < 3 s; includes starting the browser)")
shutil.rmtree(tmp, ignore_errors=True)
