// Chained puts (chainPuts): a put answers once queued, and the puts queued
// while a request is under way go together in one. What is stored equals
// what an unchained saver stores; a refused chain fails the run and stores
// none of it; a server without the chain route gets the puts one by one.
// Requests are counted at the Transport's fetch; the first chain request is
// held until the graph's last node ran, so that the rest queue behind it
// whatever the machine's speed.
import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { Annotation, Command, StateGraph, interrupt } from "@langchain/langgraph";
import { emptyCheckpoint, uuid6 } from "@langchain/langgraph-checkpoint";
import { Drover, FencedError } from "../dist/index.js";
import { DroverSaver, encodeThreadId } from "../dist/langgraph.js";
import { sharedServer, uniq } from "./helpers/server.mjs";

let srv;
before(async () => {
  srv = await sharedServer();
});
after(async () => srv.release());

const State = Annotation.Root({ trail: Annotation({ reducer: (a, b) => a.concat(b), default: () => [] }) });

/** a, b, c, d in a line; d resolves ran. */
function line(saver, ran) {
  const node = (name) => () => {
    if (name === "d") ran();
    return { trail: [name] };
  };
  return new StateGraph(State)
    .addNode("a", node("a"))
    .addNode("b", node("b"))
    .addNode("c", node("c"))
    .addNode("d", node("d"))
    .addEdge("__start__", "a")
    .addEdge("a", "b")
    .addEdge("b", "c")
    .addEdge("c", "d")
    .addEdge("d", "__end__")
    .compile({ checkpointer: saver });
}

/**
 * A client of namespace ns counting its checkpoint writes by route; the first chain request
 * waits for gate. rename: chain requests go to a route the server does not have (an older build).
 */
function counted(ns, gate, rename = false) {
  const seen = { chains: 0, puts: 0, writes: 0, noRoute: 0 };
  let first = true;
  const drover = new Drover({
    url: srv.url,
    namespace: ns,
    fetch: async (url, init) => {
      const u = new URL(String(url));
      if (init?.method === "POST" && u.pathname.endsWith("/checkpoint-chains")) {
        seen.chains++;
        if (first) {
          first = false;
          await gate;
        }
        if (rename) u.pathname += "-unknown";
      } else if (init?.method === "POST" && u.pathname.endsWith("/writes")) seen.writes++;
      else if (init?.method === "POST" && u.pathname.endsWith("/checkpoints")) seen.puts++;
      const res = await fetch(u, init);
      if (res.status === 404 && u.pathname.endsWith("-unknown")) seen.noRoute++;
      return res;
    },
  });
  return { drover, seen };
}

/** The thread's checkpoints newest first, as a fresh saver reads them: id, parent, step, writes. */
async function stored(ns, thread) {
  const fresh = new DroverSaver({ drover: new Drover({ url: srv.url, namespace: ns }) });
  const out = [];
  for await (const t of fresh.list({ configurable: { thread_id: thread } })) {
    out.push({ id: t.config.configurable.checkpoint_id, parent: t.parentConfig?.configurable.checkpoint_id, step: t.metadata.step, writes: t.pendingWrites.map(([, ch]) => ch), trail: t.checkpoint.channel_values.trail ?? [] });
  }
  return out;
}

/** What the stored chain is, without its ids: the parent of each is the next one. */
function shape(cps) {
  cps.forEach((c, i) => assert.equal(c.parent, cps[i + 1]?.id, `checkpoint ${i} is not the child of the next`));
  return cps.map(({ step, writes, trail }) => ({ step, writes, trail }));
}

test("chained puts: a run's checkpoints go in a few requests and are stored as unchained ones", async () => {
  const ns = uniq("chain");
  let open;
  const gate = new Promise((r) => (open = r));
  const { drover, seen } = counted(ns, gate);
  const lock = await drover.lock(`thread:${uniq("l")}`);
  const saver = new DroverSaver({ drover, lock, chainPuts: true });
  const thread = uniq("t");
  const out = await line(saver, open).invoke({ trail: [] }, { configurable: { thread_id: thread } });
  await saver.drain();
  assert.deepEqual(out.trail, ["a", "b", "c", "d"]);
  const chained = await stored(ns, thread);
  assert.equal(chained.length, 6, "the input, a step each, the end");
  assert.ok(seen.chains >= 1 && seen.chains <= 3, `${seen.chains} chain requests for 6 checkpoints`);
  assert.deepEqual([seen.puts, seen.writes], [0, 0], "every put and write went in a chain");
  await lock.release();

  const plain = new DroverSaver({ drover: new Drover({ url: srv.url, namespace: ns }) });
  const other = uniq("t");
  await line(plain, () => {}).invoke({ trail: [] }, { configurable: { thread_id: other } });
  assert.deepEqual(shape(chained), shape(await stored(ns, other)));
});

test("chained puts: a chain fenced out fails the run and drain, and stores none of it", async () => {
  const ns = uniq("chain");
  let open;
  const gate = new Promise((r) => (open = r));
  const { drover, seen } = counted(ns, gate);
  const thread = uniq("t");
  const name = `thread:${thread}`;
  const lock = await drover.lock(name);
  const saver = new DroverSaver({ drover, lock: { lock: lock.name, session: lock.session.id, token: lock.token }, chainPuts: true });
  const run = line(saver, () => {}).invoke({ trail: [] }, { configurable: { thread_id: thread } });
  run.catch(() => {});
  // While the first chain waits, the lock changes hands: the chain is refused.
  while (seen.chains === 0) await new Promise((r) => setTimeout(r, 5));
  await lock.release();
  const other = await new Drover({ url: srv.url, namespace: ns }).lock(name);
  open();
  await assert.rejects(run, FencedError);
  await assert.rejects(saver.drain(), FencedError);
  await saver.drain(); // once
  assert.equal(await new Drover({ url: srv.url, namespace: ns }).checkpoints.head(encodeThreadId(thread)), undefined, "a checkpoint of the refused chain was stored");
  await other.release();
});

test("chained puts: a server without the chain route gets the puts one by one", async () => {
  const ns = uniq("chain");
  const { drover, seen } = counted(ns, Promise.resolve(), true);
  const saver = new DroverSaver({ drover, chainPuts: true });
  const thread = uniq("t");
  await line(saver, () => {}).invoke({ trail: [] }, { configurable: { thread_id: thread } });
  await saver.drain();
  assert.deepEqual([seen.chains, seen.noRoute], [1, 1], "the chain route was asked for once");
  assert.ok(seen.puts >= 6, `${seen.puts} puts`);
  const plain = new DroverSaver({ drover: new Drover({ url: srv.url, namespace: ns }) });
  const other = uniq("t");
  await line(plain, () => {}).invoke({ trail: [] }, { configurable: { thread_id: other } });
  assert.deepEqual(shape(await stored(ns, thread)), shape(await stored(ns, other)));
});

test("chained puts: a fork among queued puts starts a chain of its own, and every put and write lands", async () => {
  const ns = uniq("chain");
  const { drover, seen } = counted(ns, Promise.resolve());
  const saver = new DroverSaver({ drover, protection: "none", chainPuts: true });
  const thread = uniq("t");
  const root = { configurable: { thread_id: thread, checkpoint_ns: "" } };
  const cp = (n) => ({ ...emptyCheckpoint(), id: uuid6(-3), channel_values: { n }, channel_versions: { n } });
  const meta = (step) => ({ source: "loop", step, parents: {} });
  // Queued without waiting for anything to land: c1, c2 on c1, c3 on c1 (a fork), c4 on c3.
  const c1 = await saver.put(root, cp(1), meta(0), { n: 1 });
  const c2 = await saver.put(c1, cp(2), meta(1), { n: 2 });
  const writes = saver.putWrites(c2, [["n", 20]], "task-2");
  const c3 = await saver.put(c1, cp(3), meta(1), { n: 3 });
  const c4 = await saver.put(c3, cp(4), meta(2), { n: 4 });
  await writes;
  await saver.drain();
  const got = await stored(ns, thread);
  const id = (c) => c.configurable.checkpoint_id;
  assert.deepEqual(got.map((c) => [c.id, c.parent ?? null]), [[id(c4), id(c3)], [id(c3), id(c1)], [id(c2), id(c1)], [id(c1), null]]);
  assert.deepEqual(got.find((c) => c.id === id(c2)).writes, ["n"]);
  assert.equal(seen.puts + seen.writes, 0, "everything went in chains");
  assert.ok(seen.chains >= 2, `${seen.chains} chains: the fork cannot share one with what it does not follow`);
});

test("chained puts: writes that come before their checkpoint's put (an interrupt at exit) go with it", async () => {
  const ns = uniq("chain");
  const { drover, seen } = counted(ns, Promise.resolve());
  const thread = uniq("t");
  const config = { configurable: { thread_id: thread } };
  const graph = (saver) =>
    new StateGraph(State)
      .addNode("a", () => ({ trail: ["a"] }))
      .addNode("ask", () => ({ trail: [`ask:${interrupt("approve?")}`] }))
      .addEdge("__start__", "a")
      .addEdge("a", "ask")
      .compile({ checkpointer: saver });
  // durability exit: LangGraph flushes the run's pending writes (the interrupt) before it calls its one put.
  const lock = await drover.lock(`thread:${thread}`);
  const saver = new DroverSaver({ drover, lock, chainPuts: true });
  await graph(saver).invoke({ trail: [] }, { ...config, durability: "exit" });
  await saver.drain();
  await lock.release();
  const [head] = await stored(ns, thread);
  assert.deepEqual(head.writes, ["__interrupt__"], "the interrupt is stored with the run's checkpoint");
  assert.equal(seen.writes, 0, "no write went ahead of its checkpoint");
  const lock2 = await drover.lock(`thread:${thread}`);
  const again = new DroverSaver({ drover, lock: lock2, chainPuts: true });
  const out = await graph(again).invoke(new Command({ resume: "yes" }), { ...config, durability: "exit" });
  await again.drain();
  await lock2.release();
  assert.deepEqual(out.trail, ["a", "ask:yes"]);

  // The same through the saver alone: writes of a checkpoint, then its put.
  const plain = new DroverSaver({ drover, protection: "none", chainPuts: true });
  const other = uniq("t");
  const c = { ...emptyCheckpoint(), id: uuid6(-3), channel_values: { n: 1 }, channel_versions: { n: 1 } };
  const at = { configurable: { thread_id: other, checkpoint_ns: "", checkpoint_id: c.id } };
  const w = plain.putWrites(at, [["n", 2]], "task-1");
  await plain.put({ configurable: { thread_id: other, checkpoint_ns: "" } }, c, { source: "loop", step: 0, parents: {} }, { n: 1 });
  await w;
  await plain.drain();
  assert.deepEqual((await stored(ns, other))[0].writes, ["n"]);
  assert.equal(seen.writes, 0, "no write went ahead of its checkpoint");

  // A read while such writes wait: it waits with them, and they still go with their put.
  const third = uniq("t");
  const c3 = { ...emptyCheckpoint(), id: uuid6(-3), channel_values: { n: 1 }, channel_versions: { n: 1 } };
  const w3 = plain.putWrites({ configurable: { thread_id: third, checkpoint_ns: "", checkpoint_id: c3.id } }, [["n", 3]], "task-3");
  await new Promise((r) => setTimeout(r, 10)); // the writes queued, waiting for their put
  const read = plain.getTuple({ configurable: { thread_id: third } });
  await new Promise((r) => setTimeout(r, 50));
  await plain.put({ configurable: { thread_id: third, checkpoint_ns: "" } }, c3, { source: "loop", step: 0, parents: {} }, { n: 1 });
  await Promise.all([w3, read]);
  await plain.drain();
  assert.deepEqual((await stored(ns, third))[0].writes, ["n"]);
  assert.equal(seen.writes, 0, "a read sent no write ahead of its checkpoint");
});

test("chained puts: writes held for a put that comes late, or never, are not lost", async () => {
  const ns = uniq("chain");
  const { drover, seen } = counted(ns, Promise.resolve());
  const saver = new DroverSaver({ drover, protection: "none", chainPuts: true });
  const cp = () => ({ ...emptyCheckpoint(), id: uuid6(-3), channel_values: { n: 1 }, channel_versions: { n: 1 } });
  const meta = { source: "loop", step: 0, parents: {} };

  // A checkpoint another saver stored, which this one never read: its writes wait their hold out, then go alone.
  const t1 = uniq("t");
  const other = new DroverSaver({ drover: new Drover({ url: srv.url, namespace: ns }), protection: "none" });
  const c1 = cp();
  const at1 = await other.put({ configurable: { thread_id: t1, checkpoint_ns: "" } }, c1, meta, { n: 1 });
  await saver.putWrites(at1, [["n", 1]], "task-1");
  assert.equal(seen.writes, 1, "the writes went alone");
  assert.deepEqual((await stored(ns, t1))[0].writes, ["n"]);

  // A put that comes after the hold: the writes, sent alone, are refused (404) and wait again, then go with it.
  const t2 = uniq("t");
  const c2 = cp();
  const w2 = saver.putWrites({ configurable: { thread_id: t2, checkpoint_ns: "", checkpoint_id: c2.id } }, [["n", 2]], "task-2");
  while (seen.writes < 2) await new Promise((r) => setTimeout(r, 20));
  await saver.put({ configurable: { thread_id: t2, checkpoint_ns: "" } }, c2, meta, { n: 1 });
  await w2;
  await saver.drain();
  assert.deepEqual((await stored(ns, t2))[0].writes, ["n"]);
  assert.equal(seen.writes, 2, "after the refusal, the writes went with their put");
});
