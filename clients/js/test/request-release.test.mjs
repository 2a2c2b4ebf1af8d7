import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { getEventListeners } from "node:events";
import { Transport } from "../dist/index.js";

// A request's timeout timer and its listener on the caller's signal are let go
// of once the answer is read, whether it is a 200, a 204 or an error answer:
// none stays behind for the rest of the timeout.
test("a read answer leaves no timeout timer pending and no listener on the caller's signal", async () => {
  const server = createServer((req, res) => {
    if (req.url.startsWith("/gone")) {
      res.writeHead(404, { "content-type": "application/problem+json" });
      res.end(JSON.stringify({ title: "not found", status: 404 }));
    } else if (req.url.startsWith("/empty")) {
      res.writeHead(204);
      res.end();
    } else {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ ok: true }));
    }
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address();

  // A timeout no other timer in the process uses, so only the request's own are counted.
  const timeoutMs = 654_321;
  const pending = new Set();
  const realSet = globalThis.setTimeout;
  const realClear = globalThis.clearTimeout;
  globalThis.setTimeout = function (fn, ms, ...rest) {
    const t = realSet.call(this, fn, ms, ...rest);
    if (ms === timeoutMs) pending.add(t);
    return t;
  };
  globalThis.clearTimeout = function (t) {
    pending.delete(t);
    return realClear.call(this, t);
  };
  const caller = new AbortController();
  try {
    const transport = new Transport({ url: `http://127.0.0.1:${port}`, timeoutMs, retries: 0 });
    const n = 12;
    for (let i = 0; i < n; i++) {
      const opts = { signal: caller.signal };
      if (i % 3 === 0) {
        assert.deepEqual(await transport.get("/ok", opts), { ok: true });
      } else if (i % 3 === 1) {
        assert.equal(await transport.get("/empty", opts), undefined);
      } else {
        await assert.rejects(transport.get("/gone", opts), (err) => err.status === 404);
      }
    }
    assert.equal(pending.size, 0, `${pending.size} of ${n} request timers still pending`);
    assert.equal(getEventListeners(caller.signal, "abort").length, 0, "listeners left on the caller's signal");
  } finally {
    globalThis.setTimeout = realSet;
    globalThis.clearTimeout = realClear;
    for (const t of pending) realClear(t);
    await new Promise((resolve) => server.close(resolve));
  }
});
