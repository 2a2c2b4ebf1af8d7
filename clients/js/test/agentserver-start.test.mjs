// A run's start is one request (POST .../runs/{run}/start: the thread's
// lock, the check that the run was not cancelled, the thread's head), and
// its outcome releases the lock: no lock request, no read of the task
// after it, no release. A run cancelled between its claim and its start
// runs nothing. Against a server without the start route (404 no-route,
// as an older one answers) the runtime sends the requests it did before.
// The run's first event (metadata) goes with its start and its last
// events with its outcome: two stream appends fewer a run; a server that
// refuses them there gets them through the stream route, as before.
import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { Client } from "@langchain/langgraph-sdk";
import { MessagesAnnotation, StateGraph } from "@langchain/langgraph";
import { AIMessage } from "@langchain/core/messages";
import { Drover } from "../dist/index.js";
import { AgentServerRuntime } from "../dist/agentserver.js";
import { sharedServer, uniq, until, withTimeout } from "./helpers/server.mjs";

let srv;
before(async () => {
  srv = await sharedServer();
});
after(async () => srv.release());

let steps = 0;
const echo = new StateGraph(MessagesAnnotation)
  .addNode("agent", async (s) => {
    steps++;
    return { messages: [new AIMessage(`echo ${s.messages.length}`)] };
  })
  .addEdge("__start__", "agent")
  .compile();

/** A fetch that records each request as "METHOD /path" with its body, passing it on to drover unless `answer` gives a response. */
function recorder(answer = async () => undefined) {
  const sent = [];
  const f = async (url, init = {}) => {
    const u = new URL(String(url));
    const entry = { what: `${init.method ?? "GET"} ${u.pathname}`, body: init.body ? JSON.parse(init.body) : undefined };
    sent.push(entry);
    const mine = await answer(entry);
    if (mine) {
      entry.status = mine.status;
      return mine;
    }
    const res = await fetch(url, init);
    entry.status = res.status;
    return res;
  };
  return { sent, fetch: f };
}

const count = (sent, re) => sent.filter((e) => re.test(e.what)).length;

/**
 * Waits until the runtime's requests matching re number at least n and each has its answer. runs.wait
 * returns once the outcome is stored, which can be before the runtime's request gets its answer.
 */
const answered = (sent, re, n) =>
  until(
    () => {
      const all = sent.filter((e) => re.test(e.what));
      return all.length >= n && all.every((e) => e.status !== undefined);
    },
    30_000,
    () => `${re}: ${sent.filter((e) => re.test(e.what)).map((e) => e.status ?? "no answer")} of ${n} answered`,
  );

/**
 * Checks that each run's stream holds, drover's own events left out, exactly the events the
 * runtime sent for it (with its start, its appends, its outcome: each once, in order),
 * metadata first; answers how many went with starts and with outcomes.
 */
async function checkStreams(ns, sent) {
  const d = new Drover({ url: srv.url, namespace: ns });
  const runs = sent.filter((e) => e.what.endsWith("/start") && e.status === 200).map((e) => e.what.split("/")[6]);
  let withStart = 0;
  let withOutcome = 0;
  for (const id of runs) {
    const mine = sent.filter((e) => e.what.includes(`/runs/${id}/`) || e.what === `POST /v1/tasks/${id}/stream/events`);
    const want = [];
    for (const e of mine) {
      if (e.status !== 200 || !e.body?.events) continue;
      want.push(...e.body.events.map((ev) => ev.type));
      if (e.what.endsWith("/start")) withStart += e.body.events.length;
      if (e.what.endsWith("/outcome")) withOutcome += e.body.events.length;
    }
    const page = await d.streams.read(id);
    const got = page.events.filter((e) => !["attempt_started", "attempt_lost", "attempt_ended", "done"].includes(e.type)).map((e) => e.type);
    assert.deepEqual(got, want, `run ${id}: its stream holds each event sent once, in order`);
    assert.equal(got[0], "metadata", `run ${id}: metadata first`);
  }
  return { runs: runs.length, withStart, withOutcome };
}

async function runtimeWith(t, ns, f) {
  // Cancel polls a minute apart: none during these short runs, so that every task read counts.
  const rt = new AgentServerRuntime({ drover: new Drover({ url: srv.url, namespace: ns, fetch: f }), graphs: { agent: echo }, concurrency: 2, cancelPollMs: 60_000 });
  await rt.start();
  t.after(() => withTimeout(rt.stop(), 30_000, "runtime did not stop"));
  return rt;
}

const sdk = (ns) => new Client({ apiUrl: srv.url, apiKey: null, defaultHeaders: { "Drover-Namespace": ns }, callerOptions: { maxRetries: 0 } });

test("agentserver start: one request takes the lock, the outcome releases it", async (t) => {
  const ns = uniq("lgstart");
  // Appends answered late, as from a loaded server: the run's later events queue behind one.
  const rec = recorder(async (e) => {
    if (e.what.endsWith("/stream/events")) await new Promise((res) => setTimeout(res, 50));
  });
  await runtimeWith(t, ns, rec.fetch);
  const client = sdk(ns);
  const thread = (await client.threads.create()).thread_id;
  for (const m of ["one", "two", "three"]) await client.runs.wait(thread, "agent", { input: { messages: [{ role: "user", content: m }] } });
  const runs = 3;
  await answered(rec.sent, /\/outcome$/, runs);
  assert.equal(count(rec.sent, /^POST \/v1\/agent-server\/threads\/[^/]+\/runs\/[^/]+\/start$/), runs);
  assert.equal(count(rec.sent, /\/v1\/locks\//), 0, "lock requests: the start takes it, the outcome releases it");
  assert.equal(count(rec.sent, /^GET \/v1\/queues\/langgraph\/tasks\//), 0, "task reads: the start answers a cancel");
  const outcomes = rec.sent.filter((e) => e.what.endsWith("/outcome"));
  assert.equal(outcomes.length, runs);
  for (const o of outcomes) {
    assert.equal(o.status, 200);
    assert.equal(o.body.lock.name, `thread:${thread}`);
    assert.ok(o.body.lock.token > 0 && o.body.lock.contender);
  }
  const d = new Drover({ url: srv.url, namespace: ns });
  assert.equal(await d.locks.get(`thread:${thread}`), undefined, "the thread's lock is released");
  const state = await client.threads.getState(thread);
  assert.equal(state.values.messages.length, 6);
  // The metadata went with each start, never as an append of its own.
  const appends = rec.sent.filter((e) => /^POST \/v1\/tasks\/[^/]+\/stream\/events$/.test(e.what));
  assert.equal(appends.filter((e) => e.body.events[0].type === "metadata").length, 0, "metadata sent as an append");
  for (const s of rec.sent.filter((e) => e.what.endsWith("/start"))) assert.deepEqual(s.body.events.map((e) => e.type), ["metadata"]);
  const got = await checkStreams(ns, rec.sent);
  assert.equal(got.runs, runs);
  assert.equal(got.withStart, runs);
  // Events queued behind a late append when the graph ends go with the outcome, not as an append:
  // how many did depends on how fast the graph ran (not asserted: agentserver-writer's takeRest
  // test and the Go outcome tests check that path); each went once, in order (checkStreams).
  t.diagnostic(`${got.withOutcome} events went with outcomes`);
  // An append and an outcome never both carry a run's last events.
  for (const o of outcomes) if (o.body.events) assert.ok(o.body.events_from > 1, "events_from counts the start's metadata");
});

test("agentserver start: a server that refuses events with the start and the outcome gets them as appends", async (t) => {
  const ns = uniq("lgstartnoev");
  const refuse = (e) =>
    new Response(JSON.stringify({ title: "Bad Request", status: 400, detail: "validation failed", errors: [{ location: "body.events", message: "unexpected property" }] }), {
      status: 400,
      headers: { "Content-Type": "application/problem+json" },
    });
  const rec = recorder(async (e) => ((e.what.endsWith("/start") || e.what.endsWith("/outcome")) && e.body?.events ? refuse(e) : undefined));
  await runtimeWith(t, ns, rec.fetch);
  const client = sdk(ns);
  const thread = (await client.threads.create()).thread_id;
  for (const m of ["one", "two"]) await client.runs.wait(thread, "agent", { input: { messages: [{ role: "user", content: m }] } });
  await answered(rec.sent, /\/outcome$/, 2);
  // Refused once each, then not sent again.
  assert.equal(rec.sent.filter((e) => e.what.endsWith("/start") && e.body.events).length, 1);
  assert.ok(rec.sent.filter((e) => e.what.endsWith("/outcome") && e.body.events).length <= 1);
  const got = await checkStreams(ns, rec.sent);
  assert.equal(got.runs, 2);
  assert.equal(got.withStart + got.withOutcome, 0);
  assert.equal((await client.threads.getState(thread)).values.messages.length, 4);
});

test("agentserver start: events an older server refused with the outcome are not lost when the writer then fails", async (t) => {
  const ns = uniq("lgputback");
  const refuse = () =>
    new Response(JSON.stringify({ title: "Bad Request", status: 400, detail: "validation failed", errors: [{ location: "body.events", message: "unexpected property" }] }), {
      status: 400,
      headers: { "Content-Type": "application/problem+json" },
    });
  // Appends get no answer until the second outcome is sent: the run's events all go with its first
  // outcome (none stored), which is refused; the writer they are put back into fails.
  let down = true;
  let outcomes = 0;
  const rec = recorder(async (e) => {
    if (down && e.what.startsWith("POST ") && e.what.endsWith("/stream/events")) throw new TypeError("injected: no answer");
    if (!e.what.endsWith("/outcome")) return undefined;
    if (++outcomes === 2) down = false;
    return e.body?.events ? refuse() : undefined;
  });
  await runtimeWith(t, ns, rec.fetch);
  const client = sdk(ns);
  const thread = (await client.threads.create()).thread_id;
  await client.runs.wait(thread, "agent", { input: { messages: [{ role: "user", content: "one" }] } });
  const first = rec.sent.find((e) => e.what.endsWith("/outcome"));
  assert.ok(first.body.events?.some((e) => e.type === "values"), "the first outcome carried the run's values");
  const run = first.what.split("/")[6];
  const page = await new Drover({ url: srv.url, namespace: ns }).streams.read(run);
  assert.ok(
    page.events.some((e) => e.type === "values"),
    `the run's stream holds its values (an outcome without them was not recorded): ${page.events.map((e) => e.type)}`,
  );
});

test("agentserver start: a run cancelled after its claim, before its start, runs nothing", async (t) => {
  const ns = uniq("lgstartcancel");
  let hold;
  const held = new Promise((res) => (hold = res));
  let release;
  const released = new Promise((res) => (release = res));
  const rec = recorder(async (e) => {
    if (e.what.endsWith("/start")) {
      hold();
      await released; // the test cancels the run meanwhile
    }
    return undefined;
  });
  const rt = await runtimeWith(t, ns, rec.fetch);
  const client = sdk(ns);
  const thread = (await client.threads.create()).thread_id;
  const before = steps;
  const run = await client.runs.create(thread, "agent", { input: { messages: [{ role: "user", content: "never" }] } });
  await withTimeout(held, 30_000, "the runtime never started the run");
  await client.runs.cancel(thread, run.run_id);
  release();
  await until(() => rt.stats.running === 0 && rec.sent.some((e) => e.what.endsWith("/start") && e.status), 30_000, "the runtime did not end the cancelled run");
  const start = rec.sent.find((e) => e.what.endsWith("/start"));
  assert.equal(start.status, 200);
  assert.equal(steps, before, "the graph ran");
  assert.equal(count(rec.sent, /\/outcome$/), 0);
  assert.equal(count(rec.sent, /\/v1\/threads\/[^/]+\/checkpoints$/), 0, "checkpoints written");
  const d = new Drover({ url: srv.url, namespace: ns });
  assert.equal(await d.locks.get(`thread:${thread}`), undefined, "the thread's lock is held");
  assert.equal((await client.runs.get(thread, run.run_id)).status, "interrupted");
});

test("agentserver start: against a server without the start route, the lock, the task read and the release", async (t) => {
  const ns = uniq("lgstartold");
  const noRoute = (e) =>
    new Response(JSON.stringify({ type: "https://drover.dev/problems/no-route", title: "Not Found", status: 404, detail: `no route ${e.what}` }), {
      status: 404,
      headers: { "Content-Type": "application/problem+json" },
    });
  const rec = recorder(async (e) => (e.what.endsWith("/start") ? noRoute(e) : undefined));
  await runtimeWith(t, ns, rec.fetch);
  const client = sdk(ns);
  const thread = (await client.threads.create()).thread_id;
  for (const m of ["one", "two"]) await client.runs.wait(thread, "agent", { input: { messages: [{ role: "user", content: m }] } });
  // The route is tried once, then not for a minute.
  assert.equal(count(rec.sent, /\/start$/), 1);
  assert.equal(count(rec.sent, /^POST \/v1\/locks\/thread(:|%3A)/i), 2);
  // Without the start route the outcome cannot release the lock: the runtime deletes it after the
  // outcome is recorded, so runs.wait may return before the second DELETE is sent.
  await answered(rec.sent, /^DELETE \/v1\/locks\/thread(:|%3A)/i, 2);
  assert.equal(count(rec.sent, /^DELETE \/v1\/locks\/thread(:|%3A)/i), 2);
  assert.equal(count(rec.sent, /^GET \/v1\/queues\/langgraph\/tasks\//), 2);
  for (const o of rec.sent.filter((e) => e.what.endsWith("/outcome"))) assert.equal(o.body.lock, undefined, "an older server refuses an outcome's lock");
  const d = new Drover({ url: srv.url, namespace: ns });
  assert.equal(await d.locks.get(`thread:${thread}`), undefined);
  assert.equal((await client.threads.getState(thread)).values.messages.length, 4);
});
