import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { ConflictError, Drover, DroverError, InvalidInputError, NotFoundError } from "../dist/index.js";
import { sharedServer, uniq } from "./helpers/server.mjs";

let srv;
let drover;
before(async () => {
  srv = await sharedServer();
  drover = new Drover({ url: srv.url, namespace: uniq("budgets") });
});
after(async () => srv.release());

// A day's window: it cannot turn while a test runs (windows align on the
// epoch, so a minute's window could turn between two calls).
const DAY = 86400;

test("budgets: set, get, list, reserve, settle refunds and charges, delete", async () => {
  const key = `openai/gpt-4.1/${uniq("k")}`;
  const set = await drover.budgets.set(key, { tokens: 1000, requests: 10, window_seconds: DAY, weights: { acme: 1, globex: 3 }, caps: { trial: 200 } });
  assert.equal(set.key, key);
  assert.equal(set.tokens, 1000);
  assert.deepEqual(set.weights, { acme: 1, globex: 3 });

  const r = await drover.budgets.reserve(key, { tenant: "acme", estimate: 300, ttlSeconds: 30 });
  assert.equal(r.estimate, 300);
  assert.equal(r.budget, key);
  assert.equal(r.settle_bound, 1000);
  let u = await drover.budgets.get(key);
  assert.equal(u.reserved, 300);
  assert.equal(u.used, 0);
  assert.equal(u.remaining, 700);
  assert.equal(u.live, 1);
  assert.deepEqual(u.tenant_usage.find((t) => t.tenant === "acme"), { tenant: "acme", requests: 1, used: 0, reserved: 300 });

  const s = await drover.budgets.settle(r, 250);
  assert.equal(s.difference, -50);
  u = await drover.budgets.get(key);
  assert.deepEqual([u.used, u.reserved, u.remaining, u.live], [250, 0, 750, 0]);

  const r2 = await drover.budgets.reserve(key, { tenant: "acme", estimate: 100 });
  assert.equal((await drover.budgets.settle(r2, 160)).difference, 60);
  assert.equal((await drover.budgets.get(key)).used, 410);
  await assert.rejects(drover.budgets.settle(r2, 1), ConflictError, "a settled reservation settles once");

  assert.ok((await drover.budgets.list()).some((b) => b.key === key && b.used === 410));
  await drover.budgets.delete(key);
  await assert.rejects(drover.budgets.get(key), NotFoundError);
});

test("budgets.settle passes the provider's headers: fewer remaining than drover counts is counted as used", async () => {
  const key = `anthropic/claude/${uniq("k")}`;
  await drover.budgets.set(key, { tokens: 1000, window_seconds: DAY });
  const r = await drover.budgets.reserve(key, { estimate: 100 });
  // A fetch Headers object: only the two rate-limit headers are sent.
  const h = new Headers({ "x-ratelimit-remaining-tokens": "600", "x-ratelimit-reset-tokens": "1h", "content-type": "application/json" });
  const s = await drover.budgets.settle(r, 100, h);
  assert.equal(s.corrected, 300, "drover counted 900 remaining, the provider 600");
  assert.equal((await drover.budgets.get(key)).remaining, 600);
  const r2 = await drover.budgets.reserve(key, { estimate: 10 });
  await assert.rejects(drover.budgets.settle(r2, 10, { "X-RateLimit-Remaining-Tokens": "lots" }), (err) => {
    assert.ok(err instanceof InvalidInputError, String(err));
    assert.match(err.message, /x-ratelimit-remaining-tokens/i);
    return true;
  });
});

test("budgets.reserve without room is a 429 with retryAfter, and holds nothing; bad input names the field", async () => {
  const key = `openai/gpt-4.1/${uniq("k")}`;
  await drover.budgets.set(key, { tokens: 100, window_seconds: DAY });
  const r = await drover.budgets.reserve(key, { tenant: "acme", estimate: 80 });
  await assert.rejects(drover.budgets.reserve(key, { tenant: "acme", estimate: 30 }), (err) => {
    assert.ok(err instanceof DroverError);
    assert.equal(err.status, 429);
    assert.ok(err.retryAfter >= 1, `retryAfter ${err.retryAfter}`);
    return true;
  });
  assert.equal((await drover.budgets.get(key)).reserved, 80);
  await drover.budgets.settle(r, 0);
  await assert.rejects(drover.budgets.reserve(key, { estimate: 101 }), (err) => err instanceof InvalidInputError && /estimate/.test(err.message));
  await assert.rejects(drover.budgets.set(key, { tokens: 100, window_seconds: 0.5 }), InvalidInputError);
  await assert.rejects(drover.budgets.reserve(`openai/${uniq("none")}`, { estimate: 1 }), NotFoundError);
});

test("worker: a task with a budget reserves its estimate, settles what ctx.usage reported, and waits for its budget without an attempt when there is no room", async () => {
  const key = `openai/gpt-4.1/${uniq("k")}`;
  const none = `openai/${uniq("none")}`;
  await drover.budgets.set(key, { tokens: 100, window_seconds: DAY });
  const q = uniq("llm");
  const meta = { tenant: "acme", budget: key, estimated_tokens: 40 };
  await drover.submit(q, [
    { task_id: "a", task_type: "llm", metadata: meta },
    { task_id: "b", task_type: "llm", metadata: meta },
    { task_id: "c", task_type: "llm", metadata: meta },
    { task_id: "plain", task_type: "llm" },
    { task_id: "unset", task_type: "llm", metadata: { budget: none, estimated_tokens: 5 } },
  ]);
  const seen = [];
  const w = drover.worker(q, { concurrency: 1, prefetch: 1, wait: 1, signals: false }, async (task, ctx) => {
    seen.push(task.task_id);
    if (task.task_id !== "plain") {
      const during = await drover.budgets.get(key);
      assert.equal(during.reserved, 40, "the estimate is held while the handler runs");
    }
    ctx.usage(35, { "x-ratelimit-remaining-tokens": "99999" });
    return { ok: task.task_id };
  });
  const deadline = Date.now() + 20_000;
  for (;;) {
    const st = await Promise.all(["a", "b", "c", "plain", "unset"].map((id) => drover.tasks.get(q, id)));
    const by = Object.fromEntries(st.map((t) => [t.task_id, t]));
    if (["a", "b", "plain"].every((id) => by[id].current_status === "SUCCEEDED") && by.c.budget_wait && by.unset.budget_wait) {
      // tasks get says it waits for the budget, as a Go worker's deferral does.
      for (const id of ["c", "unset"]) {
        assert.ok(["PENDING", "RETRYING"].includes(by[id].current_status), `${id} waits unclaimed: ${by[id].current_status}`);
        assert.equal(by[id].attempt, 0, `${id}: a deferral spends no attempt`);
        assert.equal(by[id].retries_attempted, 0);
        assert.equal(by[id].budget_wait.deferrals, 1);
        assert.ok(by[id].transitions.some((t) => t.error === `deferred: ${by[id].budget_wait.reason}`), `${id}'s history records why`);
      }
      assert.equal(by.c.budget_wait.budget, key);
      assert.match(by.c.budget_wait.reason, new RegExp(`^budget ${key}: `));
      assert.ok(new Date(by.c.budget_wait.next).getTime() - Date.now() > 60_000, `c waits until the day's window turns: ${by.c.budget_wait.next}`);
      assert.equal(by.unset.budget_wait.budget, none);
      assert.equal(by.unset.budget_wait.reason, `budget ${none}: not configured (drover budgets set ${none} --tokens N)`);
      const unsetWait = new Date(by.unset.budget_wait.next).getTime() - Date.now();
      assert.ok(unsetWait > 20_000 && unsetWait <= 31_000, `an unconfigured budget waits 30 s: ${unsetWait} ms`);
      break;
    }
    assert.ok(Date.now() < deadline, `statuses ${JSON.stringify(st.map((t) => [t.task_id, t.current_status, t.budget_wait]))}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  const stats = await w.drain();
  assert.deepEqual(seen.sort(), ["a", "b", "plain"], "the deferred tasks' handler did not run");
  assert.equal(stats.deferred, 2);
  assert.equal(stats.slept, 0);
  const u = await drover.budgets.get(key);
  assert.deepEqual([u.used, u.reserved, u.live, u.requests_used], [70, 0, 0, 2], "two settled at 35 each; c held nothing");
});

test("worker: a handler that reports nothing settles its estimate, and a thrown one too", async () => {
  const key = `openai/gpt-4.1/${uniq("k")}`;
  await drover.budgets.set(key, { tokens: 1000, window_seconds: DAY });
  const q = uniq("llm");
  const meta = { budget: key, estimated_tokens: 25 };
  await drover.submit(q, [
    { task_id: "quiet", task_type: "llm", metadata: meta },
    { task_id: "boom", task_type: "llm", metadata: meta, max_retries: 0 },
  ]);
  const w = drover.worker(q, { concurrency: 2, wait: 1, signals: false }, async (task) => {
    if (task.task_id === "boom") throw new Error("model down");
    return "done";
  });
  const deadline = Date.now() + 20_000;
  while ((await drover.budgets.get(key)).used < 50) {
    assert.ok(Date.now() < deadline, "both settled");
    await new Promise((r) => setTimeout(r, 100));
  }
  await w.drain();
  const u = await drover.budgets.get(key);
  assert.deepEqual([u.used, u.reserved, u.live], [50, 0, 0]);
});

test("budgets: a default estimate per task type is held by a reserve that names its type and no estimate; bad ones name the field", async () => {
  const key = `openai/gpt-4.1/${uniq("k")}`;
  const set = await drover.budgets.set(key, { tokens: 1000, window_seconds: DAY, estimates: { summarize: 250 } });
  assert.deepEqual(set.estimates, { summarize: 250 });
  const r = await drover.budgets.reserve(key, { taskType: "summarize" });
  assert.equal(r.estimate, 250);
  assert.equal(r.task_type, "summarize");
  assert.equal((await drover.budgets.reserve(key, { taskType: "summarize", estimate: 40 })).estimate, 40);
  await assert.rejects(drover.budgets.set(key, { tokens: 1000, estimates: { summarize: 2000 } }), (err) => err instanceof InvalidInputError && /estimates/.test(err.message));
  assert.equal((await drover.budgets.get(key)).estimates.summarize, 250, "the refused set wrote nothing");
});

test("TaskBudgetHold.reserve defers a 503 (the server's clock behind the budget's) like a 429", async () => {
  const { TaskBudgetHold } = await import("../dist/index.js");
  // The server's 503 is made by a clock skew the test cannot cause on a
  // shared server: the error the transport would raise stands for it.
  const budgets = { reserve: async () => { throw new DroverError("clock skew", { status: 503, retryAfter: 30 }); } };
  const task = { metadata: { budget: "openai/gpt-4.1/k", estimated_tokens: 10 }, task_type: "t" };
  const out = await TaskBudgetHold.reserve(budgets, task, 60);
  assert.equal(out.deferSeconds, 30);
});

test("TaskBudgetHold.reserve defers at most a day, whatever Retry-After says", async () => {
  const { TaskBudgetHold } = await import("../dist/index.js");
  // A proxy's 503 may say any Retry-After; an outcome deferred over a day
  // would make the server refuse the worker's whole batch of outcomes.
  const budgets = { reserve: async () => { throw new DroverError("unavailable", { status: 503, retryAfter: 7 * 86400 }); } };
  const task = { metadata: { budget: "openai/gpt-4.1/k", estimated_tokens: 10 }, task_type: "t" };
  const out = await TaskBudgetHold.reserve(budgets, task, 60);
  assert.equal(out.deferSeconds, 86400);
});
