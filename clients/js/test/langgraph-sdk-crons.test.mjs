// LangGraph's SDK Client's crons against a real drover server: a cron is
// created on a thread and on an assistant, searched, counted, updated
// and deleted through client.crons; a fire of its schedule (triggered
// through drover's schedules API, as a tick does) makes a run on the
// thread with the cron's input; bad input is refused and stores nothing.
import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { Client } from "@langchain/langgraph-sdk";
import { sharedServer, uniq } from "./helpers/server.mjs";

let srv;
before(async () => {
  srv = await sharedServer();
});
after(async () => srv.release());

test("langgraph sdk: crons create, fire, search, count, update, delete", async () => {
  const ns = uniq("lgcron");
  const headers = { "Drover-Namespace": ns };
  const c = new Client({ apiUrl: srv.url, apiKey: null, defaultHeaders: headers, callerOptions: { maxRetries: 0 } });
  const reg = await fetch(`${srv.url}/v1/agent-server/graphs/agent`, { method: "PUT", headers: { ...headers, "Content-Type": "application/json" }, body: "{}" });
  assert.equal(reg.status, 200, await reg.text());
  const thread = await c.threads.create();

  const cron = await c.crons.createForThread(thread.thread_id, "agent", {
    schedule: "*/5 * * * *",
    input: { messages: [{ role: "human", content: "tick" }] },
    metadata: { team: "ops" },
  });
  assert.equal(cron.thread_id, thread.thread_id);
  assert.equal(cron.schedule, "*/5 * * * *");
  assert.ok(cron.next_run_date, "a next run date");
  const solo = await c.crons.create("agent", { schedule: "@daily", input: { n: 1 } });
  assert.equal(solo.thread_id, null);

  assert.equal(await c.crons.count({ threadId: thread.thread_id }), 1);
  assert.equal(await c.crons.count({ metadata: { team: "ops" } }), 1);
  const found = await c.crons.search({ assistantId: "agent", sortBy: "created_at", sortOrder: "asc" });
  assert.deepEqual(found.map((x) => x.cron_id), [cron.cron_id, solo.cron_id]);

  // A fire of the cron's schedule makes one run on the thread with its input.
  const fire = await fetch(`${srv.url}/v1/schedules/agent-cron-${cron.cron_id}/trigger`, { method: "POST", headers });
  assert.equal(fire.status, 200, await fire.text());
  let runs = [];
  for (let i = 0; i < 200 && runs.length === 0; i++) {
    await new Promise((r) => setTimeout(r, 50));
    runs = await c.runs.list(thread.thread_id);
  }
  assert.equal(runs.length, 1, "the fire's run");
  assert.equal(runs[0].metadata.cron_id, cron.cron_id);
  assert.deepEqual(runs[0].kwargs.input, { messages: [{ role: "human", content: "tick" }] });

  const up = await c.crons.update(cron.cron_id, { schedule: "0 * * * *", enabled: false });
  assert.equal(up.schedule, "0 * * * *");
  assert.equal(up.enabled, false);
  assert.equal(up.next_run_date, null);
  assert.equal(await c.crons.search({ enabled: false }).then((l) => l.length), 1);

  await assert.rejects(c.crons.create("agent", { schedule: "0 25 * * *" }), /HTTP 400: .*field 2 \(hour\)/);
  await assert.rejects(c.crons.create("nograph", { schedule: "@daily" }), /HTTP 404/);
  await assert.rejects(c.crons.createForThread("00000000-0000-4000-8000-000000000000", "agent", { schedule: "@daily" }), /HTTP 404/);
  assert.equal(await c.crons.count(), 2, "bad input stores nothing");

  await c.crons.delete(cron.cron_id);
  await c.crons.delete(solo.cron_id);
  assert.equal(await c.crons.count(), 0);
  const gone = await fetch(`${srv.url}/v1/schedules/agent-cron-${cron.cron_id}`, { headers });
  assert.equal(gone.status, 404, "a deleted cron's schedule is gone");
});
