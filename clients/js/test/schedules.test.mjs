import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { ConflictError, Drover, InvalidInputError, NotFoundError } from "../dist/index.js";
import { sharedServer, uniq } from "./helpers/server.mjs";

let srv;
let drover;
before(async () => {
  srv = await sharedServer();
  drover = new Drover({ url: srv.url, namespace: uniq("sched") });
});
after(async () => srv.release());

test("schedules: bad input names the field and stores nothing; a name in use is a ConflictError", async () => {
  await assert.rejects(drover.schedules.create("a", { cron: "0 9 * 13 *", queue: "q", type: "t" }), (err) => {
    assert.ok(err instanceof InvalidInputError, String(err));
    assert.match(err.message, /field 4 \(month\)/);
    return true;
  });
  await assert.rejects(drover.schedules.create("a", { cron: "0 9 * * *", tz: "Nowhere/City", queue: "q", type: "t" }), InvalidInputError);
  await assert.rejects(drover.schedules.create("a", { every: 0.5, queue: "q", type: "t" }), InvalidInputError);
  assert.deepEqual(await drover.schedules.list(), []);
  await drover.schedules.create("dup", { every: "1h", queue: "q", type: "t" });
  await assert.rejects(drover.schedules.create("dup", { every: "1h", queue: "q", type: "t" }), ConflictError);
  await drover.schedules.delete("dup");
  await assert.rejects(drover.schedules.get("dup"), NotFoundError);
});

test("schedules: create, update, pause, trigger, history, resume, delete", async () => {
  const s = await drover.schedules.create("nightly", {
    cron: "0 2 * * *", tz: "Europe/Paris", queue: "reports", type: "report", params: { full: true }, jitter: 30,
  });
  assert.equal(s.overlap, "skip");
  assert.equal(s.catchup, "latest");
  assert.equal(s.catchup_window, "1h0m0s");
  assert.equal(s.jitter, "30s");
  assert.ok(s.next_fire_at);
  const u = await drover.schedules.update("nightly", { every: 3600, jitter: 0 });
  assert.equal(u.every, "1h0m0s");
  assert.equal(u.cron, undefined);
  const p = await drover.schedules.pause("nightly");
  assert.equal(p.paused, true);
  assert.equal(p.next_fire_at, undefined);
  const f = await drover.schedules.trigger("nightly");
  assert.match(f.task_id, /^nightly-manual-/);
  const h = await drover.schedules.history("nightly", { limit: 10 });
  assert.equal(h.length, 1);
  assert.equal(h[0].task_id, f.task_id);
  assert.equal(h[0].outcome, "PENDING");
  assert.ok(h[0].nominal_time && h[0].submitted_at);
  const r = await drover.schedules.resume("nightly");
  assert.equal(r.paused, false);
  assert.ok((await drover.schedules.list()).some((x) => x.name === "nightly"));
  await drover.schedules.delete("nightly");
});

test("schedules: the server fires an every-1s schedule of its namespace once per tick", async () => {
  const own = new Drover({ url: srv.url }); // the server fires the schedules of its --namespace
  const name = uniq("tick");
  await own.schedules.create(name, { every: "1s", queue: uniq("ticks"), type: "t", overlap: "allow" });
  let h = [];
  for (let i = 0; i < 200 && h.length < 2; i++) {
    h = await own.schedules.history(name);
    if (h.length < 2) await new Promise((r) => setTimeout(r, 100));
  }
  assert.ok(h.length >= 2, `fires: ${JSON.stringify(h)}`);
  assert.equal(new Set(h.map((x) => x.task_id)).size, h.length);
  assert.equal(Date.parse(h[0].nominal_time) - Date.parse(h[1].nominal_time), 1000);
  await own.schedules.delete(name);
});
