// PaxosLocks against drover server: its /locks routes are the lock
// service's API, so the Paxos client works against it unchanged.
import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { NotFoundError, PaxosLockHeldError, PaxosLocks, PaxosNotHeldError } from "../dist/index.js";
import { sharedServer, uniq } from "./helpers/server.mjs";

let srv;
let locks;
before(async () => {
  srv = await sharedServer();
  locks = new PaxosLocks([srv.url], { timeoutMs: 20_000 });
});
after(async () => {
  await locks.close?.();
  await srv.release();
});

test("acquire, get, renew, list and release on drover server's /locks; a release names its owner", async () => {
  const name = uniq("pxs");
  const g = await locks.acquire(name, { owner: "worker-7", ttl: 30, holder: { host: "pod-a" } });
  assert.equal(g.owner, "worker-7");
  assert.deepEqual(g.holder, { host: "pod-a" });
  assert.ok(g.token > 0);
  await assert.rejects(locks.acquire(name, { owner: "worker-8", ttl: 30 }), (err) => {
    assert.ok(err instanceof PaxosLockHeldError);
    assert.equal(err.current?.owner, "worker-7");
    return true;
  });
  const info = await locks.get(name);
  assert.equal(info.token, g.token);
  const r = await locks.renew(name, "worker-7", g.token, 60);
  assert.ok(r.expires > g.expires);
  assert.ok((await locks.list()).some((x) => x.lockId === name));
  await assert.rejects(locks.release(name, "worker-9", g.token), PaxosNotHeldError);
  assert.equal((await locks.get(name)).owner, "worker-7");
  await locks.release(name, "worker-7", g.token);
  await assert.rejects(locks.get(name), NotFoundError);
});
