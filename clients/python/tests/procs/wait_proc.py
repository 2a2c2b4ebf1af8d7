"""A queue worker process for the tests whose handler waits for the signal
"approval" twice (two signals, in one claim) and, once answered both, logs
"answered {task} {key1} {key2}" to --out, then holds --hold seconds (the
test kills or pauses it meanwhile) before it succeeds. It claims one task,
and prints the worker's counts as a final JSON line."""

import argparse
import json
import os
import time

import drover

ap = argparse.ArgumentParser()
ap.add_argument("--url", required=True)
ap.add_argument("--queue", required=True)
ap.add_argument("--out", required=True)
ap.add_argument("--hold", type=float, default=0.0)
a = ap.parse_args()

client = drover.Client(a.url)
keys = {}


@client.worker(a.queue, ttl=3, wait=1, name="wait-proc-%d" % os.getpid())
def handle(task):
    got = keys.setdefault(task.id, [])
    if task.received is not None:
        got.append(task.received.idempotency_key)
    if len(got) < 2:
        return drover.wait_signal("approval", "1h")
    with open(a.out, "a") as f:
        f.write("answered %s %s %s\n" % (task.id, got[0], got[1]))
    time.sleep(a.hold)
    return {"keys": got}


stats = handle.run(max_tasks=1, duration=120)
print(json.dumps(stats), flush=True)
