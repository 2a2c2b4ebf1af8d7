import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { ConflictError, Drover } from "../dist/index.js";
import { sharedServer, uniq } from "./helpers/server.mjs";
import { startProxy } from "./helpers/proxy.mjs";

let srv;
let drover;
before(async () => {
  srv = await sharedServer();
  drover = new Drover({ url: srv.url, namespace: uniq("reg") });
});
after(async () => srv.release());

/** Reads events from an async iterator until pred says stop, within ms. */
async function take(it, n, ms) {
  const out = [];
  const deadline = Date.now() + ms;
  while (out.length < n) {
    const left = deadline - Date.now();
    if (left <= 0) throw new Error(`only ${out.length} of ${n} events within ${ms} ms: ${JSON.stringify(out)}`);
    let t;
    const r = await Promise.race([it.next(), new Promise((res) => (t = setTimeout(() => res("timeout"), left)))]);
    clearTimeout(t);
    if (r === "timeout") continue;
    if (r.done) break;
    out.push(r.value);
  }
  return out;
}

test("watch sees a snapshot, then register (put), deregister and session end (delete)", async () => {
  const comp = uniq("gw");
  const s = await drover.session({ ttl: 5 });
  const s2 = await drover.session({ ttl: 5 });
  const pre = await drover.registry.register(comp, "gw-0", { session: s, address: "127.0.0.1:9000" });
  const ac = new AbortController();
  const it = drover.registry.watch(comp, { signal: ac.signal })[Symbol.asyncIterator]();
  try {
    const [snap] = await take(it, 1, 5000);
    assert.equal(snap.type, "snapshot");
    assert.deepEqual(snap.endpoints.map((e) => e.id), ["gw-0"]);
    const reg = await drover.registry.register(comp, "gw-1", { session: s, address: "127.0.0.1:9001", data: { model: "m" } });
    assert.equal(reg.endpoint.address, "127.0.0.1:9001");
    await assert.rejects(drover.registry.register(comp, "gw-1", { session: s2, address: "x:1" }), ConflictError, "another session holds the id");
    await reg.deregister();
    await drover.registry.register(comp, "gw-2", { session: s2, address: "127.0.0.1:9002" });
    await s2.close(); // its endpoint goes with it
    const evs = await take(it, 4, 5000);
    assert.deepEqual(evs.map((e) => `${e.type} ${e.endpoint.id}`), ["put gw-1", "delete gw-1", "put gw-2", "delete gw-2"]);
    assert.deepEqual(evs[0].endpoint.data, { model: "m" });
    assert.deepEqual((await drover.registry.list(comp)).map((e) => e.id), ["gw-0"]);
    assert.equal(await drover.registry.get(comp, "gw-2"), undefined);
    await pre.deregister();
  } finally {
    ac.abort();
    await it.return?.();
    await s.close();
  }
});

test("a broken watch reconnects with Last-Event-ID: changes made meanwhile arrive, and no second snapshot", async () => {
  const comp = uniq("llm");
  const proxy = await startProxy(Number(new URL(srv.url).port));
  const viaProxy = new Drover({ url: proxy.url, namespace: drover.transport.namespace });
  const s = await drover.session({ ttl: 10 });
  const reconnects = [];
  const ac = new AbortController();
  const it = viaProxy.registry.watch(comp, { signal: ac.signal, maxBackoffMs: 200, onReconnect: (err, last) => reconnects.push(last) })[Symbol.asyncIterator]();
  try {
    const [snap] = await take(it, 1, 5000);
    assert.equal(snap.type, "snapshot");
    await drover.registry.register(comp, "a", { session: s, address: "h:1" });
    const [putA] = await take(it, 1, 5000);
    assert.equal(putA.endpoint.id, "a");
    await proxy.cut(); // the stream breaks; the server cannot be reached
    await drover.registry.register(comp, "b", { session: s, address: "h:2" });
    await drover.registry.deregister(comp, "a", s);
    await new Promise((r) => setTimeout(r, 300));
    await proxy.restore();
    const evs = await take(it, 2, 8000);
    assert.deepEqual(evs.map((e) => `${e.type} ${e.endpoint.id}`), ["put b", "delete a"], "missed changes, no snapshot");
    assert.ok(reconnects.length >= 1);
    assert.equal(reconnects[0], String(putA.revision), "resumed after the last revision seen");
  } finally {
    ac.abort();
    await it.return?.();
    await s.close();
    await proxy.close();
  }
});
