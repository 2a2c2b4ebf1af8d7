// The Agent Server runtime's stream writer against a real server, with
// appends that get no answer (DroverError status 0 or 503) injected in the
// client: a write stored but not answered is not sent again, a write not
// stored is, in order; writes that keep failing stop the writer with the
// error after a bounded number of tries rather than looping.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { Drover, DroverError } from "../dist/index.js";
import { RunStreamWriter } from "../dist/agentserver-writer.js";
import { sharedServer, uniq } from "./helpers/server.mjs";

let srv;
let drover;
before(async () => {
  srv = await sharedServer();
  drover = new Drover({ url: srv.url, namespace: uniq("lgwriter") });
});
after(() => srv?.release());

/** A claimed task and a writer for it; `fail(call)` decides each append: "ok", "stored-unanswered", "lost". */
async function claimed(t, fail) {
  const q = uniq("w");
  const id = uniq("w");
  await drover.submit(q, [{ task_id: id, task_type: "t" }]);
  const s = await drover.session({ ttl: 15 });
  t.after(() => s.close());
  const [task] = await drover.tasks.claim(q, { session: s, max: 1, wait: "5s" });
  const real = drover.streams.append.bind(drover.streams);
  let calls = 0;
  const streams = Object.create(drover.streams);
  streams.append = async (...a) => {
    const what = fail(++calls);
    if (what === "lost") throw new DroverError("injected: no answer", { status: 0 });
    const r = await real(...a);
    if (what === "stored-unanswered") throw new DroverError("injected: answer lost", { status: 503 });
    return r;
  };
  const d = Object.create(drover, { streams: { value: streams } });
  return { id, writer: new RunStreamWriter(d, id, s.id, task.token, task.attempt ?? 1), calls: () => calls };
}

async function mine(id) {
  const p = await drover.streams.read(id, { from: 1 });
  return p.events.filter((e) => e.type === "log").map((e) => e.data);
}

test("run stream writer: a write stored but unanswered is not sent twice; a lost one is sent again, in order", async (t) => {
  const plan = { 1: "stored-unanswered", 2: "lost", 3: "lost" };
  const { id, writer, calls } = await claimed(t, (n) => plan[n] ?? "ok");
  for (let i = 0; i < 5; i++) {
    await writer.emit("log", i);
    await writer.flush(); // one append a flush: the plan applies to each in turn
  }
  assert.deepEqual(await mine(id), [0, 1, 2, 3, 4]);
  assert.equal(calls(), 7); // 0 once (stored, unanswered); 1 three times (lost twice); 2, 3, 4 once
});

test("run stream writer: appends that keep failing stop it with the error, after a bounded number of tries", async (t) => {
  const { id, writer, calls } = await claimed(t, () => "lost");
  await writer.emit("log", "never");
  await assert.rejects(writer.flush(), (e) => e instanceof DroverError && e.status === 0);
  await assert.rejects(writer.emit("log", "after"), DroverError);
  assert.ok(calls() <= 8, `${calls()} appends`);
  assert.deepEqual(await mine(id), []);
});

/** A claimed writer whose first append is answered only once letGo() is called: the next events queue behind it. */
async function firstAppendHeld(t) {
  let letGo;
  const held = new Promise((res) => (letGo = res));
  const c = await claimed(t, () => "ok");
  const append = c.writer.drover.streams.append;
  c.writer.drover.streams.append = async (...a) => {
    if (c.calls() === 0) await held;
    return append(...a);
  };
  return { ...c, letGo };
}

test("run stream writer: takeRest waits for the write under way and takes what is queued, with the seq it is to take", async (t) => {
  const { id, writer, calls, letGo } = await firstAppendHeld(t);
  await writer.emit("log", 0);
  await writer.emit("log", 1);
  await writer.emit("log", 2);
  const rest = writer.takeRest();
  letGo();
  const { events, from } = await rest;
  assert.deepEqual(events, [{ type: "log", data: 1 }, { type: "log", data: 2 }]);
  assert.equal(calls(), 1, "the queued events were written");
  assert.deepEqual(await mine(id), [0]);
  assert.equal(from, 3, "after attempt_started and the first event");
});

test("run stream writer: takeRest leaves events past what an outcome carries to the writer", async (t) => {
  const { id, writer, calls, letGo } = await firstAppendHeld(t);
  const big = "x".repeat(60 << 10);
  for (let i = 0; i < 4; i++) await writer.emit("log", `${i}${big}`);
  const rest = writer.takeRest();
  letGo();
  const { events } = await rest;
  assert.deepEqual(events, [], "more than 128 KiB queued: written, none taken");
  assert.deepEqual((await mine(id)).map((d) => d[0]), ["0", "1", "2", "3"]);
});
