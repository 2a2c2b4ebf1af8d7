#!/usr/bin/env bash
# Delayed tasks at scale, side by side: N tasks due at random times
# uniformly over WINDOW, a window that opens once all are submitted, two
# workers of concurrency 64 idle and ready before it; how late each is
# claimed (its handler's start against its due time): p50, p99, max, the
# tasks claimed early and the tasks claimed by TAIL after the window's end.
#   drover       TestDelayedAtScale (queue/delay_scale_test.go) against a
#                `drover server` process built from this checkout (embedded
#                etcd, fsync on), submitted N/100 a request (at most 10,000:
#                a million a minute's segments at any N);
#   asynq        hibiken/asynq, ProcessAt, on a Redis this script starts on
#                its own port (appendonly, appendfsync everysec), the
#                default DelayedTaskCheckInterval (5 s), and asynq-100ms;
#   river        riverqueue/river, ScheduledAt, on the local PostgreSQL
#                (postgres://127.0.0.1:5432/test, schema delaybench,
#                dropped), the defaults, and river-tuned (FetchPollInterval
#                100 ms, FetchCooldown 1 ms; River's scheduler interval is
#                not a setting).
# One after another by default; AT_ONCE=1 runs them at the same time.
# Prints one JSON line per system and drover's ratios, and adds a dated
# section to docs/bench-log/queue.md (or $LOG). Loopback only.
#   bash bench/run-delayed.sh 150000 9s
#   TAIL=2m SYSTEMS='drover asynq-100ms' bash bench/run-delayed.sh 1000000 60s
#   DROVER_BIN=/tmp/drover DROVER_BUILD=abc1234 bash bench/run-delayed.sh 150000 9s
# Other settings: DROVER_CPU (drover's idle-CPU window, default 30s),
# DROVER_LEAD and LEAD (the window's lead over the submission's start for
# drover and the peers; defaults 3 s + 1 s per 4,000 tasks, plus DROVER_CPU
# for drover), KEEP_WORK=1 keeps the logs.
set -euo pipefail
N=${1:-150000}
WINDOW=${2:-9s}
TAIL=${TAIL:-60s}
SYSTEMS=${SYSTEMS:-drover asynq asynq-100ms river river-tuned}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
work=$(mktemp -d)
rport=$((27000 + RANDOM % 2000))
mkdir "$work/bin"
started=$(date -u '+%Y-%m-%d %H:%M UTC')
load_before=$(uptime | sed 's/.*load average: //')
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -f "$work/redis.pid" ] && redis-cli -p "$rport" shutdown nosave >/dev/null 2>&1
  [ -n "${KEEP_WORK:-}" ] && echo "logs in $work" >&2 || rm -rf "$work"
}
trap cleanup EXIT

if [ -n "${DROVER_BIN:-}" ]; then
  cp "$DROVER_BIN" "$work/bin/drover"
else
  (cd "$root" && go build -o "$work/bin/drover" ./cmd/drover)
fi
# QUEUE_TEST: a test binary of ./queue built elsewhere (go test -c).
build=$(git -C "$root" rev-parse --short HEAD)
[ -n "${DROVER_BIN:-}" ] && build="$build, drover built from ${DROVER_BUILD:-another checkout}"
if [ -n "${QUEUE_TEST:-}" ]; then cp "$QUEUE_TEST" "$work/bin/queue.test"; else (cd "$root" && go test -c -o "$work/bin/queue.test" ./queue); fi
(cd "$here" && go build -o "$work/bin/delaybench" ./cmd/delaybench)

redis-server --port "$rport" --bind 127.0.0.1 --dir "$work" --appendonly yes --appendfsync everysec \
  --save '' --daemonize yes --pidfile "$work/redis.pid" --logfile "$work/redis.log"
for _ in $(seq 50); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done

request=$(( N / 100 < 1 ? 1 : (N / 100 > 10000 ? 10000 : N / 100) ))
run_drover() {
  local env=(DROVER_BIN="$work/bin/drover" DROVER_BENCH_SCALE="$N" DROVER_BENCH_SCALE_WINDOW="$WINDOW"
    DROVER_BENCH_SCALE_REQUEST="$request" DROVER_BENCH_SCALE_TAIL="$TAIL" DROVER_BENCH_SCALE_CPU="${DROVER_CPU:-30s}")
  [ -n "${DROVER_LEAD:-}" ] && env+=(DROVER_BENCH_SCALE_LEAD="$DROVER_LEAD")
  (cd "$root/queue" && env "${env[@]}" "$work/bin/queue.test" -test.run '^TestDelayedAtScale$' -test.v -test.count 1 \
    -test.timeout 90m > "$work/drover.log" 2>&1) || true
  python3 "$here/delayed-log.py" "$work/drover.log" "$N" "$WINDOW" "$TAIL" "$request" > "$work/drover.json" 2> "$work/drover.err" || true
}
run_peer() {
  local args=(-system "$1" -n "$N" -window "$WINDOW" -tail "$TAIL" -redis "127.0.0.1:$rport")
  [ -n "${LEAD:-}" ] && args+=(-lead "$LEAD")
  "$work/bin/delaybench" "${args[@]}" > "$work/$1.json" 2> "$work/$1.err" || true
}
for s in $SYSTEMS; do
  f=run_peer; [ "$s" = drover ] && f=run_drover
  if [ -n "${AT_ONCE:-}" ]; then "$f" "$s" & pids+=($!); else "$f" "$s"; fi
done
for p in "${pids[@]}"; do wait "$p" || true; done
pids=()
load_after=$(uptime | sed 's/.*load average: //')
# A system without a result is named in the section with its error, the
# others reported; the script then exits 1.
failed=0 results=()
for s in $SYSTEMS; do
  if [ -s "$work/$s.json" ]; then
    cat "$work/$s.json"; results+=("$work/$s.json")
  else
    echo "$s: no result" >&2; failed=1
    python3 -c 'import json,sys; print(json.dumps({"system": sys.argv[1], "error": open(sys.argv[2]).read().strip()[-400:]}))' \
      "$s" <(cat "$work/$s.err" 2>/dev/null | grep -v '"level"' | tail -3) > "$work/$s.failed"
    cat "$work/$s.failed" >&2; results+=("$work/$s.failed")
  fi
done

cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
mem=$(free -g | awk '/^Mem:/ {print $2}')
python3 "$here/delayed-log.py" --report "${LOG:-$root/docs/bench-log/queue.md}" "$started" "$N" "$WINDOW" "$TAIL" \
  "${AT_ONCE:+at the same time}" "$(nproc) cores, $cpu, ${mem} GiB, $(go version | cut -d' ' -f3)" "$build" \
  "$load_before" "$load_after" "${results[@]}"
exit "$failed"
