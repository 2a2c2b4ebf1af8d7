// A step's checkpoint writes and the put of their checkpoint race (LangGraph
// sends the writes without waiting for the put): runs on one thread through
// the Agent Server runtime, one after the other, must all end in success on
// their first attempt, with no write refused as "checkpoint: not found".
import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { Client } from "@langchain/langgraph-sdk";
import { Annotation, StateGraph } from "@langchain/langgraph";
import { emptyCheckpoint, uuid6 } from "@langchain/langgraph-checkpoint";
import { Drover } from "../dist/index.js";
import { DroverSaver } from "../dist/langgraph.js";
import { AgentServerRuntime } from "../dist/agentserver.js";
import { sharedServer, uniq, withTimeout } from "./helpers/server.mjs";

let srv;
before(async () => {
  srv = await sharedServer();
});
after(async () => srv.release());

const State = Annotation.Root({ count: Annotation({ reducer: (a, b) => a + b, default: () => 0 }) });
const step = () => ({ count: 1 });
/** Three nodes in a line, as in bench/agentserver. */
const line = new StateGraph(State)
  .addNode("a", step)
  .addNode("b", step)
  .addNode("c", step)
  .addEdge("__start__", "a")
  .addEdge("a", "b")
  .addEdge("b", "c")
  .addEdge("c", "__end__")
  .compile();

const RUNS = Number(process.env.DROVER_RACE_RUNS ?? 50);

test("saver writes race: streamed runs on one thread all succeed on their first attempt", async (t) => {
  const ns = uniq("cprace");
  const errors = [];
  const rt = new AgentServerRuntime({ drover: new Drover({ url: srv.url, namespace: ns }), graphs: { line }, concurrency: 2, onError: (e) => errors.push(String(e?.message ?? e)) });
  await rt.start();
  t.after(() => withTimeout(rt.stop(), 30_000, "runtime did not stop"));
  const client = new Client({ apiUrl: srv.url, apiKey: null, defaultHeaders: { "Drover-Namespace": ns }, callerOptions: { maxRetries: 0 } });
  const thread = await client.threads.create();
  const bad = [];
  for (let i = 0; i < RUNS; i++) {
    let last;
    for await (const ev of client.runs.stream(thread.thread_id, "line", { input: { count: 0 }, streamMode: ["values"] })) {
      if (ev.event === "metadata" && ev.data.attempt > 1) bad.push(`run ${i}: attempt ${ev.data.attempt}`);
      if (ev.event === "error") bad.push(`run ${i}: ${JSON.stringify(ev.data)}`);
      if (ev.event === "values") last = ev.data;
    }
    if (last?.count !== 3 * (i + 1)) bad.push(`run ${i}: count ${last?.count}, want ${3 * (i + 1)}`);
  }
  assert.deepEqual({ bad, errors: errors.filter((e) => /not found/.test(e)) }, { bad: [], errors: [] }, `${bad.length} of ${RUNS} runs went wrong`);
});

test("saver writes race: a write refused while its put was under way is sent again", async () => {
  const drover = new Drover({ url: srv.url, namespace: uniq("cprace") });
  const saver = new DroverSaver({ drover });
  const thread = uniq("t");
  const checkpoint = { ...emptyCheckpoint(), id: uuid6(-3), channel_values: { n: 1 }, channel_versions: { n: 1 } };
  const base = { configurable: { thread_id: thread, checkpoint_ns: "" } };
  // The order the race takes: the write's first attempt is refused (no put
  // yet); its second is sent before the put and answered after it ended.
  const realPutWrites = drover.checkpoints.putWrites.bind(drover.checkpoints);
  let calls = 0;
  const realPut = drover.checkpoints.put.bind(drover.checkpoints);
  let carried = 0;
  drover.checkpoints.put = async (thread, cp) => {
    const r = await realPut(thread, cp);
    carried += cp.parent_writes?.length ?? 0;
    return r;
  };
  drover.checkpoints.putWrites = async (...args) => {
    calls++;
    try {
      return await realPutWrites(...args);
    } finally {
      if (calls === 2) await saver.put(base, checkpoint, { source: "loop", step: 0, parents: {} }, { n: 1 });
    }
  };
  // The saver's waits are unref'd timers: something else keeps the process up.
  const keep = setInterval(() => {}, 1000);
  try {
    await saver.putWrites({ configurable: { ...base.configurable, checkpoint_id: checkpoint.id } }, [["n", 2]], "task-1");
  } finally {
    clearInterval(keep);
  }
  assert.equal(calls, 3);
  const tuple = await saver.getTuple({ configurable: { ...base.configurable, checkpoint_id: checkpoint.id } });
  assert.deepEqual(tuple.pendingWrites, [["task-1", "n", 2]]);
});

test("saver writes race: a step's writes wait for the put of their checkpoint, none is refused, each goes with the next put", async () => {
  // LangGraph puts a step's checkpoint and sends the step's writes at once; a write sent before
  // its put ended is refused (404) and sent again: a round trip for nothing. Counted here. Once
  // the put is done, the writes go with the put of the next checkpoint: one request, not two.
  const drover = new Drover({ url: srv.url, namespace: uniq("cprace") });
  const saver = new DroverSaver({ drover });
  const realPutWrites = drover.checkpoints.putWrites.bind(drover.checkpoints);
  let calls = 0;
  let refused = 0;
  const realPut = drover.checkpoints.put.bind(drover.checkpoints);
  let carried = 0;
  drover.checkpoints.put = async (thread, cp) => {
    const r = await realPut(thread, cp);
    carried += cp.parent_writes?.length ?? 0;
    return r;
  };
  drover.checkpoints.putWrites = async (...args) => {
    calls++;
    try {
      return await realPutWrites(...args);
    } catch (e) {
      if (e?.status === 404) refused++;
      throw e;
    }
  };
  const graph = new StateGraph(State)
    .addNode("a", step)
    .addNode("b", step)
    .addNode("c", step)
    .addEdge("__start__", "a")
    .addEdge("a", "b")
    .addEdge("b", "c")
    .addEdge("c", "__end__")
    .compile({ checkpointer: saver });
  const config = { configurable: { thread_id: uniq("t") } };
  const INVOKES = 5;
  for (let i = 0; i < INVOKES; i++) {
    const out = await graph.invoke({ count: 0 }, config);
    assert.equal(out.count, 3 * (i + 1));
  }
  // Each invoke: the input's task and the three nodes' write once each, with the next put.
  assert.deepEqual({ calls, carried, refused }, { calls: 0, carried: 4 * INVOKES, refused: 0 });
  const h = await saver.getTuple(config);
  assert.equal(h.checkpoint.channel_values.count, 3 * INVOKES);
});
