#!/usr/bin/env node
// A queue worker whose handler does nothing: for measuring what the client
// and the server cost per task.
//
//   node bench/noop-worker.mjs --url URL --queue Q --concurrency N [--prefetch P]
//        [--namespace NS] [--wait 2s] [--idle-exit 3] [--max-seconds 600] [--wait-go]
//
// --prefetch is the worker's `prefetch` (default: 100, the
// client's default). It claims and acks until SIGTERM/SIGINT (it drains), or
// until no task came for --idle-exit seconds after its first one (0: never), or
// --max-seconds passed; then prints one JSON line: {"pid","claimed",
// "succeeded","failed","lost","ahead","claim_requests","outcome_requests","claims_with_outcomes",
// "seconds"}.
// With --wait-go it prints "ready" and starts claiming on a line on stdin.
import { createInterface } from "node:readline";
import { parseArgs } from "node:util";
import { Drover } from "../dist/index.js";

const { values: a } = parseArgs({
  options: {
    url: { type: "string", default: process.env.DROVER_URL ?? "http://127.0.0.1:8080" },
    queue: { type: "string" },
    concurrency: { type: "string", default: "8" },
    prefetch: { type: "string" },
    namespace: { type: "string" },
    wait: { type: "string", default: "2s" },
    "idle-exit": { type: "string", default: "3" },
    "max-seconds": { type: "string", default: "600" },
    "wait-go": { type: "boolean", default: false },
  },
});
if (!a.queue) {
  console.error("usage: noop-worker.mjs --url URL --queue Q --concurrency N");
  process.exit(2);
}
const drover = new Drover({ url: a.url, ...(a.namespace ? { namespace: a.namespace } : {}) });
if (a["wait-go"]) {
  console.log("ready");
  await new Promise((res) => {
    const rl = createInterface({ input: process.stdin });
    rl.once("line", () => (rl.close(), res()));
  });
}
const t0 = Date.now();
let last = 0;
const opts = { concurrency: Number(a.concurrency), wait: a.wait, name: `noop-${process.pid}` };
if (a.prefetch !== undefined) opts.prefetch = Number(a.prefetch);
const worker = drover.worker(a.queue, opts, () => {
  last = Date.now();
  return null;
});
const idleMs = Number(a["idle-exit"]) * 1000;
const maxMs = Number(a["max-seconds"]) * 1000;
const timer = setInterval(() => {
  const now = Date.now();
  if ((idleMs > 0 && last && now - last > idleMs) || now - t0 > maxMs) void worker.drain();
}, 200);
const st = await worker.done;
clearInterval(timer);
const seconds = ((last || Date.now()) - t0) / 1000;
console.log(JSON.stringify({
  pid: process.pid, claimed: st.claimed, succeeded: st.succeeded, failed: st.failed, lost: st.lost,
  ahead: st.ahead, claim_requests: st.claimRequests, outcome_requests: st.outcomeRequests, claims_with_outcomes: st.claimsWithOutcomes, seconds,
}));
