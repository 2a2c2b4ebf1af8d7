// The server keeps a thread's history: a run's outcome carries only the
// states the run added, down to one the server holds (history_append),
// and the whole history when the server does not hold that one, as after
// a run cancelled before its outcome (its checkpoints stay, unrecorded).
// Either way the thread's history lists every checkpoint of the thread.
import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { Client } from "@langchain/langgraph-sdk";
import { Annotation, MessagesAnnotation, StateGraph, interrupt } from "@langchain/langgraph";
import { AIMessage } from "@langchain/core/messages";
import { Drover } from "../dist/index.js";
import { DroverSaver } from "../dist/langgraph.js";
import { AgentServerRuntime } from "../dist/agentserver.js";
import { sharedServer, uniq, until, withTimeout } from "./helpers/server.mjs";

let srv;
before(async () => {
  srv = await sharedServer();
});
after(async () => srv.release());

const gates = new Map();
const echo = new StateGraph(MessagesAnnotation)
  .addNode("agent", async (s) => {
    const key = s.messages.at(-1).content;
    if (key.startsWith("gate")) await new Promise((res) => gates.set(key, res));
    return { messages: [new AIMessage(`echo ${s.messages.length}: ${key}`)] };
  })
  .addEdge("__start__", "agent")
  .compile();

test("agentserver history: outcomes send the run's states, the thread's history stays whole", async (t) => {
  const ns = uniq("lghist");
  // [body, status] of each outcome the runtime sent, recorded as it is sent, its status once answered:
  // runs.wait returns once the outcome is stored, which can be before the runtime reads its answer.
  const outcomes = [];
  const recording = async (url, init) => {
    const entry = String(url).endsWith("/outcome") ? [JSON.parse(init.body), undefined] : undefined;
    if (entry) outcomes.push(entry);
    const res = await fetch(url, init);
    if (entry) entry[1] = res.status;
    return res;
  };
  const answered = (n) => until(() => outcomes.length >= n && outcomes.every(([, st]) => st !== undefined), 30_000, `the runtime's ${n} outcomes were not answered`);
  const rt = new AgentServerRuntime({ drover: new Drover({ url: srv.url, namespace: ns, fetch: recording }), graphs: { agent: echo }, concurrency: 2 });
  await rt.start();
  t.after(() => withTimeout(rt.stop(), 30_000, "runtime did not stop"));
  const client = new Client({ apiUrl: srv.url, apiKey: null, defaultHeaders: { "Drover-Namespace": ns }, callerOptions: { maxRetries: 0 } });
  const thread = (await client.threads.create()).thread_id;
  const checkpoints = async () => {
    const d = new Drover({ url: srv.url, namespace: ns });
    return (await d.checkpoints.list(thread, { checkpoint_ns: "", limit: 1000 })).map((c) => c.checkpoint_id);
  };
  const historyIds = async () => (await client.threads.getHistory(thread, { limit: 100 })).map((s) => s.checkpoint.checkpoint_id);

  for (const m of ["one", "two", "three"]) await client.runs.wait(thread, "agent", { input: { messages: [{ role: "user", content: m }] } });
  await answered(3);
  // Three checkpoints a run (its input, the start, the node): the first outcome sends them all,
  // the next ones their own three and the one before them.
  assert.deepEqual(outcomes.map(([b, st]) => [b.history.length, b.history_append ?? false, st]), [[3, false, 200], [4, true, 200], [4, true, 200]]);
  assert.deepEqual(await historyIds(), await checkpoints());
  assert.equal((await historyIds()).length, 9);

  // A run cancelled mid-node leaves its first checkpoints, which no outcome recorded: the next
  // run's states do not join the stored history (412), and its outcome sends the whole history.
  const key = uniq("gate");
  const run = await client.runs.create(thread, "agent", { input: { messages: [{ role: "user", content: key }] } });
  await until(() => gates.has(key), 30_000, "the runtime never started the gated run");
  await client.runs.cancel(thread, run.run_id, true);
  await until(() => rt.stats.running === 0, 30_000, "the runtime did not stop the cancelled run");
  gates.get(key)();
  outcomes.length = 0;
  await client.runs.wait(thread, "agent", { input: { messages: [{ role: "user", content: "after" }] } });
  await answered(2);
  assert.deepEqual(outcomes.map(([b, st]) => [b.history_append ?? false, st]), [[true, 412], [false, 200]]);
  const all = await checkpoints();
  assert.ok(all.length > 12, `checkpoints of the thread: ${all.length}`);
  assert.deepEqual(await historyIds(), all);
});

test("agentserver history: a run started from an older checkpoint keeps the branch it left", async (t) => {
  const ns = uniq("lgfork");
  const rt = new AgentServerRuntime({ drover: new Drover({ url: srv.url, namespace: ns }), graphs: { agent: echo } });
  await rt.start();
  t.after(() => withTimeout(rt.stop(), 30_000, "runtime did not stop"));
  const client = new Client({ apiUrl: srv.url, apiKey: null, defaultHeaders: { "Drover-Namespace": ns }, callerOptions: { maxRetries: 0 } });
  const thread = (await client.threads.create()).thread_id;
  const checkpoints = async () => (await new Drover({ url: srv.url, namespace: ns }).checkpoints.list(thread, { checkpoint_ns: "", limit: 1000 })).map((c) => c.checkpoint_id);
  const historyIds = async () => (await client.threads.getHistory(thread, { limit: 100 })).map((s) => s.checkpoint.checkpoint_id);

  await client.runs.wait(thread, "agent", { input: { messages: [{ role: "user", content: "one" }] } });
  const fork = (await client.threads.getState(thread)).checkpoint.checkpoint_id;
  await client.runs.wait(thread, "agent", { input: { messages: [{ role: "user", content: "two" }] } });
  // From the first run's last state: the second run's states are another branch, newer than it,
  // and LangGraph's history (by id) still lists them.
  await client.runs.wait(thread, "agent", { input: { messages: [{ role: "user", content: "from one" }] }, checkpointId: fork });
  const all = await checkpoints();
  assert.equal(all.length, 9);
  assert.deepEqual(await historyIds(), all);
});

test("agentserver history: the head's pending writes are not applied in the history", async (t) => {
  const ns = uniq("lgpend");
  // Two nodes in one step: a ends, b interrupts; a's writes wait as the head's pending writes.
  const build = () =>
    new StateGraph(Annotation.Root({ log: Annotation({ reducer: (a, b) => a.concat(b), default: () => [] }) }))
      .addNode("a", () => ({ log: ["a"] }))
      .addNode("b", () => ({ log: [String(interrupt("ask"))] }))
      .addEdge("__start__", "a")
      .addEdge("__start__", "b");
  const rt = new AgentServerRuntime({ drover: new Drover({ url: srv.url, namespace: ns }), graphs: { fan: build().compile() } });
  await rt.start();
  t.after(() => withTimeout(rt.stop(), 30_000, "runtime did not stop"));
  const client = new Client({ apiUrl: srv.url, apiKey: null, defaultHeaders: { "Drover-Namespace": ns }, callerOptions: { maxRetries: 0 } });
  const thread = (await client.threads.create()).thread_id;
  await client.runs.wait(thread, "fan", { input: { log: ["in"] } });

  const ref = build().compile({ checkpointer: new DroverSaver({ drover: new Drover({ url: srv.url, namespace: ns }) }) });
  const want = [];
  for await (const s of ref.getStateHistory({ configurable: { thread_id: thread } }, { limit: 1 })) want.push(s);
  const got = (await client.threads.getHistory(thread, { limit: 1 }))[0];
  assert.equal(got.checkpoint.checkpoint_id, want[0].config.configurable.checkpoint_id);
  assert.deepEqual([got.values, [...got.next].sort()], [want[0].values, [...want[0].next].sort()]);
  assert.deepEqual([...got.next].sort(), ["a", "b"]);
  // The thread's state applies them, as LangGraph's getState does.
  assert.deepEqual((await client.threads.getState(thread)).next, ["b"]);
});
