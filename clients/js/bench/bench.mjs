#!/usr/bin/env node
// Throughput of JS queue workers on no-op tasks: submits --tasks tasks,
// starts --workers processes of noop-worker.mjs (--concurrency each), lets
// them go at once, and measures until every task succeeded.
//
//   npm run build && node bench/bench.mjs [--url URL] [--tasks 20000] [--workers 16] [--concurrency 8] [--prefetch P]
//
// --prefetch is passed to each worker (default: 100, the client's default).
//
// Without --url (or $DROVER_URL) it starts a drover server of its own
// ($DROVER_BIN, else built from this repository) on free loopback ports.
// Prints a line "tasks/s: N" and a final JSON line with the details.
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { randomBytes } from "node:crypto";
import { Drover } from "../dist/index.js";
import { startServer } from "../test/helpers/server.mjs";

const { values: a } = parseArgs({
  options: {
    url: { type: "string", default: process.env.DROVER_URL },
    tasks: { type: "string", default: "20000" },
    workers: { type: "string", default: "16" },
    concurrency: { type: "string", default: "8" },
    prefetch: { type: "string" },
    "timeout-seconds": { type: "string", default: "600" },
  },
});
const N = Number(a.tasks);
const W = Number(a.workers);
const server = a.url ? undefined : await startServer();
const url = a.url ?? server.url;
const namespace = `bench-${Date.now().toString(36)}-${randomBytes(3).toString("hex")}`;
const queue = "noop";
const drover = new Drover({ url, namespace });
const procs = [];
/** What the tasks not yet succeeded are doing, and which workers still run: for a run that times out. */
async function unfinished() {
  const out = [];
  for (const status of ["PENDING", "RUNNING", "RETRYING", "DEAD"]) {
    const page = await drover.tasks.list(queue, { status, limit: 10 }).catch((e) => ({ tasks: [], error: String(e) }));
    for (const t of page.tasks ?? []) {
      const last = t.transitions?.at(-1);
      out.push(`${t.task_id} ${t.current_status} attempt ${t.attempt}${last ? ` (${last.status} at ${last.at}${last.worker ? ` on ${last.worker}` : ""})` : ""}`);
    }
  }
  const alive = procs.filter((p) => p.exitCode === null && p.signalCode === null).length;
  return `${out.join("; ") || "no task listed"}; ${alive} of ${procs.length} workers running`;
}

try {
  const ts = Date.now();
  async function* tasks() {
    for (let i = 0; i < N; i++) yield { task_id: `n-${i}`, task_type: "noop" };
  }
  const sub = await drover.submit(queue, tasks());
  if (sub.submitted !== N) throw new Error(`submitted ${sub.submitted} of ${N}: ${JSON.stringify(sub.rejected.slice(0, 3))}`);
  const submitSeconds = (Date.now() - ts) / 1000;

  const script = fileURLToPath(new URL("./noop-worker.mjs", import.meta.url));
  for (let i = 0; i < W; i++) {
    const p = spawn(process.execPath, [script, "--url", url, "--namespace", namespace, "--queue", queue, "--concurrency", a.concurrency, ...(a.prefetch ? ["--prefetch", a.prefetch] : []), "--wait-go", "--idle-exit", "0", "--max-seconds", String(Number(a["timeout-seconds"]) + 60)], { stdio: ["pipe", "pipe", "inherit"] });
    p.lines = [];
    createInterface({ input: p.stdout }).on("line", (l) => p.lines.push(l));
    p.exited = new Promise((r) => p.on("exit", r));
    procs.push(p);
  }
  const readyBy = Date.now() + 60_000;
  while (!procs.every((p) => p.lines.includes("ready"))) {
    if (Date.now() > readyBy) throw new Error("workers not ready within 60 s");
    await new Promise((r) => setTimeout(r, 20));
  }
  const t0 = Date.now();
  for (const p of procs) p.stdin.end("go\n");
  const deadline = t0 + Number(a["timeout-seconds"]) * 1000;
  let st;
  for (;;) {
    st = await drover.tasks.stats(queue);
    if (st.succeeded >= N) break;
    if (Date.now() > deadline) throw new Error(`only ${st.succeeded} of ${N} within the timeout: ${await unfinished()}`);
    await new Promise((r) => setTimeout(r, 50));
  }
  const seconds = (Date.now() - t0) / 1000;
  // The workers run until every task succeeded (they do not leave on their
  // own when idle: a server that stalls for a moment must not end them).
  for (const p of procs) p.kill("SIGTERM");
  await Promise.all(procs.map((p) => p.exited));
  const per = procs.map((p) => JSON.parse(p.lines[p.lines.length - 1]));
  const rate = N / seconds;
  console.log(`tasks/s: ${rate.toFixed(0)}`);
  console.log(JSON.stringify({
    client: "js",
    tasks: N,
    workers: W,
    concurrency: Number(a.concurrency),
    prefetch: Number(a.prefetch ?? 100),
    seconds: Number(seconds.toFixed(3)),
    tasks_per_second: Number(rate.toFixed(1)),
    submit_seconds: Number(submitSeconds.toFixed(3)),
    succeeded: per.reduce((s, x) => s + x.succeeded, 0),
    lost: per.reduce((s, x) => s + x.lost, 0),
    per_worker: per.map((x) => x.succeeded),
  }));
} finally {
  for (const p of procs) p.kill("SIGKILL");
  await server?.stop();
}
