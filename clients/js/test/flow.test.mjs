import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { BreakerOpenError, Drover, QuotaFullError, RateLimitedError } from "../dist/index.js";
import { sharedServer, uniq } from "./helpers/server.mjs";

let srv;
let drover;
before(async () => {
  srv = await sharedServer();
  drover = new Drover({ url: srv.url, namespace: uniq("flow") });
});
after(async () => srv.release());

test("limits.take waits for tokens within its bound, and settle gives back what was not used", async () => {
  const name = uniq("tok");
  await drover.limits.set(name, "20/s", 20);
  const first = await drover.limits.take(name, 20);
  assert.equal(first.taken, 20);
  const t0 = Date.now();
  const second = await drover.limits.take(name, 10, { maxWait: 5 });
  const waited = Date.now() - t0;
  assert.equal(second.taken, 10);
  assert.ok(waited >= 350 && waited < 3000, `waited ${waited} ms for 10 tokens at 20/s`);
  const before = await drover.limits.get(name);
  const settled = await drover.limits.settle(name, 10, 4);
  assert.ok(settled.available >= before.available + 5.5, `gave back 6: ${before.available} -> ${settled.available}`);
});

test("limits.take past its bound throws RateLimitedError (429 with Retry-After) and takes nothing", async () => {
  const name = uniq("slow");
  await drover.limits.set(name, "1/m", 2);
  await drover.limits.take(name, 2);
  const t0 = Date.now();
  await assert.rejects(drover.limits.take(name, 1, { maxWait: 0.3 }), (err) => {
    assert.ok(err instanceof RateLimitedError, String(err));
    assert.equal(err.status, 429);
    assert.ok(err.retryAfter >= 1);
    return true;
  });
  assert.ok(Date.now() - t0 < 2500);
  const l = await drover.limits.get(name);
  assert.ok(l.available < 1);
});

test("limits.withTokens reserves, runs, settles with what was used", async () => {
  const name = uniq("wt");
  await drover.limits.set(name, "1/h", 1000);
  const r = await drover.limits.withTokens(name, 600, async () => ({ used: 100, text: "answer" }));
  assert.equal(r.text, "answer");
  const l = await drover.limits.get(name);
  assert.ok(l.available >= 899 && l.available <= 901, `available ${l.available}`);
  assert.ok((await drover.limits.list()).some((x) => x.name === name));
});

test("quotas: a slot per session up to the limit; QuotaFullError past it; released slots free up", async () => {
  const name = uniq("q");
  await drover.quotas.set(name, 1);
  const a = await drover.session({ ttl: 5 });
  const b = await drover.session({ ttl: 5 });
  try {
    const slot = await drover.quotas.acquire(name, { session: a });
    assert.equal(slot.limit, 1);
    await assert.rejects(drover.quotas.acquire(name, { session: b }), QuotaFullError);
    const waiting = drover.quotas.acquire(name, { session: b, wait: 5 });
    await new Promise((r) => setTimeout(r, 200));
    await drover.quotas.release(name, { session: a });
    const got = await waiting;
    assert.equal(got.session, b.id);
  } finally {
    await a.close();
    await b.close();
  }
});

test("breakers: failures open it (BreakerOpenError with Retry-After), a probe after the cooldown closes it", async () => {
  const name = uniq("br");
  await drover.breakers.set(name, { failures: 2, cooldown: "500ms" });
  for (let i = 0; i < 2; i++) {
    await assert.rejects(drover.breakers.call(name, async () => {
      throw new Error("upstream down");
    }), /upstream down/);
  }
  await assert.rejects(drover.breakers.allow(name), (err) => {
    assert.ok(err instanceof BreakerOpenError);
    assert.equal(err.status, 503);
    return true;
  });
  await new Promise((r) => setTimeout(r, 700));
  const probe = await drover.breakers.allow(name);
  assert.equal(probe.probe, true);
  const after = await drover.breakers.outcome(name, true, probe.call);
  assert.equal(after.state, "closed");
  assert.equal(await drover.breakers.call(name, async () => 7), 7);
});
