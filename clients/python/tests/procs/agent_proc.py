"""Runs a 3-step agent task; each step appends its number to --log; with
--crash-at N the process SIGKILLs itself inside step N (after logging it)."""

import argparse
import json
import os
import signal

import drover

ap = argparse.ArgumentParser()
ap.add_argument("--url", required=True)
ap.add_argument("--task", required=True)
ap.add_argument("--log", required=True)
ap.add_argument("--ttl", type=int, default=3)
ap.add_argument("--crash-at", type=int, default=0)
a = ap.parse_args()

client = drover.Client(a.url)


def step(n):
    def run(state):
        with open(a.log, "a") as f:
            f.write("%d %d\n" % (n, os.getpid()))
        if n == a.crash_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return {"path": (state or {}).get("path", []) + [n]}

    run.__name__ = "step-%d" % n
    return run


r = client.run_steps(a.task, [step(1), step(2), step(3)], ttl=a.ttl)
print(json.dumps(r._asdict()), flush=True)
