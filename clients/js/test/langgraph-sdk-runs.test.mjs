// Runs of LangGraph's Agent Server API on drover, through LangGraph's own
// SDK Client: a drover runtime (AgentServerRuntime) registers graphs, claims
// their runs from the queue, runs them with DroverSaver and reports their
// outcome. The graphs call no model: their nodes answer deterministically.
import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { Client } from "@langchain/langgraph-sdk";
import { Annotation, MessagesAnnotation, StateGraph, interrupt } from "@langchain/langgraph";
import { AIMessage } from "@langchain/core/messages";
import { Drover } from "../dist/index.js";
import { AgentServerRuntime } from "../dist/agentserver.js";
import { sharedServer, uniq, until, withTimeout } from "./helpers/server.mjs";

let srv;
before(async () => {
  srv = await sharedServer();
});
after(async () => srv.release());

/** The deterministic fake model: it echoes the last message, numbered. */
const echo = new StateGraph(MessagesAnnotation)
  .addNode("agent", (s) => ({ messages: [new AIMessage(`echo ${s.messages.length}: ${s.messages.at(-1).content}`)] }))
  .addEdge("__start__", "agent")
  .compile();

const failing = new StateGraph(MessagesAnnotation)
  .addNode("agent", () => {
    throw new Error("the tool broke");
  })
  .addEdge("__start__", "agent")
  .compile();

const Approval = Annotation.Root({ plan: Annotation(), approved: Annotation() });
const approval = new StateGraph(Approval)
  .addNode("ask", (s) => ({ approved: interrupt({ question: `approve ${s.plan}?` }) }))
  .addEdge("__start__", "ask")
  .compile();

/** Gates hold a slow graph's node until the test opens them. */
const gates = new Map();
const slow = new StateGraph(MessagesAnnotation)
  .addNode("agent", async (s) => {
    const key = s.messages.at(-1).content;
    await new Promise((res) => gates.set(key, res));
    return { messages: [new AIMessage(`done ${key}`)] };
  })
  .addEdge("__start__", "agent")
  .compile();

/** A namespace with a runtime serving the graphs, and an SDK Client on it. */
async function setup(t) {
  const ns = uniq("lgrun");
  const rt = new AgentServerRuntime({
    drover: new Drover({ url: srv.url, namespace: ns }),
    graphs: { agent: echo, failing, approval, slow },
    config: { configurable: { model: "fake" } },
    concurrency: 4,
  });
  await rt.start();
  t.after(() => withTimeout(rt.stop(), 30_000, "runtime did not stop"));
  const client = new Client({ apiUrl: srv.url, apiKey: null, defaultHeaders: { "Drover-Namespace": ns }, callerOptions: { maxRetries: 0 } });
  return { client, rt, ns };
}

test("langgraph sdk runs: a runtime's graphs are system assistants", async (t) => {
  const { client } = await setup(t);
  const a = await client.assistants.get("agent");
  assert.equal(a.assistant_id, "fe096781-5601-53d2-b2f6-0d3403f7e9ca");
  assert.equal(a.metadata.created_by, "system");
  assert.deepEqual(a.config, { configurable: { model: "fake" } });
  const all = await client.assistants.search({ metadata: { created_by: "system" }, limit: 10 });
  assert.deepEqual(all.map((x) => x.graph_id).sort(), ["agent", "approval", "failing", "slow"]);
  const g = await client.assistants.getGraph("agent");
  assert.ok(g.nodes.some((n) => n.id === "agent"), JSON.stringify(g));
});

test("langgraph sdk runs: create, join, get, list, state and history", async (t) => {
  const { client } = await setup(t);
  const thread = await client.threads.create();
  const run = await client.runs.create(thread.thread_id, "agent", { input: { messages: [{ role: "user", content: "hi" }] }, metadata: { who: "ann" } });
  assert.equal(run.thread_id, thread.thread_id);
  assert.ok(["pending", "running"].includes(run.status), run.status);
  const values = await withTimeout(client.runs.join(thread.thread_id, run.run_id), 60_000, "join did not answer");
  assert.deepEqual(values.messages.map((m) => [m.type, m.content]), [["human", "hi"], ["ai", "echo 1: hi"]]);
  const got = await client.runs.get(thread.thread_id, run.run_id);
  assert.equal(got.status, "success");
  assert.deepEqual(got.metadata, { who: "ann" });
  const th = await client.threads.get(thread.thread_id);
  assert.equal(th.status, "idle");
  assert.equal(th.values.messages.length, 2);
  assert.equal(th.metadata.graph_id, "agent");

  // A second run continues from the thread's checkpoint.
  const v2 = await client.runs.wait(thread.thread_id, "agent", { input: { messages: [{ role: "user", content: "again" }] } });
  assert.deepEqual(v2.messages.map((m) => m.content), ["hi", "echo 1: hi", "again", "echo 3: again"]);
  const runs = await client.runs.list(thread.thread_id);
  assert.equal(runs.length, 2);
  assert.ok(runs.every((r) => r.status === "success"));
  const state = await client.threads.getState(thread.thread_id);
  assert.equal(state.values.messages.length, 4);
  assert.deepEqual(state.next, []);
  assert.ok(state.checkpoint.checkpoint_id);
  const history = await client.threads.getHistory(thread.thread_id, { limit: 3 });
  assert.equal(history.length, 3);
  assert.equal(history[0].checkpoint.checkpoint_id, state.checkpoint.checkpoint_id);
  const at = await client.threads.getState(thread.thread_id, history[2].checkpoint.checkpoint_id);
  assert.deepEqual(at.values, history[2].values);
  // A state update runs through the graph's reducers, as a node.
  const upd = await client.threads.updateState(thread.thread_id, { values: { messages: [{ role: "user", content: "added" }] }, asNode: "agent" });
  assert.ok(upd.checkpoint.checkpoint_id);
  const after = await client.threads.getState(thread.thread_id);
  assert.equal(after.checkpoint.checkpoint_id, upd.checkpoint.checkpoint_id);
  assert.deepEqual(after.values.messages.map((m) => m.content).slice(-2), ["echo 3: again", "added"]);
  assert.equal((await client.threads.get(thread.thread_id)).values.messages.length, 5);
  await client.runs.delete(thread.thread_id, run.run_id);
  await assert.rejects(client.runs.get(thread.thread_id, run.run_id), /HTTP 404/);
});

test("langgraph sdk runs: a stateless run, and a run that creates its thread", async (t) => {
  const { client } = await setup(t);
  const v = await client.runs.wait(null, "agent", { input: { messages: [{ role: "user", content: "solo" }] } });
  assert.deepEqual(v.messages.map((m) => m.content), ["solo", "echo 1: solo"]);
  const id = "3c9a1f4e-0000-4000-8000-000000000001";
  const v2 = await client.runs.wait(id, "agent", { input: { messages: [{ role: "user", content: "new" }] }, ifNotExists: "create" });
  assert.equal(v2.messages.length, 2);
  assert.equal((await client.threads.get(id)).status, "idle");
  await assert.rejects(client.runs.create("3c9a1f4e-0000-4000-8000-000000000002", "agent", { input: {} }), /HTTP 404/);
  await assert.rejects(client.runs.create(id, "nosuchgraph", { input: {} }), /HTTP 404/);
});

test("langgraph sdk runs: a graph's error ends the run in error", async (t) => {
  const { client } = await setup(t);
  const thread = await client.threads.create();
  await assert.rejects(client.runs.wait(thread.thread_id, "failing", { input: { messages: [{ role: "user", content: "x" }] } }), /Error: the tool broke/);
  const [run] = await client.runs.list(thread.thread_id);
  assert.equal(run.status, "error");
  assert.equal((await client.threads.get(thread.thread_id)).status, "error");
  const joined = await client.runs.join(thread.thread_id, run.run_id);
  assert.equal(joined.__error__.message, "the tool broke");
});

test("langgraph sdk runs: interrupt, then resume with a Command", async (t) => {
  const { client } = await setup(t);
  const thread = await client.threads.create();
  await client.runs.wait(thread.thread_id, "approval", { input: { plan: "deploy" } });
  const th = await client.threads.get(thread.thread_id);
  assert.equal(th.status, "interrupted");
  const state = await client.threads.getState(thread.thread_id);
  assert.deepEqual(state.next, ["ask"]);
  assert.deepEqual(state.tasks[0].interrupts.map((i) => i.value), [{ question: "approve deploy?" }]);
  const v = await client.runs.wait(thread.thread_id, "approval", { command: { resume: "yes" } });
  assert.deepEqual(v, { plan: "deploy", approved: "yes" });
  assert.equal((await client.threads.get(thread.thread_id)).status, "idle");

  // interrupt_before stops before a node: the thread waits, and a run without input continues it.
  const t2 = await client.threads.create();
  await client.runs.wait(t2.thread_id, "agent", { input: { messages: [{ role: "user", content: "wait" }] }, interruptBefore: ["agent"] });
  assert.equal((await client.threads.get(t2.thread_id)).status, "interrupted");
  assert.deepEqual((await client.threads.getState(t2.thread_id)).next, ["agent"]);
  const done = await client.runs.wait(t2.thread_id, "agent", { input: null });
  assert.deepEqual(done.messages.map((m) => m.content), ["wait", "echo 1: wait"]);
  // The SDK's recursion_limit reaches the graph: a limit of 1 ends the run in GraphRecursionError.
  const t3 = await client.threads.create();
  await assert.rejects(client.runs.wait(t3.thread_id, "agent", { input: { messages: [{ role: "user", content: "r" }] }, config: { recursion_limit: 1 } }), /GraphRecursionError/);
});

test("langgraph sdk runs: a busy thread rejects a second run; cancel ends the first", async (t) => {
  const { client, rt } = await setup(t);
  const thread = await client.threads.create();
  const key = uniq("gate");
  const run = await client.runs.create(thread.thread_id, "slow", { input: { messages: [{ role: "user", content: key }] } });
  assert.equal((await client.threads.get(thread.thread_id)).status, "busy");
  await assert.rejects(client.runs.create(thread.thread_id, "slow", { input: { messages: [{ role: "user", content: "b" }] } }), /HTTP 409/);
  // Wait until the runtime runs it, then cancel it.
  for (let i = 0; i < 600 && !gates.has(key); i++) await new Promise((r) => setTimeout(r, 50));
  assert.ok(gates.has(key), "the runtime never started the run");
  assert.equal((await client.runs.get(thread.thread_id, run.run_id)).status, "running");
  await client.runs.cancel(thread.thread_id, run.run_id, true);
  // The runtime sees the cancel and stops the graph; the node's answer comes too late to be written.
  await until(() => rt.stats.running === 0, 30_000, "the runtime did not stop the cancelled run");
  gates.get(key)();
  assert.equal((await client.runs.get(thread.thread_id, run.run_id)).status, "interrupted");
  assert.equal((await client.threads.get(thread.thread_id)).status, "idle");
  const v = await client.runs.wait(thread.thread_id, "agent", { input: { messages: [{ role: "user", content: "after" }] } });
  // The cancelled run stopped before its node's result was written: the thread holds its input only.
  assert.deepEqual(v.messages.map((m) => m.content), [key, "after", "echo 2: after"]);
});

test("langgraph sdk runs: stream values and updates, then join the stream from an event", async (t) => {
  const { client } = await setup(t);
  const thread = await client.threads.create();
  let created;
  const chunks = [];
  for await (const c of client.runs.stream(thread.thread_id, "agent", {
    input: { messages: [{ role: "user", content: "s" }] },
    streamMode: ["values", "updates"],
    onRunCreated: (m) => (created = m),
  })) chunks.push(c);
  assert.deepEqual(chunks.map((c) => c.event), ["metadata", "values", "updates", "values"]);
  assert.equal(chunks[0].data.run_id, created.run_id);
  assert.ok(chunks.every((c, i) => i === 0 || Number(c.id) > Number(chunks[i - 1].id)), "each event carries its sequence number as its id");
  assert.deepEqual(chunks[2].data, { agent: { messages: [chunks[3].data.messages[1]] } });
  assert.equal(chunks[3].data.messages[1].content, "echo 1: s");
  assert.equal((await client.runs.get(thread.thread_id, created.run_id)).status, "success");

  // The whole stream again, then from after its second event.
  const again = [];
  for await (const c of client.runs.joinStream(thread.thread_id, created.run_id)) again.push(c);
  assert.deepEqual(again.map((c) => c.event), ["metadata", "values", "updates", "values"]);
  const rest = [];
  for await (const c of client.runs.joinStream(thread.thread_id, created.run_id, { lastEventId: chunks[1].id })) rest.push(c);
  assert.deepEqual(rest.map((c) => c.event), ["updates", "values"]);

  // A stateless stream, and a graph's error as an error event.
  const solo = [];
  for await (const c of client.runs.stream(null, "agent", { input: { messages: [{ role: "user", content: "x" }] } })) solo.push(c.event);
  assert.deepEqual(solo, ["metadata", "values", "values"]);
  const bad = [];
  for await (const c of client.runs.stream(null, "failing", { input: { messages: [{ role: "user", content: "x" }] } })) bad.push(c);
  assert.deepEqual(bad.at(-1), { event: "error", data: { error: "Error", message: "the tool broke" }, id: bad.at(-1).id });
});

test("langgraph sdk runs: a run whose thread is deleted meanwhile is cancelled, not retried", async (t) => {
  const { client, rt, ns } = await setup(t);
  const thread = await client.threads.create();
  const key = uniq("gate");
  const run = await client.runs.create(thread.thread_id, "slow", { input: { messages: [{ role: "user", content: key }] } });
  await until(() => gates.has(key), 30_000, "the runtime never started the run");
  await client.threads.delete(thread.thread_id);
  gates.get(key)();
  const drover = new Drover({ url: srv.url, namespace: ns });
  const task = await until(async () => {
    const t = await drover.tasks.get("langgraph", run.run_id);
    return t.current_status === "CANCELLED" ? t : undefined;
  }, 30_000, "the run's task was not cancelled");
  assert.equal(task.attempt, 1);
  await until(() => rt.stats.running === 0, 30_000, "the runtime still runs the deleted thread's run");
  assert.equal((await drover.tasks.get("langgraph", run.run_id)).current_status, "CANCELLED");
});

/** Calls of the counted graph's node, by the last message's content. */
const calls = new Map();
const counted = new StateGraph(MessagesAnnotation)
  .addNode("agent", (s) => {
    const key = s.messages.at(-1).content;
    calls.set(key, (calls.get(key) ?? 0) + 1);
    return { messages: [new AIMessage(`counted ${key}`)] };
  })
  .addEdge("__start__", "agent")
  .compile();

/**
 * A runtime whose first `fails` outcome requests fail as a lost connection
 * would; fail(n) makes the next n fail.
 */
async function flakyOutcomes(t, fails) {
  const ns = uniq("lgflaky");
  const drover = new Drover({ url: srv.url, namespace: ns });
  const put = drover.transport.put.bind(drover.transport);
  let left = fails;
  drover.transport.put = (path, ...rest) => {
    if (path.endsWith("/outcome") && left > 0) {
      left--;
      return Promise.reject(new Error("connection reset"));
    }
    return put(path, ...rest);
  };
  const fail = (n) => {
    left = n;
  };
  const rt = new AgentServerRuntime({ drover, graphs: { counted }, onError: () => undefined });
  await rt.start();
  t.after(() => withTimeout(rt.stop(), 30_000, "runtime did not stop"));
  const client = new Client({ apiUrl: srv.url, apiKey: null, defaultHeaders: { "Drover-Namespace": ns }, callerOptions: { maxRetries: 0 } });
  return { client, drover, fail };
}

test("langgraph sdk runs: a failed outcome is sent again, the graph not run again", async (t) => {
  const { client } = await flakyOutcomes(t, 2);
  const thread = await client.threads.create();
  const key = uniq("once");
  const v = await client.runs.wait(thread.thread_id, "counted", { input: { messages: [{ role: "user", content: key }] } });
  assert.equal(calls.get(key), 1);
  assert.deepEqual(v.messages.map((m) => m.content), [key, `counted ${key}`]);
});

test("langgraph sdk runs: a retried run resumes from its checkpoints without its input", async (t) => {
  const { client, drover } = await flakyOutcomes(t, 4);
  const thread = await client.threads.create();
  const key = uniq("retry");
  const run = await client.runs.create(thread.thread_id, "counted", { input: { messages: [{ role: "user", content: key }] } });
  const task = await until(async () => {
    const t = await drover.tasks.get("langgraph", run.run_id);
    return t.current_status === "SUCCEEDED" ? t : undefined;
  }, 60_000, "the run's task did not end");
  assert.equal(task.attempt, 2, "the first attempt fails once its outcome is refused four times");
  assert.equal(calls.get(key), 1, "the node ran again on the retry");
  const state = await client.threads.getState(thread.thread_id);
  assert.deepEqual(state.values.messages.map((m) => m.content), [key, `counted ${key}`]);
});

test("langgraph sdk runs: a retried forked run resumes from its own checkpoints, not the fork's", async (t) => {
  const { client, drover, fail } = await flakyOutcomes(t, 0);
  const thread = await client.threads.create();
  const a = uniq("forka");
  const b = uniq("forkb");
  await client.runs.wait(thread.thread_id, "counted", { input: { messages: [{ role: "user", content: a }] } });
  const history = await client.threads.getHistory(thread.thread_id);
  const fork = history.find((s) => s.next.length === 1 && s.next[0] === "agent");
  assert.ok(fork, "no checkpoint before the node");
  fail(4);
  const run = await client.runs.create(thread.thread_id, "counted", { input: { messages: [{ role: "user", content: b }] }, checkpointId: fork.checkpoint.checkpoint_id });
  const task = await until(async () => {
    const t = await drover.tasks.get("langgraph", run.run_id);
    return t.current_status === "SUCCEEDED" ? t : undefined;
  }, 60_000, "the run's task did not end");
  assert.equal(task.attempt, 2, "the first attempt fails once its outcome is refused four times");
  assert.equal(calls.get(a), 1, "the retry ran the fork point's continuation again");
  assert.equal(calls.get(b), 1);
  const state = await client.threads.getState(thread.thread_id);
  assert.deepEqual(state.values.messages.map((m) => m.content), [a, b, `counted ${b}`]);
});
