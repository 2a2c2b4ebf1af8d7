import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { Drover, InvalidInputError, sleepFor, sleepUntil } from "../dist/index.js";
import { sharedServer, uniq } from "./helpers/server.mjs";

let srv;
let drover;
before(async () => {
  srv = await sharedServer();
  drover = new Drover({ url: srv.url, namespace: uniq("sleep") });
});
after(async () => srv.release());

const pause = (ms) => new Promise((r) => setTimeout(r, ms));

test("a step that sleeps parks the task: nothing held, not resumed before its time, resumed after with every step run once", async () => {
  const id = uniq("nap");
  const runs = { s1: 0, s2: 0, s3: 0 };
  const steps = [
    { name: "s1", run: (st) => (runs.s1++, sleepFor("1s", [...st, 1])) },
    { name: "s2", run: (st) => (runs.s2++, [...st, 2]) },
    { name: "s3", run: (st) => (runs.s3++, [...st, 3]) },
  ];
  const first = await drover.runSteps(id, steps, { input: [] });
  assert.deepEqual(first.ran, [1]);
  assert.ok(first.sleepingUntil instanceof Date, JSON.stringify(first));
  const until = first.sleepingUntil.getTime();
  const t = await drover.agentTasks.get(id);
  assert.equal(t.step, 1);
  assert.equal(new Date(t.sleep_until).getTime(), until);
  assert.ok(!t.claim || !t.claim.held, `nothing is held while it sleeps: ${JSON.stringify(t.claim)}`);
  const early = await drover.runSteps(id, steps, { input: [] });
  if (Date.now() < until - 50) {
    // Judged by the server's clock: only meaningful while ours says it is early too.
    assert.deepEqual(early.ran, []);
    assert.equal(early.sleepingUntil.getTime(), until);
  }
  while (Date.now() <= until + 20) await pause(until + 25 - Date.now());
  let r = await drover.runSteps(id, steps, { input: [] });
  for (let i = 0; r.sleepingUntil && i < 50; i++) {
    await pause(50); // the server's clock a little behind ours
    r = await drover.runSteps(id, steps, { input: [] });
  }
  assert.deepEqual(r.state, [1, 2, 3]);
  assert.deepEqual(runs, { s1: 1, s2: 1, s3: 1 });
  const done = await drover.agentTasks.get(id);
  assert.equal(done.completed, true);
  assert.equal(done.sleep_until, undefined);
});

test("sleepUntil a time past goes on at once; bad sleeps are refused naming the field, nothing written", async () => {
  const id = uniq("past");
  const r = await drover.runSteps(id, [(st) => sleepUntil(new Date(Date.now() - 60_000), st + 1), (st) => st + 1], { input: 0 });
  assert.equal(r.sleepingUntil, undefined);
  assert.deepEqual(r.ran, [1, 2]);
  assert.equal(r.state, 2);

  assert.throws(() => sleepFor(-1, 0), RangeError);
  const bad = uniq("bad");
  const s = await drover.session({ ttl: 10 });
  try {
    const c = await drover.agentTasks.claim(bad, { session: s, steps: 2 });
    const state = new TextEncoder().encode("1");
    for (const [opts, field, rule] of [
      [{ sleepFor: "-5s" }, "sleep_for", /negative/],
      [{ sleepUntil: "2026-12-01T09:00:00" }, "sleep_until", /zone/],
      [{ sleepUntil: "tomorrow" }, "sleep_until", /RFC 3339/],
      [{ sleepFor: "1s", sleepUntil: "2026-12-01T09:00:00Z" }, "sleep_until", /not both/],
    ]) {
      await assert.rejects(drover.agentTasks.writeStep(bad, 1, { session: s, token: c.token, state, steps: 2, ...opts }), (err) => {
        assert.ok(err instanceof InvalidInputError, String(err));
        const text = JSON.stringify(err.problem);
        assert.match(text, new RegExp(field));
        assert.match(text, rule);
        return true;
      });
    }
    assert.equal((await drover.agentTasks.get(bad)).step, 0);
  } finally {
    await s.close();
  }
});

test("a queue handler that returns sleepFor parks its task: SLEEPING, then claimed again by a worker, its attempt not counted", async () => {
  const q = uniq("napq");
  await drover.submit(q, [{ task_id: "t1", task_type: "poll" }]);
  let runs = 0;
  const worker = drover.worker(q, { signals: false, wait: "1s" }, async () => (++runs === 1 ? sleepFor("1s") : "done"));
  try {
    let t;
    for (let i = 0; i < 200; i++) {
      t = await drover.tasks.get(q, "t1");
      if (t.current_status === "SLEEPING" || t.current_status === "SUCCEEDED") break;
      await pause(20);
    }
    if (t.current_status === "SLEEPING") {
      assert.ok(t.scheduled_at, JSON.stringify(t));
      assert.equal((await drover.tasks.stats(q)).sleeping, 1);
      const listed = await drover.tasks.list(q, { status: "SLEEPING" });
      assert.deepEqual(listed.tasks.map((x) => x.task_id), ["t1"]);
    }
    for (let i = 0; i < 300 && t.current_status !== "SUCCEEDED"; i++) {
      await pause(50);
      t = await drover.tasks.get(q, "t1");
    }
    assert.equal(t.current_status, "SUCCEEDED", JSON.stringify(t));
    assert.equal(t.attempt, 1);
    assert.equal(runs, 2);
    assert.ok(t.transitions.some((x) => x.status === "SLEEPING"), JSON.stringify(t.transitions));
  } finally {
    const stats = await worker.drain();
    assert.equal(stats.slept, 1);
  }
});
