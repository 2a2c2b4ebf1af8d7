"""Per-run costs of drover from two /metrics snapshots around a runs.wait phase.

  python3 metrics-diff.py BEFORE AFTER RUNS

Prints HTTP requests per run by route and method, and etcd's WAL fsyncs and
its puts, deletes and transactions per run (the embedded etcd's own counters).
"""
import re, sys
from collections import defaultdict

LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+([0-9.eE+-]+)$')


def read(path):
    out = {}
    for line in open(path):
        m = LINE.match(line.strip())
        if m:
            out[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return out


before, after, runs = read(sys.argv[1]), read(sys.argv[2]), int(sys.argv[3])
delta = {k: v - before.get(k, 0.0) for k, v in after.items()}
routes = defaultdict(float)
for (name, labels), d in delta.items():
    if name == "drover_http_requests_total" and d > 0:
        route = re.search(r'route="([^"]*)"', labels).group(1)
        method = re.search(r'method="([^"]*)"', labels).group(1)
        routes[f"{method} {route}"] += d
print(f"HTTP requests per run (of {runs} runs):")
for r, d in sorted(routes.items(), key=lambda x: -x[1]):
    print(f"  {d / runs:7.2f}  {r}")
print(f"  {sum(routes.values()) / runs:7.2f}  in all")
for name in ("etcd_disk_wal_fsync_duration_seconds_count", "etcd_disk_backend_commit_duration_seconds_count", "etcd_mvcc_put_total", "etcd_mvcc_delete_total", "etcd_mvcc_txn_total", "etcd_mvcc_range_total"):
    d = sum(v for (n, _), v in delta.items() if n == name)
    print(f"{name} per run: {d / runs:.2f}")
