#!/usr/bin/env python3
"""Scoring on a Ballista cluster against scoring in one process, on the same generated
predictions, in the same run: `pieval score` locally, then `pieval score --cluster` on a
loopback cluster of one executor (two task slots) and of two executors (one slot each), so
every configuration has this machine's two cores. Prints wall time, throughput (MB of
response text per second), the cluster path's overhead against the local run, and a
measured model of how throughput scales with executors on separate machines.

The model: a cluster scoring splits into the client's serial part (validating and staging
the inputs, receiving and writing the results: `scoring.staging_ms` and the time after the
query, both measured here on the one-executor run) and the executors' part, which divides
across them. With S the serial seconds, W the executors' seconds on one executor of two
slots, and N executors of two slots each on their own machines:

    time(N) = S + W / N        throughput(N) = text MB / time(N)

and the limit, as N grows, is text MB / S: the client's pass. Loopback executors share these
two cores, so the two-executor run measures the cluster path's overhead, not its scaling.

Predictions are generated with the generator of compare_score_duckdb.py (--distinct: mostly
distinct ~1 KB responses), not committed.

Usage:  python3 benches/compare_score_cluster.py [--size-mb 512]
Needs:  cargo, `pip install duckdb` (the generator).
"""
import argparse, json, os, shutil, socket, subprocess, sys, tempfile, time

from bench_common import ROOT, run_child
import compare_score_duckdb as gen


def build():
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    subprocess.run(["cargo", "build", "--release", "--quiet", "--features", "distributed"],
                   cwd=ROOT, check=True)
    return os.path.join(target, "release", "pieval")


def port_pair():
    while True:
        a = socket.socket(); a.bind(("127.0.0.1", 0)); p = a.getsockname()[1]
        b = socket.socket()
        try:
            b.bind(("127.0.0.1", p + 1)); return p
        except OSError:
            pass
        finally:
            a.close(); b.close()


class Cluster:
    def __init__(self, pieval, executors, slots, logs):
        self.pieval, self.procs = pieval, []
        port = port_pair()
        self.url = f"df://127.0.0.1:{port}"
        self.procs.append(self.spawn(["cluster", "scheduler", "--bind", f"127.0.0.1:{port}"], logs, "scheduler"))
        self.wait(lambda i: i["cluster"]["executors"] == 0)
        for k in range(executors):
            p = port_pair()
            self.procs.append(self.spawn(["cluster", "executor", "--scheduler", self.url, "--bind",
                                          f"127.0.0.1:{p}", "--concurrency", str(slots)], logs, f"executor-{k}"))
        self.wait(lambda i: i["cluster"]["executors"] == executors)

    def spawn(self, args, logs, name):
        return subprocess.Popen([self.pieval, *args], cwd=ROOT, stdin=subprocess.DEVNULL,
                                stdout=open(os.path.join(logs, name + ".out"), "w"),
                                stderr=open(os.path.join(logs, name + ".log"), "w"))

    def wait(self, ready):
        deadline = time.time() + 60
        while time.time() < deadline:
            r = subprocess.run([self.pieval, "cluster", "info", "--scheduler", self.url],
                               capture_output=True, text=True)
            try:
                if ready(json.loads(r.stdout)):
                    return
            except ValueError:
                pass
            time.sleep(0.3)
        sys.exit("the cluster did not come up")

    def stop(self):
        for p in reversed(self.procs):
            p.kill(); p.wait()


def score(pieval, preds, out, cluster=None):
    cmd = [pieval, "score", "--json", "--run-id", "bench", "--predictions", preds, "--output", out]
    if cluster:
        cmd += ["--cluster", cluster]
    wall, cpu, rss, stdout = run_child(cmd)
    report = json.loads(stdout)
    with open(os.path.join(out, "case_results.jsonl"), "rb") as f:
        rows = sorted(f.read().splitlines())
    shutil.rmtree(out)
    return wall, report, rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=512)
    args = ap.parse_args()
    pieval = build()
    work = tempfile.mkdtemp(prefix="pieval-cluster-bench-")
    try:
        preds = os.path.join(work, "predictions.parquet")
        text_bytes, n = gen.generate(preds, args.size_mb, True)
        mb = text_bytes / 1e6
        print(f"{n:,} predictions, {mb:,.0f} MB of response text (--distinct)")
        logs = os.path.join(work, "logs"); os.makedirs(logs)
        results = []
        wall, report, local_rows = score(pieval, preds, os.path.join(work, "local"))
        results.append(("local (one process)", wall, report))
        for executors, slots in ((1, 2), (2, 1)):
            c = Cluster(pieval, executors, slots, logs)
            try:
                wall, report, rows = score(pieval, preds, os.path.join(work, f"c{executors}"), c.url)
            finally:
                c.stop()
            if rows != local_rows:
                sys.exit(f"{executors}-executor cluster: case_results differ from the local run")
            results.append((f"cluster, {executors} executor(s) x {slots} slot(s)", wall, report))
        base = results[0][1]
        print(f"\n| scoring | wall | throughput | overhead vs local | staging (client) |")
        print("|---|---|---|---|---|")
        for name, wall, report in results:
            staging = report["scoring"].get("staging_ms")
            st = f"{staging / 1000:.2f} s" if staging is not None else ""
            print(f"| {name} | {wall:.2f} s | {mb / wall:.1f} MB/s | {100 * (wall / base - 1):+.0f}% | {st} |")
        print("\nevery cluster run's case_results rows are identical to the local run's")
        # The model, from the one-executor run: serial client part S, executors' part W.
        _, wall1, report1 = results[1]
        sc = report1["scoring"]
        staging, query, write = sc["staging_ms"] / 1000, sc["query_ms"] / 1000, sc["client_write_ms"] / 1000
        rest = max(wall1 - staging - query, 0)   # start, connect, summary
        serial = staging + write + rest
        work_s = max(query - write, 1e-9)
        print(f"\nmodel (measured on the one-executor run): serial client part S = {serial:.2f} s "
              f"(staging {staging:.2f} s, writing results {write:.2f} s, the rest {rest:.2f} s), "
              f"executors' part W = {work_s:.2f} s on one executor of 2 slots")
        print("| executors (2 slots each, own machines) | time | throughput |")
        print("|---|---|---|")
        for k in (1, 2, 4, 8, 16, 32):
            t = serial + work_s / k
            print(f"| {k} | {t:.2f} s | {mb / t:.1f} MB/s |")
        print(f"| limit (the client's pass) | {serial:.2f} s | {mb / serial:.1f} MB/s |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
