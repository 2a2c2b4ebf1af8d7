// A step's pending writes go with the put of the next checkpoint
// (parent_writes). A put refused for carrying them must not fail the run nor
// lose the writes: a server of an older build, which refuses the field, and
// state and writes too large for one request.
import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { Annotation, StateGraph } from "@langchain/langgraph";
import { Drover } from "../dist/index.js";
import { DroverSaver } from "../dist/langgraph.js";
import { sharedServer, uniq } from "./helpers/server.mjs";

let srv;
before(async () => {
  srv = await sharedServer();
});
after(async () => srv.release());

const State = Annotation.Root({
  count: Annotation({ reducer: (a, b) => a + b, default: () => 0 }),
  doc: Annotation({ reducer: (_, b) => b, default: () => "" }),
});

function line(saver, step) {
  return new StateGraph(State)
    .addNode("a", step)
    .addNode("b", step)
    .addEdge("__start__", "a")
    .addEdge("a", "b")
    .addEdge("b", "__end__")
    .compile({ checkpointer: saver });
}

/** Counts the checkpoint puts answered 400 or 413, and those that went without writes. */
function countPuts(drover) {
  const seen = { refused: 0, plain: 0 };
  const realPost = drover.transport.post.bind(drover.transport);
  drover.transport.post = async (path, body, opts) => {
    if (/\/checkpoints$/.test(path) && body?.parent_checkpoint_id && !body.parent_writes) seen.plain++;
    try {
      return await realPost(path, body, opts);
    } catch (e) {
      if (e?.status === 400 || e?.status === 413) seen.refused++;
      throw e;
    }
  };
  return seen;
}

/** Newest first, whether each checkpoint of the thread has pending writes, read by a saver of its own. */
async function hasWrites(drover, config) {
  const fresh = new DroverSaver({ drover: new Drover({ url: srv.url, namespace: drover.transport.namespace }) });
  const out = [];
  for await (const t of fresh.list(config)) out.push(t.pendingWrites.length > 0);
  return out;
}

test("saver parent writes: a server that refuses parent_writes gets the writes alone, then the put", async () => {
  const drover = new Drover({ url: srv.url, namespace: uniq("cppw") });
  const seen = countPuts(drover);
  // A server of an older build: the field is unknown to it, a 400 naming it, nothing written.
  const post = drover.transport.post;
  drover.transport.post = (path, body, opts) => {
    if (body?.parent_writes) {
      const { parent_writes, ...rest } = body;
      body = { ...rest, parent_writes_unknown: parent_writes };
    }
    return post(path, body, opts);
  };
  const saver = new DroverSaver({ drover });
  const graph = line(saver, () => ({ count: 1 }));
  const config = { configurable: { thread_id: uniq("t") } };
  assert.equal((await graph.invoke({ count: 0 }, config)).count, 2);
  assert.ok(seen.refused > 0, "no put was refused: the test did not test the fallback");
  assert.deepEqual(await hasWrites(drover, config), [false, true, true, true]);
});

test("saver parent writes: state and writes too large for one request go in two", async () => {
  const drover = new Drover({ url: srv.url, namespace: uniq("cppw") });
  const seen = countPuts(drover);
  const saver = new DroverSaver({ drover });
  // Each node writes 600 kB: the next checkpoint's state holds it and so do the step's writes,
  // each within drover's 1 MiB bound, together past one request's.
  const big = "x".repeat(600_000);
  const graph = line(saver, () => ({ count: 1, doc: big }));
  const config = { configurable: { thread_id: uniq("t") } };
  const out = await graph.invoke({ count: 0 }, config);
  assert.equal(out.count, 2);
  assert.equal(out.doc.length, big.length);
  assert.equal(seen.refused, 0, "a put was refused");
  assert.ok(seen.plain > 0);
  assert.deepEqual(await hasWrites(drover, config), [false, true, true, true]);
});
