"""Takes a lock --iters times; inside, checks that nobody else is inside
(an O_EXCL marker file), increments a counter file read-modify-write, and
logs the fencing token. Prints a JSON line with its overlaps and tokens."""

import argparse
import json
import os
import time

import drover

ap = argparse.ArgumentParser()
ap.add_argument("--url", required=True)
ap.add_argument("--name", required=True)
ap.add_argument("--iters", type=int, default=10)
ap.add_argument("--dir", required=True)
a = ap.parse_args()

client = drover.Client(a.url)
marker = os.path.join(a.dir, "inside")
counter = os.path.join(a.dir, "counter")
log = os.path.join(a.dir, "tokens")
overlaps = 0
tokens = []
for i in range(a.iters):
    with client.lock(a.name, ttl=5, wait=60) as lk:
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            os.close(fd)
            mine = True
        except FileExistsError:
            overlaps += 1
            mine = False
        with open(counter) as f:
            n = int(f.read().strip() or "0")
        time.sleep(0.02)  # widen the window a lost update would need
        with open(counter, "w") as f:
            f.write(str(n + 1))
        with open(log, "a") as f:
            f.write("%d %d\n" % (lk.token, os.getpid()))
        tokens.append(lk.token)
        if lk.lost.is_set():
            overlaps += 1000  # a lost lock inside the section is a failure too
        if mine:
            os.unlink(marker)
print(json.dumps({"pid": os.getpid(), "overlaps": overlaps, "tokens": tokens}), flush=True)
