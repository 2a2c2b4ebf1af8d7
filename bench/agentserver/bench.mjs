// One measurement against an Agent Server (drover's or LangGraph's), through
// LangGraph's SDK Client:
//   node bench.mjs wait   URL RUNS CONC   runs per second: CONC clients, each
//                                         with its own thread, each run
//                                         created and waited for (runs.wait)
//   node bench.mjs stream URL RUNS CONC   time to first streamed event
//                                         (runs.stream), p50 and p99
// The input adds 1 and each node 1: every run adds 4 to the thread's count.
// Prints one JSON line. Every request has the SDK's own timeout; the whole
// is bounded by the caller's `timeout`.
// Before the timed runs, WARMUP runs a client (default 1) are waited for,
// not timed: a server's JIT compiles its hot code in its first thousand or
// so runs, which a short measurement would count. With BENCH_CPU_SIDS (a
// comma-separated list of session ids), the JSON line also holds the CPU
// (user and system, ms) of each session's processes per timed run, read
// from /proc at the start and the end of the timed runs: the warm-up's CPU
// is not counted.
import { readdirSync, readFileSync } from "node:fs";
import { Client } from "@langchain/langgraph-sdk";

const [mode, apiUrl, runsArg, concArg] = process.argv.slice(2);
const RUNS = Number(runsArg ?? 640);
const CONC = Number(concArg ?? 64);
if (!["wait", "stream"].includes(mode) || !apiUrl || !(RUNS > 0) || !(CONC > 0)) {
  console.error("usage: node bench.mjs wait|stream URL RUNS CONC");
  process.exit(2);
}
// maxConcurrency: the SDK's Client sends at most 4 requests at once by default (its AsyncCaller),
// so that CONC clients sharing one Client would be 4 runs at a time, whatever CONC is.
const client = new Client({ apiUrl, apiKey: null, callerOptions: { maxRetries: 0, maxConcurrency: CONC }, timeoutMs: 120_000 });
const input = { count: 1 };
const WARMUP = Number(process.env.WARMUP ?? 1);
if (!Number.isInteger(WARMUP) || WARMUP < 0) {
  console.error(`WARMUP must be a whole number of runs a client, not ${process.env.WARMUP}`);
  process.exit(2);
}
// BENCH_DURABILITY: the runs.wait runs' durability (LangGraph's async, sync or exit; unset: the
// server's default, async), for experiments on what a run's checkpoints cost.
const DURABILITY = process.env.BENCH_DURABILITY ?? "";
if (DURABILITY && !["async", "sync", "exit"].includes(DURABILITY)) {
  console.error(`BENCH_DURABILITY must be async, sync or exit, not ${DURABILITY}`);
  process.exit(2);
}
const SIDS = (process.env.BENCH_CPU_SIDS ?? "").split(",").filter(Boolean).map(Number);
/** Clock ticks a second (USER_HZ): 100 on Linux. */
const HZ = 100;

/** The CPU ms (user and system) of every process in each session of SIDS, from /proc. */
function sessionsCpu() {
  const t = new Map(SIDS.map((s) => [s, 0]));
  for (const p of readdirSync("/proc")) {
    if (!/^\d+$/.test(p)) continue;
    let f;
    try {
      f = readFileSync(`/proc/${p}/stat`, "utf8").split(")").pop().trim().split(" ");
    } catch {
      continue; // gone meanwhile
    }
    const sid = Number(f[3]);
    if (t.has(sid)) t.set(sid, t.get(sid) + ((Number(f[11]) + Number(f[12])) * 1000) / HZ);
  }
  return SIDS.map((s) => t.get(s));
}

function pct(xs, p) {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)] : null;
}
const r2 = (x) => (x == null ? null : Math.round(x * 100) / 100);

/** One run, waited for; throws unless its three nodes ran. */
async function waitRun(thread) {
  const t0 = performance.now();
  const v = await client.runs.wait(thread, "bench", { input, ...(DURABILITY ? { durability: DURABILITY } : {}) });
  if (!v || typeof v.count !== "number" || v.count % 4 !== 0) throw new Error(`unexpected values ${JSON.stringify(v)}`);
  return performance.now() - t0;
}

/** One run, streamed: the time to its first event, to its first data event, and to its end. */
async function streamRun(thread) {
  const t0 = performance.now();
  let first = null;
  let firstData = null;
  let last = null;
  for await (const ev of client.runs.stream(thread, "bench", { input, streamMode: ["values"] })) {
    const t = performance.now() - t0;
    first ??= t;
    if (ev.event === "values") firstData ??= t;
    if (ev.event === "error") throw new Error(`stream error ${JSON.stringify(ev.data)}`);
    last = ev;
  }
  if (!last || last.event !== "values" || last.data.count % 4 !== 0) throw new Error(`unexpected last event ${JSON.stringify(last)}`);
  return { first, firstData, total: performance.now() - t0 };
}

const threads = await Promise.all(Array.from({ length: CONC }, () => client.threads.create().then((t) => t.thread_id)));
let next = 0;
let errors = 0;
let firstError = null;
// Warm-up: WARMUP runs per client, not timed; a failed one is counted with the rest.
await Promise.all(
  threads.map(async (t) => {
    for (let i = 0; i < WARMUP; i++)
      await waitRun(t).catch((e) => {
        errors++;
        firstError ??= String(e?.message ?? e).slice(0, 300);
      });
  }),
);
const cpu0 = sessionsCpu();
const lat = [];
const first = [];
const firstData = [];
const t0 = performance.now();
await Promise.all(
  threads.map(async (thread) => {
    while (next < RUNS) {
      next++;
      try {
        if (mode === "wait") lat.push(await waitRun(thread));
        else {
          const r = await streamRun(thread);
          lat.push(r.total);
          first.push(r.first);
          firstData.push(r.firstData);
        }
      } catch (e) {
        // A failed run is counted, not timed, and the client goes on.
        errors++;
        firstError ??= String(e?.message ?? e).slice(0, 300);
      }
    }
  }),
);
const secs = (performance.now() - t0) / 1000;
const cpu = sessionsCpu().map((ms, i) => Math.round(((ms - cpu0[i]) / Math.max(1, lat.length)) * 10) / 10);
const out = { mode, runs: lat.length, conc: CONC, warmup: WARMUP * CONC, secs: r2(secs), runs_per_s: r2(lat.length / secs), run_ms_p50: r2(pct(lat, 50)), run_ms_p99: r2(pct(lat, 99)), errors, first_error: firstError };
if (SIDS.length) out.cpu_ms_per_run_each = cpu;
if (mode === "stream") Object.assign(out, { first_ms_p50: r2(pct(first, 50)), first_ms_p99: r2(pct(first, 99)), first_values_ms_p50: r2(pct(firstData, 50)), first_values_ms_p99: r2(pct(firstData, 99)) });
console.log(JSON.stringify(out));
