// Under Node, a request that streams neither way goes through node:http with
// one keep-alive agent a client (not fetch), with every behaviour of fetch's
// path: headers, bodies, answers, timeouts, aborts, typed errors.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { ConnectionError, Drover, NotFoundError, RateLimitedError, Transport } from "../dist/index.js";
import { neverSent } from "../dist/http.js";
import { sharedServer, uniq, withTimeout } from "./helpers/server.mjs";

let srv;
before(async () => {
  srv = await sharedServer();
});
after(async () => srv.release());

/** A node:http server on a loopback port; handler(req, res, body, n) with n the request's number on its connection (1, 2...). */
async function local(handler) {
  const seen = [];
  const sockets = new Set();
  const server = createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      const body = Buffer.concat(chunks);
      req.socket.n = (req.socket.n ?? 0) + 1;
      seen.push({ method: req.method, url: req.url, headers: req.headers, body, n: req.socket.n });
      handler(req, res, body, req.socket.n);
    });
  });
  server.on("connection", (s) => {
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
  });
  let connections = 0;
  server.on("connection", () => connections++);
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    seen,
    get connections() {
      return connections;
    },
    close: () =>
      new Promise((r) => {
        for (const s of sockets) s.destroy();
        server.close(() => r());
      }),
  };
}

/** Counts the requests handed to a transport's agent. */
function spy(transport) {
  const agent = transport.sender.agent;
  const count = { n: 0 };
  const add = agent.addRequest;
  agent.addRequest = function (...a) {
    count.n++;
    return add.apply(this, a);
  };
  return count;
}

test("requests go through the client's node:http agent by default, and through fetch when asked for", async () => {
  const d = new Drover({ url: srv.url, namespace: uniq("nh") });
  assert.ok(d.transport.sender, "a node:http sender under Node");
  assert.equal(d.namespace("other").transport.sender, d.transport.sender, "namespaces share the agent");
  const viaAgent = spy(d.transport);
  const s = await d.session({ ttl: 5 });
  await d.locks.list();
  await assert.rejects(d.tasks.get(uniq("q"), "none"), NotFoundError);
  await s.close();
  assert.equal(viaAgent.n, 4, "session, list, get, close: each through the agent");
  assert.equal(d.transport.sender.sends, 4);

  // A streamed answer is fetch's.
  const res = await d.transport.request("GET", "/readyz", { stream: true });
  assert.equal(typeof res.data.body?.getReader, "function", "a fetch Response");
  await res.data.text();
  assert.equal(viaAgent.n, 4, "the stream did not go through the agent");

  // A fetch or a dispatcher of the caller's takes every request.
  let fetched = 0;
  const f = new Drover({ url: srv.url, fetch: (u, i) => (fetched++, fetch(u, i)) });
  assert.equal(f.transport.sender, undefined);
  await f.locks.list();
  assert.equal(fetched, 1);
  assert.equal(new Transport({ url: srv.url, dispatcher: {} }).sender, undefined);
});

test("headers and bodies as sent, answers as read", async () => {
  const l = await local((req, res, body) => {
    if (req.url === "/empty") {
      res.writeHead(204);
      return res.end();
    }
    if (req.url === "/text") {
      res.writeHead(200, { "content-type": "text/plain", "x-extra": "1" });
      return res.end("plain é");
    }
    if (req.url === "/big") {
      res.writeHead(200, { "content-type": "application/json" });
      return res.end(JSON.stringify({ s: "é".repeat(300_000) }));
    }
    res.writeHead(200, { "content-type": "application/json", "x-answer": "yes" });
    res.end(JSON.stringify({ echo: body.toString("latin1") }));
  });
  try {
    const t = new Transport({ url: l.url, token: "tok", namespace: "ns-a", headers: { "X-Every": "e" }, retries: 0 });
    const viaAgent = spy(t);
    const r = await t.request("POST", "/json", { body: { a: 1, s: "ü" }, headers: { "X-One": "1" }, query: { q: "a b", n: [1, 2] } });
    assert.deepEqual(r.data, { echo: Buffer.from(JSON.stringify({ a: 1, s: "ü" })).toString("latin1") });
    assert.equal(r.status, 200);
    assert.equal(r.attempts, 1);
    assert.ok(r.headers instanceof Headers);
    assert.equal(r.headers.get("x-answer"), "yes");
    let h = l.seen.at(-1);
    assert.equal(h.url, "/json?q=a+b&n=1&n=2");
    assert.equal(h.headers.authorization, "Bearer tok");
    assert.equal(h.headers["drover-namespace"], "ns-a");
    assert.equal(h.headers["x-every"], "e");
    assert.equal(h.headers["x-one"], "1");
    assert.equal(h.headers["content-type"], "application/json");
    assert.equal(h.headers.accept, "application/json, application/problem+json");
    assert.equal(h.headers["content-length"], String(Buffer.byteLength(JSON.stringify({ a: 1, s: "ü" }))));
    assert.equal(h.headers["sec-fetch-mode"], undefined, "not sent by fetch");

    for (const [raw, want] of [
      [new Uint8Array([0, 1, 2, 255]), Buffer.from([0, 1, 2, 255])],
      [Buffer.from("buf"), Buffer.from("buf")],
      ["a string ✓", Buffer.from("a string ✓")],
    ]) {
      await t.request("PUT", "/raw", { rawBody: raw, contentType: "application/x-test" });
      h = l.seen.at(-1);
      assert.deepEqual(h.body, want);
      assert.equal(h.headers["content-type"], "application/x-test");
      assert.equal(h.headers["content-length"], String(want.length));
    }
    assert.deepEqual(await t.delete("/json", { body: { d: 1 } }), { echo: '{"d":1}' }, "a DELETE's body");
    assert.equal(l.seen.at(-1).headers["content-length"], "7");
    await t.request("POST", "/nothing");
    assert.equal(l.seen.at(-1).headers["content-length"], "0", "a POST without a body says so");
    await t.get("/json");
    assert.equal(l.seen.at(-1).headers["content-length"], undefined);

    const empty = await t.request("DELETE", "/empty");
    assert.equal(empty.status, 204);
    assert.equal(empty.data, undefined);
    const text = await t.request("GET", "/text");
    assert.equal(text.data, "plain é");
    assert.equal(text.headers.get("x-extra"), "1");
    assert.equal((await t.get("/big")).s, "é".repeat(300_000), "an answer of many chunks, split inside characters");
    assert.equal(viaAgent.n, 10);
    assert.equal(l.connections, 1, "one kept-alive connection for requests one after another");
  } finally {
    await l.close();
  }
});

test("problem documents, Retry-After and the retry rule", async () => {
  let n = 0;
  const l = await local((req, res) => {
    n++;
    if (req.url === "/limited") {
      res.writeHead(429, { "content-type": "application/problem+json", "retry-after": "7" });
      return res.end(JSON.stringify({ type: "https://drover.dev/problems/rate-limited", title: "Too Many Requests", status: 429, detail: "slow down" }));
    }
    if (req.url === "/busy") {
      res.writeHead(503, { "content-type": "application/problem+json", "retry-after": "0" });
      return res.end(JSON.stringify({ title: "Service Unavailable", status: 503 }));
    }
    res.writeHead(500, "Broken Here", { "content-type": "text/plain" });
    res.end("not json");
  });
  try {
    const t = new Transport({ url: l.url, retries: 2 });
    await assert.rejects(t.post("/limited"), (err) => {
      assert.ok(err instanceof RateLimitedError, String(err));
      assert.equal(err.retryAfter, 7);
      assert.equal(err.problem.detail, "slow down");
      return true;
    });
    assert.equal(n, 1);
    n = 0;
    await assert.rejects(t.get("/busy"), (err) => err.status === 503);
    assert.equal(n, 3, "a read answered 503 is sent 1 + 2 times");
    n = 0;
    await assert.rejects(t.post("/busy"), (err) => err.status === 503);
    assert.equal(n, 1, "a POST is not repeated");
    await assert.rejects(t.get("/other"), (err) => err.status === 500 && err.problem.detail === "not json");
  } finally {
    await l.close();
  }
  const d = new Drover({ url: srv.url, namespace: uniq("nh") });
  await assert.rejects(d.tasks.get(uniq("q"), "none"), NotFoundError);
});

test("no answer within the timeout; an answer stopping or cut mid-body broke off", async () => {
  const l = await local((req, res) => {
    if (req.url === "/silent") return; // never answers
    res.writeHead(200, { "content-type": "application/json", "content-length": "100" });
    res.write('{"a":');
    if (req.url === "/cut") setTimeout(() => res.socket.destroy(), 20);
  });
  try {
    const t = new Transport({ url: l.url, retries: 0, timeoutMs: 300 });
    await assert.rejects(t.get("/silent"), (err) => {
      assert.ok(err instanceof ConnectionError, String(err));
      assert.equal(err.message, "GET /silent: no answer within 300 ms");
      assert.equal(neverSent(err), false);
      return true;
    });
    await assert.rejects(t.get("/stalls"), (err) => err instanceof ConnectionError && err.message === "GET /stalls: the answer broke off (no answer within 300 ms)");
    await assert.rejects(t.get("/cut", { timeoutMs: 0 }), (err) => err instanceof ConnectionError && /^GET \/cut: the answer broke off/.test(err.message));
    assert.equal(t.sender.sends, 3);
  } finally {
    await l.close();
  }
});

test("the caller's signal: rejects with its reason, before and while the request is out", async () => {
  const l = await local(() => {});
  try {
    const t = new Transport({ url: l.url, timeoutMs: 10_000 });
    const reason = new Error("stop now");
    const ac = new AbortController();
    const p = t.get("/hangs", { signal: ac.signal });
    setTimeout(() => ac.abort(reason), 50);
    await assert.rejects(p, (err) => err === reason);
    await assert.rejects(t.get("/hangs", { signal: AbortSignal.abort(reason) }), (err) => err === reason);
    assert.equal(t.sender.sends, 1, "an aborted signal sends nothing");
  } finally {
    await l.close();
  }
});

test("a refused connection is a ConnectionError that was never sent", async () => {
  const l = await local(() => {});
  const url = l.url;
  await l.close();
  const t = new Transport({ url, retries: 0 });
  assert.ok(t.sender);
  await assert.rejects(t.post("/x", { a: 1 }), (err) => {
    assert.ok(err instanceof ConnectionError, String(err));
    assert.ok(neverSent(err), "never sent");
    assert.match(err.message, /cannot reach .* \(ECONNREFUSED\)$/);
    return true;
  });
});

test("a reused connection reset before any answer: sent again on a new one only when the request may be repeated", async () => {
  // The server reads the second request of every connection and drops it
  // unanswered: as a server that closed an idle connection while it was
  // being reused, or one that acted on the request and then lost the
  // connection (stopped, crashed), which the client cannot tell apart.
  const l = await local((req, res, body, n) => {
    if (n === 2) return req.socket.destroy();
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify({ n, body: body.toString() }));
  });
  try {
    const t = new Transport({ url: l.url, retries: 0 });
    assert.deepEqual(await t.post("/a", { i: 1 }, { retry: false }), { n: 1, body: '{"i":1}' });
    const r = await t.request("POST", "/b", { body: { i: 2 }, retry: true });
    assert.deepEqual(r.data, { n: 1, body: '{"i":2}' }, "answered on a new connection");
    assert.equal(r.attempts, 1, "not the retry rule's repeat");
    assert.equal(t.sender.resends, 1);
    assert.equal(l.seen.length, 3);
    assert.equal(l.connections, 2);

    // A claim or a lock acquisition the server may have acted on is not sent
    // twice (the second request on the second connection).
    await assert.rejects(t.post("/d", { i: 4 }), (err) => {
      assert.ok(err instanceof ConnectionError, String(err));
      assert.equal(neverSent(err), false, "it may have been acted on");
      assert.match(err.message, /^POST \/d: cannot reach .* \(ECONNRESET\)$/);
      return true;
    });
    assert.equal(l.seen.filter((s) => s.url === "/d").length, 1, "the POST reached the server once");
    assert.equal(t.sender.resends, 1);
  } finally {
    await l.close();
  }
  // A reset on a new connection is not sent again.
  const dropAll = await local((req) => req.socket.destroy());
  try {
    const t = new Transport({ url: dropAll.url, retries: 0 });
    await assert.rejects(t.post("/c", { i: 3 }), (err) => err instanceof ConnectionError && !neverSent(err));
    assert.equal(dropAll.seen.length, 1);
    assert.equal(t.sender.resends, 0);
  } finally {
    await dropAll.close();
  }
});

test("a redirect is followed, as fetch does", async () => {
  const l = await local((req, res) => {
    if (req.url === "/old") {
      res.writeHead(307, { location: "/new" });
      return res.end();
    }
    res.writeHead(200, { "content-type": "application/json" });
    res.end('{"at":"new"}');
  });
  try {
    const t = new Transport({ url: l.url });
    assert.deepEqual(await t.get("/old"), { at: "new" });
  } finally {
    await l.close();
  }
});

test("idle kept-alive connections do not keep the process alive", async () => {
  const dist = fileURLToPath(new URL("../dist/index.js", import.meta.url));
  const script = `
    import { Drover } from ${JSON.stringify(dist)};
    const d = new Drover({ url: process.env.U, namespace: "exit" });
    await d.locks.list();
    await d.locks.list();
    console.log("sent", d.transport.sender.sends, "sockets", Object.values(d.transport.sender.agent.freeSockets).flat().length);
  `;
  const child = spawn(process.execPath, ["--input-type=module", "-e", script], { env: { ...process.env, U: srv.url }, stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  child.stdout.on("data", (d) => (out += d));
  child.stderr.on("data", (d) => (out += d));
  // The agent keeps an idle connection 30 s: a process it held would not be done within 15 s.
  const code = await withTimeout(new Promise((r) => child.on("exit", r)), 15_000, "the process did not exit").finally(() => child.kill());
  assert.equal(code, 0, out);
  assert.equal(out.trim(), "sent 2 sockets 1", "both requests over one connection, still open at the end");
});
