// runEvents takes LangGraph's `stream` when no mode asked needs callback
// events, and `streamEvents` when one does (`events`, `messages`): the
// same chunks either way, on a real compiled graph with an interrupt and
// a subgraph. No server: the graph's own MemorySaver.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Annotation, MemorySaver, StateGraph, interrupt } from "@langchain/langgraph";
import { needsCallbacks, runEvents } from "../dist/agentserver-stream.js";

const State = Annotation.Root({ log: Annotation({ reducer: (a, b) => a.concat(b), default: () => [] }) });

function build() {
  const sub = new StateGraph(State).addNode("s1", () => ({ log: ["s1"] })).addEdge("__start__", "s1").addEdge("s1", "__end__").compile();
  return new StateGraph(State)
    .addNode("a", (_s, config) => {
      config.writer?.({ note: "a" });
      return { log: ["a"] };
    })
    .addNode("sub", sub)
    .addNode("ask", () => ({ log: [String(interrupt("ok?"))] }))
    .addEdge("__start__", "a")
    .addEdge("a", "sub")
    .addEdge("sub", "ask")
    .addEdge("ask", "__end__")
    .compile({ checkpointer: new MemorySaver() });
}

/** The events of a run of a fresh graph on thread, and how often each of its methods was called. */
async function collect(asked, subgraphs, thread) {
  const g = build();
  const calls = { stream: 0, streamEvents: 0 };
  for (const m of ["stream", "streamEvents"]) {
    const orig = g[m].bind(g);
    g[m] = (...args) => (calls[m]++, orig(...args));
  }
  const out = [];
  const opts = { configurable: { thread_id: thread } };
  for await (const ev of runEvents(g, { log: ["in"] }, opts, asked, `run-${thread}`, subgraphs)) out.push(ev);
  return { out, calls };
}

test("needsCallbacks: only events and messages", () => {
  assert.equal(needsCallbacks(["values", "updates", "debug", "custom", "messages-tuple", "tasks", "checkpoints"]), false);
  assert.equal(needsCallbacks(["values", "events"]), true);
  assert.equal(needsCallbacks(["messages"]), true);
});

for (const subgraphs of [false, true]) {
  test(`runEvents: values and updates through stream equal streamEvents' (subgraphs ${subgraphs})`, async () => {
    const cheap = await collect(["values", "updates"], subgraphs, "t1");
    assert.deepEqual(cheap.calls, { stream: 1, streamEvents: 0 });
    // With events asked too, the graph runs under streamEvents: its chunk events are the same.
    const full = await collect(["values", "updates", "events"], subgraphs, "t2");
    assert.equal(full.calls.streamEvents, 1);
    const chunks = full.out.filter((e) => e.event !== "events");
    assert.ok(cheap.out.length >= 4, `only ${cheap.out.length} events`);
    // An interrupt's id and a subgraph's namespace come from their task's id, made of the
    // checkpoint's (a new uuid each run).
    const same = (evs) =>
      JSON.parse(
        JSON.stringify(evs)
          .replace(/"id":"[0-9a-f]{32}"/g, '"id":"…"')
          .replace(/\|sub:[0-9a-f-]{36}/g, "|sub:…"),
      );
    assert.deepEqual(same(cheap.out), same(chunks));
    assert.ok(cheap.out.some((e) => e.event.startsWith("updates") && JSON.stringify(e.data).includes("__interrupt__")), "the interrupt is streamed");
    if (subgraphs) assert.ok(cheap.out.some((e) => e.event.includes("|")), "a subgraph's chunk is named with its namespace");
  });
}

/** Events with what each run makes anew (uuids, ids, timestamps) made alike. */
function alike(evs) {
  return JSON.parse(
    JSON.stringify(evs)
      .replace(/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/g, "uuid")
      .replace(/"[0-9a-f]{32}"/g, '"id"')
      .replace(/"\d{4}-\d\d-\d\dT[^"]+"/g, '"time"')
      .replace(/run-t\d/g, "run")
      .replace(/"t\d"/g, '"thread"'),
  );
}

test("runEvents: every graph mode through stream equals streamEvents' (subgraphs)", async () => {
  const modes = ["values", "updates", "debug", "tasks", "checkpoints", "custom"];
  const cheap = await collect(modes, true, "t4");
  assert.deepEqual(cheap.calls, { stream: 1, streamEvents: 0 });
  const full = await collect([...modes, "events"], true, "t5");
  assert.ok(cheap.out.some((e) => e.event.startsWith("custom")), "the writer's chunk is streamed");
  assert.ok(cheap.out.some((e) => e.event.startsWith("debug|sub")), "a subgraph's debug chunk is streamed");
  assert.deepEqual(alike(cheap.out), alike(full.out.filter((e) => e.event !== "events")));
});

test("runEvents: a task's start is seen through stream too (onTaskStart)", async () => {
  const g = build();
  let starts = 0;
  for await (const _ of runEvents(g, { log: ["in"] }, { configurable: { thread_id: "t3" } }, ["values"], "run-t3", false, () => starts++));
  assert.ok(starts >= 3, `${starts} task starts`);
});
