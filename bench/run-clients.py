"""No-op tasks through the language clients' workers against the Go worker,
in one run on one drover server (embedded etcd, fsync on), loopback only:

  go      one `drover worker --handler noop --concurrency C` (etcd directly)
  js      W processes of clients/js/bench/noop-worker.mjs, concurrency C/W each
  python  W processes of clients/python/bench/noop_worker.py, concurrency C/W each

Each system gets a queue of its own. Its workers start first and wait in
their claims; then N tasks are submitted in one NDJSON request and the
clock runs until the queue reports all N succeeded. Prints one JSON line
per system and the clients' ratios to the Go worker.

    python3 bench/run-clients.py --tasks 20000 --workers 16 --concurrency 64
    python3 bench/run-clients.py --tasks 20000 --workers 16 --concurrency 64 --prefetch 16

--prefetch P is passed to every client worker process (its `prefetch`: the
most tasks one claim takes, and how many it may claim ahead of its free
slots while tasks take under 5 ms). Without it each process uses the
clients' default, 100 (held ahead: about 50 ms of work). The Go worker always runs with
its default, --prefetch equal to its concurrency C. For the clients the
JSON lines also give the workers' summed counts: tasks claimed ahead of a
free slot, and tasks per claim (a claim request or one sent with outcomes), outcomes per
outcome request, and requests per 100 tasks.

Needs node, the TypeScript client built (cd clients/js && npm ci && npm run
build) and a drover binary ($DROVER_BIN, else built here).
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "clients", "python", "src"))
sys.path.insert(0, os.path.join(ROOT, "clients", "python", "tests"))

import drover  # noqa: E402
from _support import Server, binary  # noqa: E402


def cpu_seconds(pids):
    """User and system CPU seconds the processes used so far (Linux)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        try:
            with open("/proc/%d/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
    return total


def run(system, srv, client, n, workers, conc, prefetch=None):
    queue = "bench-%s-%d" % (system, int(time.time()))
    per = max(1, conc // workers)
    extra = [] if prefetch is None else ["--prefetch", str(prefetch)]
    if system == "go":
        cmds = [[binary(), "worker", "--etcd-endpoints", srv.etcd, "--queue", queue, "--handler", "noop",
                 "--concurrency", str(conc)]]
    elif system == "js":
        cmds = [["node", os.path.join(ROOT, "clients", "js", "bench", "noop-worker.mjs"), "--url", srv.url,
                 "--queue", queue, "--concurrency", str(per), "--idle-exit", "600"] + extra for _ in range(workers)]
    else:
        cmds = [[sys.executable, os.path.join(ROOT, "clients", "python", "bench", "noop_worker.py"), "--url", srv.url,
                 "--queue", queue, "--concurrency", str(per)] + extra for _ in range(workers)]
    # The clients' workers print their counts as a JSON line when they end.
    out = subprocess.DEVNULL if system == "go" else subprocess.PIPE
    procs = [subprocess.Popen(c, stdout=out, stderr=subprocess.DEVNULL) for c in cmds]
    finals = []
    try:
        time.sleep(3)  # every worker connected and waiting in its claim
        lines = (json.dumps({"task_id": "%s-%d" % (queue, i), "task_type": "noop"}) + "\n" for i in range(n))
        cpu0, scpu0 = cpu_seconds([p.pid for p in procs]), cpu_seconds([srv.proc.pid])
        t0 = time.monotonic()
        res = client.queue(queue).submit_ndjson(lines)
        if res.submitted != n:
            raise SystemExit("%s: submitted %d of %d" % (system, res.submitted, n))
        deadline = t0 + 900
        while client.queue(queue).stats()["succeeded"] < n:
            if time.monotonic() > deadline:
                raise SystemExit("%s: not done within 900 s" % system)
            time.sleep(0.05 if system == "go" else 0.2)  # a stats read costs the server too
        secs = time.monotonic() - t0
        cpu, scpu = cpu_seconds([p.pid for p in procs]) - cpu0, cpu_seconds([srv.proc.pid]) - scpu0
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                stdout, _ = p.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                stdout, _ = p.communicate()
            for line in reversed((stdout or b"").decode("utf-8", "replace").splitlines()):
                if line.startswith("{"):
                    finals.append(json.loads(line))
                    break
    res = {"system": system, "tasks": n, "processes": len(procs), "concurrency": per * len(procs) if system != "go" else conc,
           "prefetch": conc if system == "go" else (100 if prefetch is None else prefetch),
           "seconds": round(secs, 2), "tasks_per_s": round(n / secs),
           "worker_cpu_ms_per_task": round(1000 * cpu / n, 3), "server_cpu_ms_per_task": round(1000 * scpu / n, 3)}
    if finals:
        total = {k: sum(f.get(k) or 0 for f in finals)
                 for k in ("claimed", "ahead", "claim_requests", "outcome_requests", "claims_with_outcomes")}
        res["claimed_ahead"] = total["ahead"]
        # Claims sent with outcomes count as claims here.
        claims = total["claim_requests"] + total["claims_with_outcomes"]
        if claims:
            res["tasks_per_claim"] = round(total["claimed"] / claims, 2)
        if total["outcome_requests"]:
            res["outcomes_per_request"] = round(total["claimed"] / total["outcome_requests"], 2)
        res["requests_per_100_tasks"] = round(100 * (total["claim_requests"] + total["outcome_requests"]) / max(1, total["claimed"]), 2)
    print(json.dumps(res), flush=True)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=20000)
    ap.add_argument("--workers", type=int, default=16, help="processes per client language")
    ap.add_argument("--concurrency", type=int, default=64, help="total concurrency per system")
    ap.add_argument("--prefetch", type=int, default=None,
                    help="the client workers' prefetch (default: 100, the clients' default); the Go worker keeps its default")
    ap.add_argument("--systems", default="go,js,python")
    a = ap.parse_args()
    srv = Server().start()
    try:
        client = drover.Client(srv.url)
        results = {s: run(s, srv, client, a.tasks, a.workers, a.concurrency, a.prefetch) for s in a.systems.split(",")}
    finally:
        srv.stop()
    if "go" in results:
        for s, r in results.items():
            if s != "go":
                print("%-6s / go: %.2fx" % (s, r["tasks_per_s"] / results["go"]["tasks_per_s"]))


if __name__ == "__main__":
    main()
