// Claiming ahead (the worker's prefetch option): short tasks are claimed
// ahead of free slots, slow ones are not; tasks claimed ahead survive a
// SIGKILL (they come back after the TTL), run on drain, and are not started
// once their session is lost.
import { test, after, before, beforeEach } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { Drover } from "../dist/index.js";
import { sharedServer, uniq, until } from "./helpers/server.mjs";

let srv;
let ns;
let drover;
before(async () => (srv = await sharedServer()));
// Task ids are unique within a namespace: each test gets one of its own.
beforeEach(() => {
  ns = uniq("prefetch");
  drover = new Drover({ url: srv.url, namespace: ns });
});
after(async () => srv.release());

const fixture = fileURLToPath(new URL("./fixtures/prefetch-worker.mjs", import.meta.url));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * A client that records every claim, of a claim request or sent with
 * outcomes (withOutcomes): when it was sent, the max it asked for, and how
 * many tasks it got.
 */
function recordingClient() {
  const claims = [];
  const client = new Drover({
    url: srv.url,
    namespace: ns,
    fetch: async (url, init) => {
      const u = String(url);
      const body = u.endsWith("/claim") || u.endsWith("/outcomes") ? JSON.parse(init.body) : undefined;
      const max = u.endsWith("/claim") ? body.max : body?.claim?.max;
      if (max === undefined) return fetch(url, init);
      const rec = { at: performance.now(), max, got: 0, withOutcomes: u.endsWith("/outcomes") };
      claims.push(rec);
      const res = await fetch(url, init);
      if (res.ok) rec.got = ((await res.clone().json()).tasks ?? []).length;
      return res;
    },
  });
  return { client, claims };
}

test("prefetch: a worker is checked: 1 to 100, default 100", async () => {
  for (const bad of [0, 101, 2.5, -1]) {
    assert.throws(() => drover.worker(uniq("q"), { prefetch: bad, signals: false }, () => null), RangeError, String(bad));
  }
  const w = drover.worker(uniq("q"), { concurrency: 2, signals: false, wait: 0.2 }, () => null);
  assert.equal(w.prefetch, 100);
  await w.drain();
});

test("prefetch: the tasks held ahead are about 50 ms of work at the measured average", async () => {
  // The rule itself, on the worker's running average (ms) of its tasks.
  const w = drover.worker(uniq("q"), { concurrency: 2, signals: false, wait: 0.2 }, () => null);
  for (const [taskTime, ahead] of [[0, 0], [0.1, 100], [2, 50], [4, 25], [4.9, 20], [5, 0], [20, 0]]) {
    w.taskTime = taskTime;
    assert.equal(w.aheadLimit(), ahead, `average task time ${taskTime} ms`);
    assert.equal(w.cap(), 2 + ahead);
  }
  await w.drain();
  const capped = drover.worker(uniq("q"), { concurrency: 2, prefetch: 8, signals: false, wait: 0.2 }, () => null);
  capped.taskTime = 0.1;
  assert.equal(capped.aheadLimit(), 8, "never more than prefetch");
  await capped.drain();
});

test("prefetch: by default short tasks are claimed many at a time", async () => {
  const q = uniq("default");
  const n = 600;
  await drover.submit(q, Array.from({ length: n }, (_, i) => ({ task_id: `d-${i}`, task_type: "t" })));
  const { client, claims } = recordingClient();
  const w = client.worker(q, { concurrency: 2, wait: 1, signals: false }, () => null);
  await until(async () => (await drover.tasks.stats(q)).succeeded === n, 30_000, "every task succeeded");
  const st = await w.drain();
  assert.equal(st.succeeded, n);
  assert.equal(claims[0].max, 2, "the first claim is for the free slots");
  assert.ok(claims.every((c) => c.got <= c.max && c.max <= 100));
  const most = Math.max(...claims.map((c) => c.got));
  assert.ok(most > 8, `claims took ${claims.map((c) => c.got).join(",")}`);
});

test("prefetch: short tasks are claimed ahead of the free slots, never more than concurrency run at once", async () => {
  const q = uniq("ahead");
  const n = 200;
  await drover.submit(q, Array.from({ length: n }, (_, i) => ({ task_id: `a-${i}`, task_type: "t" })));
  const { client, claims } = recordingClient();
  let now = 0;
  let peak = 0;
  const seen = new Map();
  const w = client.worker(q, { concurrency: 2, prefetch: 8, wait: 1, signals: false }, async (task) => {
    now++;
    peak = Math.max(peak, now);
    seen.set(task.task_id, (seen.get(task.task_id) ?? 0) + 1);
    await new Promise((r) => setImmediate(r));
    now--;
    return null;
  });
  await until(async () => (await drover.tasks.stats(q)).succeeded === n, 30_000, "every task succeeded");
  const st = await w.drain();
  assert.equal(st.succeeded, n);
  assert.equal(st.claimed, n);
  assert.equal(st.lost, 0);
  assert.equal(st.waiting, 0);
  assert.ok(peak <= 2, `at most 2 ran at once, saw ${peak}`);
  assert.equal(seen.size, n);
  for (const [id, k] of seen) assert.equal(k, 1, `${id} ran once`);
  // The first claim (no task timed yet) is for the free slots; later ones
  // take up to prefetch, more than the slots.
  assert.equal(claims[0].max, 2);
  const most = Math.max(...claims.map((c) => c.got));
  assert.ok(most > 2, `a claim took more tasks than the 2 slots: claims took ${claims.map((c) => c.got).join(",")}`);
  assert.ok(claims.every((c) => c.max <= 8 && c.got <= c.max), "no claim asked for more than prefetch");
  assert.ok(st.ahead > 0, `tasks waited for a slot: ${JSON.stringify(st)}`);
  assert.equal(st.claimRequests, claims.filter((c) => !c.withOutcomes).length);
  assert.equal(st.claimsWithOutcomes, claims.filter((c) => c.withOutcomes).length);
  assert.ok(st.outcomeRequests < n, `${n} outcomes in ${st.outcomeRequests} requests`);
});

test("prefetch: slow tasks (over 5 ms) are claimed only for free slots", async () => {
  const q = uniq("slow");
  const n = 16;
  await drover.submit(q, Array.from({ length: n }, (_, i) => ({ task_id: `s-${i}`, task_type: "t" })));
  const { client, claims } = recordingClient();
  const w = client.worker(q, { concurrency: 2, prefetch: 8, wait: 1, signals: false }, async () => {
    await sleep(25);
    return null;
  });
  await until(async () => (await drover.tasks.stats(q)).succeeded === n, 30_000, "every task succeeded");
  const st = await w.drain();
  assert.equal(st.succeeded, n);
  assert.equal(st.ahead, 0);
  assert.ok(claims.every((c) => c.max <= 2 && c.got <= 2), `claims asked for ${claims.map((c) => c.max).join(",")}`);
});

test("prefetch: while a running task has run over 5 ms, claims are for free slots only", async () => {
  const q = uniq("mixed");
  await drover.submit(q, Array.from({ length: 40 }, (_, i) => ({ task_id: `warm-${i}`, task_type: "t" })));
  const { client, claims } = recordingClient();
  let longStart = 0;
  let longEnd = 0;
  const w = client.worker(q, { concurrency: 2, prefetch: 8, wait: 1, signals: false }, async (task) => {
    if (task.task_id === "long") {
      longStart = performance.now();
      await sleep(600);
      longEnd = performance.now();
      return null;
    }
    await new Promise((r) => setImmediate(r));
    return null;
  });
  await until(async () => (await drover.tasks.stats(q)).succeeded === 40, 30_000, "the warm-up tasks succeeded");
  // The worker claims ahead once it measured its tasks under 5 ms: on a
  // loaded machine the first ones may take longer, so warm up again (at
  // most 4 more rounds) until a claim took more than its 2 free slots.
  let warm = 40;
  for (let round = 1; round < 5 && !claims.some((c) => c.got > 2); round++) {
    await drover.submit(q, Array.from({ length: 40 }, (_, i) => ({ task_id: `warm-${round}-${i}`, task_type: "t" })));
    warm += 40;
    await until(async () => (await drover.tasks.stats(q)).succeeded === warm, 30_000, "the warm-up tasks succeeded");
  }
  assert.ok(claims.some((c) => c.got > 2), "short tasks were claimed ahead before it");
  await drover.submit(q, [{ task_id: "long", task_type: "t", metadata: { priority: 9 } }]);
  await until(() => longStart > 0, 10_000, "the long task started");
  await sleep(50);
  // Short tasks keep coming while the long one runs.
  await drover.submit(q, Array.from({ length: 30 }, (_, i) => ({ task_id: `short-${i}`, task_type: "t" })));
  await until(async () => (await drover.tasks.stats(q)).succeeded === warm + 31, 30_000, "every task succeeded");
  const st = await w.drain();
  assert.equal(st.succeeded, warm + 31);
  const during = claims.filter((c) => c.at > longStart + 20 && c.at < longEnd - 5);
  assert.ok(during.length > 0, "claims were made while the long task ran");
  assert.ok(during.every((c) => c.max <= 1), `claims while the long task ran asked for ${during.map((c) => c.max).join(",")} (one slot free)`);
});

/** Starts the fixture; returns helpers over its output. */
function startWorker(q, { concurrency = 1, prefetch = 8, ttl = 2 } = {}) {
  const child = spawn(process.execPath, [fixture, srv.url, ns, q, String(concurrency), String(prefetch), String(ttl)], { stdio: ["ignore", "pipe", "inherit"] });
  let out = "";
  child.stdout.on("data", (d) => (out += d));
  const exited = new Promise((res) => child.on("exit", (code, sig) => res({ code, sig })));
  const lines = () => out.split("\n");
  const started = () => lines().filter((l) => l.startsWith("start ")).map((l) => l.split(" ")[1]);
  const holder = () => lines().find((l) => l.startsWith("hold "))?.split(" ")[1];
  const lastStats = () => {
    const l = lines().filter((x) => x.startsWith("stats ")).pop();
    return l ? JSON.parse(l.slice(6)) : undefined;
  };
  return { child, exited, out: () => out, started, holder, lastStats };
}

const held = Array.from({ length: 8 }, (_, i) => `h-${i}`);

/**
 * Warms a worker up with short tasks (so that it claims ahead), then gives
 * it 8 tasks at once: the first to start runs for holdMs, and the others,
 * claimed with it, wait behind it.
 */
async function holdAhead(q, w, holdMs) {
  await drover.submit(q, Array.from({ length: 20 }, (_, i) => ({ task_id: `warm-${i}`, task_type: "t" })));
  await until(async () => (await drover.tasks.stats(q)).succeeded === 20, 20_000, () => `the warm-up tasks succeeded:\n${w.out()}`);
  await drover.submit(q, held.map((id) => ({ task_id: id, task_type: "t", parameters: { hold: holdMs } })));
  await until(() => w.holder() && w.lastStats()?.waiting > 0, 20_000, () => `tasks claimed ahead wait behind the held one:\n${w.out()}`);
  return w.lastStats();
}

test("prefetch: a worker SIGKILLed while holding tasks claimed ahead loses none: they run once, elsewhere, after its TTL", async () => {
  const q = uniq("kill");
  const w = startWorker(q, { concurrency: 1, prefetch: 8, ttl: 2 });
  try {
    const st = await holdAhead(q, w, 60_000);
    const waiting = st.waiting;
    w.child.kill("SIGKILL");
    const killed = Date.now();
    await w.exited;
    const claimedByDead = (await Promise.all(held.map((id) => drover.tasks.get(q, id)))).filter((t) => t.current_status === "RUNNING").map((t) => t.task_id);
    assert.ok(claimedByDead.length >= 1 + waiting, `the dead worker held one running and ${waiting} claimed ahead: ${claimedByDead}`);
    const handled = new Map();
    const rescuer = drover.worker(q, { concurrency: 4, wait: 1, signals: false }, (task) => {
      handled.set(task.task_id, (handled.get(task.task_id) ?? 0) + 1);
      return { by: "rescuer", attempt: task.attempt };
    });
    await until(async () => (await drover.tasks.stats(q)).succeeded === 28, 20_000, "every task succeeded");
    const back = Date.now() - killed;
    await rescuer.drain();
    assert.ok(back >= 1000, `the tasks came back after the TTL (${back} ms)`);
    for (const id of held) {
      assert.equal(handled.get(id), 1, `${id} ran once on the rescuer`);
      const t = await drover.tasks.get(q, id);
      assert.equal(t.current_status, "SUCCEEDED");
      assert.equal(t.result.by, "rescuer");
      if (claimedByDead.includes(id)) assert.equal(t.attempt, 2, `${id} was claimed once before`);
    }
    // Those claimed ahead never started on the dead worker.
    assert.deepEqual(w.started().filter((id) => held.includes(id)), [w.holder()]);
  } finally {
    w.child.kill("SIGKILL");
  }
});

test("prefetch: drain runs the tasks claimed ahead before the worker exits", async () => {
  const q = uniq("drainahead");
  const w = startWorker(q, { concurrency: 1, prefetch: 8, ttl: 5 });
  try {
    const st = await holdAhead(q, w, 700);
    assert.ok(st.waiting > 0);
    w.child.kill("SIGTERM");
    const { code, sig } = await w.exited;
    assert.equal(sig, null);
    assert.equal(code, 0);
    const final = JSON.parse(w.out().trim().split("\n").pop());
    assert.equal(final.final, true);
    assert.equal(final.lost, 0);
    assert.equal(final.waiting, 0);
    assert.equal(final.succeeded, final.claimed, "every task claimed, ahead or not, ran and succeeded");
    const started = w.started();
    assert.equal(started.length, final.claimed);
    assert.equal(new Set(started).size, started.length, "each started once");
    assert.ok(started.length >= 21 + st.waiting, "the tasks that waited ran after SIGTERM");
    for (const id of started) assert.equal((await drover.tasks.get(q, id)).current_status, "SUCCEEDED", id);
    const stats = await drover.tasks.stats(q);
    assert.equal(stats.running, 0, "no claim left behind");
    assert.equal(stats.succeeded, final.claimed);
    assert.equal(stats.pending, 28 - final.claimed);
    const sessionId = w.out().match(/session (\S+)/)[1];
    const r = await fetch(`${srv.url}/v1/sessions/${sessionId}`, { headers: { "Drover-Namespace": ns } });
    assert.equal(r.status, 404, "the worker's session was ended");
  } finally {
    w.child.kill("SIGKILL");
  }
});

test("prefetch: tasks claimed ahead are not started once their session is lost; they run again under the next one", async () => {
  const q = uniq("lostahead");
  await drover.submit(q, Array.from({ length: 20 }, (_, i) => ({ task_id: `warm-${i}`, task_type: "t" })));
  const starts = [];
  let first;
  let holder;
  const w = drover.worker(q, { concurrency: 1, prefetch: 8, ttl: 5, wait: 1, signals: false }, async (task, { signal, session }) => {
    starts.push({ id: task.task_id, session: session.id, attempt: task.attempt });
    if (!task.task_id.startsWith("h-") || holder) return null;
    holder = task.task_id;
    first = session;
    await until(() => w.stats.waiting > 0, 5000, "tasks claimed ahead wait behind this one");
    // The session ends server-side while tasks wait behind this one.
    await fetch(`${srv.url}/v1/sessions/${session.id}`, { method: "DELETE", headers: { "Drover-Namespace": ns } });
    // (It may be known lost already: an outcome request found it gone.)
    if (!signal.aborted) await new Promise((r) => signal.addEventListener("abort", r, { once: true }));
    return "too late";
  });
  await until(async () => (await drover.tasks.stats(q)).succeeded === 20, 20_000, "the warm-up tasks succeeded");
  await drover.submit(q, held.map((id) => ({ task_id: id, task_type: "t" })));
  await until(async () => (await drover.tasks.stats(q)).succeeded === 28, 20_000, () => `every task succeeded: ${JSON.stringify(w.stats)}`);
  const st = await w.drain();
  assert.ok(first, "a task held the slot");
  const underLost = starts.filter((s) => s.session === first.id && s.id.startsWith("h-")).map((s) => s.id);
  assert.deepEqual(underLost, [holder], "nothing claimed ahead started under the lost session");
  assert.ok(st.lost >= 2, `the held task's outcome and the tasks claimed ahead were counted lost: ${JSON.stringify(st)}`);
  const rest = starts.filter((s) => s.id.startsWith("h-") && s.id !== holder);
  assert.equal(rest.length, 7, "each of the others ran once");
  assert.equal(new Set(rest.map((s) => s.id)).size, 7);
});

test("prefetch: an outcome request that carried a claim and lost its answer: its outcomes count once, written; the worker claims under a new session, and the old one, closed once its tasks are answered, frees what the lost claim took", async () => {
  const q = uniq("lostanswer");
  const n = 120;
  await drover.submit(q, Array.from({ length: n }, (_, i) => ({ task_id: `l-${i}`, task_type: "t" })));
  let dropped = 0;
  let droppedClaimed = 0;
  const client = new Drover({
    url: srv.url,
    namespace: ns,
    fetch: async (url, init) => {
      const res = await fetch(url, init);
      if (dropped === 0 && String(url).endsWith("/outcomes") && JSON.parse(init.body).claim) {
        dropped++;
        droppedClaimed = ((await res.json()).tasks ?? []).length;
        throw new TypeError("fetch failed: the answer was lost"); // written and claimed, never answered
      }
      return res;
    },
  });
  const ran = new Map();
  const errors = [];
  const sessions = new Set();
  const a = client.worker(q, { concurrency: 2, wait: 0.3, signals: false, ttl: 30, onError: (e) => errors.push(e) }, (t, { session }) => {
    ran.set(t.task_id, (ran.get(t.task_id) ?? 0) + 1);
    sessions.add(session.id);
    return null;
  });
  // With a TTL of 30 s, the tasks the lost answer claimed come back this
  // soon only because the worker ended that session itself.
  await until(async () => (await drover.tasks.stats(q)).succeeded === n, 20_000, () => `every task succeeded (${ran.size} ran)`);
  const st = await a.drain();
  assert.equal(dropped, 1);
  assert.ok(droppedClaimed > 0, "the lost answer had claimed tasks");
  assert.equal(st.lost, 0, `outcomes written before the lost answer count as written: ${JSON.stringify(st)}`);
  assert.equal(st.succeeded, n);
  assert.ok(sessions.size >= 2, "tasks ran under a new session after the lost answer");
  assert.ok(errors.some((e) => String(e).includes("answer was lost")), "the lost answer was reported");
  assert.equal(ran.size, n);
  for (const [id, k] of ran) assert.equal(k, 1, `${id} ran ${k} times`);
});

test("a claim whose answer is lost: the worker claims under a new session and ends the old one, which frees the tasks that claim took", async () => {
  const q = uniq("lostclaim");
  const n = 30;
  await drover.submit(q, Array.from({ length: n }, (_, i) => ({ task_id: `c-${i}`, task_type: "t" })));
  let dropped = 0;
  const client = new Drover({
    url: srv.url,
    namespace: ns,
    fetch: async (url, init) => {
      const res = await fetch(url, init);
      if (dropped === 0 && String(url).endsWith("/claim") && ((await res.clone().json()).tasks ?? []).length > 0) {
        dropped++;
        throw new TypeError("fetch failed: the answer was lost");
      }
      return res;
    },
  });
  const ran = new Map();
  const a = client.worker(q, { concurrency: 2, wait: 0.3, signals: false, ttl: 30, onError: () => {} }, (t) => {
    ran.set(t.task_id, (ran.get(t.task_id) ?? 0) + 1);
    return null;
  });
  await until(async () => (await drover.tasks.stats(q)).succeeded === n, 20_000, () => `every task succeeded (${ran.size} ran)`);
  const st = await a.drain();
  assert.equal(dropped, 1);
  assert.equal(st.succeeded, n);
  assert.equal(st.lost, 0);
  for (const [id, k] of ran) assert.equal(k, 1, `${id} ran ${k} times`);
});

test("drain while an outcome request that carries a claim is in flight: the tasks it brings run before the worker ends", async () => {
  const q = uniq("draininflight");
  const n = 60;
  await drover.submit(q, Array.from({ length: n }, (_, i) => ({ task_id: `d-${i}`, task_type: "t" })));
  let w;
  let drained = false;
  const client = new Drover({
    url: srv.url,
    namespace: ns,
    fetch: async (url, init) => {
      if (!drained && String(url).endsWith("/outcomes") && JSON.parse(init.body).claim) {
        drained = true;
        void w.drain(); // the drain starts while this request, with its claim, is on its way
      }
      return fetch(url, init);
    },
  });
  const ran = new Map();
  w = client.worker(q, { concurrency: 2, wait: 0.3, signals: false }, async (t) => {
    ran.set(t.task_id, (ran.get(t.task_id) ?? 0) + 1);
    // Once the drain has begun, tasks take a while: some still run when
    // the last outcome request is answered.
    await (drained ? sleep(30) : new Promise((r) => setImmediate(r)));
    return null;
  });
  // Bounded: should no outcome request carry a claim, drain all the same
  // (and fail below) rather than leave the worker running.
  await until(() => drained, 20_000, "an outcome request carried a claim").catch(() => w.drain());
  const st = await w.done;
  assert.ok(drained, "an outcome request carried a claim");
  assert.equal(st.running, 0, `nothing runs once the worker is done: ${JSON.stringify(st)}`);
  assert.equal(st.waiting, 0);
  assert.equal(st.lost, 0, `no task or outcome was dropped: ${JSON.stringify(st)}`);
  assert.equal(st.succeeded, st.claimed, `every task claimed succeeded here: ${JSON.stringify(st)}`);
  const stats = await drover.tasks.stats(q);
  assert.equal(stats.running, 0, "no task left running on the server");
  assert.equal(stats.succeeded + stats.pending, n);
  for (const [id, k] of ran) assert.equal(k, 1, `${id} ran ${k} times`);
});
