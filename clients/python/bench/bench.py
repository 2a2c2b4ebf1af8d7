"""Python side of the worker benchmark: N no-op worker processes against one
drover server; prints tasks/s.

    python3 bench/bench.py --url http://127.0.0.1:8080 --tasks 20000 --workers 16 --concurrency 8 [--prefetch P]

Without --url it starts a server of its own on free loopback ports (the
binary from $DROVER_BIN, else built with `go build ./cmd/drover` in the
repository). The workers start first and wait in their long polls; then all
tasks are submitted in one NDJSON request, and the clock runs from the
submission until the queue reports every task SUCCEEDED. The workers are
then drained with SIGTERM and their counts summed. The last line printed is
one JSON object: tasks, workers, concurrency, submit_s, seconds (submission
to the last success), tasks_per_s, and the workers' summed counts.
--prefetch is passed to each worker (default: 100, the client's default).
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import drover  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=None, help="a running server; without it one is started")
    ap.add_argument("--tasks", type=int, default=20000)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--prefetch", type=int, default=None, help="each worker's prefetch (default: 100, the client's default)")
    ap.add_argument("--queue", default=None, help="default: a new queue per run")
    ap.add_argument("--timeout", type=float, default=600, help="give up after this many seconds")
    a = ap.parse_args()

    server = None
    url = a.url
    if url is None:
        from _support import Server  # the tests' helper: free ports, readiness

        server = Server().start()
        url = server.url
        print("server at %s (data in %s)" % (url, server.dir), file=sys.stderr)
    queue = a.queue or "bench-%s" % uuid.uuid4().hex[:8]
    client = drover.Client(url)
    tmp = tempfile.mkdtemp(prefix="drover-bench-")
    procs = []
    try:
        for i in range(a.workers):
            ready = os.path.join(tmp, "ready-%d" % i)
            procs.append(
                (
                    subprocess.Popen(
                        [
                            sys.executable, os.path.join(HERE, "noop_worker.py"), "--url", url, "--queue", queue,
                            "--concurrency", str(a.concurrency), "--ready", ready,
                        ]
                        + ([] if a.prefetch is None else ["--prefetch", str(a.prefetch)]),
                        stdout=subprocess.PIPE,
                        text=True,
                    ),
                    ready,
                )
            )
        deadline = time.monotonic() + 60
        while not all(os.path.exists(r) for _, r in procs):
            if time.monotonic() > deadline:
                raise SystemExit("the workers did not start within 60 s")
            time.sleep(0.05)

        lines = (json.dumps({"task_id": "%s-%d" % (queue, i), "task_type": "noop"}) + "\n" for i in range(a.tasks))
        t0 = time.monotonic()
        res = client.queue(queue).submit_ndjson(lines)
        submit_s = time.monotonic() - t0
        if res.submitted != a.tasks:
            raise SystemExit("submitted %d of %d: %s" % (res.submitted, a.tasks, res.rejected[:3]))
        done = 0
        deadline = t0 + a.timeout
        while True:
            st = client.queue(queue).stats()
            done = st["succeeded"]
            if done >= a.tasks:
                break
            if time.monotonic() > deadline:
                raise SystemExit("only %d of %d tasks succeeded within %.0f s" % (done, a.tasks, a.timeout))
            time.sleep(0.05)
        secs = time.monotonic() - t0
    finally:
        for p, _ in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        counts = {}
        for p, _ in procs:
            try:
                out, _ = p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                out, _ = p.communicate()
            for line in reversed((out or "").strip().splitlines()):
                if line.startswith("{"):
                    for k, v in json.loads(line).items():
                        if k in ("claimed", "succeeded", "failed", "dead", "lost", "not_found", "errors"):
                            counts[k] = counts.get(k, 0) + v
                    break
        client.close()
        shutil.rmtree(tmp, ignore_errors=True)
        if server is not None:
            server.stop()
    print(
        json.dumps(
            dict(
                tasks=a.tasks,
                workers=a.workers,
                concurrency=a.concurrency,
                prefetch=a.prefetch if a.prefetch is not None else 100,
                submit_s=round(submit_s, 3),
                seconds=round(secs, 3),
                tasks_per_s=round(a.tasks / secs, 1),
                **{"workers_" + k: v for k, v in sorted(counts.items())},
            )
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
