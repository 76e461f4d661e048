#!/usr/bin/env python3
"""Scoring on a Ballista cluster against scoring in one process, on the same generated
predictions, in the same run: `pieval score` locally, then `pieval score --cluster` on a
loopback cluster of one executor (two task slots) and of two executors (one slot each), so
every configuration has this machine's two cores; then 1, 2 and 4 executors of one slot each,
each pinned to a core (taskset), with the client's share of all processes' CPU. Prints wall time, throughput (MB of
response text per second), the cluster path's overhead against the local run, and a
measured model of how throughput scales with executors on separate machines.

The model, from CPU seconds measured on the one-executor run (loopback processes share these
two cores, so their wall times measure the cluster path's overhead, not its scaling): the
executors' CPU seconds E (read from /proc: the survey of the predictions, scoring, writing the
parts) divide between them; the client's CPU seconds S (staging the corpus, putting the
survey together, checking the parts and writing the Parquet footers, the summary) run while the executors wait
or before they start, so they add; F is what the one-executor run's wall time holds beyond
S + E/2 (scheduling, task start-up, waiting on each other), kept as a fixed cost. With N
executors of two cores each on their own machines:

    time(N) = S + E / 2N + F        throughput(N) = text MB / time(N)

and the limit, as N grows, is S + F: the client's passes and the fixed cost.

A second measurement runs a detector aggregate through `pieval sql` (locally and with
--cluster, over the same Parquet file): its result is one row, so there the executors' CPU
(E') is all that divides: time(N) = E' / 2N + the query's fixed cost.

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
    def __init__(self, pieval, executors, slots, logs, pin=False):
        self.pieval, self.procs, self.pin = pieval, [], pin
        port = port_pair()
        self.url = f"df://127.0.0.1:{port}"
        self.procs.append(self.spawn(["cluster", "scheduler", "--bind", f"127.0.0.1:{port}"], logs, "scheduler"))
        self.wait(lambda i: i["cluster"]["executors"] == 0)
        for k in range(executors):
            p = port_pair()
            self.procs.append(self.spawn(["cluster", "executor", "--scheduler", self.url, "--bind",
                                          f"127.0.0.1:{p}", "--concurrency", str(slots)], logs, f"executor-{k}",
                                         cpu=(k % os.cpu_count()) if pin else None))
        self.wait(lambda i: i["cluster"]["executors"] == executors)

    def spawn(self, args, logs, name, cpu=None):
        # Pinned (taskset, sched_setaffinity): the executor's threads run on that one core.
        pin = ["taskset", "-c", str(cpu)] if cpu is not None else []
        return subprocess.Popen([*pin, self.pieval, *args], cwd=ROOT, stdin=subprocess.DEVNULL,
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


def cpu_seconds(pids):
    """User + system CPU seconds of running processes so far (/proc/PID/stat)."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / tick


SQL = ("SELECT count(*) AS n, sum(CASE WHEN pi_refusal(response_text) THEN 1 ELSE 0 END) AS refusals, "
       "sum(cardinality(pi_rule_hits(response_text))) AS rule_hits FROM p")


def sql(pieval, preds, cluster=None):
    cmd = [pieval, "sql", "--format", "json", "--table", f"p={preds}", SQL]
    others = [p.pid for p in cluster.procs] if cluster else []
    before = cpu_seconds(others)
    if cluster:
        cmd += ["--cluster", cluster.url]
    wall, cpu, rss, stdout = run_child(cmd)
    return wall, cpu, cpu_seconds(others) - before, json.loads(stdout)


def score(pieval, preds, out, cluster=None):
    cmd = [pieval, "score", "--json", "--run-id", "bench", "--predictions", preds, "--output", out]
    others = [p.pid for p in cluster.procs] if cluster else []
    before = cpu_seconds(others)
    if cluster:
        cmd += ["--cluster", cluster.url]
    wall, cpu, rss, stdout = run_child(cmd)
    report = json.loads(stdout)
    report["cluster_cpu_s"] = cpu_seconds(others) - before
    report["client_cpu_s"] = cpu
    with open(os.path.join(out, "case_results.jsonl"), "rb") as f:
        rows = sorted(f.read().splitlines())
    shutil.rmtree(out)
    return wall, report, rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=512)
    args = ap.parse_args()
    os.chdir(ROOT)  # pieval's default corpus path is relative to the repository
    pieval = build()
    work = tempfile.mkdtemp(prefix="pieval-cluster-bench-")
    try:
        preds = os.path.join(work, "predictions.parquet")
        text_bytes, n = gen.generate(preds, args.size_mb, True)
        mb = text_bytes / 1e6
        print(f"{n:,} predictions, {mb:,.0f} MB of response text (--distinct)")
        logs = os.path.join(work, "logs"); os.makedirs(logs)
        results, sqls = [], []
        wall, report, local_rows = score(pieval, preds, os.path.join(work, "local"))
        results.append(("local (one process)", wall, report))
        sqls.append(("local (one process)", *sql(pieval, preds)))
        for executors, slots in ((1, 2), (2, 1)):
            c = Cluster(pieval, executors, slots, logs)
            try:
                wall, report, rows = score(pieval, preds, os.path.join(work, f"c{executors}"), c)
                sqls.append((f"cluster, {executors} executor(s) x {slots} slot(s)", *sql(pieval, preds, c)))
            finally:
                c.stop()
            if rows != local_rows:
                sys.exit(f"{executors}-executor cluster: case_results differ from the local run")
            results.append((f"cluster, {executors} executor(s) x {slots} slot(s)", wall, report))
        # Executors pinned to a core each (one task slot each; with more executors than
        # cores, they share cores in turn): loopback executors otherwise spread over every
        # core, which hides how work divides between them. The client's share is its CPU
        # seconds over all processes' (client, scheduler, executors).
        pinned = []
        for executors in (1, 2, 4):
            c = Cluster(pieval, executors, 1, logs, pin=True)
            try:
                wall, report, rows = score(pieval, preds, os.path.join(work, f"p{executors}"), c)
            finally:
                c.stop()
            if rows != local_rows:
                sys.exit(f"{executors} pinned executor(s): case_results differ from the local run")
            pinned.append((executors, wall, report))
        base, base_cpu = results[0][1], results[0][2]["client_cpu_s"]
        print(f"\n| scoring | wall | throughput | wall vs local | CPU, all processes | CPU vs local | staging (client) |")
        print("|---|---|---|---|---|---|---|")
        for name, wall, report in results:
            staging = report["scoring"].get("staging_ms")
            st = f"{staging / 1000:.2f} s" if staging is not None else ""
            cpu = report["client_cpu_s"] + report["cluster_cpu_s"]
            print(f"| {name} | {wall:.2f} s | {mb / wall:.1f} MB/s | {100 * (wall / base - 1):+.0f}% "
                  f"| {cpu:.1f} s | {100 * (cpu / base_cpu - 1):+.0f}% | {st} |")
        print(f"\nexecutors pinned to one of this machine's {os.cpu_count()} cores each (taskset), one task slot each")
        print("| executors | wall | throughput | vs 1 executor | scheduler's and executors' CPU | client CPU | client's share of all CPU |")
        print("|---|---|---|---|---|---|---|")
        for executors, wall, report in pinned:
            allcpu = report["client_cpu_s"] + report["cluster_cpu_s"]
            print(f"| {executors} | {wall:.2f} s | {mb / wall:.1f} MB/s | {pinned[0][1] / wall:.2f}x "
                  f"| {report['cluster_cpu_s']:.1f} s | {report['client_cpu_s']:.1f} s "
                  f"| {100 * report['client_cpu_s'] / allcpu:.0f}% |")
        print("\nevery cluster run's case_results rows are identical to the local run's")
        # The model, from the one-executor run (see the module docs).
        _, wall1, r1 = results[1]
        sc = r1["scoring"]
        e, s_ = r1["cluster_cpu_s"], r1["client_cpu_s"]
        fixed = max(wall1 - s_ - e / 2, 0)
        print(f"\nmodel (measured on the one-executor run): executors' CPU E = {e:.1f} s, the client's "
              f"CPU S = {s_:.2f} s, fixed F = {fixed:.2f} s; staging and survey "
              f"{sc['staging_ms'] / 1000:.2f} s, query {sc['query_ms'] / 1000:.2f} s, checking and "
              f"putting together the {sc.get('parts')} parts {sc.get('commit_ms', 0) / 1000:.2f} s (wall)")
        print("| executors (2 cores each, own machines) | time | throughput |")
        print("|---|---|---|")
        for n in (1, 2, 4, 8, 16, 32):
            t = s_ + e / (2 * n) + fixed
            print(f"| {n} | {t:.2f} s | {mb / t:.1f} MB/s |")
        t = s_ + fixed
        print(f"| limit (the client's passes and the fixed cost) | {t:.2f} s | {mb / t:.1f} MB/s |")

        print(f"\n`pieval sql` with detectors, one-row result: {SQL}")
        print("| sql | wall | throughput | client CPU | executors' CPU |")
        print("|---|---|---|---|---|")
        for name, wall, cpu, ecpu, rows in sqls:
            if rows != sqls[0][4]:
                sys.exit(f"{name}: the SQL result differs from the local one: {rows} vs {sqls[0][4]}")
            print(f"| {name} | {wall:.2f} s | {mb / wall:.1f} MB/s | {cpu:.1f} s | {ecpu:.1f} s |")
        _, wall1, ccpu1, e1, _ = sqls[1]
        fixed = max(wall1 - e1 / 2, 0)
        print(f"model: E' = {e1:.1f} s of executors' CPU, fixed cost {fixed:.2f} s (the one-executor wall less E'/2)")
        print("| executors (2 cores each) | time | throughput |")
        print("|---|---|---|")
        for n in (1, 2, 4, 8, 16, 32):
            t = e1 / (2 * n) + fixed
            print(f"| {n} | {t:.2f} s | {mb / t:.1f} MB/s |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
