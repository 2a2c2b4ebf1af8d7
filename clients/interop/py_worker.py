"""A queue worker of the Python client for the mixed-fleet test: it appends
the id of every task it runs to LOG, and stops once no task came for 3 s.
Its prefetch is 8, so that the four workers share the tasks (at the
default, a worker holds up to 100 short tasks ahead, and one process may
take most of 1,000).

    python3 py_worker.py URL QUEUE LOG
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "src"))

import drover  # noqa: E402

url, queue, log = sys.argv[1:4]
client = drover.Client(url)


@client.worker(queue, concurrency=8, prefetch=8)
def handle(task):
    with open(log, "a") as f:
        f.write(task.id + "\n")
    return {"by": "python"}


stats = handle.run(idle_timeout=3)
print(json.dumps({"lang": "python", "pid": os.getpid(), "stats": stats}, default=str))
