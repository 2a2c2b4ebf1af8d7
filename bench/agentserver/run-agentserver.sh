#!/usr/bin/env bash
# Agent Server benchmark: the same 3-node graph (no model call), the same
# @langchain/langgraph-sdk Client, against drover (embedded etcd, fsync on)
# plus its TypeScript runtime, and against LangGraph's development server
# (`langgraphjs dev` of @langchain/langgraph-cli, everything in memory).
# Each round starts one system, measures it, stops it, then the other; the
# order alternates between rounds. Per system and round it prints one JSON
# line: runs per second with CONC clients (each its own thread, runs.wait),
# then time to first streamed event (runs.stream) p50/p99. Loopback only;
# every step is bounded by `timeout`.
#   bash bench/agentserver/run-agentserver.sh
#   ROUNDS=4 RUNS=1280 STREAM_RUNS=300 bash bench/agentserver/run-agentserver.sh
#   DEPS=/path/with/node_modules bash bench/agentserver/run-agentserver.sh
#   DROVER_BIN=/tmp/drover-other bash bench/agentserver/run-agentserver.sh   # that binary, not one built here
#   DROVER_BENCH_CANCEL_POLL_MS=60000 DROVER_BENCH_HISTORY_LIMIT=1 ONLY=drover bash bench/agentserver/run-agentserver.sh
#     # the runtime without its per-run cancel reads and history (an experiment: runtime.mjs)
#   RUNTIMES=2 bash bench/agentserver/run-agentserver.sh   # two runtime processes share drover's runs
#   PROCESSES=2 bash bench/agentserver/run-agentserver.sh  # one runtime, `serve --processes 2`
#   RUNTIME_NODE_FLAGS=--max-semi-space-size=32 bash bench/agentserver/run-agentserver.sh  # node flags of the runtime
#   BENCH_DURABILITY=exit bash bench/agentserver/run-agentserver.sh  # runs.wait's runs checkpoint at their end only (an experiment)
#   SERVER_CPUS=2 bash bench/agentserver/run-agentserver.sh  # the server's GOMAXPROCS (default 1: see below)
#   PROFILE_DIR=/tmp/prof ONLY=drover ROUNDS=1 bash bench/agentserver/run-agentserver.sh
#     # also a 15 s CPU profile of `drover server` (pprof) and of the
#     # runtime (node --cpu-prof), during the runs.wait phase, and the HTTP
#     # requests, etcd fsyncs and writes per run (metrics-diff.py), the CPU per run of each
#     # process's threads (threads-diff.py), the processes' logs
# DEPS is a directory whose node_modules holds this folder's package.json
# (npm install there, once); the built @droverhq/client (clients/js/dist,
# `npm run build`) is copied into it, so that the runtime and the graph
# share one @langchain/langgraph.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
ROUNDS=${ROUNDS:-3}
RUNS=${RUNS:-640}
CONC=${CONC:-64}
STREAM_RUNS=${STREAM_RUNS:-200}
STREAM_CONC=${STREAM_CONC:-1}
# Runs a client waits for before the timed ones (bench.mjs): the first thousand or so runs of a
# fresh server are its JIT's warm-up, for both systems; the CPU figures count the timed runs only.
export WARMUP=${WARMUP:-8}
JOBS=${JOBS:-64}          # runs each server executes at once (langgraphjs dev -n, the runtimes' concurrency in all)
RUNTIMES=${RUNTIMES:-1}   # drover's runtime processes (LangGraph's dev server is one Node process)
PROCESSES=${PROCESSES:-}  # each runtime's `serve --processes` (unset: the CLI's default)
RUNTIME_NODE_FLAGS=${RUNTIME_NODE_FLAGS:-}  # node options of the runtime processes, e.g. --max-semi-space-size=32
# The drover server's GOMAXPROCS: its share of the machine's cores, as a container's CPU limit
# sets it (Go sizes GOMAXPROCS to the cgroup's limit). The runtime needs the other core; a server
# that schedules its goroutines over both pays for every wake of an idle thread (docs/deploy.md).
SERVER_CPUS=${SERVER_CPUS:-1}
STEP_TIMEOUT=${STEP_TIMEOUT:-600}  # seconds for each measurement, then it counts as failed
ONLY=${ONLY:-}            # drover or langgraph: one system only
DEPS=${DEPS:-$here}
[ -d "$DEPS/node_modules/@langchain/langgraph-cli" ] || (cd "$DEPS" && npm install --no-audit --no-fund)
[ -f "$root/clients/js/dist/agentserver-cli.js" ] || { echo "build clients/js first (npm run build)" >&2; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/agentserver-bench.XXXXXX")
pids=()
stop_all() {
  [ -n "${PROFILE_DIR:-}" ] && { for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null || true; done; sleep 3; cp "$work"/*.log "$PROFILE_DIR/" 2>/dev/null || true; }
  for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do for _ in $(seq 100); do kill -0 -- "-$p" 2>/dev/null || break; sleep 0.1; done; kill -KILL -- "-$p" 2>/dev/null || true; done
  pids=()
}
trap 'stop_all; rm -rf "$work"' EXIT

if [ -n "${DROVER_BIN:-}" ]; then cp "$DROVER_BIN" "$work/drover"; else (cd "$root" && go build -o "$work/drover" ./cmd/drover); fi
rm -rf "$DEPS/node_modules/@droverhq/client" && mkdir -p "$DEPS/node_modules/@droverhq/client"
cp -r "$root/clients/js/package.json" "$root/clients/js/dist" "$DEPS/node_modules/@droverhq/client/"
mkdir -p "$work/proj" && cp "$here/graph.mjs" "$here/langgraph.json" "$here/bench.mjs" "$here/runtime.mjs" "$work/proj/"
ln -s "$DEPS/node_modules" "$work/proj/node_modules"
export LANGSMITH_TRACING=false LANGCHAIN_TRACING_V2=false LANGGRAPH_CLI_NO_ANALYTICS=1 DO_NOT_TRACK=1

wait_for() { # url, log, seconds
  for _ in $(seq $(($3 * 5))); do curl -sf -o /dev/null "$1" && return 0; sleep 0.2; done
  echo "not up: $1" >&2; tail -20 "$2" >&2; return 1
}

# start_drover PORT ROUND: server (fsync on, its data on disk) and runtime; sets URL.
start_drover() {
  local p=$1 prof=()
  [ -n "${PROFILE_DIR:-}" ] && prof=(--metrics-listen "127.0.0.1:$((p + 3))")
  GOMAXPROCS=$SERVER_CPUS setsid "$work/drover" server --data-dir "$work/data-$2" --http-listen "127.0.0.1:$p" "${prof[@]}" \
    --etcd-listen "http://127.0.0.1:$((p + 1))" --etcd-peer-listen "http://127.0.0.1:$((p + 2))" >"$work/drover-$2.log" 2>&1 &
  pids+=($!)
  wait_for "http://127.0.0.1:$p/readyz" "$work/drover-$2.log" 60
  local nodeprof=() runtime=("$DEPS/node_modules/@droverhq/client/dist/agentserver-cli.js" serve -c langgraph.json)
  [ -n "$PROCESSES" ] && runtime+=(--processes "$PROCESSES")
  # An experiment's options (runtime.mjs): DROVER_BENCH_CANCEL_POLL_MS, DROVER_BENCH_HISTORY_LIMIT.
  [ -n "${DROVER_BENCH_CANCEL_POLL_MS:-}${DROVER_BENCH_HISTORY_LIMIT:-}" ] && runtime=(runtime.mjs langgraph.json)
  [ -n "${PROFILE_DIR:-}" ] && nodeprof=(--cpu-prof --cpu-prof-dir "$PROFILE_DIR")
  # RUNTIMES runtime processes share the work, JOBS runs at once in all (each takes its share).
  local i per=$(((JOBS + RUNTIMES - 1) / RUNTIMES))
  for i in $(seq "$RUNTIMES"); do
    DROVER_URL="http://127.0.0.1:$p" DROVER_LANGGRAPH_CONCURRENCY=$per setsid env -C "$work/proj" \
      node $RUNTIME_NODE_FLAGS "${nodeprof[@]}" "${runtime[@]}" >"$work/runtime-$2-$i.log" 2>&1 &
    pids+=($!)
  done
  for i in $(seq "$RUNTIMES"); do
    local log="$work/runtime-$2-$i.log"
    for _ in $(seq 300); do grep -q 'drover-langgraph: serving' "$log" && break; sleep 0.2; done
    grep -q 'drover-langgraph: serving' "$log" || { tail -20 "$log" >&2; return 1; }
    # With LangGraph's schema parser beside it (@langchain/langgraph-api, a dependency of the CLI),
    # the runtime compiles the graph's types once at start: tens of seconds of CPU, not measured.
    for _ in $(seq 1500); do grep -q 'drover-langgraph: schemas registered' "$log" && break; sleep 0.2; done
  done
  URL="http://127.0.0.1:$p"
}

# start_langgraph PORT ROUND: `langgraphjs dev` (in memory); sets URL.
start_langgraph() {
  setsid env -C "$work/proj" node "$DEPS/node_modules/@langchain/langgraph-cli/dist/cli/cli.mjs" dev --host 127.0.0.1 --port "$1" \
    --no-browser --no-reload -n "$JOBS" -c langgraph.json >"$work/langgraph-$2.log" 2>&1 &
  pids+=($!)
  wait_for "http://127.0.0.1:$1/ok" "$work/langgraph-$2.log" 120
  URL="http://127.0.0.1:$1"
}

# cpu_ms SESSION...: CPU time (user and system, ms) of every process in each of these sessions
# (each process started by setsid leads its own), read from /proc: one figure a session.
cpu_ms() {
  python3 -c 'import os,sys
sids=[int(a) for a in sys.argv[1:]]; hz=os.sysconf("SC_CLK_TCK"); t={s: 0 for s in sids}
for p in os.listdir("/proc"):
    if not p.isdigit(): continue
    try: f=open(f"/proc/{p}/stat").read().rsplit(")",1)[1].split()
    except OSError: continue
    if int(f[3]) in t: t[int(f[3])]+=int(f[11])+int(f[12])
print(",".join(str(t[s]*1000//hz) for s in sids))' "$@"
}

# threads_cpu FILE SESSION...: each thread's CPU ticks (user and system) of these sessions' processes,
# as JSON lines {sid, pid, tid, comm, ticks}: which threads (the event loop, V8's GC and compiler
# workers, libuv's pool) the CPU went to.
threads_cpu() {
  local out=$1; shift
  python3 -c 'import os,sys,json
sids={int(a) for a in sys.argv[2:]}; out=open(sys.argv[1],"w")
for p in os.listdir("/proc"):
    if not p.isdigit(): continue
    try:
        f=open(f"/proc/{p}/stat").read().rsplit(")",1)[1].split()
        if int(f[3]) not in sids: continue
        for t in os.listdir(f"/proc/{p}/task"):
            s=open(f"/proc/{p}/task/{t}/stat").read(); comm=s[s.index("(")+1:s.rindex(")")]; g=s.rsplit(")",1)[1].split()
            out.write(json.dumps({"sid":int(f[3]),"pid":int(p),"tid":int(t),"comm":comm,"ticks":int(g[11])+int(g[12])})+"\n")
    except OSError: continue' "$out" "$@"
}

measure() { # system round url
  local load w s prof=""
  load=$(uptime | sed 's/.*load average: //')
  if [ -n "${PROFILE_DIR:-}" ] && [ "$1" = drover ]; then
    (sleep 5; curl -s -o "$PROFILE_DIR/server.pprof" "http://127.0.0.1:$((port + 3))/debug/pprof/profile?seconds=15") &
    prof=$!
  fi
  echo "$(date -u +%T) $1 round $2: runs.wait" >&2
  [ -n "${PROFILE_DIR:-}" ] && [ "$1" = drover ] && curl -s -o "$PROFILE_DIR/metrics-before.txt" "http://127.0.0.1:$((port + 3))/metrics"
  local cpu0 cpu1 cpu_per_run
  cpu0=$(cpu_ms "${pids[@]}")
  [ -n "${PROFILE_DIR:-}" ] && threads_cpu "$PROFILE_DIR/threads-$1-$2-before.jsonl" "${pids[@]}"
  # the phase's monotonic clock (a .cpuprofile's startTime is on it, in µs): for cpuprofile windows
  [ -n "${PROFILE_DIR:-}" ] && python3 -c 'import time; print("runs.wait start", time.monotonic())' >>"$PROFILE_DIR/phase-$1-$2.txt"
  w=$(cd "$work/proj" && BENCH_CPU_SIDS=$(IFS=,; echo "${pids[*]}") timeout "$STEP_TIMEOUT" node bench.mjs wait "$3" "$RUNS" "$CONC") || w='{"mode":"failed","runs":0,"conc":0,"runs_per_s":null,"run_ms_p50":null,"run_ms_p99":null,"errors":1,"first_error":"timed out or failed","first_ms_p50":null,"first_ms_p99":null,"first_values_ms_p50":null,"first_values_ms_p99":null}'
  if [ -n "${PROFILE_DIR:-}" ] && [ "$1" = drover ]; then
    curl -s -o "$PROFILE_DIR/metrics-after.txt" "http://127.0.0.1:$((port + 3))/metrics"
    # the warm-up's runs (WARMUP a client) are counted with the timed ones
    python3 "$here/metrics-diff.py" "$PROFILE_DIR/metrics-before.txt" "$PROFILE_DIR/metrics-after.txt" $((RUNS + WARMUP * CONC)) > "$PROFILE_DIR/per-run.txt"
  fi
  # the server's CPU (for drover: server and runtime) a run, warm-up runs counted (RUNS + WARMUP * CONC);
  # replaced below by bench.mjs's figure of the timed runs alone
  cpu1=$(cpu_ms "${pids[@]}")
  if [ -n "${PROFILE_DIR:-}" ]; then
    threads_cpu "$PROFILE_DIR/threads-$1-$2-after.jsonl" "${pids[@]}"
    python3 "$here/threads-diff.py" "$PROFILE_DIR/threads-$1-$2-before.jsonl" "$PROFILE_DIR/threads-$1-$2-after.jsonl" $((RUNS + WARMUP * CONC)) >"$PROFILE_DIR/threads-$1-$2.txt"
  fi
  [ -n "${PROFILE_DIR:-}" ] && python3 -c 'import time; print("runs.wait end", time.monotonic())' >>"$PROFILE_DIR/phase-$1-$2.txt"
  # one figure a session (drover: the server, then each runtime), then their sum
  cpu_per_run=$(python3 -c 'import sys; a,b,n=[int(x) for x in sys.argv[1].split(",")],[int(x) for x in sys.argv[2].split(",")],int(sys.argv[3]); d=[round((y-x)/n,1) for x,y in zip(a,b)]; print(",".join(map(str,d+[round(sum(d),1)])))' "$cpu0" "$cpu1" $((RUNS + WARMUP * CONC)))
  # bench.mjs's figures, of the timed runs alone, when it read them (then the sum)
  local each
  each=$(python3 -c 'import json,sys; e=json.loads(sys.argv[1]).get("cpu_ms_per_run_each"); print(",".join(map(str,e+[round(sum(e),1)])) if e else "")' "$w")
  [ -n "$each" ] && cpu_per_run=$each
  echo "$(date -u +%T) $1 round $2: runs.stream" >&2
  s=$(cd "$work/proj" && timeout "$STEP_TIMEOUT" node bench.mjs stream "$3" "$STREAM_RUNS" "$STREAM_CONC") || s='{"mode":"failed","runs":0,"conc":0,"runs_per_s":null,"run_ms_p50":null,"run_ms_p99":null,"errors":1,"first_error":"timed out or failed","first_ms_p50":null,"first_ms_p99":null,"first_values_ms_p50":null,"first_values_ms_p99":null}'
  [ -n "$prof" ] && wait "$prof"
  python3 -c 'import json,sys; w,s=json.loads(sys.argv[4]),json.loads(sys.argv[5]); print(json.dumps({"system":sys.argv[1],"round":int(sys.argv[2]),"load":sys.argv[3],"runtimes":int(sys.argv[7]),"runs_per_s":w["runs_per_s"],"wait_ms_p50":w["run_ms_p50"],"wait_ms_p99":w["run_ms_p99"],"runs":w["runs"],"conc":w["conc"],"first_ms_p50":s["first_ms_p50"],"first_ms_p99":s["first_ms_p99"],"first_values_ms_p50":s["first_values_ms_p50"],"first_values_ms_p99":s["first_values_ms_p99"],"stream_runs":s["runs"],"stream_conc":s["conc"],"cpu_ms_per_run":[float(x) for x in sys.argv[6].split(",")][-1],"cpu_ms_per_run_each":[float(x) for x in sys.argv[6].split(",")][:-1],"node_flags":sys.argv[8],"processes":sys.argv[9],"server_cpus":sys.argv[10],"errors":w["errors"]+s["errors"],"first_error":w["first_error"] or s["first_error"]}))' \
    "$1" "$2" "$load" "$w" "$s" "$cpu_per_run" "$([ "$1" = drover ] && echo "$RUNTIMES" || echo 1)" "$RUNTIME_NODE_FLAGS" "$PROCESSES" "$([ "$1" = drover ] && echo "$SERVER_CPUS")" | tee -a "$work/results.jsonl"
}

for round in $(seq "$ROUNDS"); do
  order=(drover langgraph)
  [ $((round % 2)) -eq 0 ] && order=(langgraph drover)
  for sys in "${order[@]}"; do
    [ -n "$ONLY" ] && [ "$ONLY" != "$sys" ] && continue
    port=$((24000 + RANDOM % 4000))
    "start_$sys" "$port" "$round"
    measure "$sys" "$round" "$URL"
    stop_all
  done
done

python3 - "$work/results.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    by.setdefault(r["system"], []).append(r)
med = {s: {k: statistics.median([r[k] for r in rs if r[k] is not None] or [0]) for k in ("runs_per_s", "first_ms_p50", "first_ms_p99", "first_values_ms_p50", "first_values_ms_p99", "cpu_ms_per_run")} for s, rs in by.items()}
for s, m in med.items():
    print(json.dumps({"system": s, "median_of_rounds": len(by[s]), **m}))
if "drover" in med and "langgraph" in med:
    d, l = med["drover"], med["langgraph"]
    print(json.dumps({"drover_over_langgraph": {
        "throughput": round(d["runs_per_s"] / l["runs_per_s"], 2),
        "first_event_p50": round(d["first_ms_p50"] / l["first_ms_p50"], 2),
        "first_event_p99": round(d["first_ms_p99"] / l["first_ms_p99"], 2)}}))
PY
