import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { Drover, NotFoundError } from "../dist/index.js";
import { sharedServer, uniq, until } from "./helpers/server.mjs";

let srv;
before(async () => (srv = await sharedServer()));
after(async () => srv.release());

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

test("a paused queue: running tasks finish and are acked, nothing is claimed, submissions are taken; resume drains it", async () => {
  const drover = new Drover({ url: srv.url, namespace: uniq("pause") });
  const q = uniq("q");
  await drover.submit(q, Array.from({ length: 10 }, (_, i) => ({ task_id: `t-${i}`, task_type: "t" })));
  let release;
  const gate = new Promise((r) => (release = r));
  const started = [];
  const worker = drover.worker(q, { concurrency: 2, prefetch: 1, ttl: 10, wait: 2 }, async (task) => {
    started.push(task.task_id);
    await gate;
    return { ok: true };
  });
  try {
    await until(() => started.length >= 2, 10_000, "two tasks running");
    const p = await drover.tasks.pause(q);
    assert.equal(p.paused, true);
    assert.equal(p.changed, true);
    assert.ok(p.since, "since is set");
    assert.equal((await drover.tasks.pause(q)).changed, false, "pausing a paused queue is not an error");
    release();
    // The tasks claimed before the pause (running, or claimed ahead) finish and are acked.
    await until(async () => {
      const st = await drover.tasks.stats(q);
      return st.running === 0 && st.succeeded === started.length;
    }, 10_000, "the running tasks acked");
    const atPause = started.length;
    const res = await drover.submit(q, [{ task_id: "late", task_type: "t" }]);
    assert.equal(res.submitted, 1, "a paused queue takes submissions");
    // A window in which the worker would have claimed the rest: it claims nothing.
    await sleep(1000);
    assert.equal(started.length, atPause, `no task started while paused: ${started}`);
    const st = await drover.tasks.stats(q);
    assert.equal(st.paused, true);
    assert.equal(st.pending, 11 - atPause);
    const r = await drover.tasks.resume(q);
    assert.equal(r.paused, false);
    assert.equal(r.changed, true);
    assert.equal((await drover.tasks.resume(q)).changed, false, "resuming a running queue is not an error");
    await until(() => started.length === 11, 15_000, () => `every task ran after the resume (${started.length})`);
    await until(async () => (await drover.tasks.stats(q)).succeeded === 11, 10_000, "all acked");
  } finally {
    await worker.drain();
  }
});

test("pause and resume of an unknown queue are NotFoundError", async () => {
  const drover = new Drover({ url: srv.url, namespace: uniq("pause") });
  await assert.rejects(drover.tasks.pause(uniq("nope")), NotFoundError);
  await assert.rejects(drover.tasks.resume(uniq("nope")), NotFoundError);
});
