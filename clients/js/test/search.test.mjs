import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { Drover, InvalidInputError, NotFoundError } from "../dist/index.js";
import { sharedServer, uniq } from "./helpers/server.mjs";

let srv;
let drover;
let q;
before(async () => {
  srv = await sharedServer();
  drover = new Drover({ url: srv.url, namespace: uniq("search") });
  q = uniq("q");
  const tasks = [];
  for (let i = 0; i < 40; i++) tasks.push({ task_id: `r-${String(i).padStart(3, "0")}`, task_type: i < 30 ? "render" : "mail", parameters: { n: i, tag: i % 2 ? "odd" : "even" } });
  await drover.submit(q, tasks);
});
after(async () => srv.release());

test("search: by type, id prefix, parameters and time", async () => {
  assert.equal((await drover.tasks.search(q, { type: "mail" })).tasks.length, 10);
  const byPrefix = await drover.tasks.search(q, { idPrefix: "r-01" });
  assert.deepEqual(byPrefix.tasks.map((t) => t.task_id), ["r-010", "r-011", "r-012", "r-013", "r-014", "r-015", "r-016", "r-017", "r-018", "r-019"]);
  assert.equal(byPrefix.nextCursor, undefined);
  assert.equal((await drover.tasks.search(q, { params: { n: 7 } })).tasks[0].task_id, "r-007");
  assert.equal((await drover.tasks.search(q, { params: { tag: "odd" }, type: "render", status: "PENDING" })).tasks.length, 15);
  assert.equal((await drover.tasks.search(q, { since: "1h", until: new Date(Date.now() + 60_000) })).tasks.length, 40);
  assert.equal((await drover.tasks.search(q, { since: new Date(Date.now() + 60_000) })).tasks.length, 0);
});

test("searchAll: pages with the cursor, each task once", async () => {
  const page = await drover.tasks.search(q, { type: "render", limit: 4 });
  assert.equal(page.tasks.length, 4);
  assert.ok(page.nextCursor);
  const ids = [];
  for await (const t of drover.tasks.searchAll(q, { type: "render", limit: 4 })) ids.push(t.task_id);
  assert.equal(ids.length, 30);
  assert.equal(new Set(ids).size, 30);
});

test("search: bad input names the field; an unknown queue is not found", async () => {
  const first = await drover.tasks.search(q, { type: "render", limit: 2 });
  const cases = [
    [{ params: { "a b": 1 } }, "query.param"],
    [{ since: "2026-11-28T10:00:00Z", until: "2026-11-28T09:00:00Z" }, "query.until"],
    [{ status: "DONE" }, "query.status"],
    [{ type: "mail", cursor: first.nextCursor }, "query.cursor"],
  ];
  for (const [query, location] of cases) {
    await assert.rejects(drover.tasks.search(q, query), (err) => {
      assert.ok(err instanceof InvalidInputError, String(err));
      assert.equal(err.problem.errors?.[0]?.location, location, JSON.stringify(err.problem));
      return true;
    });
  }
  await assert.rejects(drover.tasks.search(uniq("nosuch")), NotFoundError);
});
