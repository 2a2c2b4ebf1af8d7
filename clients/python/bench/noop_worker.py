"""A drover queue worker whose tasks do nothing: it measures the client and
the server, not the work.

    python3 bench/noop_worker.py --url http://127.0.0.1:8080 --queue bench --concurrency 8 [--prefetch P]

--prefetch is the worker's ``prefetch`` (default: 100, the
client's default). Runs until SIGTERM/SIGINT (or --idle-timeout seconds
without a task, or --max-tasks claimed), drains, and prints one JSON line
with its counts: claimed, succeeded, failed, dead, lost, not_found, errors,
ahead, claim_requests, outcome_requests, claims_with_outcomes, seconds,
tasks_per_s.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

import drover  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=os.environ.get("DROVER_URL", "http://127.0.0.1:8080"))
    ap.add_argument("--queue", required=True)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--prefetch", type=int, default=None, help="most tasks per claim and held ahead (default: 100)")
    ap.add_argument("--ttl", type=int, default=15, help="session TTL, seconds")
    ap.add_argument("--wait", type=float, default=2.0, help="longest claim long poll, seconds")
    ap.add_argument("--idle-timeout", type=float, default=None, help="stop after this many seconds without a task")
    ap.add_argument("--max-tasks", type=int, default=None, help="stop after claiming this many")
    ap.add_argument("--token", default=os.environ.get("DROVER_TOKEN"))
    ap.add_argument("--namespace", default=os.environ.get("DROVER_NAMESPACE"))
    ap.add_argument("--ready", default=None, help="a file to create once the worker claims")
    a = ap.parse_args()

    client = drover.Client(a.url, token=a.token, namespace=a.namespace)

    @client.worker(
        a.queue, concurrency=a.concurrency, prefetch=a.prefetch, ttl=a.ttl, wait=a.wait, name="noop-%d" % os.getpid()
    )
    def noop(task):
        return None

    if a.ready:
        import threading

        def ready() -> None:
            if noop.running.wait(60):
                open(a.ready, "w").close()

        threading.Thread(target=ready, daemon=True).start()
    t0 = time.monotonic()
    stats = noop.run(max_tasks=a.max_tasks, idle_timeout=a.idle_timeout)
    secs = time.monotonic() - t0
    stats["seconds"] = round(secs, 3)
    stats["tasks_per_s"] = round(stats["succeeded"] / secs, 1) if secs > 0 else 0.0
    stats["pid"] = os.getpid()
    print(json.dumps(stats), flush=True)


if __name__ == "__main__":
    main()
