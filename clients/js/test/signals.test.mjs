// Signals against a real server: sent before the wait and still delivered,
// delivered once however often retried, a timeout the next step acts on,
// and the errors of the route (unknown task, finished task, full inbox).
import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { Drover, InboxFullError, NotFoundError, TaskFinishedError, waitSignal } from "../dist/index.js";
import { freePort, sharedServer, uniq, until } from "./helpers/server.mjs";

let srv;
let drover;
let ns;
before(async () => {
  srv = await sharedServer();
  ns = uniq("signals");
  drover = new Drover({ url: srv.url, namespace: ns });
});

/** A client of the server that calls onClaim(n) before its n-th agent-task claim and records each claim's outcome in seen. */
function watched(onClaim) {
  const seen = [];
  const client = new Drover({
    url: srv.url, namespace: ns,
    fetch: async (url, init) => {
      if (!(init?.method === "POST" && /\/v1\/agent-tasks\/[^/]+\/claim/.test(String(url)))) return fetch(url, init);
      await onClaim(seen.length + 1);
      const res = await fetch(url, init);
      seen.push(res.status);
      return res;
    },
  });
  return [client, seen];
}
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

test("a signal without a key is sent again when its request never left", async () => {
  const id = uniq("conn");
  await drover.runSteps(id, [{ name: "wait", run: () => waitSignal("go", {}, 1) }, { name: "then", run: (x) => x }]);
  const closed = await freePort(); // nothing listens there: the connection is refused
  let calls = 0;
  const client = new Drover({
    url: srv.url, namespace: ns,
    fetch: (url, init) => (calls++ === 0 ? fetch(String(url).replace(new URL(srv.url).host, `127.0.0.1:${closed}`), init) : fetch(url, init)),
  });
  const r = await client.signal(id, "go", { data: 1 });
  assert.equal(calls, 2);
  assert.ok(r.stored);
});

test("resumeWithin is counted from each wait's start", async () => {
  const id = uniq("budget");
  const [client, seen] = watched(() => {});
  const sending = (async () => {
    await until(() => seen.length >= 2, 20_000, "the run did not claim after its wait"); // the claim right after the wait found no signal
    await drover.signal(id, "go", { data: "b" });
  })();
  const r = await client.runSteps(id, [
    { name: "slow", run: async () => (await new Promise((res) => setTimeout(res, 1000)), waitSignal("go", {}, "a")) }, // longer than resumeWithin
    { name: "then", run: (s, { received }) => `${s}+${received?.data}` },
  ], { resumeWithin: "800ms" });
  await sending;
  assert.equal(r.waitingFor, undefined, JSON.stringify(seen));
  assert.deepEqual(r.ran, [1, 2]);
  assert.equal(r.state, "a+b");
});

test("a run resuming after a wait goes on after the steps another run wrote; a claim held elsewhere is still waiting", async () => {
  const id = uniq("moved");
  let open;
  const gate = new Promise((r) => (open = r));
  let blocked = false;
  const [a, seen] = watched(async (n) => {
    if (n === 3) { // 1: the run's first claim, 2: its claim right after the wait
      blocked = true;
      await gate;
    }
  });
  const runs = [];
  const steps = (who) => [
    { name: "plan", run: () => waitSignal("go", {}, { v: 1 }) },
    { name: "act", run: async () => {
      runs.push(["act", who]);
      if (who === "other") {
        open(); // run A claims while this run holds the task
        await until(() => seen.includes(409), 10_000, "run A did not meet the held claim");
      }
      return waitSignal("more", {}, { v: 2 });
    } },
    { name: "finish", run: (s) => (runs.push(["finish", who]), { ...s, v: 3 }) },
  ];
  const ra = a.runSteps(id, steps("A"), { resumeWithin: 60 });
  await until(() => blocked, 20_000, "run A did not poll");
  await drover.signal(id, "go", { data: 1 });
  const rb = await drover.runSteps(id, steps("other"));
  assert.deepEqual(rb.waitingFor?.signals, ["more"]);
  await drover.signal(id, "more", { data: 2 });
  const r = await ra;
  assert.ok(seen.includes(409), JSON.stringify(seen));
  assert.deepEqual(runs, [["act", "other"], ["finish", "A"]]); // act ran once, by the other run
  assert.deepEqual(r.ran, [1, 3]);
  assert.deepEqual(r.state, { v: 3 });
});
