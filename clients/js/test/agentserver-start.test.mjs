// A run's start is one request (POST .../runs/{run}/start: the thread's
// lock, the check that the run was not cancelled, the thread's head), and
// its outcome releases the lock: no lock request, no read of the task
// after it, no release. A run cancelled between its claim and its start
// runs nothing. Against a server without the start route (404 no-route,
// as an older one answers) the runtime sends the requests it did before.
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
    if (mine) return mine;
    const res = await fetch(url, init);
    entry.status = res.status;
    return res;
  };
  return { sent, fetch: f };
}

const count = (sent, re) => sent.filter((e) => re.test(e.what)).length;

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
  const rec = recorder();
  await runtimeWith(t, ns, rec.fetch);
  const client = sdk(ns);
  const thread = (await client.threads.create()).thread_id;
  for (const m of ["one", "two", "three"]) await client.runs.wait(thread, "agent", { input: { messages: [{ role: "user", content: m }] } });
  const runs = 3;
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
  assert.equal(count(rec.sent, /^DELETE \/v1\/locks\/thread(:|%3A)/i), 2);
  assert.equal(count(rec.sent, /^GET \/v1\/queues\/langgraph\/tasks\//), 2);
  for (const o of rec.sent.filter((e) => e.what.endsWith("/outcome"))) assert.equal(o.body.lock, undefined, "an older server refuses an outcome's lock");
  const d = new Drover({ url: srv.url, namespace: ns });
  assert.equal(await d.locks.get(`thread:${thread}`), undefined);
  assert.equal((await client.threads.getState(thread)).values.messages.length, 4);
});
