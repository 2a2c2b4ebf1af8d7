// The shapes of a run's stream modes and of subgraph states, as LangGraph's
// Agent Server sends them, through a real drover server, a runtime and
// LangGraph's SDK Client. The model is LangChain's fake streaming model.
import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { Client } from "@langchain/langgraph-sdk";
import { Annotation, MessagesAnnotation, StateGraph, interrupt } from "@langchain/langgraph";
import { FakeListChatModel } from "@langchain/core/utils/testing";
import { Drover } from "../dist/index.js";
import { AgentServerRuntime } from "../dist/agentserver.js";
import { sharedServer, uniq, withTimeout } from "./helpers/server.mjs";

let srv;
before(async () => {
  srv = await sharedServer();
});
after(async () => srv.release());

/** One node calling a fake model that streams "hi" token by token. */
const chat = new StateGraph(MessagesAnnotation)
  .addNode("agent", async (s) => ({ messages: [await new FakeListChatModel({ responses: ["hi"] }).invoke(s.messages)] }))
  .addEdge("__start__", "agent")
  .compile();

/** A subgraph that asks before it goes on, inside a parent. */
const Inner = Annotation.Root({ city: Annotation() });
const inner = new StateGraph(Inner)
  .addNode("ask", (s) => ({ city: interrupt(`city ${s.city}?`) }))
  .addEdge("__start__", "ask")
  .compile();
const parent = new StateGraph(Inner).addNode("weather", inner).addEdge("__start__", "weather").compile();

async function setup(t) {
  const ns = uniq("lgstream");
  const rt = new AgentServerRuntime({ drover: new Drover({ url: srv.url, namespace: ns }), graphs: { chat, parent }, concurrency: 2 });
  await rt.start();
  t.after(() => withTimeout(rt.stop(), 30_000, "runtime did not stop"));
  return new Client({ apiUrl: srv.url, apiKey: null, defaultHeaders: { "Drover-Namespace": ns }, callerOptions: { maxRetries: 0 } });
}

async function gather(it) {
  const out = [];
  for await (const c of it) out.push(c);
  return out;
}

const input = { messages: [{ type: "human", content: "hello", id: "m0" }] };

test("agent server streams: events, messages and messages-tuple", async (t) => {
  const client = await setup(t);
  const th = await client.threads.create();
  const events = await gather(client.runs.stream(th.thread_id, "chat", { input, streamMode: "events" }));
  assert.deepEqual(new Set(events.map((e) => e.event)), new Set(["metadata", "events"]));
  const kinds = new Set(events.filter((e) => e.event === "events").map((e) => e.data.event));
  for (const k of ["on_chain_start", "on_chain_end", "on_chat_model_start", "on_chat_model_stream", "on_chat_model_end"]) assert.ok(kinds.has(k), `${k} in ${[...kinds]}`);

  const th2 = await client.threads.create();
  const msgs = await gather(client.runs.stream(th2.thread_id, "chat", { input, streamMode: ["messages", "values"] }));
  assert.equal(msgs.at(-1).event, "messages/complete");
  const partial = msgs.filter((e) => e.event === "messages/partial").map((e) => e.data[0].content);
  assert.deepEqual(partial, ["h", "hi"], "each partial is the message so far");
  const meta = msgs.find((e) => e.event === "messages/metadata");
  const [id] = Object.keys(meta.data);
  assert.equal(typeof meta.data[id].metadata, "object");
  const complete = msgs.filter((e) => e.event === "messages/complete").flatMap((e) => e.data);
  assert.deepEqual(complete.map((m) => [m.type, m.content]), [["human", "hello"], ["ai", "hi"]], "each message complete once");
  assert.ok(msgs.some((e) => e.event === "values"));

  const th3 = await client.threads.create();
  const tuples = await gather(client.runs.stream(th3.thread_id, "chat", { input, streamMode: "messages-tuple" }));
  const tok = tuples.filter((e) => e.event === "messages");
  assert.deepEqual(tok.map((e) => e.data[0].content), ["h", "i"]);
  assert.equal(tok[0].data[1].langgraph_node, "agent");
});

test("agent server streams: debug checkpoints are the history's", async (t) => {
  const client = await setup(t);
  const th = await client.threads.create();
  const chunks = await gather(client.runs.stream(th.thread_id, "chat", { input, streamMode: "debug" }));
  const cps = chunks.filter((e) => e.event === "debug" && e.data.type === "checkpoint").map((e) => e.data.payload);
  const history = (await client.threads.getHistory(th.thread_id, { limit: cps.length })).reverse();
  assert.deepEqual(
    cps.map((p) => [p.metadata.step, p.checkpoint, p.parent_checkpoint]),
    history.map((h) => [h.metadata.step, h.checkpoint, h.parent_checkpoint]),
  );
  assert.equal(cps[0].parentConfig, undefined, "parent_config, not parentConfig");
  assert.ok(!Object.keys(cps[0].config.configurable).some((k) => k.startsWith("__")), "no internal configurable");
});

test("agent server streams: a subgraph task's state or its reference", async (t) => {
  const client = await setup(t);
  const th = await client.threads.create();
  await gather(client.runs.stream(th.thread_id, "parent", { input: { city: "SF" } }));
  const flat = await client.threads.getState(th.thread_id);
  assert.equal(flat.tasks.length, 1);
  assert.equal(flat.tasks[0].state, null);
  assert.equal(flat.tasks[0].checkpoint.thread_id, th.thread_id);
  assert.match(flat.tasks[0].checkpoint.checkpoint_ns, /^weather:/);
  const deep = await client.threads.getState(th.thread_id, undefined, { subgraphs: true });
  assert.equal(deep.tasks[0].checkpoint, null);
  assert.deepEqual(deep.tasks[0].state.next, ["ask"]);
  assert.equal(deep.tasks[0].state.values.city, "SF");
  const subs = await client.assistants.getSubgraphs("parent");
  assert.deepEqual(Object.keys(subs), ["weather"]);
});
