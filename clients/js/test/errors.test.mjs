import { test, after, before, describe } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, writeFileSync, readFileSync, rmSync } from "node:fs";
import { randomBytes } from "node:crypto";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { Agent } from "undici";
import {
  ConflictError,
  ConnectionError,
  Drover,
  DroverError,
  FencedError,
  ForbiddenError,
  InvalidInputError,
  LockHeldError,
  NotFoundError,
  QueueFullError,
  RateLimitedError,
  SessionNotFoundError,
  StoreFullError,
  TooLargeError,
  UnauthorizedError,
  UnavailableError,
  errorFromProblem,
} from "../dist/index.js";
import { sharedServer, startServer, uniq, withTimeout } from "./helpers/server.mjs";
import { startProxy } from "./helpers/proxy.mjs";

let srv;
let drover;
before(async () => {
  srv = await sharedServer();
  drover = new Drover({ url: srv.url, namespace: uniq("err") });
});
after(async () => srv.release());

test("problem documents map to typed errors by their type, then their status", () => {
  const P = (kind, status) => errorFromProblem(status, { type: `https://drover.dev/problems/${kind}`, status, detail: kind });
  assert.ok(P("lock-held", 409) instanceof LockHeldError);
  assert.ok(P("task-busy", 409) instanceof LockHeldError);
  assert.ok(P("fenced", 409) instanceof FencedError);
  assert.ok(P("lock-not-held", 409) instanceof FencedError);
  assert.ok(P("lock-not-held", 404) instanceof NotFoundError);
  assert.ok(P("conflict", 409) instanceof ConflictError);
  assert.ok(!(P("conflict", 409) instanceof FencedError));
  assert.ok(P("queue-full", 429) instanceof QueueFullError);
  assert.ok(P("rate-limited", 429) instanceof RateLimitedError);
  assert.ok(P("store-full", 507) instanceof StoreFullError);
  assert.ok(P("unauthorized", 401) instanceof UnauthorizedError);
  assert.ok(P("forbidden", 403) instanceof ForbiddenError);
  assert.ok(P("forbidden", 403) instanceof UnauthorizedError, "403 is caught as unauthorized too");
  assert.ok(P("session-not-found", 404) instanceof SessionNotFoundError);
  assert.ok(P("unavailable", 503) instanceof UnavailableError);
  const e = errorFromProblem(418, { title: "I'm a teapot", status: 418 });
  assert.equal(e.constructor, DroverError);
  assert.equal(e.status, 418);
  assert.equal(P("fenced", 409).kind, "fenced");
});

test("real answers: 400 names the input at fault, 404, 404 session, 413", async () => {
  await assert.rejects(drover.lock("bad name!"), (err) => {
    assert.ok(err instanceof InvalidInputError, String(err));
    assert.equal(err.status, 400);
    assert.equal(err.problem.errors[0].location, "path.name");
    return true;
  });
  await assert.rejects(drover.tasks.get(uniq("q"), "nope"), (err) => err instanceof NotFoundError && !(err instanceof SessionNotFoundError));
  await assert.rejects(drover.transport.post("/v1/sessions/0123abcd.aaaaaaaaaaaaaaaaaaaaaaaaaa/keepalive"), SessionNotFoundError);
  await assert.rejects(drover.transport.post("/v1/sessions", { ttl: 5, name: "x".repeat(2 << 20) }), TooLargeError);
});

test("connection errors: reads are retried, claims and lock acquisitions are not", async () => {
  const proxy = await startProxy(Number(new URL(srv.url).port));
  const calls = [];
  const d = new Drover({
    url: proxy.url,
    namespace: drover.transport.namespace,
    retries: 3,
    fetch: (url, init) => {
      calls.push(`${init.method} ${new URL(url).pathname}`);
      return fetch(url, init);
    },
  });
  try {
    const q = uniq("q");
    await drover.submit(q, [{ task_id: "t", task_type: "x" }]);
    const session = await d.session({ ttl: 10 });
    await proxy.cut();
    calls.length = 0;
    await assert.rejects(d.tasks.claim(q, { session, wait: 1 }), ConnectionError);
    assert.equal(calls.filter((c) => c.endsWith("/claim")).length, 1, "a claim is sent once");
    calls.length = 0;
    await assert.rejects(d.lock(uniq("l"), { session }), ConnectionError);
    assert.equal(calls.filter((c) => c.startsWith("POST /v1/locks")).length, 1, "a lock acquisition is sent once");
    calls.length = 0;
    await assert.rejects(d.tasks.get(q, "t"), ConnectionError);
    assert.equal(calls.length, 4, "a read is tried 1 + 3 times");
    // Back within the retries: the read succeeds.
    calls.length = 0;
    setTimeout(() => proxy.restore(), 150);
    const t = await d.tasks.get(q, "t");
    assert.equal(t.task_id, "t");
    assert.ok(calls.length >= 2, `retried: ${calls.length}`);
    await session.close();
  } finally {
    await proxy.close();
  }
});

describe("a server with a full store", () => {
  let full;
  before(async () => {
    full = await startServer({ extraArgs: ["--quota-backend-bytes", "16777216", "--high-water", "4%", "--low-water", "3%"] });
  });
  after(async () => full?.stop());

  test("submissions and checkpoints get StoreFullError (507, Retry-After) while locks still work", async () => {
    const d = new Drover({ url: full.url });
    // Incompressible parameters, a batch at a time, until the server
    // refuses both a small submission and a small checkpoint. The server
    // counts what a write adds before sending it, so a large batch may be
    // refused while small writes still fit; the batches go on until the
    // store is past its high-water mark, where every data write is refused.
    const refusal = (p) => p.then(() => undefined, (e) => e);
    const pad = (b) => Array.from({ length: 40 }, (_, i) => ({ task_id: `pad-${b}-${i}`, task_type: "t", parameters: { pad: randomBytes(5000).toString("hex") } }));
    let err, cpErr;
    for (let b = 0; b < 60; b++) {
      err = await refusal(d.submit("after", [{ task_id: uniq("t"), task_type: "t" }]));
      cpErr = await refusal(d.checkpoints.put(uniq("th"), { state: new Uint8Array([1]) }));
      if (err && cpErr) break;
      const e = await refusal(d.submit("filler", pad(b)));
      if (e && !(e instanceof StoreFullError)) throw e;
      if (e) await new Promise((r) => setTimeout(r, 250)); // the guard measures again
    }
    assert.ok(err instanceof StoreFullError, `expected StoreFullError, got ${err}`);
    assert.equal(err.status, 507);
    assert.ok(err.retryAfter > 0);
    assert.ok(cpErr instanceof StoreFullError, `a checkpoint: expected StoreFullError, got ${cpErr}`);
    const lock = await d.lock(uniq("still-works"));
    await lock.release();
  });
});

describe("a server with bearer tokens and TLS", () => {
  let sec;
  let dir;
  const writeToken = randomBytes(32).toString("hex");
  const readToken = randomBytes(32).toString("hex");
  before(async () => {
    dir = mkdtempSync(join(tmpdir(), "drover-tls-"));
    // A CA of our own and a certificate for 127.0.0.1 signed by it.
    const run = (args) => execFileSync("openssl", args, { cwd: dir, stdio: "ignore" });
    run(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=drover test CA"]);
    run(["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1"]);
    writeFileSync(join(dir, "ext.cnf"), "subjectAltName=IP:127.0.0.1\n");
    run(["x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "server.pem", "-days", "1", "-extfile", "ext.cnf"]);
    writeFileSync(join(dir, "tokens.json"), JSON.stringify({
      tokens: [
        { name: "agents", token: writeToken, namespaces: ["team-a"], role: "write" },
        { name: "dash", token: readToken, namespaces: ["*"], role: "read" },
      ],
    }));
    sec = await startServer({
      scheme: "https",
      extraArgs: ["--auth-file", join(dir, "tokens.json"), "--tls-cert", join(dir, "server.pem"), "--tls-key", join(dir, "server.key")],
    });
  });
  after(async () => {
    await sec?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  test("a custom CA through a dispatcher; the bearer token and its namespaces and role", async () => {
    const dispatcher = new Agent({ connect: { ca: readFileSync(join(dir, "ca.pem")) } });
    try {
      const ok = new Drover({ url: sec.url, token: writeToken, namespace: "team-a", dispatcher });
      const s = await ok.session({ ttl: 5 });
      await s.close();
      await assert.rejects(new Drover({ url: sec.url, namespace: "team-a", dispatcher, token: "" }).session(), (err) => {
        assert.ok(err instanceof UnauthorizedError && !(err instanceof ForbiddenError));
        assert.equal(err.status, 401);
        return true;
      });
      await assert.rejects(new Drover({ url: sec.url, token: writeToken, namespace: "team-b", dispatcher }).session(), ForbiddenError);
      const reader = new Drover({ url: sec.url, token: readToken, namespace: "team-a", dispatcher });
      assert.deepEqual(await reader.locks.list(), []);
      await assert.rejects(reader.session(), (err) => err instanceof ForbiddenError && err.status === 403);
      // Without the CA the certificate is refused: no answer at all.
      await assert.rejects(new Drover({ url: sec.url, token: writeToken, namespace: "team-a", retries: 0 }).locks.list(), ConnectionError);
    } finally {
      await dispatcher.close();
    }
  });

  test("a custom CA through NODE_EXTRA_CA_CERTS", async () => {
    const dist = fileURLToPath(new URL("../dist/index.js", import.meta.url));
    const script = `
      import { Drover } from ${JSON.stringify(dist)};
      const d = new Drover({ url: process.env.U, token: process.env.T, namespace: "team-a" });
      const s = await d.session({ ttl: 5 });
      await s.close();
      console.log("ok");
    `;
    const child = spawn(process.execPath, ["--input-type=module", "-e", script], {
      env: { ...process.env, U: sec.url, T: writeToken, NODE_EXTRA_CA_CERTS: join(dir, "ca.pem") },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let out = "";
    child.stdout.on("data", (d) => (out += d));
    child.stderr.on("data", (d) => (out += d));
    const code = await withTimeout(new Promise((r) => child.on("exit", r)), 15_000, "child did not finish");
    assert.equal(code, 0, out);
    assert.equal(out.trim(), "ok");
  });
});
