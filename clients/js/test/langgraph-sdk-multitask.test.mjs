// Multitask strategies of LangGraph's Agent Server API on drover, through
// LangGraph's own SDK Client and a real `drover server`: a second run on a
// thread with an active run is rejected, enqueued, or stops the first
// (interrupt, rollback), and the thread never has two runs active. Also
// LangGraph's plain-text errors, the SDK's message for a missing thread.
import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { Client } from "@langchain/langgraph-sdk";
import { MessagesAnnotation, StateGraph } from "@langchain/langgraph";
import { AIMessage } from "@langchain/core/messages";
import { Drover } from "../dist/index.js";
import { AgentServerRuntime } from "../dist/agentserver.js";
import { DroverSaver } from "../dist/langgraph.js";
import { sharedServer, uniq, until, withTimeout } from "./helpers/server.mjs";

let srv;
before(async () => {
  srv = await sharedServer();
});
after(async () => srv.release());

/** Gates hold a node until the test opens them, or the run is stopped (its signal). */
const gates = new Map();
const entered = new Map();
const held = new StateGraph(MessagesAnnotation)
  .addNode("first", (s) => ({ messages: [new AIMessage(`begin ${s.messages.at(-1).content}`)] }))
  .addNode("wait", async (s, config) => {
    const key = s.messages.at(-2).content;
    entered.get(key)?.();
    await new Promise((res, rej) => {
      gates.set(key, res);
      config.signal?.addEventListener("abort", () => rej(config.signal.reason), { once: true });
    });
    return { messages: [new AIMessage(`done ${key}`)] };
  })
  .addEdge("__start__", "first")
  .addEdge("first", "wait")
  .compile();

async function setup(t) {
  const ns = uniq("lgmt");
  const rt = new AgentServerRuntime({ drover: new Drover({ url: srv.url, namespace: ns }), graphs: { held }, concurrency: 4, cancelPollMs: 50 });
  await rt.start();
  t.after(() => withTimeout(rt.stop(), 30_000, "runtime did not stop"));
  const client = new Client({ apiUrl: srv.url, apiKey: null, defaultHeaders: { "Drover-Namespace": ns }, callerOptions: { maxRetries: 0 } });
  // The checkpoints as stored, read beside the runtime: the Agent Server's
  // thread state is what a run reported when it ended.
  const saver = new DroverSaver({ drover: new Drover({ url: srv.url, namespace: ns }) });
  return { client, saver };
}

/** Starts a run whose node waits at its gate (named by its message), resolved once it is there. */
async function startHeld(client, thread, content, strategy) {
  const there = new Promise((res) => entered.set(content, res));
  const run = await client.runs.create(thread, "held", { input: { messages: [{ role: "user", content }] }, multitaskStrategy: strategy });
  return { run, there };
}

const contents = (state) => (state.values?.messages ?? []).map((m) => m.content);
/** The message contents of the thread's newest stored checkpoint. */
async function stored(saver, thread) {
  const t = await saver.getTuple({ configurable: { thread_id: thread, checkpoint_ns: "" } });
  return (t?.checkpoint.channel_values.messages ?? []).map((m) => m.content);
}

test("langgraph sdk multitask: reject and enqueue", async (t) => {
  const { client } = await setup(t);
  const { thread_id: th } = await client.threads.create();
  const a = await startHeld(client, th, uniq("a"));
  await a.there;
  await assert.rejects(client.runs.create(th, "held", { input: { messages: [] }, multitaskStrategy: "reject" }), /HTTP 409/);
  const b = await startHeld(client, th, uniq("b"), "enqueue");
  assert.equal((await client.runs.get(th, b.run.run_id)).status, "pending");
  gates.get(a.run.kwargs.input.messages[0].content)();
  await b.there; // only once the first ended
  assert.equal((await client.runs.get(th, a.run.run_id)).status, "success");
  gates.get(b.run.kwargs.input.messages[0].content)();
  await client.runs.join(th, b.run.run_id);
  assert.equal((await client.runs.get(th, b.run.run_id)).status, "success");
  const st = await client.threads.getState(th);
  assert.equal(st.values.messages.length, 6, JSON.stringify(contents(st)));
});

test("langgraph sdk multitask: interrupt keeps the stopped run's checkpoints", async (t) => {
  const { client, saver } = await setup(t);
  const { thread_id: th } = await client.threads.create();
  const a = await startHeld(client, th, uniq("a"));
  await a.there;
  // LangGraph stores a step's checkpoint in the background: the next node
  // may be entered before it is stored. Interrupt only once it is.
  const ac = a.run.kwargs.input.messages[0].content;
  await until(async () => (await stored(saver, th)).includes(`begin ${ac}`), 10_000, "the first run's first step is stored");
  const b = await startHeld(client, th, uniq("b"), "interrupt");
  assert.equal((await client.runs.get(th, a.run.run_id)).status, "interrupted");
  await b.there;
  gates.get(b.run.kwargs.input.messages[0].content)();
  await client.runs.join(th, b.run.run_id);
  assert.equal((await client.runs.get(th, b.run.run_id)).status, "success");
  const st = await client.threads.getState(th);
  // The first run's input and first node stay; the second continues from them.
  assert.deepEqual(contents(st).slice(0, 2), [ac, `begin ${ac}`]);
  const runs = await client.runs.list(th);
  assert.equal(runs.filter((r) => r.status === "pending" || r.status === "running").length, 0);
});

test("langgraph sdk multitask: rollback deletes the stopped run and what it wrote", async (t) => {
  const { client } = await setup(t);
  const { thread_id: th } = await client.threads.create();
  const a = await startHeld(client, th, uniq("a"));
  await a.there;
  const b = await startHeld(client, th, uniq("b"), "rollback");
  await assert.rejects(client.runs.get(th, a.run.run_id), /HTTP 404/);
  await b.there;
  gates.get(b.run.kwargs.input.messages[0].content)();
  await client.runs.join(th, b.run.run_id);
  const st = await client.threads.getState(th);
  const bc = b.run.kwargs.input.messages[0].content;
  assert.deepEqual(contents(st), [bc, `begin ${bc}`, `done ${bc}`]);
  await until(async () => (await client.runs.list(th)).length === 1, 10_000, "the rolled back run is listed");
});

test("langgraph sdk multitask: errors are LangGraph's plain text for the SDK", async (t) => {
  const { client } = await setup(t);
  const missing = "00000000-0000-4000-8000-000000000000";
  await assert.rejects(client.threads.get(missing), (e) => e.message === `HTTP 404: Thread with ID ${missing} not found`);
  const res = await fetch(`${srv.url}/threads/${missing}`, { headers: { Accept: "application/problem+json" } });
  assert.equal(res.status, 404);
  assert.equal(res.headers.get("content-type"), "application/problem+json");
  assert.equal((await res.json()).detail, `Thread with ID ${missing} not found`);
});
