"""bench/run-delayed.sh's helper (standard library only).

  delayed-log.py LOG N WINDOW TAIL REQUEST
      drover's TestDelayedAtScale log -> one JSON line in delaybench's shape.
  delayed-log.py --report NOTEBOOK STARTED N WINDOW TAIL MODE MACHINE BUILD LOAD_BEFORE LOAD_AFTER JSON...
      prints drover's ratios and adds a dated section at the top of NOTEBOOK.
"""
import json
import re
import sys

UNITS = {"h": 3600e3, "m": 60e3, "s": 1e3, "ms": 1.0, "us": 1e-3, "\u00b5s": 1e-3, "ns": 1e-6}


def millis(d):
    """A Go duration's text (1m7.2s, 354ms, -5ms) in milliseconds."""
    sign = -1 if d.startswith("-") else 1
    parts = re.findall(r"([0-9.]+)(h|ms|us|\u00b5s|ns|m|s)", d)
    if not parts or "".join(a + b for a, b in parts) != d.lstrip("-"):
        raise ValueError("not a duration: %r" % d)
    return round(sign * sum(float(a) * UNITS[u] for a, u in parts), 1)


def seconds(d):
    return millis(d) / 1000


def parse(path, n, window, tail, request):
    text = open(path, encoding="utf-8", errors="replace").read()
    m = re.search(r"(\d+) claimed, late by p50 (\S+), p99 (\S+), max (\S+); early: (\d+)", text)
    if not m:
        said = [l for l in text.splitlines() if "_test.go:" in l or l.startswith("--- ")]
        sys.exit("drover: no claims line in the test's log:\n" + "\n".join(said[-20:]))
    r = {"system": "drover", "tasks": int(n), "window_s": seconds(window), "tail_s": seconds(tail)}
    s = re.search(r"due over \S+ from (\S+) on, submitted in (\S+) .*?, ([0-9]+) etcd bytes per task", text)
    if s:
        r["lead_s"], r["submitted_s"] = seconds(s.group(1)), seconds(s.group(2))
    r.update({"claimed_by_deadline": int(m.group(1)), "lateness_p50_ms": millis(m.group(2)),
              "lateness_p99_ms": millis(m.group(3)), "lateness_max_ms": millis(m.group(4)),
              "early": int(m.group(5)), "duplicates": None,
              "config": "drover server (embedded etcd, fsync on), %s a request; two workers, concurrency 64 each" % request})
    notes = {}
    if s:
        notes["etcd_bytes_per_task"] = int(s.group(3))
    c = re.search(r"server CPU while all wait and none is due: ([0-9.]+) %", text)
    if c:
        notes["server_idle_cpu_pct"] = float(c.group(1))
    mv = re.search(r"due moves: (\d+) gathered, (\d+) lost, (\d+) one by one; (\d+) errors", text)
    if mv:
        notes["due_moves"] = dict(zip(["gathered", "lost", "one_by_one", "errors"], map(int, mv.groups())))
    notes["test"] = "PASS" if "--- PASS" in text else "FAIL"
    r["notes"] = notes
    print(json.dumps(r))


def ms(v):
    return "%.0f ms" % v if abs(v) < 1000 else "%.2f s" % (v / 1000)


def report(out, started, n, window, tail, mode, machine, build, before, after, paths):
    rows = [json.loads(open(p).read().strip().splitlines()[-1]) for p in paths]
    failed = [r for r in rows if "error" in r]
    rows = [r for r in rows if "error" not in r]
    d = next((r for r in rows if r["system"] == "drover"), None)
    ratios = []
    for p in rows:
        if d is None or p is d:
            continue
        line = "%s over drover: p99 lateness %s, max %s; drover's claimed by the deadline over its: %.2fx" % (
            p["system"], ratio(d["lateness_p99_ms"], p["lateness_p99_ms"]),
            ratio(d["lateness_max_ms"], p["lateness_max_ms"]), d["claimed_by_deadline"] / max(1, p["claimed_by_deadline"]))
        ratios.append(line)
        print(line)
    lines = ["## Delayed tasks side by side with asynq and River: %s over %s, %s" % (f"{int(n):,}", window, started), "",
             "`bash bench/run-delayed.sh %s %s` (tail %s) at %s; %s; the systems ran %s; load average before %s, after %s."
             % (n, window, tail, build, machine, mode or "one after another", before, after), "",
             "| system | claimed by the deadline | late p50 | p99 | max | early (most) | submitted in | config |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        early = "%d" % r["early"] + (" (%s)" % ms(r["early_max_ms"]) if r.get("early_max_ms") else "")
        lines.append("| %s | %s of %s | %s | %s | %s | %s | %.1f s | %s |" % (
            r["system"], f"{r['claimed_by_deadline']:,}", f"{r['tasks']:,}", ms(r["lateness_p50_ms"]),
            ms(r["lateness_p99_ms"]), ms(r["lateness_max_ms"]), early, r.get("submitted_s", 0), r["config"]))
    for r in failed:
        lines.append("| %s | no result: %s | | | | | | |" % (r["system"], r["error"].replace("\n", " ").replace("|", "/")))
    lines += ["", "Ratios (a peer's lateness over drover's: above 1, drover is less late):", ""]
    lines += ["- " + x for x in ratios]
    lines += ["", "```"] + [json.dumps(r, separators=(",", ":")) for r in rows] + ["```", "", ""]
    text = open(out, encoding="utf-8").read()
    at = text.find("\n## ")
    at = len(text) if at < 0 else at + 1
    with open(out, "w", encoding="utf-8") as f:
        f.write(text[:at] + "\n".join(lines) + text[at:])
    print("added to", out)


def ratio(drover, peer):
    if drover <= 0:
        return "n/a (drover %s)" % ms(drover)
    return "%.2fx" % (peer / drover)


if __name__ == "__main__":
    if sys.argv[1] == "--report":
        report(*sys.argv[2:12], sys.argv[12:])
    else:
        parse(*sys.argv[1:6])
