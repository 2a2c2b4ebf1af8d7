// Agent-task steps (runSteps) emitting to the task's stream: tokens and
// progress under the claim, done once the last step completes the task,
// a takeover's boundary with the stale claim fenced, and bad input.
import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { Drover, FencedError, NotFoundError, StreamFullError } from "../dist/index.js";
import { sharedServer, uniq, withTimeout } from "./helpers/server.mjs";

let srv;
let drover;
before(async () => {
  srv = await sharedServer();
  drover = new Drover({ url: srv.url, namespace: uniq("stepstreams") });
});
after(async () => srv.release());

const collect = async (it) => {
  const out = [];
  for await (const ev of it) out.push(ev);
  return out;
};

test("runSteps' steps emit through ctx.stream; the last step's write ends the stream with done", async () => {
  const id = uniq("chat");
  await assert.rejects(drover.streams.read(id), NotFoundError); // never claimed: unknown
  const steps = [
    { name: "think", run: async (st, { stream }) => { await stream.token("Hel"); await stream.token("lo"); return st + "Hello"; } },
    { name: "answer", run: async (st, { stream }) => { await stream.emit("progress", { done: 2, of: 2 }); return st; } },
  ];
  const r = await drover.runSteps(id, steps, { input: "" });
  assert.equal(r.state, "Hello");
  const evs = await withTimeout(collect(drover.streams.follow(id)), 20_000, "the follower did not end");
  assert.deepEqual(evs.map((e) => [e.seq, e.attempt, e.type]), [
    [1, 1, "attempt_started"], [2, 1, "token"], [3, 1, "token"], [4, 1, "progress"], [5, 1, "done"],
  ]);
  assert.deepEqual(evs[1].data, { text: "Hel" });
  assert.equal(evs[4].data.outcome, "succeeded");
});

test("after a takeover the stale claim's emit is FencedError and nothing of it follows the boundary", async () => {
  const id = uniq("takeover");
  const s1 = await drover.session({ ttl: 5 });
  const c = await drover.agentTasks.claim(id, { session: s1, steps: 2 });
  const stale = drover.streams.writer(id, { session: s1, token: c.token });
  await stale.token("first ");
  await stale.flush();
  await s1.close(); // its process died: the claim ends with the session
  const r = await drover.runSteps(id, [
    async (st, { stream }) => { await stream.token("second "); return st; },
    async (st) => st,
  ], { input: 0 });
  assert.deepEqual(r.ran, [1, 2]);
  await stale.token("late");
  await assert.rejects(stale.flush(), FencedError);
  await assert.rejects(stale.emit("log", "x"), FencedError);
  const evs = await withTimeout(collect(drover.streams.follow(id)), 20_000, "the follower did not end");
  assert.deepEqual(evs.map((e) => [e.attempt, e.type]), [
    [1, "attempt_started"], [1, "token"], [2, "attempt_lost"], [2, "attempt_started"], [2, "token"], [2, "done"],
  ]);
  assert.ok(!evs.some((e) => JSON.stringify(e.data).includes("late")));
});

test("an over-size event is StreamFullError (413) and a stale token FencedError (409): nothing stored", async () => {
  const id = uniq("bad");
  const s = await drover.session({ ttl: 10 });
  try {
    const c = await drover.agentTasks.claim(id, { session: s, steps: 1 });
    await assert.rejects(drover.streams.append(id, { session: s, token: c.token, events: [{ type: "log", data: "x".repeat(70 << 10) }] }), StreamFullError);
    await assert.rejects(drover.streams.append(id, { session: s, token: c.token + 1000, events: [{ type: "log" }] }), FencedError);
    assert.equal((await drover.streams.read(id)).events.length, 0);
  } finally {
    await s.close();
  }
});

test("a step that throws has its events stored before its claim is released", async () => {
  const id = uniq("throws");
  const big = "x".repeat(60_000);
  const steps = [
    async (st, { stream }) => {
      // Three writes' worth: a release while the first is under way would fence the others.
      for (let i = 0; i < 30; i++) stream.emit("log", big).catch(() => {});
      throw new Error("the step failed");
    },
  ];
  await assert.rejects(drover.runSteps(id, steps, { input: 0 }), /the step failed/);
  const evs = [];
  for (let from = 1, i = 0; i < 100; i++) {
    const page = await drover.streams.read(id, { from });
    if (page.events.length === 0) break;
    evs.push(...page.events);
    from = page.next;
  }
  assert.equal(evs.filter((e) => e.type === "log").length, 30, `stored ${evs.map((e) => e.type)}`);
});
