"""A queue worker process for the tests: each task records that it started
(task id, token, attempt, session id, TTL, pid) as a JSON line in --out,
sleeps --sleep seconds and succeeds. Prints the worker's counts as a final
JSON line."""

import argparse
import json
import os
import time

import drover

ap = argparse.ArgumentParser()
ap.add_argument("--url", required=True)
ap.add_argument("--queue", required=True)
ap.add_argument("--out", required=True)
ap.add_argument("--sleep", type=float, default=0.0)
ap.add_argument("--concurrency", type=int, default=1)
ap.add_argument("--ttl", type=int, default=3)
ap.add_argument("--wait", type=float, default=2.0)
ap.add_argument("--idle-timeout", type=float, default=None)
ap.add_argument("--duration", type=float, default=60.0)
ap.add_argument("--ready", default=None, help="a file written once the worker runs")
a = ap.parse_args()

client = drover.Client(a.url)


@client.worker(a.queue, concurrency=a.concurrency, ttl=a.ttl, wait=a.wait, name="test-worker-%d" % os.getpid())
def handle(task):
    rec = {
        "task_id": task.id,
        "token": task.token,
        "attempt": task.attempt,
        "session": task.session.id,
        "ttl": task.session.ttl,
        "pid": os.getpid(),
        "at": time.time(),
    }
    with open(a.out, "a") as f:
        f.write(json.dumps(rec) + "\n")
    time.sleep(a.sleep)
    return {"done_by": os.getpid()}


if a.ready:
    import threading

    def _ready():
        if handle.running.wait(30):  # set once run() installed its signal handlers
            open(a.ready, "w").close()

    threading.Thread(target=_ready, daemon=True).start()
stats = handle.run(idle_timeout=a.idle_timeout, duration=a.duration)
print(json.dumps(stats), flush=True)
