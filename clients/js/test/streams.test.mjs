// Task streams against a real server: a worker's tokens, followers started
// before and after the task seeing one sequence, resuming with
// Last-Event-ID, a stale writer fenced after a takeover, caps, and the
// browser page's example server.
import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { Drover, FencedError, NotFoundError, StreamFullError, sleepFor } from "../dist/index.js";
import { parseSSE } from "../dist/registry.js";
import { startProxy } from "./helpers/proxy.mjs";
import { freePort, sharedServer, uniq, until, withTimeout } from "./helpers/server.mjs";

let srv;
let drover;
let ns;
before(async () => {
  srv = await sharedServer();
  ns = uniq("streams");
  drover = new Drover({ url: srv.url, namespace: ns });
});
after(async () => srv.release());

const collect = async (it) => {
  const out = [];
  for await (const ev of it) out.push(ev);
  return out;
};
const shape = (evs) => evs.map((e) => [e.seq, e.attempt, e.type, JSON.stringify(e.data)]);

/** Runs one task of queue q through a worker whose handler streams words as tokens. */
async function runTokens(q, id, words) {
  await drover.submit(q, [{ task_id: id, task_type: "answer" }]);
  const early = collect(drover.streams.follow(id)); // before any worker runs it
  await new Promise((r) => setTimeout(r, 100));
  const worker = drover.worker(q, { signals: false }, async (_task, { stream }) => {
    let reply = "";
    for (const w of words) {
      await stream.token(w);
      reply += w;
    }
    await stream.emit("progress", { done: 1, of: 1 });
    return { message: reply };
  });
  const evs = await withTimeout(early, 30_000, "the early follower did not end");
  await worker.drain();
  return evs;
}

test("a follower started before the task sees the same sequence as one started after; the result is the message", async () => {
  const q = uniq("chat");
  const id = uniq("chat");
  const words = Array.from({ length: 40 }, (_, i) => `w${i} `);
  const early = await runTokens(q, id, words);
  const late = await collect(drover.streams.follow(id));
  assert.deepEqual(shape(late), shape(early));
  assert.deepEqual(early.map((e) => e.seq), early.map((_, i) => i + 1)); // 1, 2, 3... no gap
  assert.equal(early[0].type, "attempt_started");
  assert.equal(early.at(-1).type, "done");
  assert.equal(early.at(-1).data.outcome, "succeeded");
  const text = early.filter((e) => e.type === "token").map((e) => e.data.text).join("");
  assert.equal(text, words.join(""));
  const t = await drover.tasks.get(q, id);
  assert.equal(t.result.message, text);

  // Resumed mid-stream, as EventSource does: the events after it, each once.
  const resumed = await collect(drover.streams.follow(id, { lastEventId: 10 }));
  assert.deepEqual(shape(resumed), shape(early.slice(10)));
  const from = await collect(drover.streams.follow(id, { from: 5 }));
  assert.deepEqual(shape(from), shape(early.slice(4)));
  const page = await drover.streams.read(id, { from: 3 });
  assert.equal(page.done, true);
  assert.deepEqual(shape(page.events), shape(early.slice(2)));
});

test("after a takeover the stale writer's emit is FencedError, and nothing of it follows the boundary", async () => {
  const q = uniq("take");
  const id = uniq("take");
  await drover.submit(q, [{ task_id: id, task_type: "t" }]);
  const s1 = await drover.session({ ttl: 5 });
  const [t1] = await drover.tasks.claim(q, { session: s1, max: 1, wait: "5s" });
  const stale = drover.streams.writer(id, { session: s1, token: t1.token });
  await stale.token("old-1 ");
  await stale.token("old-2 ");
  await stale.flush();

  await s1.close(); // the first worker is gone: its claim with it
  const s2 = await drover.session({ ttl: 15 });
  const [t2] = await until(async () => {
    const got = await drover.tasks.claim(q, { session: s2, max: 1, wait: "1s" });
    return got.length ? got : undefined;
  }, 30_000, "the task was not claimed again");
  assert.equal(t2.task_id, id);
  assert.notEqual(t2.token, t1.token);
  const fresh = drover.streams.writer(id, { session: s2, token: t2.token });
  await fresh.token("new-1 ");
  await fresh.flush();

  await stale.token("old-3 "); // queued: the write is refused
  await assert.rejects(stale.flush(), FencedError);
  await assert.rejects(stale.token("old-4 "), FencedError); // and every emit after it, at once
  assert.ok(stale.error instanceof FencedError);
  await assert.rejects(drover.streams.append(id, { session: s1.id, token: t1.token, events: [{ type: "log", data: "late" }] }), FencedError);

  await fresh.token("new-2 ");
  await fresh.flush();
  await drover.tasks.ack(q, s2, t2, { ok: true });
  const evs = await collect(drover.streams.follow(id));
  const boundary = evs.findIndex((e) => e.type === "attempt_lost");
  assert.ok(boundary > 0, JSON.stringify(shape(evs)));
  assert.deepEqual(evs.slice(0, boundary).filter((e) => e.type === "token").map((e) => e.data.text), ["old-1 ", "old-2 "]);
  const after = evs.slice(boundary + 1);
  assert.ok(after.every((e) => e.attempt === t2.attempt), JSON.stringify(shape(after)));
  assert.deepEqual(after.filter((e) => e.type === "token").map((e) => e.data.text), ["new-1 ", "new-2 "]);
  assert.equal(evs.at(-1).type, "done");
  await s2.close();
});

test("a follower whose connection breaks resumes with Last-Event-ID: no gap, no duplicate", async () => {
  const q = uniq("cut");
  const id = uniq("cut");
  await drover.submit(q, [{ task_id: id, task_type: "t" }]);
  const s = await drover.session({ ttl: 15 });
  const [t] = await drover.tasks.claim(q, { session: s, max: 1, wait: "5s" });
  const w = drover.streams.writer(id, { session: s, token: t.token });
  const proxy = await startProxy(Number(new URL(srv.url).port));
  const viaProxy = new Drover({ url: proxy.url, namespace: ns, retries: 0 });
  const seen = [];
  let reconnects = 0;
  const following = (async () => {
    for await (const ev of viaProxy.streams.follow(id, { maxBackoffMs: 200, onReconnect: () => reconnects++ })) seen.push(ev);
  })();
  try {
    for (let i = 0; i < 5; i++) await w.token(`a${i} `);
    await w.flush();
    await until(() => seen.length >= 6, 10_000, "the first events did not come"); // attempt_started + 5
    await proxy.cut(); // the connection breaks; new ones are refused
    for (let i = 0; i < 5; i++) await w.token(`b${i} `);
    await w.flush();
    await new Promise((r) => setTimeout(r, 300));
    await proxy.restore();
    for (let i = 0; i < 5; i++) await w.token(`c${i} `);
    await w.flush();
    await drover.tasks.ack(q, s, t, null);
    await withTimeout(following, 20_000, "the follower did not end");
  } finally {
    await proxy.close();
    await s.close();
  }
  assert.ok(reconnects >= 1);
  assert.deepEqual(seen.map((e) => e.seq), seen.map((_, i) => i + 1));
  assert.deepEqual(shape(seen), shape(await collect(drover.streams.follow(id))));
});

test("stream errors: an event over 64 KiB is StreamFullError at emit; drover's own types and unknown tasks are refused", async () => {
  const q = uniq("cap");
  const id = uniq("cap");
  await drover.submit(q, [{ task_id: id, task_type: "t" }]);
  const s = await drover.session({ ttl: 15 });
  try {
    const [t] = await drover.tasks.claim(q, { session: s, max: 1, wait: "5s" });
    const w = drover.streams.writer(id, { session: s, token: t.token });
    await assert.rejects(w.emit("done", {}), TypeError);
    await assert.rejects(w.emit("log", "x".repeat(70 << 10)), StreamFullError); // at once, not the batch it would go in
    // The server's own 413, for an append that is not a writer's.
    await assert.rejects(drover.streams.append(id, { session: s, token: t.token, events: [{ type: "log", data: "x".repeat(70 << 10) }] }), (err) => {
      assert.ok(err instanceof StreamFullError, String(err));
      assert.equal(err.status, 413);
      return true;
    });
    assert.equal((await drover.streams.read(id)).events.length, 0); // nothing stored
  } finally {
    await s.close();
  }
  await assert.rejects(collect(drover.streams.follow(uniq("nobody"))), NotFoundError);
});

test("the LLM tokens example runs, and the browser page's server passes the stream on", async () => {
  const examples = fileURLToPath(new URL("../build/examples/", import.meta.url));
  const env = { ...process.env, DROVER_URL: srv.url, DROVER_NAMESPACE: ns };
  const out = await new Promise((resolve, reject) => {
    const p = spawn(process.execPath, [examples + "llm-tokens.js"], { env, stdio: ["ignore", "pipe", "inherit"] });
    let s = "";
    p.stdout.on("data", (d) => (s += d));
    p.on("exit", (code) => (code === 0 ? resolve(s) : reject(new Error(`exit ${code}: ${s}`))));
  });
  assert.match(out, /done \{"attempt":1,"outcome":"succeeded"\}/);
  assert.match(out, /same: true/);
  const id = out.match(/streamed: /) && (await drover.tasks.list("chat", { status: "SUCCEEDED" })).tasks[0].task_id;

  const port = await freePort();
  const page = spawn(process.execPath, [examples + "stream-page.js"], { env: { ...env, PORT: String(port) }, stdio: ["ignore", "pipe", "inherit"] });
  try {
    await new Promise((r) => page.stdout.once("data", r));
    const html = await (await fetch(`http://127.0.0.1:${port}/?task=${id}`)).text();
    assert.match(html, /new EventSource\("\/v1\/tasks\/"/);
    const res = await fetch(`http://127.0.0.1:${port}/v1/tasks/${id}/stream`, { headers: { "Last-Event-ID": "1" } });
    assert.equal(res.headers.get("content-type"), "text/event-stream");
    const sse = await res.text(); // the task ended: the stream ends after done
    assert.doesNotMatch(sse, /^id: 1$/m);
    assert.match(sse, /^id: 2$/m);
    assert.match(sse, /"type":"token","data":\{"text":"You "\}/);
    assert.match(sse, /^event: end\ndata: \{"reason":"done"/m);
  } finally {
    page.kill("SIGTERM");
  }
});

/** A claimed task of a fresh queue: [id, session, claim]. */
async function claimed(prefix) {
  const q = uniq(prefix);
  const id = uniq(prefix);
  await drover.submit(q, [{ task_id: id, task_type: "t" }]);
  const s = await drover.session({ ttl: 15 });
  const [t] = await drover.tasks.claim(q, { session: s, max: 1, wait: "5s" });
  return [id, s, t, q];
}

/** A client whose stream writes wait until gate.open() (they still go to the real server). */
function gated() {
  let open;
  const opened = new Promise((r) => (open = r));
  const gate = { open, waiting: 0 };
  const client = new Drover({
    url: srv.url, namespace: ns,
    fetch: async (url, init) => {
      if (String(url).endsWith("/stream/events")) {
        gate.waiting++;
        await opened;
      }
      return fetch(url, init);
    },
  });
  return [client, gate];
}

const own = (evs) => evs.filter((e) => !["attempt_started", "attempt_lost", "attempt_ended", "done"].includes(e.type));

test("emit serialises the data at once: a later change is not sent, and a value that stops being JSON harms nothing", async () => {
  const [id, s, t] = await claimed("mut");
  const [client, gate] = gated();
  try {
    const w = client.streams.writer(id, { session: s, token: t.token });
    await w.emit("a", { n: 1 });
    await until(() => gate.waiting > 0, 5000, "the first write did not start");
    const later = { n: 2 };
    await w.emit("b", later); // queued behind the write in flight
    later.n = 3;
    later.big = 10n; // not JSON any more
    gate.open();
    await w.flush();
    assert.deepEqual(own((await drover.streams.read(id)).events).map((e) => [e.type, e.data]), [["a", { n: 1 }], ["b", { n: 2 }]]);
  } finally {
    await s.close();
  }
});

test("an event over 64 KiB of UTF-8 is refused at emit, and a batch is cut by its UTF-8 bytes", async () => {
  const [id, s, t] = await claimed("utf8");
  const [client, gate] = gated();
  try {
    const w = client.streams.writer(id, { session: s, token: t.token });
    await assert.rejects(w.emit("log", "é".repeat(33 << 10)), StreamFullError); // 33 Ki UTF-16 units, 66 KiB of UTF-8
    await w.emit("first");
    await until(() => gate.waiting > 0, 5000, "the first write did not start");
    // 14 events of 60,000 bytes: 840,000 bytes, over the server's 768 KiB a write (420,000 UTF-16 units).
    for (let i = 0; i < 14; i++) await w.emit("log", "é".repeat(30_000));
    gate.open();
    await w.flush();
    assert.equal(w.error, undefined);
    assert.equal(own((await drover.streams.read(id)).events).length, 15);
  } finally {
    await s.close();
  }
});

test("an emit in the turn the writer's last write ends is sent, and flush waits for it", async () => {
  const [id, s, t] = await claimed("race");
  try {
    const w = drover.streams.writer(id, { session: s, token: t.token });
    // The writer sets `last` as its write is stored, then ends in the same
    // turn: an emit queued right then lands between the two.
    let last = 0;
    let emitted;
    Object.defineProperty(w, "last", {
      configurable: true,
      get: () => last,
      set: (v) => {
        last = v;
        if (!emitted) emitted = new Promise((r) => queueMicrotask(() => r(w.emit("b", 2))));
      },
    });
    await w.emit("a", 1);
    await until(() => emitted !== undefined, 5000, "the first write was not stored");
    await emitted;
    await w.flush();
    assert.deepEqual(own((await drover.streams.read(id)).events).map((e) => e.type), ["a", "b"], "an event was left in the queue");
  } finally {
    await s.close();
  }
});

test("a worker's streamed outcomes go in the batch and end the stream; a sleep ends its attempt with attempt_ended", async () => {
  const q = uniq("wso");
  const id = uniq("wso");
  const acks = [];
  const client = new Drover({
    url: srv.url, namespace: ns,
    fetch: (url, init) => {
      if (/\/tasks\/[^/]+\/(ack|fail)$/.test(new URL(String(url)).pathname)) acks.push(String(url));
      return fetch(url, init);
    },
  });
  await drover.submit(q, [{ task_id: id, task_type: "t" }]);
  let runs = 0;
  const worker = client.worker(q, { signals: false }, async (_task, { stream }) => {
    runs++;
    await stream.token(`run${runs}`);
    return runs === 1 ? sleepFor("200ms") : { ok: true };
  });
  const evs = await withTimeout(collect(drover.streams.follow(id)), 30_000, "the follower did not end");
  await worker.drain();
  assert.deepEqual(acks, []); // the batch route only
  const types = evs.map((e) => e.type);
  assert.deepEqual(types, ["attempt_started", "token", "attempt_ended", "attempt_started", "token", "done"], JSON.stringify(shape(evs)));
});

test("a follower whose connection stays silent reconnects after idleTimeoutMs; onEnd gets the end", async () => {
  const [id, s, t, q] = await claimed("idle");
  let calls = 0;
  const client = new Drover({
    url: srv.url, namespace: ns,
    fetch: async (url, init) => {
      if (String(url).includes("/stream") && init?.method === "GET" && calls++ === 0) {
        // Headers, then nothing: a connection a proxy stalled.
        const body = new ReadableStream({ start(c) { init.signal?.addEventListener("abort", () => c.error(new Error("aborted"))); } });
        return new Response(body, { status: 200, headers: { "Content-Type": "text/event-stream" } });
      }
      return fetch(url, init);
    },
  });
  const reconnects = [];
  let end;
  try {
    await drover.streams.append(id, { session: s, token: t.token, events: [{ type: "log", data: 1 }] });
    const following = collect(client.streams.follow(id, { idleTimeoutMs: 300, onReconnect: (err) => reconnects.push(String(err)), onEnd: (e) => (end = e) }));
    await until(() => calls >= 2, 10_000, "the silent connection was not reopened");
    await drover.tasks.ack(q, s, t, null);
    const evs = await withTimeout(following, 30_000, "the follower did not end");
    assert.ok(evs.some((e) => e.type === "log"));
    assert.match(reconnects[0], /silent/);
    assert.ok(end && ["done", "ended"].includes(end.reason), JSON.stringify(end));
  } finally {
    await s.close().catch(() => {});
  }
});

test("an SSE parse that stops early cancels the response body", async () => {
  let cancelled = false;
  const body = new ReadableStream({
    start(c) {
      c.enqueue(new TextEncoder().encode("data: 1\n\ndata: 2\n\n"));
    },
    cancel() {
      cancelled = true;
    },
  });
  for await (const ev of parseSSE(body, new AbortController().signal)) {
    assert.equal(ev.data, "1");
    break;
  }
  await until(() => cancelled, 2000, "the body was left open");
});
