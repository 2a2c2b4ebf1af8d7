import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { Drover, InvalidInputError } from "../dist/index.js";
import { sharedServer, uniq } from "./helpers/server.mjs";

let srv;
let drover;
before(async () => {
  srv = await sharedServer();
  drover = new Drover({ url: srv.url, namespace: uniq("delay") });
});
after(async () => srv.release());

test("run_at and delay: SCHEDULED until due, claimed only then, bad values name the field", async () => {
  const q = uniq("later");
  const runAt = new Date(Date.now() + 3600_000).toISOString();
  const r = await drover.submit(q, [
    { task_id: "at", task_type: "t", run_at: runAt },
    { task_id: "in", task_type: "t", delay: "300ms" },
  ]);
  assert.equal(r.submitted, 2);
  const page = await drover.tasks.list(q, { status: "SCHEDULED" });
  assert.ok(page.tasks.length >= 1 && page.tasks.every((t) => t.current_status === "SCHEDULED"), JSON.stringify(page));
  const s = await drover.session({ ttl: 10 });
  let got = [];
  for (let i = 0; got.length === 0 && i < 30; i++) got = await drover.tasks.claim(q, { session: s, max: 5, wait: 2 });
  assert.deepEqual(got.map((t) => t.task_id), ["in"]);
  assert.equal((await drover.tasks.stats(q)).scheduled, 1);
  await s.close();
  for (const [task, field] of [
    [{ task_id: "b1", task_type: "t", delay: "-1m" }, "delay"],
    [{ task_id: "b2", task_type: "t", run_at: "tomorrow" }, "run_at"],
  ]) {
    await assert.rejects(drover.submit(q, [task]), (err) => {
      assert.ok(err instanceof InvalidInputError);
      assert.match(JSON.stringify(err.problem), new RegExp(field));
      return true;
    });
  }
});
