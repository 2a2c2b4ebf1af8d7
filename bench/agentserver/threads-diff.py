"""CPU per run of each process's threads, from two snapshots around a runs.wait phase.

  python3 threads-diff.py BEFORE AFTER RUNS

BEFORE and AFTER are JSON lines {sid, pid, tid, comm, ticks} (run-agentserver.sh's
threads_cpu). Prints, per process, its CPU ms per run by thread name (a process's
first thread is its main thread: Node's event loop, Go's runtime), then the total.
"""
import json, os, sys
from collections import defaultdict

hz = os.sysconf("SC_CLK_TCK")
before = {(r["pid"], r["tid"]): r for r in map(json.loads, open(sys.argv[1]))}
after = [json.loads(l) for l in open(sys.argv[2])]
runs = int(sys.argv[3])
per = defaultdict(lambda: defaultdict(float))
for r in after:
    d = r["ticks"] - before.get((r["pid"], r["tid"]), {"ticks": 0})["ticks"]
    name = "main" if r["tid"] == r["pid"] else r["comm"]
    per[(r["sid"], r["pid"])][name] += d * 1000 / hz / runs
total = 0.0
for (sid, pid), names in sorted(per.items()):
    s = sum(names.values())
    total += s
    print(f"session {sid} pid {pid}: {s:.1f} ms per run: " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(names.items(), key=lambda x: -x[1]) if v > 0))
print(f"in all: {total:.1f} ms per run (of {runs} runs)")
