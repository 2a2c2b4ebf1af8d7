import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { Drover, Session, SessionLostError, SessionClosedError, SessionNotFoundError } from "../dist/index.js";
import { sharedServer, uniq } from "./helpers/server.mjs";
import { startProxy } from "./helpers/proxy.mjs";

let srv;
let drover;
before(async () => {
  srv = await sharedServer();
  drover = new Drover({ url: srv.url, namespace: uniq("sess") });
});
after(async () => srv.release());

const waitAbort = (signal, ms) =>
  new Promise((res, rej) => {
    if (signal.aborted) return res(signal.reason);
    const t = setTimeout(() => rej(new Error(`signal did not fire within ${ms} ms`)), ms);
    signal.addEventListener("abort", () => {
      clearTimeout(t);
      res(signal.reason);
    }, { once: true });
  });

test("keepalives hold a session past its TTL", async () => {
  const s = await drover.session({ ttl: 2, name: "keeper" });
  try {
    await new Promise((r) => setTimeout(r, 4500));
    assert.equal(s.alive, true);
    assert.equal(s.signal.aborted, false);
    const info = await s.info();
    assert.equal(info.id, s.id);
    assert.ok(new Date(info.expires_at).getTime() > Date.now(), "the server still has it");
  } finally {
    await s.close();
  }
});

test("the signal fires when the session is deleted server-side", async () => {
  const s = await drover.session({ ttl: 3 });
  const t0 = Date.now();
  // Someone else ends it (an operator, another client with the id).
  const r = await fetch(`${srv.url}/v1/sessions/${s.id}`, { method: "DELETE", headers: { "Drover-Namespace": drover.transport.namespace } });
  assert.equal(r.status, 204);
  const reason = await waitAbort(s.signal, 3000);
  assert.ok(reason instanceof SessionLostError, `reason is ${reason}`);
  assert.equal(s.lost, true);
  assert.ok(Date.now() - t0 <= 1500, "noticed at the next keepalive (TTL/3)");
  await s.close(); // fine after loss
});

test("the signal fires when keepalives are refused (404: a wrong secret is a missing session)", async () => {
  const real = await drover.session({ ttl: 3 });
  try {
    const [lease] = real.id.split(".");
    const forged = `${lease}.${"a".repeat(26)}`;
    // The server refuses a keepalive that does not prove the session.
    await assert.rejects(drover.transport.post(`/v1/sessions/${forged}/keepalive`), SessionNotFoundError);
    const t0 = Date.now();
    const s = new Session(drover.transport, { id: forged, ttl: 3, expires_at: new Date().toISOString() }, Date.now());
    const reason = await waitAbort(s.signal, 3000);
    assert.ok(reason instanceof SessionLostError);
    assert.equal(reason.status, 404);
    assert.ok(Date.now() - t0 < 1500, "at the first keepalive (TTL/3), not at the TTL");
    assert.equal(real.alive, true, "the real session is not affected");
  } finally {
    await real.close();
  }
});

test("the signal fires once the TTL runs out while the server is unreachable, not before", async () => {
  const proxy = await startProxy(Number(new URL(srv.url).port));
  try {
    const d = new Drover({ url: proxy.url, namespace: drover.transport.namespace, retries: 0 });
    const s = await d.session({ ttl: 2 });
    const cutAt = Date.now();
    await proxy.cut();
    const reason = await waitAbort(s.signal, 5000);
    const after = Date.now() - cutAt;
    assert.ok(reason instanceof SessionLostError, String(reason));
    assert.match(reason.message, /could not be reached/);
    assert.ok(after >= 1000 && after <= 2600, `fired ${after} ms after the cut, for a 2 s TTL kept alive every 0.67 s`);
    assert.equal(s.lost, true);
  } finally {
    await proxy.close();
  }
});

test("a short outage within the TTL does not lose the session", async () => {
  const proxy = await startProxy(Number(new URL(srv.url).port));
  try {
    const d = new Drover({ url: proxy.url, namespace: drover.transport.namespace, retries: 0 });
    const s = await d.session({ ttl: 3 });
    await proxy.cut();
    await new Promise((r) => setTimeout(r, 1300));
    await proxy.restore();
    await new Promise((r) => setTimeout(r, 2500));
    assert.equal(s.alive, true, "kept alive once the server was back");
    await s.close();
    assert.ok(s.signal.reason instanceof SessionClosedError);
  } finally {
    await proxy.close();
  }
});

test("close() deletes the session on the server and stops the keepalives", async () => {
  const s = await drover.session({ ttl: 5 });
  await s.close();
  assert.equal(s.closed, true);
  assert.ok(s.signal.aborted);
  await assert.rejects(drover.transport.post(`/v1/sessions/${s.id}/keepalive`), SessionNotFoundError);
  await s.close(); // twice is fine
});

test("an open session's keepalive timer does not keep the process alive", async () => {
  const dist = fileURLToPath(new URL("../dist/index.js", import.meta.url));
  const script = `
    import { Drover } from ${JSON.stringify(dist)};
    const d = new Drover({ url: process.env.U, namespace: process.env.NS });
    const s = await d.session({ ttl: 30 });
    console.log("open", s.id);
  `;
  const child = spawn(process.execPath, ["--input-type=module", "-e", script], { env: { ...process.env, U: srv.url, NS: drover.transport.namespace }, stdio: ["ignore", "pipe", "inherit"] });
  let out = "";
  child.stdout.on("data", (d) => (out += d));
  const code = await new Promise((res) => {
    const t = setTimeout(() => {
      child.kill("SIGKILL");
      res("timeout");
    }, 8000);
    child.on("exit", (c) => {
      clearTimeout(t);
      res(c);
    });
  });
  assert.equal(code, 0, "the process exited by itself although its session was open (keepalive timer unref'd)");
  assert.match(out, /^open /);
});
