#!/usr/bin/env bash
# drover alone: N no-op tasks through `drover server` (embedded etcd, fsync
# on) and WORKERS `drover worker` processes, printing the processing rate
# every SAMPLE seconds (to see whether it changes as the queue drains) and
# the embedded etcd's commit counters at the end. Loopback only.
#   bash bench/queue-progress.sh 300000
#   GOGC=300 bash bench/queue-progress.sh 60000      # the GC setting, server and worker
#   PROF=1 bash bench/queue-progress.sh 60000        # also a 10 s CPU profile of the server
set -euo pipefail
N=${1:-100000}
CONC=${CONC:-64}
SAMPLE=${SAMPLE:-10}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'pkill -f "^$work/drover" 2>/dev/null || true; rm -rf "$work"' EXIT
(cd "$here/.." && go build -o "$work/drover" ./cmd/drover)
python3 - "$N" > "$work/tasks.jsonl" <<'PY'
import sys
for i in range(int(sys.argv[1])):
    print('{"task_id":"t%08d","task_type":"noop"}' % i)
PY
port=$((25000 + RANDOM % 2000))
mport=$((port + 2))
"$work/drover" server --data-dir "$work/data" --etcd-listen "http://127.0.0.1:$port" \
  --etcd-peer-listen "http://127.0.0.1:$((port + 1))" --metrics-listen "127.0.0.1:$mport" 2>"$work/server.log" &
for _ in $(seq 50); do grep -q ready "$work/server.log" 2>/dev/null && break; sleep 0.2; done
E="--etcd-endpoints 127.0.0.1:$port"
t0=$(date +%s.%N)
"$work/drover" submit $E --queue bench --file "$work/tasks.jsonl" >/dev/null 2>&1
t1=$(date +%s.%N)
echo "submit $(python3 -c "print(round($N/($t1-$t0)))")/s"
pids=()
for _ in $(seq "${WORKERS:-1}"); do
  "$work/drover" worker $E --queue bench --handler noop --concurrency "$CONC" --prefetch "$CONC" --drain >/dev/null 2>&1 &
  pids+=($!)
done
wp=${pids[-1]}
if [ -n "${PROF:-}" ]; then
  (sleep 6; go tool pprof -top -nodecount=40 "http://127.0.0.1:$mport/debug/pprof/profile?seconds=10" > "$work/profile.txt" 2>&1) &
fi
prev=0
while kill -0 "$wp" 2>/dev/null; do
  sleep "$SAMPLE"
  s=$("$work/drover" tasks stats $E --queue bench --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["succeeded"])' || echo "$prev")
  echo "$(date +%T) succeeded=$s rate=$(( (s - prev) / SAMPLE ))/s"
  prev=$s
done
wait "${pids[@]}"
t2=$(date +%s.%N)
curl -s "http://127.0.0.1:$mport/metrics" | grep -E "^etcd_server_proposals_committed_total|^etcd_disk_wal_fsync_duration_seconds_(sum|count)" || true
[ -f "$work/profile.txt" ] && cat "$work/profile.txt"
echo "process $(python3 -c "print(round($N/($t2-$t1)))")/s, end to end $(python3 -c "print(round($t2-$t0,1))") s"
