#!/usr/bin/env python3
"""Scoring on a Ballista cluster with everything on object storage — the predictions read
where they are in a bucket, `--staging s3://…`, the run committed into `s3://…` — against
scoring in one process on the same generated predictions, in the same run. The server is
moto's S3 server on 127.0.0.1 (from PyPI), so the bucket's bytes cross loopback, not a network.

What it measures is the client's share of the pieval processes' CPU (client, scheduler,
executors): on object storage the executors read the inputs, write their parts, and put
the run's files together in the bucket by multipart upload (docs/cluster.md, "Staging on
object storage"), so the client's share should stay what it is on a shared file system.
moto's own CPU (a Python server holding every object in memory) is printed apart: it is the
store's, not pieval's. Every cluster run's case_results rows, fetched from the bucket, are
checked to be the local run's.

Usage:  python3 benches/compare_score_cluster_s3.py [--size-mb 512]
Needs:  cargo, `pip install duckdb 'moto[server]'`.
"""
import argparse, http.client, json, os, shutil, socket, subprocess, sys, tempfile, time

from bench_common import ROOT, run_child
import compare_score_duckdb as gen
from compare_score_cluster import Cluster, build, cpu_seconds


def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close()
    return p


def request(port, method, path, body=b""):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request(method, path, body=body)
    r = c.getresponse()
    data = r.read()
    c.close()
    if r.status >= 300:
        sys.exit(f"moto: {method} {path}: {r.status} {data[:300]!r}")
    return data


def start_moto():
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return p, port
        except OSError:
            if time.time() > deadline:
                sys.exit("moto's server did not start (pip install 'moto[server]')")
            time.sleep(0.2)


def committed_rows(port, run):
    commit = json.loads(request(port, "GET", f"/bkt/{run}/_pieval_commit.json"))
    body = request(port, "GET", f"/bkt/{run}/v/{commit['commit_id']}/case_results.jsonl")
    return sorted(body.splitlines())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=512)
    args = ap.parse_args()
    os.chdir(ROOT)
    if subprocess.run([sys.executable, "-c", "import moto.server, duckdb"], capture_output=True).returncode:
        sys.exit("pip install duckdb 'moto[server]'")
    pieval = build()
    work = tempfile.mkdtemp(prefix="pieval-cluster-s3-bench-")
    moto = None
    try:
        preds = os.path.join(work, "predictions.parquet")
        text_bytes, n = gen.generate(preds, args.size_mb, True)
        mb = text_bytes / 1e6
        print(f"{n:,} predictions, {mb:,.0f} MB of response text (--distinct)")
        local = os.path.join(work, "local")
        wall, cpu, _, _ = run_child([pieval, "score", "--json", "--run-id", "bench", "--predictions", preds,
                                     "--output", local])
        with open(os.path.join(local, "case_results.jsonl"), "rb") as f:
            local_rows = sorted(f.read().splitlines())
        print(f"local (one process): {wall:.2f} s, {mb / wall:.1f} MB/s, CPU {cpu:.1f} s", flush=True)

        moto, port = start_moto()
        request(port, "PUT", "/bkt")
        # This script reads the committed rows back without signing its requests.
        policy = {"Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Principal": "*", "Action": ["s3:GetObject", "s3:PutObject", "s3:ListBucket"],
            "Resource": ["arn:aws:s3:::bkt", "arn:aws:s3:::bkt/*"]}]}
        request(port, "PUT", "/bkt?policy", json.dumps(policy).encode())
        with open(preds, "rb") as f:
            request(port, "PUT", "/bkt/in/predictions.parquet", f.read())
        for k in [k for k in os.environ if k.startswith("AWS_")]:
            del os.environ[k]
        os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench-secret",
                           "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
                           "AWS_ALLOW_HTTP": "true"})
        logs = os.path.join(work, "logs"); os.makedirs(logs)
        print(f"\nexecutors pinned to one of this machine's {os.cpu_count()} cores each (taskset), one task "
              "slot each; predictions, staging and the run in moto's bucket")
        print("| executors | wall | throughput | scheduler's and executors' CPU | client CPU "
              "| client's share of pieval's CPU | moto's CPU | files put together by the executors |")
        print("|---|---|---|---|---|---|---|---|")
        for executors in (1, 2):
            c = Cluster(pieval, executors, 1, logs, pin=True)
            run = f"results/bench-{executors}"
            try:
                others = [p.pid for p in c.procs]
                before, moto_before = cpu_seconds(others), cpu_seconds([moto.pid])
                wall, client, _, stdout = run_child([
                    pieval, "score", "--json", "--run-id", "bench", "--cluster", c.url,
                    "--predictions", "s3://bkt/in/predictions.parquet", "--staging", "s3://bkt/stage",
                    "--output", f"s3://bkt/{run}"])
                cluster = cpu_seconds(others) - before
                moto_cpu = cpu_seconds([moto.pid]) - moto_before
            finally:
                c.stop()
            report = json.loads(stdout)
            by = ", ".join(report["scoring"].get("assembled_by_executors") or [])
            print(f"| {executors} | {wall:.2f} s | {mb / wall:.1f} MB/s | {cluster:.1f} s | {client:.2f} s "
                  f"| {100 * client / (client + cluster):.1f}% | {moto_cpu:.1f} s | {by} |", flush=True)
            if committed_rows(port, run) != local_rows:
                sys.exit(f"{executors} executor(s): case_results differ from the local run")
        print("\nevery cluster run's case_results rows, read from the bucket, are identical to the local run's")
    finally:
        if moto is not None:
            moto.kill(); moto.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
