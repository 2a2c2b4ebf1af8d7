#!/usr/bin/env bash
# Queue benchmark: N no-op tasks through drover (embedded etcd, fsync on),
# hibiken/asynq (a Redis this script starts on its own port with an
# append-only file, appendfsync everysec, as asynq is run in production) and
# riverqueue/river (local PostgreSQL, default and 1 ms FetchCooldown), one
# after another, concurrency 64. Prints one JSON line per system and
# drover's ratios. Loopback only.
#   bash bench/run-queue.sh 100000
#   DROVER_ONLY=1 bash bench/run-queue.sh 100000   # drover alone
#   SERVER_FLAGS='--auto-compaction-retention 2m' DROVER_ONLY=1 bash bench/run-queue.sh 10000000
#   PROFILE_DIR=/tmp/prof DROVER_ONLY=1 bash bench/run-queue.sh 1000000
#     # also 20 s CPU profiles of server and worker, 10 s into processing
set -euo pipefail
N=${1:-100000}
CONC=${CONC:-64}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'pkill -f "^$work/drover server" 2>/dev/null || true; [ -f "$work/redis.pid" ] && kill "$(cat "$work/redis.pid")" 2>/dev/null; rm -rf "$work"' EXIT

(cd "$here/.." && go build -o "$work/drover" ./cmd/drover)
(cd "$here" && go build -o "$work/queuebench" ./cmd/queuebench && go build -o "$work/etcdsize" ./cmd/etcdsize)
python3 - "$N" > "$work/tasks.jsonl" <<'PY'
import sys
for i in range(int(sys.argv[1])):
    print('{"task_id":"t%08d","task_type":"noop"}' % i)
PY

port=$((23000 + RANDOM % 2000))
prof_server=() prof_worker=()
if [ -n "${PROFILE_DIR:-}" ]; then
  mkdir -p "$PROFILE_DIR"
  prof_server=(--metrics-listen "127.0.0.1:$((port + 2))") prof_worker=(--metrics-listen "127.0.0.1:$((port + 3))")
fi
/usr/bin/time -f '%M %U %S' -o "$work/server.rss" "$work/drover" server --data-dir "$work/data" "${prof_server[@]}" ${SERVER_FLAGS:-} \
  --etcd-listen "http://127.0.0.1:$port" --etcd-peer-listen "http://127.0.0.1:$((port + 1))" 2>"$work/server.log" &
timer=$!
for _ in $(seq 50); do grep -q ready "$work/server.log" 2>/dev/null && break; sleep 0.2; done
E="--etcd-endpoints 127.0.0.1:$port"
t0=$(date +%s.%N)
/usr/bin/time -f '%U %S' -o "$work/submit.cpu" "$work/drover" submit $E --queue bench --file "$work/tasks.jsonl" >/dev/null 2>&1
t1=$(date +%s.%N)
if [ -n "${PROFILE_DIR:-}" ]; then
  (sleep 10
   curl -s -o "$PROFILE_DIR/server.pprof" "http://127.0.0.1:$((port + 2))/debug/pprof/profile?seconds=20" &
   curl -s -o "$PROFILE_DIR/worker.pprof" "http://127.0.0.1:$((port + 3))/debug/pprof/profile?seconds=20"; wait) &
fi
/usr/bin/time -f '%M %U %S' -o "$work/worker.rss" "$work/drover" worker $E --queue bench --handler noop "${prof_worker[@]}" \
  --concurrency "$CONC" --prefetch "$CONC" --drain >/dev/null 2>&1
t2=$(date +%s.%N)
db=$(du -sb "$work/data" | cut -f1)
# The database a stored task costs: after compaction and defragmentation,
# with every task still stored (finished tasks are kept for the retention).
"$work/etcdsize" -endpoint "127.0.0.1:$port" -prefix /drover/ > "$work/size.json"
compacted=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["db_bytes"])' "$work/size.json")
kill -TERM "$(pgrep -P "$timer")"; wait "$timer" || true
python3 - "$N" "$t0" "$t1" "$t2" "$(cat "$work/server.rss")" "$(cat "$work/worker.rss")" "$db" "$compacted" "$(cat "$work/submit.cpu")" <<'PY' | tee "$work/drover.json"
import json, sys
n, t0, t1, t2, stime, wtime, db, compacted, subtime = sys.argv[1:]
n = int(n)
# /usr/bin/time: peak RSS (KiB), user and system CPU seconds. The server's
# CPU covers submission and processing, the worker's processing alone,
# drover submit's (submit_cpu_s) submission alone.
srss, su, ss = stime.split()
wrss, wu, ws = wtime.split()
print(json.dumps({"system": "drover", "tasks": n, "insert_per_s": round(n / (float(t1) - float(t0))),
  "process_per_s": round(n / (float(t2) - float(t1))), "end_to_end_s": round(float(t2) - float(t0), 1),
  "server_peak_rss_mib": int(srss) // 1024, "worker_peak_rss_mib": int(wrss) // 1024, "etcd_data_mib": int(db) >> 20,
  "db_bytes_per_task_compacted": round(int(compacted) / n),
  "server_cpu_s": round(float(su) + float(ss), 1), "worker_cpu_s": round(float(wu) + float(ws), 1),
  "submit_cpu_s": round(sum(map(float, subtime.split())), 1)}))
PY
[ -n "${DROVER_ONLY:-}" ] && exit 0
rport=$((25000 + RANDOM % 2000))
redis-server --port "$rport" --bind 127.0.0.1 --dir "$work" --appendonly yes --appendfsync everysec \
  --save '' --daemonize yes --pidfile "$work/redis.pid" --logfile "$work/redis.log"
for _ in $(seq 50); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
for sys in asynq river-tuned river; do
  n=$N
  [ "$sys" = river ] && n=$(( N < 20000 ? N : 20000 ))   # 100 ms fetch cooldown: ~640/s
  "$work/queuebench" -system "$sys" -redis "127.0.0.1:$rport" -n "$n" -concurrency "$CONC" | tee -a "$work/peers.json"
done
python3 - "$work/drover.json" "$work/peers.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for line in open(sys.argv[2]):
    p = json.loads(line)
    print("drover / %-12s processing %.2fx, insert %.2fx" % (p["system"], d["process_per_s"] / p["process_per_s"], d["insert_per_s"] / p["insert_per_s"]))
PY
