// The store of LangGraph's Agent Server API on drover, through LangGraph's
// own SDK (client.store, its StoreClient) against a real drover server, and
// the store a runtime gives graphs (DroverStore): a node's config.store and
// getStore() share items with the SDK's client.
import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { Client } from "@langchain/langgraph-sdk";
import { Annotation, StateGraph, getStore } from "@langchain/langgraph";
import { Drover } from "../dist/index.js";
import { AgentServerRuntime, DroverStore } from "../dist/agentserver.js";
import { sharedServer, uniq, withTimeout } from "./helpers/server.mjs";

let srv;
before(async () => {
  srv = await sharedServer();
});
after(async () => srv.release());

function sdk(ns) {
  return new Client({ apiUrl: srv.url, apiKey: null, defaultHeaders: { "Drover-Namespace": ns }, callerOptions: { maxRetries: 0 } });
}

test("langgraph sdk store: put, get, search, namespaces, delete", async () => {
  const ns = uniq("lgstore");
  const { store } = sdk(ns);
  assert.deepEqual((await store.searchItems(["docs"])).items, []);
  assert.deepEqual((await store.listNamespaces()).namespaces, []);
  await store.putItem(["docs", "ann"], "a", { kind: "note", n: 1 });
  await store.putItem(["docs", "ann"], "b", { kind: "todo", n: 2 });
  await store.putItem(["docs", "bob"], "c", { kind: "note", n: 3 });
  const a = await store.getItem(["docs", "ann"], "a");
  assert.deepEqual(a.value, { kind: "note", n: 1 });
  assert.deepEqual(a.namespace, ["docs", "ann"]);
  assert.ok(a.createdAt && a.updatedAt);
  await store.putItem(["docs", "ann"], "a", { kind: "note", n: 10 });
  const a2 = await store.getItem(["docs", "ann"], "a");
  assert.equal(a2.createdAt, a.createdAt);
  assert.ok(new Date(a2.updatedAt) > new Date(a.updatedAt));

  const notes = await store.searchItems(["docs"], { filter: { kind: "note" } });
  assert.deepEqual(notes.items.map((i) => i.key), ["a", "c"]);
  const big = await store.searchItems([], { filter: { n: { $gte: 3 } }, limit: 1, offset: 1 });
  assert.deepEqual(big.items.map((i) => i.key), ["c"]);
  assert.deepEqual((await store.listNamespaces({ prefix: ["docs"] })).namespaces, [["docs", "ann"], ["docs", "bob"]]);
  assert.deepEqual((await store.listNamespaces({ maxDepth: 1 })).namespaces, [["docs"]]);
  assert.deepEqual((await store.listNamespaces({ suffix: ["bob"] })).namespaces, [["docs", "bob"]]);

  await store.deleteItem(["docs", "ann"], "a");
  assert.equal(await store.getItem(["docs", "ann"], "a"), null);
});

test("langgraph sdk store: bad input is a problem naming the field, and stores nothing", async () => {
  const ns = uniq("lgstore");
  const { store } = sdk(ns);
  await assert.rejects(store.putItem(["langgraph"], "k", { v: 1 }), /namespace\[0\]/);
  await assert.rejects(store.putItem(["a", ""], "k", { v: 1 }), /namespace\[1\]/);
  await assert.rejects(store.putItem(["a"], "k", { s: "x".repeat(300 << 10) }), /body\.value/);
  await assert.rejects(store.searchItems(["a"], { limit: 5000 }), /limit/);
  await assert.rejects(store.searchItems(["a"], { query: "cats" }), /query/);
  assert.deepEqual((await store.listNamespaces()).namespaces, []);
});

test("langgraph sdk store: a graph run by the runtime reads and writes the store", async (t) => {
  const ns = uniq("lgstore");
  const State = Annotation.Root({ user: Annotation(), seen: Annotation(), count: Annotation() });
  const graph = new StateGraph(State)
    .addNode("remember", async (s, config) => {
      const prev = await config.store.get(["memories", s.user], "profile");
      const count = (prev?.value.count ?? 0) + 1;
      await config.store.put(["memories", s.user], "profile", { count });
      return { count };
    })
    .addNode("recall", async (s) => {
      const found = await getStore().search(["memories"], { filter: { count: { $gte: 1 } } });
      return { seen: found.map((i) => `${i.namespace.join("/")}:${i.value.count}`) };
    })
    .addEdge("__start__", "remember")
    .addEdge("remember", "recall")
    .compile();
  const rt = new AgentServerRuntime({ drover: new Drover({ url: srv.url, namespace: ns }), graphs: { memo: graph } });
  await rt.start();
  t.after(() => withTimeout(rt.stop(), 30_000, "runtime did not stop"));
  const client = sdk(ns);
  await client.store.putItem(["memories", "bob"], "profile", { count: 5 });
  const thread = await client.threads.create();
  const out = await client.runs.wait(thread.thread_id, "memo", { input: { user: "ann" } });
  assert.equal(out.count, 1);
  assert.deepEqual(out.seen, ["memories/ann:1", "memories/bob:5"]);
  const again = await client.runs.wait(thread.thread_id, "memo", { input: { user: "bob" } });
  assert.equal(again.count, 6);
  assert.deepEqual((await client.store.getItem(["memories", "bob"], "profile")).value, { count: 6 });

  // The same store outside the runtime, as a compiled graph's store.
  const direct = new DroverStore({ drover: new Drover({ url: srv.url, namespace: ns }) });
  assert.deepEqual(await direct.listNamespaces({ prefix: ["memories"] }), [["memories", "ann"], ["memories", "bob"]]);
  await direct.delete(["memories", "ann"], "profile");
  assert.equal(await direct.get(["memories", "ann"], "profile"), null);
  assert.equal(await direct.get([], "profile"), null);
});
