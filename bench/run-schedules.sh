#!/usr/bin/env bash
# Schedules under leader kills: a schedule every second, measured for
# DURATION while its leader is SIGKILLed every KILL_EVERY and started again
# a few seconds later, on three systems side by side in one run:
#   drover  a 3-member `drover server` cluster (built from this checkout),
#           the etcd leader's server killed;
#   asynq   two asynq schedulers on the local Redis (127.0.0.1:6379, db 11,
#           flushed), one of them killed in turn;
#   river   two River clients with a periodic job on the local PostgreSQL
#           (postgres://127.0.0.1:5432/test, schema schedbench, dropped),
#           the elected leader killed.
# Each prints one JSON line: expected ticks, fired, distinct ticks,
# duplicates, missed, lateness p50/p99/max. The three run at once (the
# same machine, the same minutes); SEQUENTIAL=1 runs them one after another.
# The results are appended, dated, to docs/bench-log/schedules.md (or $LOG).
# Loopback only.
#   bash bench/run-schedules.sh            # 10m, a kill every 1m
#   bash bench/run-schedules.sh 3m 1m
#   SYSTEMS='asynq river' bash bench/run-schedules.sh 3m 1m
#   DROVER_BIN=/tmp/drover DROVER_BUILD=abc1234 bash bench/run-schedules.sh
#     # a drover binary built elsewhere (DROVER_BUILD names its commit)
set -euo pipefail
DURATION=${1:-10m}
KILL_EVERY=${2:-1m}
SYSTEMS=${SYSTEMS:-drover asynq river}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
work=$(mktemp -d)
mkdir "$work/bin"
started=$(date -u '+%Y-%m-%d %H:%M UTC')
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -n "${KEEP_WORK:-}" ] || rm -rf "$work"
}
trap cleanup EXIT

if [ -n "${DROVER_BIN:-}" ]; then
  cp "$DROVER_BIN" "$work/bin/drover"
else
  (cd "$root" && go build -o "$work/bin/drover" ./cmd/drover)
fi
build=$(git -C "$root" rev-parse --short HEAD)
[ -n "${DROVER_BIN:-}" ] && build="$build, drover built from ${DROVER_BUILD:-another checkout}"
(cd "$here" && go build -o "$work/bin/schedbench" ./cmd/schedbench)
for s in $SYSTEMS; do
  args=(-system "$s" -duration "$DURATION" -kill-every "$KILL_EVERY" -work-dir "$work/$s")
  [ "$s" = drover ] && args+=(-drover-bin "$work/bin/drover")
  if [ -n "${SEQUENTIAL:-}" ]; then
    "$work/bin/schedbench" "${args[@]}" > "$work/$s.json" 2> "$work/$s.err" || { cat "$work/$s.err" >&2; exit 1; }
  else
    "$work/bin/schedbench" "${args[@]}" > "$work/$s.json" 2> "$work/$s.err" &
    pids+=($!)
  fi
done
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=1; done
pids=()
for s in $SYSTEMS; do
  [ -s "$work/$s.json" ] || { echo "$s: no result" >&2; cat "$work/$s.err" >&2; failed=1; }
done
[ "$failed" = 0 ] || exit 1
cat "$work"/*.json

cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
mem=$(free -g | awk '/^Mem:/ {print $2}')
python3 - "${LOG:-$root/docs/bench-log/schedules.md}" "$started" "$DURATION" "$KILL_EVERY" "${SEQUENTIAL:+one after another}" \
  "$(nproc) cores, $cpu, ${mem} GiB, $(go version | cut -d' ' -f3)" "$build" $(for s in $SYSTEMS; do echo "$work/$s.json"; done) <<'PY'
import json, sys
out, started, dur, kill, seq, machine, rev = sys.argv[1:8]
rows = [json.load(open(p)) for p in sys.argv[8:]]
lines = ["", "### %s: %s, a kill every %s (run-schedules.sh)" % (started, dur, kill), "",
         "`bash bench/run-schedules.sh %s %s` at %s; %s; the systems ran %s." % (dur, kill, rev, machine, seq or "at the same time"), "",
         "| system | expected | fired | distinct | duplicates | missed | longest gap | lateness p50 | p99 | max | kills |",
         "|---|---|---|---|---|---|---|---|---|---|---|"]
for r in rows:
    lines.append("| %s | %d | %d | %d | %d | %d | %g s | %g ms | %g ms | %g ms | %d |" % (r["system"], r["expected_ticks"], r["fired"],
        r["distinct_ticks"], r["duplicates"], r["missed"], r["longest_gap_s"], r["lateness_p50_ms"], r["lateness_p99_ms"], r["lateness_max_ms"], r["kills"]))
lines += ["", "```"] + [json.dumps(r, separators=(",", ":")) for r in rows] + ["```"]
with open(out, "a") as f:
    f.write("\n".join(lines) + "\n")
PY
echo "appended to ${LOG:-docs/bench-log/schedules.md}"
