"""A queue worker process for the prefetch tests: each task records that it
started (a JSON line in --out: task id, attempt, session id) and runs for
parameters.ms milliseconds; the first task to start with parameters.hold
runs for that many milliseconds instead (the tasks claimed with it wait
behind it), and is recorded with "hold": true. Every 20 ms the worker's
counts, with "waiting", replace --stats. Prints its counts as a final JSON
line once drained (SIGTERM)."""

import argparse
import json
import os
import threading
import time

import drover

ap = argparse.ArgumentParser()
ap.add_argument("--url", required=True)
ap.add_argument("--queue", required=True)
ap.add_argument("--out", required=True)
ap.add_argument("--stats", required=True)
ap.add_argument("--concurrency", type=int, default=1)
ap.add_argument("--prefetch", type=int, default=8)
ap.add_argument("--ttl", type=int, default=2)
a = ap.parse_args()

client = drover.Client(a.url)
mu = threading.Lock()
held = [False]


@client.worker(a.queue, concurrency=a.concurrency, prefetch=a.prefetch, ttl=a.ttl, wait=1.0, name="prefetch-%d" % os.getpid())
def handle(task):
    params = task.params or {}
    ms = params.get("ms", 0)
    hold = False
    with mu:
        if params.get("hold") and not held[0]:
            held[0] = hold = True
            ms = params["hold"]
    rec = {"task_id": task.id, "attempt": task.attempt, "session": task.session.id, "hold": hold}
    with mu:
        with open(a.out, "a") as f:
            f.write(json.dumps(rec) + "\n")
    if ms:
        time.sleep(ms / 1000.0)
    return {"by": os.getpid()}


def report() -> None:
    while True:
        st = dict(handle.stats)
        st["waiting"] = handle.waiting
        tmp = a.stats + ".tmp"
        with open(tmp, "w") as f:
            json.dump(st, f)
        os.replace(tmp, a.stats)
        time.sleep(0.02)


threading.Thread(target=report, daemon=True).start()
stats = handle.run()
stats["waiting"] = handle.waiting
print(json.dumps(stats), flush=True)
