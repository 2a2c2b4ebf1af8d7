import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { Drover, waitSignal } from "../dist/index.js";
import { sharedServer, uniq } from "./helpers/server.mjs";

let srv;
let drover;
let ns;
before(async () => {
  srv = await sharedServer();
  ns = uniq("qwait");
  drover = new Drover({ url: srv.url, namespace: ns });
});
after(async () => srv.release());

const pause = (ms) => new Promise((r) => setTimeout(r, ms));

async function statusOf(q, id, want, tries = 300) {
  let t;
  for (let i = 0; i < tries; i++) {
    t = await drover.tasks.get(q, id);
    if (want.includes(t.current_status)) return t;
    await pause(20);
  }
  return t;
}

test("a queue handler that returns waitSignal parks its task WAITING; the signal wakes it and the handler gets it, consumed once", async () => {
  const q = uniq("waitq");
  await drover.submit(q, [{ task_id: "t1", task_type: "approve" }, { task_id: "t2", task_type: "approve" }]);
  // Sent before t2 waits: kept, and delivered to its first wait at once.
  await drover.signal("t2", "approval", { data: { by: "early" }, idempotencyKey: "e1" });
  const got = {};
  const worker = drover.worker(q, { signals: false, wait: "1s", concurrency: 2 }, async (task, ctx) => {
    if (!ctx.received) return waitSignal("approval", { timeout: "1h" });
    got[task.task_id] = ctx.received;
    return { approved: ctx.received.data };
  });
  try {
    const t1 = await statusOf(q, "t1", ["WAITING"]);
    assert.equal(t1.current_status, "WAITING", JSON.stringify(t1));
    assert.deepEqual(t1.waiting_for.signals, ["approval"]);
    const t2 = await statusOf(q, "t2", ["SUCCEEDED"]);
    assert.equal(t2.current_status, "SUCCEEDED", JSON.stringify(t2));
    assert.deepEqual(got.t2.data, { by: "early" });
    const sent = await drover.signal("t1", "approval", { data: { by: "ana" }, idempotencyKey: "k1" });
    assert.equal(sent.woke, true, JSON.stringify(sent));
    const done = await statusOf(q, "t1", ["SUCCEEDED"]);
    assert.equal(done.current_status, "SUCCEEDED", JSON.stringify(done));
    assert.deepEqual(done.result, { approved: { by: "ana" } });
    assert.equal(done.attempt, 1, "the wait costs no attempt");
    assert.equal(got.t1.idempotencyKey, "k1");
    const again = await drover.signal("t2", "approval", { data: { by: "early" }, idempotencyKey: "e1" }).catch((e) => e);
    assert.ok(again instanceof Error, "a finished task takes no signal");
    const sigs = (await drover.tasks.get(q, "t1")).signals;
    assert.deepEqual(sigs.map((s) => [s.name, s.consumed]), [["approval", true]]);
  } finally {
    const stats = await worker.drain();
    assert.equal(stats.waited, 1, JSON.stringify(stats));
  }
});

const waitFixture = fileURLToPath(new URL("./fixtures/wait-worker.mjs", import.meta.url));

// A worker process is hit with sig once both its waits were answered
// (answered, not consumed); a worker here is then answered both signals
// again, and its success consumes each once. A paused process, continued,
// sends its success under a claim lost: refused, nothing changes.
async function answeredThen(sig) {
  const q = uniq("waitcrash");
  const id = uniq("c");
  await drover.submit(q, [{ task_id: id, task_type: "approve" }]);
  await drover.signal(id, "approval", { data: { n: 1 }, idempotencyKey: "k1" });
  await drover.signal(id, "approval", { data: { n: 2 }, idempotencyKey: "k2" });
  const child = spawn(process.execPath, [waitFixture, srv.url, ns, q, sig === "SIGKILL" ? "30000" : "3000"], { stdio: ["ignore", "pipe", "inherit"] });
  let out = "";
  child.stdout.on("data", (d) => (out += d));
  const exited = new Promise((r) => child.on("exit", r));
  try {
    for (let i = 0; i < 3000 && !out.includes("answered"); i++) await pause(20);
    assert.ok(out.includes(`answered ${id} k1 k2`), out);
    const before = (await drover.tasks.get(q, id)).signals;
    assert.deepEqual(before.map((s) => [s.idempotency_key, s.consumed]), [["k1", false], ["k2", false]], "answered, not consumed");
    child.kill(sig);
    const got = [];
    const rescuer = drover.worker(q, { signals: false, wait: "1s", ttl: 5 }, async (task, ctx) => {
      if (ctx.received) got.push(ctx.received.idempotencyKey);
      if (got.length < 2) return waitSignal("approval", { timeout: "1h" });
      return { keys: [...got] };
    });
    const done = await statusOf(q, id, ["SUCCEEDED"], 3000);
    await rescuer.drain();
    assert.equal(done.current_status, "SUCCEEDED", JSON.stringify(done));
    assert.deepEqual(done.result, { keys: ["k1", "k2"] });
    assert.deepEqual(done.signals.map((s) => [s.idempotency_key, s.consumed]), [["k1", true], ["k2", true]]);
    if (sig === "SIGSTOP") {
      child.kill("SIGCONT");
      // Its handler returns; drained, its counts say its success was refused.
      for (let i = 0; i < 3000 && !out.includes(`returned ${id}`); i++) await pause(20);
      child.kill("SIGTERM");
      await exited;
      const final = JSON.parse(out.trim().split("\n").at(-1));
      assert.equal(final.succeeded, 0, JSON.stringify(final));
      const after = await drover.tasks.get(q, id);
      assert.deepEqual(after.result, { keys: ["k1", "k2"] });
      assert.deepEqual(after.signals.map((s) => [s.idempotency_key, s.consumed]), [["k1", true], ["k2", true]]);
    }
  } finally {
    child.kill("SIGCONT");
    child.kill("SIGKILL");
  }
}

test("a worker process SIGKILLed after its waits were answered consumed nothing: the next claim gets the same signals, each consumed once", async () => {
  await answeredThen("SIGKILL");
});

test("a worker process SIGSTOPped after its waits were answered: another claim consumes the signals once, and its late success is refused", async () => {
  await answeredThen("SIGSTOP");
});
