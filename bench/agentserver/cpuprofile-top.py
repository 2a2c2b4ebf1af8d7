"""Self time by function, and by package, of a node --cpu-prof profile.

  python3 cpuprofile-top.py FILE.cpuprofile [N]
"""
import json, re, sys
from collections import defaultdict

prof = json.load(open(sys.argv[1]))
n = int(sys.argv[2]) if len(sys.argv) > 2 else 25
nodes = {x["id"]: x for x in prof["nodes"]}
dt = defaultdict(float)
for sid, delta in zip(prof["samples"], prof["timeDeltas"]):
    dt[sid] += delta / 1000.0
total = sum(dt.values()) or 1.0
fn, pkg = defaultdict(float), defaultdict(float)
for sid, ms in dt.items():
    cf = nodes[sid]["callFrame"]
    url = cf.get("url", "")
    m = re.search(r"node_modules/((?:@[^/]+/)?[^/]+)", url)
    where = m.group(1) if m else (url.rsplit("/", 1)[-1] or "(native/idle/gc)")
    fn[f'{cf.get("functionName") or "(anonymous)"} {where}:{cf.get("lineNumber", 0) + 1}'] += ms
    pkg[where] += ms
print(f"total {total:.0f} ms")
print("by package or file:")
for k, v in sorted(pkg.items(), key=lambda x: -x[1])[:n]:
    print(f"  {100 * v / total:5.1f}%  {k}")
print("by function:")
for k, v in sorted(fn.items(), key=lambda x: -x[1])[:n]:
    print(f"  {100 * v / total:5.1f}%  {k}")
