// A saver that holds the thread's lock answers the thread's head and list
// reads from what it read and wrote under the lock, without a request; its
// answers equal a fresh saver's, read from the server. Without a lock every
// read is a request. A lock lost makes it read from the server again.
// Requests are counted at the Transport's fetch.
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

/** A client of namespace ns whose checkpoint reads (GET of a thread's head or checkpoints) are counted. */
function counted(ns) {
  const seen = [];
  const drover = new Drover({
    url: srv.url,
    namespace: ns,
    fetch: (url, init) => {
      const path = new URL(String(url)).pathname;
      if ((init?.method ?? "GET") === "GET" && /^\/v1\/threads\/[^/]+\/(head|checkpoints)/.test(path)) seen.push(path);
      return fetch(url, init);
    },
  });
  return { drover, reads: () => seen.length };
}

const collect = async (it) => {
  const out = [];
  for await (const x of it) out.push(x);
  return out;
};

const State = Annotation.Root({ trail: Annotation({ reducer: (a, b) => a.concat(b), default: () => [] }) });

/** outer, then sub (prep, then ask: an interrupt) beside side: the parent's checkpoint holds side's writes and sub's interrupt. */
function graphWith(saver) {
  const sub = new StateGraph(State)
    .addNode("prep", () => ({ trail: ["prep"] }))
    .addNode("ask", () => ({ trail: [`ask:${interrupt("approve?")}`] }))
    .addEdge("__start__", "prep")
    .addEdge("prep", "ask")
    .compile();
  return new StateGraph(State)
    .addNode("outer", () => ({ trail: ["outer"] }))
    .addNode("sub", sub)
    .addNode("side", () => ({ trail: ["side"] }))
    .addEdge("__start__", "outer")
    .addEdge("outer", "sub")
    .addEdge("outer", "side")
    .compile({ checkpointer: saver });
}

/** Every read the runtime and LangGraph make of a thread's namespace, as saver answers them. */
async function answers(saver, thread, ns, ids) {
  const c = { configurable: { thread_id: thread, checkpoint_ns: ns } };
  const at = (id) => ({ configurable: { thread_id: thread, checkpoint_ns: ns, checkpoint_id: id } });
  return {
    head: await saver.getTuple(c),
    all: await collect(saver.list(c)),
    two: await collect(saver.list(c, { limit: 2 })),
    before: await collect(saver.list(c, { before: at(ids[0]), limit: 2 })),
    oldest: await saver.getTuple(at(ids[ids.length - 1])),
  };
}

/** The thread's namespaces and, per namespace, its checkpoint ids newest first, as a fresh saver lists them. */
async function namespaces(ns, thread) {
  const fresh = new DroverSaver({ drover: new Drover({ url: srv.url, namespace: ns }) });
  const by = new Map();
  for await (const t of fresh.list({ configurable: { thread_id: thread } })) {
    const n = t.config.configurable.checkpoint_ns;
    if (!by.has(n)) by.set(n, []);
    by.get(n).push(t.config.configurable.checkpoint_id);
  }
  return by;
}

/**
 * Checks that held answers every read of every namespace as a fresh saver does, with no request
 * (after a first list of each when warm); returns the namespaces.
 */
async function sameAsServer(held, reads, ns, thread, graph, freshGraph, warm = false) {
  const by = await namespaces(ns, thread);
  assert.ok(by.size >= 2, `the root and the subgraph's namespace: ${[...by.keys()]}`);
  const fresh = new DroverSaver({ drover: new Drover({ url: srv.url, namespace: ns }) });
  for (const n of by.keys()) {
    if (!warm) continue;
    const before = reads();
    await collect(held.list({ configurable: { thread_id: thread, checkpoint_ns: n } }));
    assert.equal(reads() - before, 1, `namespace ${JSON.stringify(n)}: its first list is read`);
  }
  for (const [n, ids] of by) {
    const before = reads();
    const mine = await answers(held, thread, n, ids);
    assert.equal(reads() - before, 0, `namespace ${JSON.stringify(n)}: the held saver read nothing`);
    assert.deepStrictEqual(mine, await answers(fresh, thread, n, ids), `namespace ${JSON.stringify(n)}: as the server answers`);
  }
  const before = reads();
  const state = await graph.getState({ configurable: { thread_id: thread } }, { subgraphs: true });
  const history = await collect(graph.getStateHistory({ configurable: { thread_id: thread } }, { limit: 6 }));
  assert.equal(reads() - before, 0, "getState with subgraphs and getStateHistory read nothing");
  assert.deepStrictEqual(state, await freshGraph.getState({ configurable: { thread_id: thread } }, { subgraphs: true }));
  assert.deepStrictEqual(history, await collect(freshGraph.getStateHistory({ configurable: { thread_id: thread } }, { limit: 6 })));
  return by;
}

test("held saver: under the thread's lock, a run's head, list and state reads are answered from memory, as the server answers them", async () => {
  const ns = uniq("held");
  const { drover, reads } = counted(ns);
  const thread = uniq("th");
  const fresh = () => graphWith(new DroverSaver({ drover: new Drover({ url: srv.url, namespace: ns }) }));

  // A new thread: its head read once, as the runtime's start request would answer it (none).
  const l1 = await drover.lock(`thread:${thread}`);
  const s1 = new DroverSaver({ drover, lock: l1 });
  s1.seedHead(thread, "", null);
  const g1 = graphWith(s1);
  const r0 = reads();
  await g1.invoke({ trail: [] }, { configurable: { thread_id: thread } });
  // The subgraph's namespace is new to the saver: its head read once, none of the root's.
  assert.equal(reads() - r0, 1, "the run read only its subgraph's head");
  const by = await sameAsServer(s1, reads, ns, thread, g1, fresh());
  assert.ok(by.get("").length >= 2);
  await l1.release();

  // The next run resumes it: the head seeded from a read, the subgraph's namespace read once. It
  // shares the first saver's cache of checkpoint states, as the runtime's savers do: the
  // states the head refers to are not read again.
  const l2 = await drover.lock(`thread:${thread}`);
  const s2 = new DroverSaver({ drover, lock: l2, shareCacheOf: s1 });
  s2.seedHead(thread, "", await new Drover({ url: srv.url, namespace: ns }).checkpoints.head(encodeThreadId(thread)));
  const g2 = graphWith(s2);
  const r1 = reads();
  await g2.invoke(new Command({ resume: "yes" }), { configurable: { thread_id: thread } });
  assert.equal(reads() - r1, 1, "the resumed run read only its subgraph's head");
  assert.deepStrictEqual((await s2.getTuple({ configurable: { thread_id: thread } })).checkpoint.channel_values.trail.slice(-1), ["ask:yes"]);
  assert.equal(reads() - r1, 1, "the head after the run: no read");
  // The older checkpoints are not known to this saver: its first list of a namespace reads them,
  // then it knows them.
  await sameAsServer(s2, reads, ns, thread, g2, fresh(), true);
  await l2.release();
});

const cp = (values, versions) => ({ ...emptyCheckpoint(), id: uuid6(-3), channel_values: values, channel_versions: versions ?? Object.fromEntries(Object.keys(values).map((k) => [k, 1])) });
const meta = (step) => ({ source: "loop", step, parents: {} });

test("held saver: a read waits for the puts and writes under way, and answers what the server holds once they landed", async () => {
  const ns = uniq("held");
  const { drover, reads } = counted(ns);
  const thread = uniq("th");
  const lock = await drover.lock(`thread:${thread}`);
  const saver = new DroverSaver({ drover, lock });
  saver.seedHead(thread, "", null);
  const root = { configurable: { thread_id: thread, checkpoint_ns: "" } };
  const a = cp({ n: 0 });
  const pa = saver.put(root, a, meta(-1), { n: 1 });
  assert.equal((await saver.getTuple(root)).checkpoint.id, a.id, "the head read waited for the put");
  const ac = await pa;
  // As LangGraph's async durability: a step's writes, then the next checkpoint's put, unawaited.
  const pw = [saver.putWrites(ac, [["n", 5], ["__interrupt__", { value: "why?" }]], "task-b"), saver.putWrites(ac, [["n", 7]], "task-a", "~p")];
  const b = cp({ n: 12 }, { n: 2 });
  const pb = saver.put(ac, b, meta(0), { n: 2 });
  const listed = await collect(saver.list(root));
  const head = await saver.getTuple(root);
  const first = await saver.getTuple({ configurable: { ...root.configurable, checkpoint_id: a.id } });
  await Promise.all([...pw, pb]);
  assert.equal(reads(), 0, "no read");
  assert.equal(listed.length, 2);
  assert.equal(first.pendingWrites.length, 3, "the writes under way are in");
  const server = new DroverSaver({ drover: new Drover({ url: srv.url, namespace: ns }) });
  assert.deepStrictEqual(listed, await collect(server.list(root)));
  assert.deepStrictEqual(head, await server.getTuple(root));
  assert.deepStrictEqual(first, await server.getTuple({ configurable: { ...root.configurable, checkpoint_id: a.id } }));
  await lock.release();
});

test("held saver: without a lock every head and list read is a request", async () => {
  const ns = uniq("held");
  const { drover, reads } = counted(ns);
  const thread = uniq("th");
  const saver = new DroverSaver({ drover });
  saver.seedHead(thread, "", null); // changes nothing without a lock
  const root = { configurable: { thread_id: thread, checkpoint_ns: "" } };
  await saver.put(root, cp({ n: 0 }), meta(-1), { n: 1 });
  await saver.getTuple(root);
  await saver.getTuple(root);
  await collect(saver.list(root));
  await collect(saver.list(root, { limit: 1 }));
  assert.equal(reads(), 4);
});

test("held saver: a lock taken away (session ended, another holder writes) makes it read from the server, not answer what it knew", async () => {
  const ns = uniq("held");
  const { drover, reads } = counted(ns);
  const thread = uniq("th");
  const root = { configurable: { thread_id: thread, checkpoint_ns: "" } };
  const other = async () => {
    const l = await drover.lock(`thread:${thread}`, { wait: 30 });
    const s = new DroverSaver({ drover, lock: l });
    const head = await s.getTuple(root);
    const c = cp({ n: 99 }, { n: 9 });
    await s.put(head.config, c, meta(5), { n: 9 });
    await l.release();
    return c;
  };

  // A Lock: its session's end is seen by its signal; the saver forgets at once.
  const s1 = await drover.session({ ttl: 5 });
  const l1 = await drover.lock(`thread:${thread}`, { session: s1 });
  const saver1 = new DroverSaver({ drover, lock: l1 });
  saver1.seedHead(thread, "", null);
  await saver1.put(root, cp({ n: 0 }), meta(-1), { n: 1 });
  assert.equal(reads(), 0);
  await s1.close();
  const c1 = await other();
  const r1 = reads();
  assert.equal((await saver1.getTuple(root)).checkpoint.id, c1.id, "the other holder's checkpoint, read");
  assert.ok(reads() > r1);

  // A bare fence (name, session, token: no signal): its next write is fenced, and then it forgets.
  const s2 = await drover.session({ ttl: 5 });
  const l2 = await drover.lock(`thread:${thread}`, { session: s2 });
  const saver2 = new DroverSaver({ drover, lock: { lock: l2.name, session: s2.id, token: l2.token } });
  const h2 = await saver2.getTuple(root);
  const mine = await saver2.put(h2.config, cp({ n: 1 }, { n: 10 }), meta(6), { n: 10 });
  await s2.close();
  const c2 = await other();
  await assert.rejects(saver2.put(mine, cp({ n: 2 }, { n: 11 }), meta(7), { n: 11 }), FencedError);
  const r2 = reads();
  const head = await saver2.getTuple(root);
  const listed = await collect(saver2.list(root, { limit: 2 }));
  assert.equal(reads() - r2, 2, "both read from the server");
  assert.equal(head.checkpoint.id, c2.id);
  assert.equal(listed[0].checkpoint.id, c2.id);
});

test("held saver: forks are listed by id as the server lists them, and a deleted thread is read again", async () => {
  const ns = uniq("held");
  const { drover, reads } = counted(ns);
  const thread = uniq("th");
  const lock = await drover.lock(`thread:${thread}`);
  const saver = new DroverSaver({ drover, lock });
  const root = { configurable: { thread_id: thread, checkpoint_ns: "" } };
  assert.equal(await saver.getTuple(root), undefined, "read: no checkpoint yet");
  assert.equal(reads(), 1);
  const r = await saver.put(root, cp({ n: 0 }), meta(-1), { n: 1 });
  const a = await saver.put(r, cp({ n: 1 }, { n: 2 }), meta(0), { n: 2 });
  const fork = await saver.put(r, cp({ n: 5 }, { n: 3 }), meta(0), { n: 3 }); // updateState on the root
  await saver.putWrites(a, [["n", 3]], "task-a");
  await saver.put(a, cp({ n: 2 }, { n: 4 }), meta(1), { n: 4 }); // the head again on a's branch
  const at = (c) => ({ configurable: { ...root.configurable, checkpoint_id: c.configurable.checkpoint_id } });
  const mine = [await saver.getTuple(root), await collect(saver.list(root)), await collect(saver.list(root, { limit: 3, before: at(fork) })), await saver.getTuple(at(a))];
  assert.equal(reads(), 1, "answered from memory");
  const server = new DroverSaver({ drover: new Drover({ url: srv.url, namespace: ns }) });
  assert.deepStrictEqual(mine, [await server.getTuple(root), await collect(server.list(root)), await collect(server.list(root, { limit: 3, before: at(fork) })), await server.getTuple(at(a))]);
  await saver.deleteThread(thread);
  assert.equal(await saver.getTuple(root), undefined);
  assert.equal(reads(), 2, "after the delete, the head is read");
  await lock.release();
});

test("held saver: a read right after putWrites (its values still being serialized) waits for those writes", async () => {
  const ns = uniq("held");
  const { drover, reads } = counted(ns);
  const thread = uniq("th");
  const lock = await drover.lock(`thread:${thread}`);
  const saver = new DroverSaver({ drover, lock });
  saver.seedHead(thread, "", null);
  const root = { configurable: { thread_id: thread, checkpoint_ns: "" } };
  const a = await saver.put(root, cp({ n: 0 }), meta(-1), { n: 1 });
  // Not awaited, as LangGraph sends a step's writes; the reads come in the same turn.
  const pw = saver.putWrites(a, [["n", 1], ["n", 2], ["n", 3], ["n", 4], ["n", 5]], "task-a");
  const byId = saver.getTuple(a);
  const head = saver.getTuple(root);
  const listed = collect(saver.list(root));
  const mine = [await byId, await head, await listed];
  await pw;
  assert.equal(reads(), 0, "answered from memory");
  assert.equal(mine[0].pendingWrites.length, 5, "the writes under way are in");
  const server = new DroverSaver({ drover: new Drover({ url: srv.url, namespace: ns }) });
  assert.deepStrictEqual(mine, [await server.getTuple(a), await server.getTuple(root), await collect(server.list(root))]);
  await lock.release();
});

test("held saver: two writes of one task and index at once (the server keeps the first to land) are read from the server", async () => {
  const ns = uniq("held");
  const thread = uniq("th");
  // The first write lands first, but its answer comes after the second's.
  let firstLanded;
  const landed = new Promise((r) => (firstLanded = r));
  let secondAnswered;
  const answered = new Promise((r) => (secondAnswered = r));
  let n = 0;
  const drover = new Drover({
    url: srv.url,
    namespace: ns,
    fetch: async (url, init) => {
      if (init?.method !== "POST" || !String(url).endsWith("/writes")) return fetch(url, init);
      if (n++ === 0) {
        const res = await fetch(url, init);
        firstLanded();
        await answered;
        return res;
      }
      await landed;
      const res = await fetch(url, init);
      secondAnswered();
      return res;
    },
  });
  const lock = await drover.lock(`thread:${thread}`);
  const saver = new DroverSaver({ drover, lock });
  saver.seedHead(thread, "", null);
  const root = { configurable: { thread_id: thread, checkpoint_ns: "" } };
  const a = await saver.put(root, cp({ n: 0 }), meta(-1), { n: 1 });
  await Promise.all([saver.putWrites(a, [["n", "first"]], "task-a"), saver.putWrites(a, [["n", "second"]], "task-a")]);
  const server = new DroverSaver({ drover: new Drover({ url: srv.url, namespace: ns }) });
  const theirs = await server.getTuple(a);
  assert.deepStrictEqual(theirs.pendingWrites, [["task-a", "n", "first"]]);
  assert.deepStrictEqual(await saver.getTuple(a), theirs);
  assert.deepStrictEqual(await collect(saver.list(root)), await collect(server.list(root)));
  await lock.release();
});
