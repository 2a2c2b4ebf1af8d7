// Child tasks from runSteps against a real server: a step spawns children
// into a queue (worked by a real worker) and the next step gets their
// results; a spawning step killed with SIGKILL (before its write, and while
// the task waits) spawns nothing twice; fail-fast, first-N, collect,
// detached; and bad input (an unknown queue, a result over 64 KiB, a child
// id that is not the task's, wait above the number of children, a spawn
// from the last step).
import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, existsSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { ChildFailedError, Drover, InvalidInputError, NotFoundError, Permanent, spawnChildren } from "../dist/index.js";
import { jsRoot, repoRoot, sharedServer, uniq, until } from "./helpers/server.mjs";

let srv;
let drover;
before(async () => {
  srv = await sharedServer();
  drover = new Drover({ url: srv.url, namespace: uniq("children") });
});
after(async () => srv.release());

/** A queue that exists (a spawn into a queue that does not is refused). */
async function newQueue(prefix) {
  const q = uniq(prefix);
  await drover.submit(q, [{ task_id: `${q}-seed`, task_type: "seed" }]);
  await drover.tasks.cancel(q, `${q}-seed`);
  return q;
}

/** A worker of queue q whose handler is fn(task); counts each run by task id in runs. */
function work(q, fn, runs = new Map()) {
  const w = drover.worker(q, { concurrency: 8, wait: 1, signals: false }, async (task) => {
    runs.set(task.task_id, (runs.get(task.task_id) ?? 0) + 1);
    return fn(task);
  });
  return { w, runs };
}

/** Resolves once release() was called: children that block until the test lets them end. */
function gate() {
  let release;
  const p = new Promise((r) => (release = r));
  return { p, release };
}

test("a step fans out 20 children; the next step gets their 20 results in id order; each child runs once", async () => {
  const q = await newQueue("square");
  const { w, runs } = work(q, (t) => ({ sq: t.parameters.i * t.parameters.i }));
  const id = uniq("fan");
  const seen = [];
  try {
    const r = await drover.runSteps(id, [
      { name: "plan", run: (s) => spawnChildren(Array.from({ length: 20 }, (_, i) => ({ queue: q, taskType: "square", parameters: { i }, key: `k${String(i).padStart(2, "0")}` })), {}, s) },
      {
        name: "merge",
        run: async (s, ctx) => {
          const kids = await ctx.children();
          seen.push(kids);
          assert.equal(await ctx.children(), kids, "read once");
          return { sum: kids.results().reduce((a, x) => a + x.sq, 0) };
        },
      },
      { name: "report", run: async (s, ctx) => (assert.equal(await ctx.children(), undefined), s) },
    ], { input: {}, resumeWithin: "60s" });
    assert.deepEqual(r.ran, [1, 2, 3]);
    assert.equal(r.state.sum, Array.from({ length: 20 }, (_, i) => i * i).reduce((a, b) => a + b));
    const kids = seen[0];
    assert.equal(kids.step, 1);
    assert.equal(kids.n, 20);
    assert.equal(kids.ended, 20);
    assert.equal(kids.failed, 0);
    assert.equal(kids.failedChild, undefined);
    assert.deepEqual(kids.outcomes.map((o) => o.id), Array.from({ length: 20 }, (_, i) => `${id}.1.k${String(i).padStart(2, "0")}`));
    assert.ok(kids.outcomes.every((o) => o.status === "SUCCEEDED" && o.ended));
    assert.equal(runs.size, 20);
    assert.ok([...runs.values()].every((n) => n === 1), "each child ran once");
    const t = await drover.agentTasks.get(id);
    assert.equal(t.completed, true);
    const one = await drover.agentTasks.child(id, `${id}.1.k07`);
    assert.equal(one.status, "SUCCEEDED");
    assert.deepEqual(one.result, { sq: 49 });
  } finally {
    await w.drain();
  }
});

test("the spawning step killed (SIGKILL) before its write and while the task waits: its children are spawned once", async () => {
  const q = await newQueue("square");
  const id = uniq("crash");
  const dir = mkdtempSync(join(tmpdir(), "drover-spawn-"));
  const logFile = join(dir, "steps.log");
  const fixture = fileURLToPath(new URL("./fixtures/spawn-parent.mjs", import.meta.url));
  const starts = () => (existsSync(logFile) ? readFileSync(logFile, "utf8").split("\n").filter((l) => l.endsWith("start 1")).length : 0);
  const run = (mode) => {
    const p = spawn(process.execPath, [fixture, srv.url, drover.transport.namespace, id, q, logFile, mode], { stdio: ["ignore", "ignore", "pipe"] });
    let err = "";
    p.stderr.on("data", (d) => (err += d));
    const exited = new Promise((res) => p.on("exit", (code, sig) => res({ code, sig, err })));
    return { p, exited };
  };
  let w;
  try {
    // 1: killed inside step 1, before it wrote anything.
    const a = run("hang");
    await until(() => starts() === 1, 30_000, "the first process to start step 1");
    a.p.kill("SIGKILL");
    assert.equal((await a.exited).sig, "SIGKILL");
    assert.equal((await drover.tasks.list(q, { limit: 100 })).tasks.filter((t) => t.task_id.startsWith(id)).length, 0, "nothing spawned before the write");
    // 2: runs step 1 again once the first one's claim expired, spawns, and is killed while the task waits (no worker yet).
    const b = run("spawn");
    await until(async () => (await drover.agentTasks.get(id).catch(() => undefined))?.step === 1, 30_000, () => "the second process to write step 1");
    const written = await drover.agentTasks.get(id);
    assert.equal(written.waiting_for.children.n, 20);
    b.p.kill("SIGKILL");
    assert.equal((await b.exited).sig, "SIGKILL");
    assert.equal(starts(), 2);
    // 3: this process resumes at step 2 once the children ran; step 1 does not run again.
    let runs;
    ({ w, runs } = work(q, (t) => t.parameters.i));
    const r = await drover.runSteps(id, [
      { name: "plan", run: () => assert.fail("step 1 runs again") },
      { name: "merge", run: async (s, ctx) => ({ ...s, results: (await ctx.children()).results() }) },
    ], { wait: "30s", resumeWithin: "60s" });
    assert.deepEqual(r.ran, [2]);
    // In id order: {task}.1.0, {task}.1.1, {task}.1.10, ... (the ids' keys are the positions, compared as text).
    assert.deepEqual(r.state.results, Array.from({ length: 20 }, (_, i) => i).sort((x, y) => (String(x) < String(y) ? -1 : 1)));
    assert.equal(runs.size, 20);
    assert.ok([...runs.values()].every((n) => n === 1));
    const st = await drover.tasks.stats(q);
    assert.equal(st.succeeded, 20, "20 children ran, each once");
    assert.equal(st.pending + st.running, 0);
    assert.equal(starts(), 2);
  } finally {
    await w?.drain();
    rmSync(dir, { recursive: true, force: true });
  }
});

test("the same spawn write sent again (its answer lost) spawns nothing new", async () => {
  const q = await newQueue("again");
  const id = uniq("again");
  const s = await drover.session({ ttl: 5 });
  try {
    const c = await drover.agentTasks.claim(id, { session: s, steps: 2 });
    const write = { session: s, token: c.token, state: new TextEncoder().encode("{}"), steps: 2, children: [{ queue: q, taskType: "t" }, { queue: q, taskType: "t" }] };
    const first = await drover.agentTasks.writeSpawn(id, 1, write);
    const second = await drover.agentTasks.writeSpawn(id, 1, write);
    assert.deepEqual(second.waiting_for.children, first.waiting_for.children);
    assert.equal(first.waiting_for.children.n, 2);
    const page = await drover.agentTasks.children(id);
    assert.equal(page.n, 2);
    assert.equal(page.submitted, true);
    assert.equal((await drover.tasks.list(q, { limit: 100 })).tasks.filter((t) => t.task_id.startsWith(`${id}.`)).length, 2);
  } finally {
    await s.close();
  }
});

test("without collect, the first dead child ends the wait: the next step runs with failedChild while others still run", async () => {
  const q = await newQueue("failfast");
  const g = gate();
  const { w } = work(q, async (t) => {
    if (t.parameters.bad) throw new Permanent("search backend down");
    await g.p;
    return "ok";
  });
  const id = uniq("failfast");
  try {
    let kids;
    const children = [{ queue: q, taskType: "s", key: "bad", parameters: { bad: true } }, ...[1, 2, 3].map((i) => ({ queue: q, taskType: "s", key: `ok${i}`, parameters: {} }))];
    await assert.rejects(
      drover.runSteps(id, [
        { name: "plan", run: () => spawnChildren(children) },
        { name: "merge", run: async (s, ctx) => { kids = await ctx.children(); kids.throwIfFailed(); return "merged"; } },
      ], { resumeWithin: "60s" }),
      (err) => err instanceof ChildFailedError && err.child.id === `${id}.1.bad` && /search backend down/.test(err.message),
    );
    assert.equal(kids.failedChild.id, `${id}.1.bad`);
    assert.equal(kids.failedChild.status, "DEAD");
    assert.equal(kids.ended, 1, "the others had not ended: the wait did not wait for them");
    assert.equal(kids.failed, 1);
    const t = await drover.agentTasks.get(id);
    assert.equal(t.completed, false);
    assert.equal(t.step, 1);
  } finally {
    g.release();
    await w.drain();
  }
});

test("wait: 2 resumes once the first 2 children ended; collect keeps every outcome, dead ones too", async () => {
  const q = await newQueue("firstn");
  const g = gate();
  const { w } = work(q, async (t) => {
    if (t.parameters.fail) throw new Permanent("no luck");
    if (t.parameters.slow) await g.p;
    return t.parameters.n;
  });
  const id = uniq("firstn");
  try {
    const kids = [];
    const r = await drover.runSteps(id, [
      { name: "plan", run: () => spawnChildren([0, 1, 2, 3, 4, 5].map((n) => ({ queue: q, taskType: "s", parameters: { n, slow: n >= 2 } })), { wait: 2 }) },
      {
        name: "collect",
        run: async (s, ctx) => {
          const k = await ctx.children();
          kids.push(k);
          g.release(); // the other 4 may end now
          return spawnChildren([{ queue: q, taskType: "s", parameters: { n: 10 } }, { queue: q, taskType: "s", parameters: { fail: true } }, { queue: q, taskType: "s", parameters: { n: 12 } }], { collect: true }, k.results());
        },
      },
      { name: "end", run: async (s, ctx) => { const k = await ctx.children(); kids.push(k); k.throwIfFailed(); return { first: s, then: k.results() }; } },
    ], { resumeWithin: "60s" });
    assert.equal(kids[0].n, 6);
    assert.equal(kids[0].ended, 2, "resumed after the first 2, the 4 others held back");
    assert.deepEqual(r.state.first.sort(), [0, 1]);
    assert.equal(kids[1].ended, 3);
    assert.equal(kids[1].failed, 1);
    assert.equal(kids[1].failedChild, undefined);
    assert.deepEqual(kids[1].outcomes.map((o) => o.status), ["SUCCEEDED", "DEAD", "SUCCEEDED"]);
    assert.match(kids[1].outcomes[1].error, /no luck/);
    assert.deepEqual(r.state.then, [10, 12]);
  } finally {
    g.release();
    await w.drain();
  }
});

test("a detached child is submitted detached, runs and reports to its parent", async () => {
  const q = await newQueue("detached");
  const { w } = work(q, () => "done");
  const bodies = [];
  const client = new Drover({
    url: srv.url, namespace: drover.transport.namespace,
    fetch: async (url, init) => {
      if (init?.method === "PUT" && String(url).endsWith("/spawn")) bodies.push(JSON.parse(init.body));
      return fetch(url, init);
    },
  });
  const id = uniq("detached");
  try {
    const r = await client.runSteps(id, [
      { name: "plan", run: () => spawnChildren([{ queue: q, taskType: "s", key: "bg", detached: true, timeout: 30, maxRetries: 1, priority: 5 }]) },
      { name: "merge", run: async (s, ctx) => (await ctx.children()).outcomes },
    ], { resumeWithin: "60s" });
    assert.deepEqual(bodies[0].children, [{ queue: q, task_type: "s", key: "bg", priority: 5, max_retries: 1, timeout: "30000ms", detached: true }]);
    assert.deepEqual(r.state.map((o) => [o.id, o.status, o.result]), [[`${id}.1.bg`, "SUCCEEDED", "done"]]);
    const child = await drover.tasks.get(q, `${id}.1.bg`);
    assert.equal(child.parent, id);
    assert.equal(child.parent_step, 1);
  } finally {
    await w.drain();
  }
});

test("bad input: unknown queue, wait above the children, spawn from the last step (nothing stored); a result over 64 KiB; not a child", async () => {
  const id = uniq("bad");
  await assert.rejects(
    drover.runSteps(id, [{ name: "plan", run: () => spawnChildren([{ queue: uniq("nowhere"), taskType: "s" }]) }, { name: "b", run: (s) => s }]),
    (err) => err instanceof InvalidInputError && /children\[0\]\.queue/.test(err.message),
  );
  await assert.rejects(drover.agentTasks.get(id), NotFoundError, "nothing checkpointed");
  assert.throws(() => spawnChildren([{ queue: "q", taskType: "s" }], { wait: 2 }), RangeError);
  const q = await newQueue("big");
  await assert.rejects(
    drover.runSteps(uniq("last"), [{ name: "only", run: () => spawnChildren([{ queue: q, taskType: "s" }]) }]),
    (err) => err instanceof InvalidInputError && /body\.children/.test(err.message) && /last step/.test(err.message),
  );

  const { w } = work(q, () => "x".repeat(100 << 10));
  const big = uniq("big");
  try {
    const r = await drover.runSteps(big, [
      { name: "plan", run: () => spawnChildren([{ queue: q, taskType: "s", maxRetries: 0 }], { collect: true }) },
      { name: "merge", run: async (s, ctx) => (await ctx.children()).outcomes },
    ], { resumeWithin: "60s" });
    assert.equal(r.state[0].status, "DEAD");
    assert.match(r.state[0].error, /too large|64 KiB|65536/i);
  } finally {
    await w.drain();
  }
  await assert.rejects(drover.agentTasks.child(big, `${id}.1.0`), (err) => err instanceof NotFoundError && /not a child/.test(err.message));
  await assert.rejects(drover.agentTasks.child(big, `${big}.1.7`), NotFoundError);
});

test("docs/workflows.md shows examples/fanout.ts whole, and the README a part of it", async () => {
  const example = readFileSync(join(jsRoot, "examples", "fanout.ts"), "utf8");
  const blocks = (file) => [...readFileSync(join(repoRoot, file), "utf8").matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1]);
  assert.ok(blocks("docs/workflows.md").includes(example.slice(example.indexOf("import "))), "docs/workflows.md's TypeScript example is not examples/fanout.ts");
  const part = blocks("README.md").filter((b) => b.includes("spawnChildren"));
  assert.equal(part.length, 1);
  assert.ok(example.includes(part[0]), "the README's TypeScript spawn example is not a part of examples/fanout.ts");
});
