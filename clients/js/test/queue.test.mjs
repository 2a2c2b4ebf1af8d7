import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { Drover, FencedError, InvalidInputError, Permanent, QueueFullError } from "../dist/index.js";
import { droverCli, sharedServer, uniq, until } from "./helpers/server.mjs";

let srv;
let drover;
let ns;
before(async () => {
  srv = await sharedServer();
  ns = uniq("queue");
  drover = new Drover({ url: srv.url, namespace: ns });
});
after(async () => srv.release());

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));


test("submit: a JSON array, duplicates, and a whole-array rejection naming the positions", async () => {
  const q = uniq("q");
  const r = await drover.submit(q, [
    { task_id: "a", task_type: "t", parameters: { n: 1 } },
    { task_id: "b", task_type: "t" },
  ]);
  assert.deepEqual(r, { submitted: 2, duplicates: 0, rejected: [] });
  const again = await drover.submit(q, [{ task_id: "a", task_type: "t", parameters: { n: 1 } }]);
  assert.equal(again.duplicates, 1);
  await assert.rejects(drover.submit(q, [{ task_id: "c", task_type: "t" }, { task_id: "d", task_type: "" }]), (err) => {
    assert.ok(err instanceof InvalidInputError);
    assert.ok(err.problem.lines?.length >= 1, JSON.stringify(err.problem));
    return true;
  });
  const st = await drover.tasks.stats(q);
  assert.equal(st.pending, 2, "nothing of the rejected array was stored");
});

test("submit: NDJSON streamed from an async iterable, rejects by line number", async () => {
  const q = uniq("nd");
  async function* lines() {
    yield { task_id: "n1", task_type: "t" };
    yield "not json";
    yield { task_id: "n2", task_type: "t" };
    yield { task_id: "n3" }; // no task_type
    for (let i = 0; i < 300; i++) yield { task_id: `bulk-${i}`, task_type: "t" };
  }
  const r = await drover.submit(q, lines());
  assert.equal(r.submitted, 302);
  assert.deepEqual(r.rejected.map((x) => x.line), [2, 4]);
  assert.match(r.rejected[0].error, /JSON/i);
});

test("tasks: get, list by status with a cursor, stats, cancel", async () => {
  const q = uniq("insp");
  await drover.submit(q, Array.from({ length: 5 }, (_, i) => ({ task_id: `i${i}`, task_type: "t", parameters: { i } })));
  const t = await drover.tasks.get(q, "i3");
  assert.equal(t.current_status, "PENDING");
  assert.deepEqual(t.parameters, { i: 3 });
  const p1 = await drover.tasks.list(q, { status: "PENDING", limit: 2 });
  assert.equal(p1.tasks.length, 2);
  assert.ok(p1.next);
  const all = [];
  for await (const x of drover.tasks.iterate(q, { status: "PENDING", pageSize: 2 })) all.push(x.task_id);
  assert.deepEqual(all.sort(), ["i0", "i1", "i2", "i3", "i4"]);
  const c = await drover.tasks.cancel(q, "i4");
  assert.equal(c.current_status, "CANCELLED");
  const st = await drover.tasks.stats(q);
  assert.equal(st.pending, 4);
  assert.equal(st.cancelled, 1);
});

test("worker: success acks with the result, errors are retried, Permanent goes to the DLQ; outcomes are batched", async () => {
  const q = uniq("w");
  const seen = new Map();
  let outcomeRequests = 0;
  const counting = new Drover({
    url: srv.url,
    namespace: ns,
    fetch: (url, init) => {
      if (String(url).endsWith("/outcomes")) outcomeRequests++;
      return fetch(url, init);
    },
  });
  const tasks = [
    { task_id: "ok", task_type: "t", parameters: { kind: "ok" } },
    { task_id: "flaky", task_type: "t", parameters: { kind: "flaky" }, backoff_base: "50ms", backoff_max: "100ms" },
    { task_id: "perm", task_type: "t", parameters: { kind: "perm" } },
    ...Array.from({ length: 40 }, (_, i) => ({ task_id: `fast-${i}`, task_type: "t", parameters: { kind: "fast" } })),
  ];
  await drover.submit(q, tasks);
  const w = counting.worker(q, { concurrency: 8, ttl: 5, wait: 1, signals: false }, async (task, { signal, token, attempt }) => {
    assert.ok(signal instanceof AbortSignal);
    assert.ok(token > 0);
    seen.set(task.task_id, (seen.get(task.task_id) ?? 0) + 1);
    const kind = task.parameters.kind;
    if (kind === "ok") return { doubled: 42 };
    if (kind === "flaky" && attempt === 1) throw new Error("transient: try again");
    if (kind === "perm") throw new Permanent("bad input: retrying cannot help");
    if (kind === "fast") await sleep(5);
    return { attempt };
  });
  await until(async () => (await drover.tasks.stats(q)).succeeded === 42, 15000, "42 tasks succeeded");
  const stats = await w.drain();
  assert.equal(stats.succeeded, 42);
  assert.equal(stats.failed, 1, "flaky failed once");
  assert.equal(stats.permanent, 1);
  assert.equal(stats.lost, 0);
  assert.equal(stats.running, 0);

  const ok = await drover.tasks.get(q, "ok");
  assert.equal(ok.current_status, "SUCCEEDED");
  assert.deepEqual(ok.result, { doubled: 42 });
  const flaky = await drover.tasks.get(q, "flaky");
  assert.equal(flaky.current_status, "SUCCEEDED");
  assert.equal(flaky.attempt, 2);
  assert.equal(seen.get("perm"), 1, "a permanent failure is not retried");
  const dead = await drover.dlq.list(q);
  assert.deepEqual(dead.tasks.map((t) => t.task_id), ["perm"]);
  assert.match((await drover.dlq.show(q, "perm")).last_error, /retrying cannot help/);
  assert.ok(outcomeRequests < 43, `43 outcomes in ${outcomeRequests} requests`);
});

test("dlq: requeue runs a dead task again; purge deletes", async () => {
  const q = uniq("dlq");
  await drover.submit(q, [1, 2, 3].map((i) => ({ task_id: `d${i}`, task_type: "t", max_retries: 0 })));
  let fail = true;
  const w = drover.worker(q, { concurrency: 3, wait: 1, signals: false }, async () => {
    if (fail) throw new Error("down");
    return "done";
  });
  await until(async () => (await drover.tasks.stats(q)).dead === 3, 10000, "3 dead (out of retries)");
  fail = false;
  const one = await drover.dlq.requeue(q, "d1");
  assert.equal(one.count, 1);
  await until(async () => (await drover.tasks.get(q, "d1")).current_status === "SUCCEEDED", 10000, "d1 succeeded after requeue");
  await w.drain();
  const purged = await drover.dlq.purge(q, "d2");
  assert.equal(purged.count, 1);
  const rest = await drover.dlq.purge(q);
  assert.equal(rest.count, 1);
  assert.equal((await drover.dlq.list(q)).tasks.length, 0);
});

test("a late ack under a lost claim is refused (409 FencedError), on both outcome routes", async () => {
  const q = uniq("late");
  await drover.submit(q, [{ task_id: "x", task_type: "t" }]);
  const s = await drover.session({ ttl: 5 });
  const [task] = await drover.tasks.claim(q, { session: s, max: 1, wait: 2 });
  assert.equal(task.task_id, "x");
  await s.close(); // the claim ends with the session
  await assert.rejects(drover.tasks.ack(q, s.id, task, { late: true }), FencedError);
  const s2 = await drover.session({ ttl: 5 });
  const [again] = await drover.tasks.claim(q, { session: s2, max: 1, wait: 2 });
  assert.equal(again.task_id, "x");
  assert.ok(again.token > task.token);
  const results = await drover.tasks.outcomes(q, s2, [
    { task_id: "x", token: task.token, ok: true, result: "stale" },
  ]);
  assert.equal(results[0].status, 409, "the old token is refused");
  const ok = await drover.tasks.outcomes(q, s2, [{ task_id: "x", token: again.token, ok: true, result: "fresh" }]);
  assert.equal(ok[0].status, 200);
  assert.equal((await drover.tasks.get(q, "x")).result, "fresh");
  await s2.close();
});

test("worker: a task whose session is lost mid-run has its outcome dropped, and runs again under a new session", async () => {
  const q = uniq("lostrun");
  await drover.submit(q, [{ task_id: "slow", task_type: "t" }]);
  let runs = 0;
  let firstSession;
  const w = drover.worker(q, { ttl: 2, wait: 1, signals: false }, async (task, { signal, session }) => {
    runs++;
    if (runs === 1) {
      firstSession = session;
      // The session ends server-side while the task runs.
      await fetch(`${srv.url}/v1/sessions/${session.id}`, { method: "DELETE", headers: { "Drover-Namespace": ns } });
      await new Promise((r) => signal.addEventListener("abort", r, { once: true }));
      return "too late";
    }
    return "second run";
  });
  await until(async () => (await drover.tasks.get(q, "slow")).current_status === "SUCCEEDED", 15000, "slow succeeded");
  const st = await w.drain();
  assert.equal(runs, 2);
  assert.equal(st.lost, 1);
  assert.equal(st.succeeded, 1);
  assert.equal(firstSession.lost, true);
  assert.equal((await drover.tasks.get(q, "slow")).result, "second run");
});

test("a queue at its maximum depth answers QueueFullError (429) with Retry-After", async () => {
  const q = uniq("full");
  droverCli(srv.etcd, ["queues", "set", q, "--max-depth", "2"], ns);
  await drover.submit(q, [{ task_id: "f1", task_type: "t" }, { task_id: "f2", task_type: "t" }]);
  await assert.rejects(drover.submit(q, [{ task_id: "f3", task_type: "t" }]), (err) => {
    assert.ok(err instanceof QueueFullError, String(err));
    assert.equal(err.status, 429);
    assert.ok(err.retryAfter >= 1);
    return true;
  });
});

test("worker: a result that is not JSON, or too large, fails the task for good instead of breaking the batch", async () => {
  const q = uniq("badresult");
  await drover.submit(q, [
    { task_id: "bigint", task_type: "t" },
    { task_id: "huge", task_type: "t" },
    { task_id: "fine", task_type: "t" },
  ]);
  const w = drover.worker(q, { concurrency: 3, wait: 1, signals: false }, async (task) => {
    if (task.task_id === "bigint") return { n: 1n };
    if (task.task_id === "huge") return "x".repeat(300 << 10);
    return "ok";
  });
  await until(async () => {
    const st = await drover.tasks.stats(q);
    return st.dead === 2 && st.succeeded === 1;
  }, 10000, "2 dead, 1 succeeded");
  const st = await w.drain();
  assert.equal(st.permanent, 2);
  assert.match((await drover.dlq.show(q, "bigint")).last_error, /not JSON/);
  assert.match((await drover.dlq.show(q, "huge")).last_error, /bytes of JSON/);
});

test("defer: one claimed task handed back unrun, its attempt not counted, its budget wait shown", async () => {
  const q = uniq("q");
  const key = "openai/js-defer/key-a";
  await drover.submit(q, [{ task_id: "d", task_type: "t", metadata: { budget: key, estimated_tokens: 10 } }]);
  const s = await drover.session({ ttl: 10 });
  const [task] = await drover.tasks.claim(q, { session: s, max: 1, wait: 2 });
  const reason = `budget ${key}: 3 requests of 3 used in this window`;
  const t = await drover.tasks.defer(q, s, task, { after: "1h", reason });
  assert.equal(t.current_status, "PENDING");
  assert.equal(t.attempt, 0);
  const got = await drover.tasks.get(q, "d");
  assert.equal(got.budget_wait?.budget, key);
  assert.equal(got.budget_wait?.reason, reason);
  await assert.rejects(drover.tasks.defer(q, s, task, { after: 1, reason }), FencedError);
  await assert.rejects(drover.tasks.defer(q, s, task, { after: "25h", reason }), InvalidInputError);
  await s.close();
});
