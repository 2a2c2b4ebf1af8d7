import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { Drover, NotFoundError } from "../dist/index.js";
import { sharedServer, uniq } from "./helpers/server.mjs";

let srv;
let drover;
before(async () => {
  srv = await sharedServer();
  drover = new Drover({ url: srv.url, namespace: uniq("runnow") });
});
after(async () => srv.release());

test("runNow: a task delayed 1h is claimed at once; every one, then none left", async () => {
  const q = uniq("runnow");
  await drover.submit(q, [
    { task_id: "soon", task_type: "t", delay: "1h" },
    { task_id: "later", task_type: "t", delay: "1h" },
    { task_id: "much-later", task_type: "t", delay: "2h" },
  ]);
  assert.equal((await drover.tasks.stats(q)).scheduled, 3);
  assert.deepEqual(await drover.tasks.runNow(q, ["soon"]), { queue: q, moved: 1 });
  await assert.rejects(drover.tasks.runNow(q, ["soon"]), NotFoundError);
  const s = await drover.session({ ttl: 10 });
  let got = [];
  for (let i = 0; got.length === 0 && i < 30; i++) got = await drover.tasks.claim(q, { session: s, max: 5, wait: 2 });
  assert.deepEqual(got.map((t) => t.task_id), ["soon"]);
  assert.deepEqual(await drover.tasks.runNow(q), { queue: q, moved: 2 });
  assert.deepEqual(await drover.tasks.runNow(q, []), { queue: q, moved: 0 });
  const st = await drover.tasks.stats(q);
  assert.equal(st.scheduled, 0);
  assert.equal(st.pending, 2);
  await s.close();
  await assert.rejects(drover.tasks.runNow(uniq("never")), NotFoundError);
});
