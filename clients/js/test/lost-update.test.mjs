// The lost-update experiment: 5 worker processes x 3 invocations of a real
// LangGraph StateGraph on one thread, each incrementing a counter in the
// thread's state through DroverSaver. Protected (compare-and-swap, or a
// lock), the counter ends at exactly 15; unprotected, updates are lost.
import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { Drover } from "../dist/index.js";
import { DroverSaver } from "../dist/langgraph.js";
import { sharedServer, uniq, withTimeout } from "./helpers/server.mjs";

let srv;
before(async () => (srv = await sharedServer()));
after(async () => srv.release());

const fixture = fileURLToPath(new URL("./fixtures/graph-worker.mjs", import.meta.url));
const WORKERS = 5;
const INVOCATIONS = 3;

async function experiment(protect) {
  const ns = uniq("lost");
  const thread = uniq("thread");
  const procs = Array.from({ length: WORKERS }, () => {
    const p = spawn(process.execPath, [fixture, srv.url, ns, thread, protect, String(INVOCATIONS), "60"], { stdio: ["pipe", "pipe", "inherit"] });
    p.out = "";
    p.stdout.on("data", (d) => (p.out += d));
    p.exited = new Promise((res) => p.on("exit", (code) => res(code)));
    return p;
  });
  try {
    const deadline = Date.now() + 30_000;
    while (!procs.every((p) => p.out.includes("ready"))) {
      if (Date.now() > deadline) throw new Error("workers not ready within 30 s");
      await new Promise((r) => setTimeout(r, 20));
    }
    for (const p of procs) p.stdin.end("go\n"); // all at once
    const codes = await withTimeout(Promise.all(procs.map((p) => p.exited)), 60_000, "workers did not finish within 60 s");
    assert.deepEqual(codes, Array(WORKERS).fill(0), procs.map((p) => p.out).join("\n"));
    const reports = procs.map((p) => JSON.parse(p.out.trim().split("\n").pop()));
    const saver = new DroverSaver({ drover: new Drover({ url: srv.url, namespace: ns }) });
    const head = await saver.getTuple({ configurable: { thread_id: thread } });
    return { counter: head.checkpoint.channel_values.counter, conflicts: reports.reduce((a, r) => a + r.conflicts, 0), invocations: reports.reduce((a, r) => a + r.done, 0) };
  } finally {
    for (const p of procs) p.kill("SIGKILL");
  }
}

test("without protection, concurrent invocations lose updates (fewer than 15)", async () => {
  const r = await experiment("none");
  assert.equal(r.invocations, WORKERS * INVOCATIONS);
  assert.ok(r.counter < WORKERS * INVOCATIONS, `expected lost updates, counter is ${r.counter}`);
  console.log(`# protection none: counter ${r.counter} of ${WORKERS * INVOCATIONS}`);
});

test("with compare-and-swap protection, exactly 15 (conflicts are re-invoked)", async () => {
  const r = await experiment("cas");
  assert.equal(r.counter, WORKERS * INVOCATIONS);
  assert.ok(r.conflicts > 0, "the race was real: some writes conflicted");
  console.log(`# protection cas: counter ${r.counter}, conflicts retried ${r.conflicts}`);
});

test("with a drover lock held across each invocation, exactly 15", async () => {
  const r = await experiment("lock");
  assert.equal(r.counter, WORKERS * INVOCATIONS);
  console.log(`# protection lock: counter ${r.counter}`);
});
