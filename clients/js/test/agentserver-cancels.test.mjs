// RunStops: the stops of running runs pushed by the server over one
// stream (GET /v1/agent-server/runs/stops), against a real drover server:
// a cancel reaches the runtime with no read of its task, a stop before the
// watch is remembered, a cut connection resumes with the stops meanwhile,
// a restarted server's stream goes on after the revision reached, a
// server without the route (404) gets the per-task reads instead, and one
// that serves it later (upgraded) has the stream take over.
import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { Drover } from "../dist/index.js";
import { RunStops } from "../dist/agentserver-cancels.js";
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { droverBin, freePort, sharedServer, uniq, until, withTimeout } from "./helpers/server.mjs";
import { startProxy } from "./helpers/proxy.mjs";

let srv;
before(async () => {
  srv = await sharedServer();
});
after(async () => srv.release());

/** A fetch that counts the reads of tasks of the runs queue (and answers the stops route 404 while c.noStops, as an older server). */
function counting({ noStops = false } = {}) {
  const c = { taskReads: 0, stopsOpened: 0, noStops };
  c.fetch = async (url, init) => {
    const u = new URL(url);
    if (u.pathname.startsWith("/v1/queues/langgraph/tasks/") && (init?.method ?? "GET") === "GET") c.taskReads++;
    if (u.pathname === "/v1/agent-server/runs/stops") {
      c.stopsOpened++;
      if (c.noStops) return new Response(JSON.stringify({ title: "Not Found", status: 404, detail: "no such route" }), { status: 404, headers: { "Content-Type": "application/problem+json" } });
    }
    return fetch(url, init);
  };
  return c;
}

/**
 * A namespace with a graph registered and a worker that runs its runs'
 * tasks: each claimed task waits for `watchGate` (when set), is watched by
 * stops, and ends when its stop comes. started(id) resolves once task id
 * runs; stopped(id) with its stop.
 */
async function setup(t, stopsDrover, ns, url = srv.url, opts = {}) {
  const d = new Drover({ url, namespace: ns });
  await d.transport.put("/v1/agent-server/graphs/agent", {});
  const stops = new RunStops({ drover: stopsDrover, keepaliveS: 1, ...opts });
  const started = new Map();
  const stoppedOf = new Map();
  const waiter = (m, id) => {
    if (!m.has(id)) {
      let res;
      const p = new Promise((r) => (res = r));
      m.set(id, { p, res });
    }
    return m.get(id);
  };
  const env = { watchGate: undefined };
  const worker = d.worker("langgraph", { concurrency: 4, signals: false }, async (task, ctx) => {
    waiter(started, task.task_id).res(task);
    if (env.watchGate) await env.watchGate;
    const stop = await new Promise((res) => {
      stops.watch(task.task_id, res);
      ctx.signal.addEventListener("abort", () => res(undefined), { once: true });
    });
    waiter(stoppedOf, task.task_id).res(stop);
    return null;
  });
  t.after(async () => {
    await withTimeout(worker.drain(), 30_000, "worker did not drain");
    await stops.close();
  });
  const run = async () => {
    const th = (await d.transport.post("/threads", {})).thread_id;
    const id = (await d.transport.post(`/threads/${th}/runs`, { assistant_id: "agent" })).run_id;
    return { th, id };
  };
  const cancel = (r) => d.transport.post(`/threads/${r.th}/runs/${r.id}/cancel`);
  return { d, stops, env, run, cancel, started: (id) => waiter(started, id).p, stopped: (id) => waiter(stoppedOf, id).p };
}

test("RunStops: a cancel of a running run arrives with no read of its task", async (t) => {
  const ns = uniq("stops");
  const c = counting();
  const s = await setup(t, new Drover({ url: srv.url, namespace: ns, fetch: c.fetch }), ns);
  await withTimeout(s.stops.ready(), 10_000, "the stream was not live");
  assert.equal(s.stops.state, "live");
  const r = await s.run();
  await withTimeout(s.started(r.id), 20_000, "the run did not start");
  await s.cancel(r);
  const stop = await withTimeout(s.stopped(r.id), 10_000, "the cancel did not arrive within 10 s");
  assert.equal(stop.task_id, r.id);
  assert.equal(stop.run_id, r.id);
  assert.ok(stop.revision > 0, "the stop came from the stream");
  assert.equal(c.taskReads, 0, "no task was read");
  assert.equal(s.stops.stats.checks, 0);
  assert.equal(c.stopsOpened, 1);
});

test("RunStops: a stop that comes before its task is watched is remembered", async (t) => {
  const ns = uniq("stops");
  const c = counting();
  const s = await setup(t, new Drover({ url: srv.url, namespace: ns, fetch: c.fetch }), ns);
  let open;
  s.env.watchGate = new Promise((r) => (open = r));
  await withTimeout(s.stops.ready(), 10_000, "the stream was not live");
  const r = await s.run();
  await withTimeout(s.started(r.id), 20_000, "the run did not start");
  await s.cancel(r);
  await until(() => s.stops.stats.stops >= 1, 10_000, "the stream told no stop");
  open();
  const stop = await withTimeout(s.stopped(r.id), 10_000, "the stop seen before the watch was not told to it");
  assert.equal(stop.task_id, r.id);
  assert.equal(c.taskReads, 0);
});

test("RunStops: a cut connection reopens after the revision reached, and the cancel meanwhile arrives", async (t) => {
  const ns = uniq("stops");
  const proxy = await startProxy(Number(new URL(srv.url).port));
  t.after(() => proxy.close());
  const c = counting();
  const s = await setup(t, new Drover({ url: proxy.url, namespace: ns, fetch: c.fetch }), ns);
  await withTimeout(s.stops.ready(), 10_000, "the stream was not live");
  const r = await s.run();
  await withTimeout(s.started(r.id), 20_000, "the run did not start");
  await proxy.cut();
  await until(() => s.stops.state === "connecting", 10_000, "the cut was not noticed");
  await s.cancel(r);
  await proxy.restore();
  const stop = await withTimeout(s.stopped(r.id), 30_000, "the cancel made while the stream was cut did not arrive");
  assert.ok(stop.revision > 0, "the stop came from the resumed stream");
  assert.ok(c.stopsOpened >= 2, `${c.stopsOpened} streams opened`);
  assert.equal(c.taskReads, 0, "the resumed stream needed no read of the task");
  assert.equal(s.stops.stats.checks, 0);
});

test("RunStops: a server without the route (404) gets the per-task reads", async (t) => {
  const ns = uniq("stops");
  const c = counting({ noStops: true });
  const s = await setup(t, new Drover({ url: srv.url, namespace: ns, fetch: c.fetch }), ns, srv.url, { routeRetryMs: 600_000 });
  await withTimeout(s.stops.ready(), 10_000, "the 404 was not seen");
  assert.equal(s.stops.state, "fallback");
  const r = await s.run();
  await withTimeout(s.started(r.id), 20_000, "the run did not start");
  await until(() => c.taskReads >= 1, 10_000, "the fallback read no task");
  await s.cancel(r);
  const stop = await withTimeout(s.stopped(r.id), 10_000, "the fallback did not see the cancel");
  assert.equal(stop.task_id, r.id);
  assert.equal(stop.revision, 0, "seen by a read");
  assert.equal(c.stopsOpened, 1, "the stream was not asked for again");
  assert.equal(s.stops.stats.fallbacks, 1);
});

test("RunStops: a server that serves the route after a 404 (upgraded) has the stream take over", async (t) => {
  const ns = uniq("stops");
  const c = counting({ noStops: true }); // 404, as an older member, until the run is watched
  const s = await setup(t, new Drover({ url: srv.url, namespace: ns, fetch: c.fetch }), ns, srv.url, { routeRetryMs: 1_000 });
  await withTimeout(s.stops.ready(), 10_000, "the 404 was not seen");
  const r = await s.run();
  await withTimeout(s.started(r.id), 20_000, "the run did not start");
  await until(() => s.stops.stats.fallbacks === 1, 10_000, "the run was not watched by the fallback");
  c.noStops = false; // the members upgraded
  await until(() => s.stops.state === "live", 20_000, `the stream did not take over (state ${s.stops.state}, ${c.stopsOpened} opened)`);
  assert.ok(c.stopsOpened >= 2, `${c.stopsOpened} streams asked for`);
  assert.equal(s.stops.stats.fallbacks, 1, "the run was watched by the fallback first");
  // Taken over, the run is read once more at most (what happened before the stream is unknown), then no more.
  const reads = c.taskReads;
  await new Promise((r) => setTimeout(r, 1_500)); // the fallback would have read it about six times by now
  assert.ok(c.taskReads <= reads + 1, `${c.taskReads - reads} reads of the task after the stream took over: the fallback still polls`);
  await s.cancel(r);
  const stop = await withTimeout(s.stopped(r.id), 10_000, "the stream did not bring the cancel");
  assert.ok(stop.revision > 0, "the stop came from the stream, not a read");
});

/** A drover server of its own on a data dir it keeps: restart() stops it (SIGTERM) and starts it again on the same ports. */
async function ownServer() {
  const dataDir = mkdtempSync(join(tmpdir(), "drover-data-"));
  const [p1, p2, p3] = [await freePort(), await freePort(), await freePort()];
  const args = ["server", "--data-dir", dataDir, "--etcd-listen", `http://127.0.0.1:${p1}`, "--etcd-peer-listen", `http://127.0.0.1:${p2}`, "--http-listen", `127.0.0.1:${p3}`];
  const url = `http://127.0.0.1:${p3}`;
  let proc;
  const start = async () => {
    proc = spawn(droverBin(), args, { stdio: ["ignore", "ignore", "ignore"] });
    await until(() => fetch(`${url}/readyz`, { signal: AbortSignal.timeout(1000) }).then((r) => r.status === 200, () => false), 30_000, "the server was not ready");
  };
  const halt = async () => {
    const exited = new Promise((r) => proc.once("exit", r));
    proc.kill("SIGTERM");
    await withTimeout(exited, 20_000, "the server did not stop");
  };
  await start();
  return {
    url,
    etcd: `http://127.0.0.1:${p1}`,
    restart: async () => {
      await halt();
      await start();
    },
    stop: async () => {
      await halt();
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

test("RunStops: after the server restarts, the stream reopens after the revision reached, and a cancel arrives", async (t) => {
  const own = await ownServer();
  t.after(() => own.stop());
  const ns = uniq("stops");
  const c = counting();
  const s = await setup(t, new Drover({ url: own.url, namespace: ns, fetch: c.fetch }), ns, own.url);
  await withTimeout(s.stops.ready(), 10_000, "the stream was not live");
  const r = await s.run();
  await withTimeout(s.started(r.id), 20_000, "the run did not start");
  await own.restart();
  await until(() => c.stopsOpened >= 2 && s.stops.state === "live", 30_000, () => `the stream was not live again (${c.stopsOpened} opened, ${s.stops.state})`);
  await s.cancel(r);
  const stop = await withTimeout(s.stopped(r.id), 10_000, "the cancel after the restart did not arrive");
  assert.equal(stop.task_id, r.id);
  assert.ok(stop.revision > 0, "the stop came from the stream");
  assert.equal(c.taskReads, 0, "the reopened stream needed no read of the task");
  assert.equal(s.stops.stats.checks, 0);
});

test("RunStops: a stream that cannot resume (compacted) reads the tasks watched, whose signal is gone", async (t) => {
  const own = await ownServer();
  t.after(() => own.stop());
  const proxy = await startProxy(Number(new URL(own.url).port));
  t.after(() => proxy.close());
  const ns = uniq("stops");
  const c = counting();
  const s = await setup(t, new Drover({ url: proxy.url, namespace: ns, fetch: c.fetch }), ns, own.url);
  await withTimeout(s.stops.ready(), 10_000, "the stream was not live");
  const r = await s.run();
  await withTimeout(s.started(r.id), 20_000, "the run did not start");
  await proxy.cut();
  await until(() => s.stops.state === "connecting", 10_000, "the cut was not noticed");
  await s.cancel(r);
  // The signal gone (as its minute's lease would end it) and its put compacted away.
  const etcd = (op, body) => fetch(`${own.etcd}/v3/kv/${op}`, { method: "POST", body: JSON.stringify(body) }).then((res) => res.json());
  const key = Buffer.from(`/${ns}/queues/langgraph/cancel/`).toString("base64");
  const end = Buffer.from(`/${ns}/queues/langgraph/cancel0`).toString("base64");
  const del = await etcd("deleterange", { key, range_end: end });
  assert.equal(del.deleted, "1", "the cancel put its signal");
  await etcd("compaction", { revision: del.header.revision, physical: true });
  await proxy.restore();
  const stop = await withTimeout(s.stopped(r.id), 30_000, "the stop missed while the stream could not resume was not read");
  assert.equal(stop.task_id, r.id);
  assert.equal(stop.revision, 0, "seen by the read of the task");
  assert.equal(s.stops.stats.checks, 1, "the task watched was read once");
});
