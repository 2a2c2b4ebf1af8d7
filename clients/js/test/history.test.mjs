import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { Drover, InvalidInputError, NotFoundError, Permanent } from "../dist/index.js";
import { sharedServer, uniq, until } from "./helpers/server.mjs";

let srv;
let drover;
before(async () => {
  srv = await sharedServer();
  // The server's own namespace: it keeps that one's history from its start
  // (another namespace's only from the first history request that finds a
  // queue in it), and the queue's name is unique to this run.
  drover = new Drover({ url: srv.url });
});
after(async () => srv.release());

test("history: a queue's minutes count what its workers did, as the server closes them", { timeout: 240_000 }, async () => {
  const q = uniq("h");
  await assert.rejects(drover.tasks.history(q), NotFoundError);
  await drover.submit(q, [
    // Task ids are shared by every queue of the namespace: unique to this run.
    ...Array.from({ length: 5 }, (_, i) => ({ task_id: `${q}-ok${i}`, task_type: "ok" })),
    { task_id: `${q}-bad`, task_type: "bad" },
  ]);
  const w = drover.worker(q, { concurrency: 3, wait: 1, signals: false }, async (task) => {
    if (task.task_type === "bad") throw new Permanent("no such input");
    return "done";
  });
  await until(async () => {
    const st = await drover.tasks.stats(q);
    return st.succeeded === 5 && st.dead === 1;
  }, 30_000, "5 succeeded, 1 dead");
  await w.drain();
  // A minute is closed about two seconds after it ends: wait for it.
  let h;
  const deadline = Date.now() + 180_000;
  for (;;) {
    h = await drover.tasks.history(q);
    if (h.totals.processed === 5 && h.totals.failed === 1) break;
    assert.ok(Date.now() < deadline, `no minute closed with 5 processed and 1 failed: ${JSON.stringify(h.totals)}`);
    await new Promise((r) => setTimeout(r, 500));
  }
  assert.equal(h.buckets.length, 60);
  assert.equal(h.bucket_seconds, 60);
  assert.equal(h.totals.retried, 0);
  assert.equal(h.latency.samples, 6);
  assert.ok(h.latency.p99_seconds >= h.latency.p50_seconds);
  assert.ok(h.closed_through, "a minute was closed");
  const counted = h.buckets.filter((b) => b.processed > 0);
  assert.ok(counted.every((b) => b.closed));
  const day = await drover.tasks.history(q, { window: "24h" });
  assert.equal(day.buckets.length, 1440);
  assert.deepEqual(day.totals, h.totals);
  await assert.rejects(drover.tasks.history(q, { window: "2h" }), InvalidInputError);
});
