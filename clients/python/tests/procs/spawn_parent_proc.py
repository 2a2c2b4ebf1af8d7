"""Runs a 2-step agent task whose step 1 spawns 20 children into --queue
and waits for them (resume_within 10 min). Each run of step 1 appends
"PID start 1" to --log; with --hang the step then never returns, so that
a test can SIGKILL the process inside it, before its write; without, a
test kills it while the task waits for its children."""

import argparse
import os
import time

import drover

ap = argparse.ArgumentParser()
ap.add_argument("--url", required=True)
ap.add_argument("--task", required=True)
ap.add_argument("--queue", required=True)
ap.add_argument("--log", required=True)
ap.add_argument("--hang", action="store_true")
a = ap.parse_args()

client = drover.Client(a.url)


def plan(state):
    with open(a.log, "a") as f:
        f.write("%d start 1\n" % os.getpid())
    while a.hang:
        time.sleep(1)
    return drover.spawn_children(
        [{"queue": a.queue, "task_type": "square", "parameters": {"i": i}} for i in range(20)], state=state
    )


def merge(state):
    return dict(state, results=drover.step_children().results())


client.run_steps(a.task, [("plan", plan), ("merge", merge)], initial={"by": os.getpid()}, ttl=2, wait=30, resume_within="10m")
