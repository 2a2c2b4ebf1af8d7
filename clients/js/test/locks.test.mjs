import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { hostname } from "node:os";
import { Drover, LockHeldError, SessionLostError } from "../dist/index.js";
import { sharedServer, uniq } from "./helpers/server.mjs";

let srv;
let drover;
before(async () => {
  srv = await sharedServer();
  drover = new Drover({ url: srv.url, namespace: uniq("locks") });
});
after(async () => srv.release());

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

test("a held lock refuses a second holder with LockHeldError naming the holder", async () => {
  const name = uniq("l");
  const a = await drover.lock(name, { ttl: 5, name: "alpha" });
  try {
    assert.ok(a.token > 0);
    await assert.rejects(drover.lock(name, { ttl: 5 }), (err) => {
      assert.ok(err instanceof LockHeldError);
      assert.equal(err.status, 409);
      assert.equal(err.holder?.holder?.id, "alpha");
      assert.equal(err.holder?.token, a.token);
      return true;
    });
    const st = await drover.locks.get(name);
    assert.equal(st.held, true);
    assert.equal(st.token, a.token);
  } finally {
    assert.equal(await a.release(), true);
  }
  assert.equal(await drover.locks.get(name), undefined, "free after release");
});

test("without a name, a lock's holder is this process: host:pid, with its host and pid", async () => {
  const name = uniq("h");
  const l = await drover.lock(name, { ttl: 5 });
  try {
    const st = await drover.locks.get(name);
    for (const h of [l.holder, st.holder]) {
      assert.equal(h.id, `${hostname()}:${process.pid}`);
      assert.equal(h.host, hostname());
      assert.equal(h.pid, process.pid);
    }
  } finally {
    await l.release();
  }
});

test("mutual exclusion: 6 contenders x 3 rounds never overlap, tokens strictly increase", async () => {
  const name = uniq("mx");
  let inside = 0;
  let maxInside = 0;
  const tokens = [];
  const contender = async (i) => {
    for (let r = 0; r < 3; r++) {
      const lock = await drover.lock(name, { ttl: 5, wait: "30s", name: `c${i}` });
      try {
        inside++;
        maxInside = Math.max(maxInside, inside);
        tokens.push(lock.token);
        await sleep(15);
        inside--;
      } finally {
        await lock.release();
      }
    }
  };
  await Promise.all([0, 1, 2, 3, 4, 5].map(contender));
  assert.equal(maxInside, 1, "never two holders at once");
  assert.equal(tokens.length, 18);
  for (let i = 1; i < tokens.length; i++) assert.ok(tokens[i] > tokens[i - 1], `token ${tokens[i]} after ${tokens[i - 1]}`);
});

test("wait gives up with LockHeldError once it runs out", async () => {
  const name = uniq("w");
  const a = await drover.lock(name, { ttl: 5 });
  try {
    const t0 = Date.now();
    await assert.rejects(drover.lock(name, { ttl: 5, wait: 1 }), LockHeldError);
    const took = Date.now() - t0;
    assert.ok(took >= 900 && took < 4000, `waited ${took} ms`);
  } finally {
    await a.release();
  }
});

test("await using / Symbol.asyncDispose releases the lock", async () => {
  const name = uniq("dispose");
  {
    const lock = await drover.lock(name, { ttl: 5 });
    assert.equal(typeof lock[Symbol.asyncDispose], "function");
    // What `await using lock = ...` runs at the end of its block:
    await lock[Symbol.asyncDispose]();
    assert.ok(lock.signal.aborted, "the signal fires on release");
  }
  const again = await drover.lock(name, { ttl: 5 });
  await again.release();
});

test("try/finally with release(); release is idempotent", async () => {
  const name = uniq("tf");
  const lock = await drover.lock(name);
  try {
    assert.equal(lock.released, false);
  } finally {
    assert.equal(await lock.release(), true);
    assert.equal(await lock.release(), true);
  }
  assert.equal(lock.released, true);
});

test("a lock under a shared session; its signal fires when the session is lost, and the next holder gets a higher token", async () => {
  const name = uniq("lost");
  const session = await drover.session({ ttl: 2 });
  const lock = await drover.lock(name, { session });
  assert.equal(lock.session, session);
  // The session ends server-side (as when its process stops keeping it alive).
  await fetch(`${srv.url}/v1/sessions/${session.id}`, { method: "DELETE", headers: { "Drover-Namespace": drover.transport.namespace } });
  await new Promise((res, rej) => {
    const t = setTimeout(() => rej(new Error("lock signal did not fire")), 3000);
    lock.signal.addEventListener("abort", () => (clearTimeout(t), res()), { once: true });
  });
  assert.ok(lock.signal.reason instanceof SessionLostError);
  const next = await drover.lock(name, { wait: 5 });
  assert.ok(next.token > lock.token);
  assert.equal(await lock.release(), false, "nothing to release: it was lost");
  await next.release();
  await session.close();
});

test("a lost holder's release cannot free the next holder's lock", async () => {
  const name = uniq("steal");
  const a = await drover.lock(name, { ttl: 2 });
  const b = await drover.lock(name, { ttl: 5 }).catch((e) => e);
  assert.ok(b instanceof LockHeldError);
  // Release with the right token but a wrong contender is refused by the server.
  await assert.rejects(drover.transport.delete(`/v1/locks/${name}`, { query: { token: a.token, contender: "x-0", session: a.session.id } }));
  assert.equal((await drover.locks.get(name)).held, true);
  await a.release();
});
