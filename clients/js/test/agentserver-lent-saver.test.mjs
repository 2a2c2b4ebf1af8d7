// The runtime lends each run its own checkpointer through the run's config
// (LangGraph's CONFIG_KEY_CHECKPOINTER, "__pregel_checkpointer", as
// agentserver.ts's LENT_CHECKPOINTER): an internal key of
// @langchain/langgraph, not its public API. This test fails when a
// LangGraph version stops honouring it, for the graph and for a subgraph
// it runs as a node, before runs write their checkpoints under another
// run's lock.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Annotation, MemorySaver, StateGraph } from "@langchain/langgraph";

const State = Annotation.Root({ trail: Annotation({ reducer: (a, b) => a.concat(b), default: () => [] }) });

test("lent checkpointer: a run's config's saver is used over the graph's own, subgraphs included", async () => {
  const sub = new StateGraph(State).addNode("inner", () => ({ trail: ["inner"] })).addEdge("__start__", "inner").compile();
  const graph = new StateGraph(State)
    .addNode("outer", () => ({ trail: ["outer"] }))
    .addNode("sub", sub)
    .addEdge("__start__", "outer")
    .addEdge("outer", "sub")
    .compile();
  const own = new MemorySaver();
  const lent = new MemorySaver();
  graph.checkpointer = own;
  const config = { configurable: { thread_id: "t1", __pregel_checkpointer: lent } };
  for await (const _ of await graph.stream({ trail: [] }, { ...config, subgraphs: true })) {
    /* drained */
  }
  const namespaces = async (saver) => {
    const ns = new Set();
    for await (const tp of saver.list({ configurable: { thread_id: "t1" } })) ns.add(tp.config.configurable.checkpoint_ns);
    return ns;
  };
  assert.equal((await own.getTuple({ configurable: { thread_id: "t1" } })), undefined, "the graph's own saver got no checkpoint");
  const ns = await namespaces(lent);
  assert.ok(ns.has(""), "the lent saver holds the graph's checkpoints");
  assert.ok([...ns].some((x) => x.startsWith("sub:")), `the lent saver holds the subgraph's checkpoints: ${[...ns]}`);
  // The same state as the graph's own saver holds after the same run.
  await graph.invoke({ trail: [] }, { configurable: { thread_id: "t2" } });
  const state = await graph.getState({ configurable: { thread_id: "t1", __pregel_checkpointer: lent } });
  assert.deepEqual(state.values, (await graph.getState({ configurable: { thread_id: "t2" } })).values);
  assert.ok(state.values.trail.includes("inner"));
});
