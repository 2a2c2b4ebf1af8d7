#!/usr/bin/env bash
# drover alone, one run: N no-op tasks submitted from a JSONL file, then
# drained by one `drover worker --concurrency 64 --prefetch 64` against
# `drover server` (embedded etcd, fsync on). Prints the submit and
# processing rates, the server's peak RSS and its database size; optionally
# CPU profiles and the worker's metrics. Loopback only; every loop ends.
#   bash bench/queue-one.sh 60000
#   DROVER_BIN=/tmp/drover-old bash bench/queue-one.sh 100000   # another build
#   SERVER_ARGS="--auto-compaction-retention 5m" bash bench/queue-one.sh 1000000
#   GOGC=100 bash bench/queue-one.sh 60000       # Go's GC default, server and worker
#   PROF=1 PROFDELAY=90 PROFSECS=15 bash bench/queue-one.sh 1000000   # server profile
#   WPROF=1 bash bench/queue-one.sh 60000        # worker profile
#   SAMPLE=1 bash bench/queue-one.sh 60000       # queue counts every 2.5 s (costs some)
# Profiles and the worker's metrics (scraped 4 s into processing) are left
# in OUT (default ./queue-one-out).
set -euo pipefail
N=${1:-60000}
OUT=${OUT:-$PWD/queue-one-out}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
mkdir -p "$OUT"
trap 'pkill -f "^$work/drover" 2>/dev/null || true; rm -rf "$work"' EXIT
if [ -n "${DROVER_BIN:-}" ]; then
  cp "$DROVER_BIN" "$work/drover"
else
  (cd "$here/.." && go build -o "$work/drover" ./cmd/drover)
fi
python3 - "$N" > "$work/tasks.jsonl" <<'PY'
import sys
for i in range(int(sys.argv[1])):
    print('{"task_id":"t%08d","task_type":"noop"}' % i)
PY
port=$((27000 + RANDOM % 2000))
# shellcheck disable=SC2086 # SERVER_ARGS holds several flags
"$work/drover" server --data-dir "$work/data" --etcd-listen "http://127.0.0.1:$port" \
  --etcd-peer-listen "http://127.0.0.1:$((port + 1))" --metrics-listen "127.0.0.1:$((port + 2))" \
  ${SERVER_ARGS:-} 2>"$work/server.log" &
sp=$!
for _ in $(seq 50); do grep -q ready "$work/server.log" 2>/dev/null && break; sleep 0.2; done
E="--etcd-endpoints 127.0.0.1:$port"
t0=$(date +%s.%N)
"$work/drover" submit $E --queue bench --file "$work/tasks.jsonl" >/dev/null 2>&1
t1=$(date +%s.%N)
echo "submit $(python3 -c "print(round($N/($t1-$t0)))")/s"
"$work/drover" worker $E --queue bench --handler noop --concurrency 64 --prefetch 64 --drain \
  --metrics-listen "127.0.0.1:$((port + 3))" >/dev/null 2>"$work/worker.log" &
wp=$!
(
  sleep 3
  if [ -n "${WPROF:-}" ]; then
    curl -s -o "$OUT/worker-cpu.pb.gz" "http://127.0.0.1:$((port + 3))/debug/pprof/profile?seconds=8" || true
  fi
  sleep 1
  curl -s "http://127.0.0.1:$((port + 3))/metrics" > "$OUT/worker-metrics.txt" || true
) &
if [ -n "${PROF:-}" ]; then
  (sleep "${PROFDELAY:-3}"; curl -s -o "$OUT/server-cpu.pb.gz" \
    "http://127.0.0.1:$((port + 2))/debug/pprof/profile?seconds=${PROFSECS:-8}" || true) &
fi
while kill -0 "$wp" 2>/dev/null; do
  sleep 0.5
  if [ -n "${SAMPLE:-}" ]; then
    echo "$(date +%T) $("$work/drover" tasks stats $E --queue bench --json 2>/dev/null || true)"
    sleep 2
  fi
done
t2=$(date +%s.%N)
echo "process $(python3 -c "print(round($N/($t2-$t1)))")/s"
curl -s "http://127.0.0.1:$((port + 2))/metrics" | grep -E "^etcd_mvcc_db_total_size_in_bytes " || true
grep VmHWM "/proc/$sp/status" | sed 's/^/server peak /'
kill "$sp"
