// Signals against a real server: sent before the wait and still delivered,
// delivered once however often retried, a timeout the next step acts on,
// and the errors of the route (unknown task, finished task, full inbox).
import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { Drover, InboxFullError, NotFoundError, TaskFinishedError, waitSignal } from "../dist/index.js";
import { sharedServer, uniq } from "./helpers/server.mjs";

let srv;
let drover;
before(async () => {
  srv = await sharedServer();
  drover = new Drover({ url: srv.url, namespace: uniq("signals") });
});
after(async () => srv.release());

test("a signal sent before the step waits for it is delivered to the next step", async () => {
  const id = uniq("early");
  const got = [];
  const r = await drover.runSteps(id, [
    { name: "draft", run: () => ({ plan: "p" }) },
    {
      name: "ask",
      run: async (s) => {
        // Step 1 is checkpointed: the task takes signals. This one comes before the wait exists.
        const sent = await drover.signal(id, "approval", { data: { approved: true, by: "ana" }, idempotencyKey: "k1" });
        assert.equal(sent.stored, true);
        return waitSignal("approval", { timeout: "1h" }, s);
      },
    },
    { name: "act", run: (s, { received }) => (got.push(received), { ...s, approved: received.data.approved }) },
  ]);
  assert.deepEqual(r.ran, [1, 2, 3]); // the wait found its signal at once: no second run needed
  assert.equal(r.waitingFor, undefined);
  assert.deepEqual(r.state, { plan: "p", approved: true });
  assert.equal(got.length, 1);
  assert.equal(got[0].name, "approval");
  assert.equal(got[0].timedOut, false);
  assert.equal(got[0].idempotencyKey, "k1");
  assert.deepEqual(got[0].data, { approved: true, by: "ana" });
});

test("a signal retried with its key is delivered once; the next wait for that name times out", async () => {
  const id = uniq("once");
  const seen = [];
  const steps = [
    { name: "wait-1", run: () => waitSignal("approval", { timeout: "1h" }, { n: 0 }) },
    { name: "wait-2", run: (s, { received }) => (seen.push(received), waitSignal(["approval", "reject"], { timeout: 1 }, { n: 1 })) },
    { name: "act", run: (s, { received }) => (seen.push(received), { n: 2 }) },
  ];
  const first = await drover.runSteps(id, steps);
  assert.deepEqual(first.ran, [1]);
  assert.deepEqual(first.waitingFor.signals, ["approval"]);
  assert.ok(first.waitingFor.until);

  const results = [];
  for (let i = 0; i < 3; i++) results.push(await drover.signal(id, "approval", { data: { try: i }, idempotencyKey: "review-42" }));
  assert.deepEqual(results.map((r) => r.stored), [true, false, false]);
  // (woke is about queue tasks parked WAITING; an agent task is claimed again by its runner.)

  const done = await drover.runSteps(id, steps, { resumeWithin: "20s" });
  assert.deepEqual(done.ran, [2, 3]);
  assert.equal(seen.length, 2);
  assert.deepEqual(seen[0].data, { try: 0 }); // the first send's data: the retries stored nothing
  assert.equal(seen[1].timedOut, true); // the retried signal did not come a second time
  assert.equal(seen[1].name, undefined);
  const t = await drover.agentTasks.get(id);
  assert.equal(t.completed, true);
});

test("a waiting task holds nothing: runSteps returns waitingFor, and resumes from another call", async () => {
  const id = uniq("park");
  const steps = [
    { name: "plan", run: () => waitSignal("go", {}, "planned") },
    { name: "act", run: (s, { received }) => `${s} then ${received.data}` },
  ];
  const a = await drover.runSteps(id, steps);
  assert.deepEqual(a.waitingFor.signals, ["go"]);
  assert.equal(a.waitingFor.until, undefined); // no timeout
  const claim = (await drover.agentTasks.get(id)).claim;
  assert.ok(!claim || !claim.held, "a parked task is not claimed");
  const b = await drover.runSteps(id, steps); // before the signal: runs nothing
  assert.deepEqual(b.ran, []);
  assert.ok(b.waitingFor);
  await drover.signal(id, "go", { data: "went" });
  const c = await drover.runSteps(id, steps);
  assert.deepEqual(c.ran, [2]);
  assert.equal(c.state, "planned then went");
});

test("signal errors: 404 unknown task, 409 finished task, 409 full inbox", async () => {
  await assert.rejects(drover.signal(uniq("nobody"), "approval"), NotFoundError);

  const done = uniq("done");
  await drover.runSteps(done, [() => 1]);
  await assert.rejects(drover.signal(done, "approval", { data: 1 }), (err) => {
    assert.ok(err instanceof TaskFinishedError, String(err));
    assert.equal(err.status, 409);
    return true;
  });

  const q = uniq("q");
  const full = uniq("full");
  await drover.submit(q, [{ task_id: full, task_type: "t" }]);
  for (let i = 0; i < 1000; i += 50) {
    await Promise.all(Array.from({ length: 50 }, (_, j) => drover.signal(full, "note", { idempotencyKey: `k${i + j}` })));
  }
  await assert.rejects(drover.signal(full, "note", { idempotencyKey: "one-more" }), (err) => {
    assert.ok(err instanceof InboxFullError, String(err));
    assert.equal(err.status, 409);
    assert.equal(err.kind, "inbox-full");
    return true;
  });
  // A retry of a signal already stored is still answered, storing nothing.
  assert.equal((await drover.signal(full, "note", { idempotencyKey: "k7" })).stored, false);
});
