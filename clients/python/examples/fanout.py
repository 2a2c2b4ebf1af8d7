"""Fan-out and fan-in: step 1 spawns 20 searches into the queue "search"
and the task waits for them, holding nothing; a worker (here, in a thread
of this same program) runs them; step 2 merges their results.

    DROVER_URL=http://127.0.0.1:8080 python3 examples/fanout.py
"""

import os
import threading

import drover

client = drover.Client(os.environ.get("DROVER_URL", "http://127.0.0.1:8080"))
task_id = "research-%d" % os.getpid()

# A queue exists once a task was submitted to it (or `drover queues set` configured it).
client.submit("search", [{"task_id": "warm-up-%d" % os.getpid(), "task_type": "web-search", "parameters": {"topic": "drover"}}])


@client.worker("search", concurrency=8)
def search(task):
    return {"topic": task.params["topic"], "hits": len(task.params["topic"])}


threading.Thread(target=lambda: search.run(handle_signals=False), daemon=True).start()


def plan(state):
    topics = ["%s %d" % (state["question"], i) for i in range(20)]
    children = [{"queue": "search", "task_type": "web-search", "parameters": {"topic": t}} for t in topics]
    return drover.spawn_children(children, state=state)  # wait for all; wait=5 for the first 5, collect=True to keep dead ones


def merge(state):
    kids = drover.step_children()
    kids.raise_if_failed()  # without collect, the first dead child ends the wait
    return dict(state, hits=sum(r["hits"] for r in kids.results()))


r = client.run_steps(task_id, [("plan", plan), ("merge", merge)], initial={"question": "etcd leases"}, resume_within="5m")
print(r.ran, r.state["hits"])  # [1, 2] 270
search.stop()
