"""Claims one task under a session, prints the claim as a JSON line, holds
it --hold seconds, then acks it and prints what the ack got (a line with
"ack": "ok" or the error's class name) and whether the session was lost."""

import argparse
import json
import time

import drover

ap = argparse.ArgumentParser()
ap.add_argument("--url", required=True)
ap.add_argument("--queue", required=True)
ap.add_argument("--ttl", type=int, default=3)
ap.add_argument("--hold", type=float, default=0.5)
a = ap.parse_args()

client = drover.Client(a.url)
session = client.session(ttl=a.ttl, name="claim-ack")
q = client.queue(a.queue)
tasks = []
deadline = time.monotonic() + 20
while not tasks and time.monotonic() < deadline:
    tasks = q.claim(session, max=1, wait=2)
t = tasks[0]
print(json.dumps({"claimed": t.id, "token": t.token, "session": session.id, "ttl": session.ttl}), flush=True)
time.sleep(a.hold)
try:
    q.ack(session, t.id, t.token, {"late": True})
    ack = "ok"
except drover.DroverError as e:
    ack = type(e).__name__
# The keepalive thread has had its chance to see the session gone.
session.lost.wait(a.ttl)
print(json.dumps({"ack": ack, "lost": session.lost.is_set(), "reason": session.lost_reason}), flush=True)
