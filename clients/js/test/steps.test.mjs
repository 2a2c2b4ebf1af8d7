import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, existsSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { Drover, FencedError, LockHeldError } from "../dist/index.js";
import { sharedServer, uniq, withTimeout } from "./helpers/server.mjs";

let srv;
let drover;
before(async () => {
  srv = await sharedServer();
  drover = new Drover({ url: srv.url, namespace: uniq("steps") });
});
after(async () => srv.release());

test("runSteps runs every step once, checkpoints each, completes; a second run runs nothing", async () => {
  const id = uniq("task");
  const ran = [];
  const steps = [1, 2, 3].map((n) => ({ name: `s${n}`, run: async (st, ctx) => (ran.push(ctx.step), [...st, n]) }));
  const r = await drover.runSteps(id, steps, { input: [] });
  assert.deepEqual(r.state, [1, 2, 3]);
  assert.deepEqual(r.ran, [1, 2, 3]);
  assert.equal(r.alreadyComplete, false);
  const t = await drover.agentTasks.get(id);
  assert.equal(t.completed, true);
  assert.deepEqual(t.history.map((h) => h.name), ["s1", "s2", "s3"]);
  const again = await drover.runSteps(id, steps, { input: [] });
  assert.equal(again.alreadyComplete, true);
  assert.deepEqual(again.state, [1, 2, 3]);
  assert.deepEqual(ran, [1, 2, 3]);
});

test("runSteps resumes after the last checkpointed step; a stale claim's step write is fenced", async () => {
  const id = uniq("resume");
  const s1 = await drover.session({ ttl: 5 });
  const c = await drover.agentTasks.claim(id, { session: s1, steps: 3 });
  await drover.agentTasks.writeStep(id, 1, { session: s1, token: c.token, state: new TextEncoder().encode(JSON.stringify({ a: 1 })), name: "one", steps: 3 });
  await assert.rejects(drover.runSteps(id, [async (x) => x, async (x) => x, async (x) => x]), LockHeldError, "held by s1");
  await s1.close(); // the first runner dies
  await assert.rejects(
    drover.agentTasks.writeStep(id, 2, { session: s1, token: c.token, state: new Uint8Array([1]), steps: 3 }),
    FencedError,
  );
  const ran = [];
  const r = await drover.runSteps(id, [1, 2, 3].map((n) => async (st) => (ran.push(n), { ...st, [`s${n}`]: true })));
  assert.deepEqual(ran, [2, 3]);
  assert.equal(r.resumedAfter, 1);
  assert.deepEqual(r.state, { a: 1, s2: true, s3: true });
});

test("3 worker processes race for a 4-step task; the winner is SIGKILLed in step 3; another resumes at step 3; no checkpointed step runs again", async () => {
  const ns = drover.transport.namespace;
  const id = uniq("race");
  const dir = mkdtempSync(join(tmpdir(), "drover-steps-"));
  const logFile = join(dir, "steps.log");
  const fixture = fileURLToPath(new URL("./fixtures/steps-worker.mjs", import.meta.url));
  const procs = [0, 1, 2].map(() => {
    const p = spawn(process.execPath, [fixture, srv.url, ns, id, logFile, "1500"], { stdio: ["ignore", "pipe", "inherit"] });
    p.out = "";
    p.stdout.on("data", (d) => (p.out += d));
    p.exited = new Promise((res) => p.on("exit", (code, signal) => res({ code, signal })));
    return p;
  });
  const lines = () => (existsSync(logFile) ? readFileSync(logFile, "utf8").trim().split("\n").filter(Boolean) : []);
  try {
    const deadline = Date.now() + 15_000;
    let winner;
    while (!winner && Date.now() < deadline) {
      const l = lines().find((x) => x.endsWith(" start 3"));
      if (l) winner = Number(l.split(" ")[0]);
      else await new Promise((r) => setTimeout(r, 10));
    }
    assert.ok(winner, "some process reached step 3");
    const victim = procs.find((p) => p.pid === winner);
    victim.kill("SIGKILL");
    const results = await withTimeout(Promise.all(procs.map((p) => p.exited)), 20_000, () => `workers did not finish:\n${lines().join("\n")}`);
    assert.equal(results[procs.indexOf(victim)].signal, "SIGKILL");
    for (const [i, r] of results.entries()) if (procs[i] !== victim) assert.equal(r.code, 0, `process ${procs[i].pid} exit`);

    const log = lines().map((l) => {
      const [pid, what, n] = l.split(" ");
      return { pid: Number(pid), what, n: Number(n) };
    });
    const starts = (n) => log.filter((x) => x.what === "start" && x.n === n);
    const ends = (n) => log.filter((x) => x.what === "end" && x.n === n);
    // Checkpointed steps ran exactly once, by the winner.
    for (const n of [1, 2]) {
      assert.equal(starts(n).length, 1, `step ${n} ran once:\n${lines().join("\n")}`);
      assert.equal(starts(n)[0].pid, winner);
    }
    // Step 3 was cut off in the winner, and ran again (once) in the resumer; step 4 once.
    assert.equal(starts(3).length, 2);
    assert.equal(ends(3).length, 1);
    const resumer = ends(3)[0].pid;
    assert.notEqual(resumer, winner);
    assert.equal(starts(4).length, 1);
    assert.equal(starts(4)[0].pid, resumer);

    const outs = procs.filter((p) => p !== victim).map((p) => JSON.parse(p.out.trim().split("\n").pop()));
    const res = outs.find((o) => o.pid === resumer);
    assert.deepEqual(res.ran, [3, 4]);
    assert.equal(res.resumedAfter, 2);
    assert.deepEqual(res.state, { task: id, s1: winner, s2: winner, s3: resumer, s4: resumer });
    const third = outs.find((o) => o.pid !== resumer);
    assert.equal(third.alreadyComplete, true, "the third found it complete and ran nothing");
    assert.deepEqual(third.ran, []);

    const t = await drover.agentTasks.get(id);
    assert.equal(t.completed, true);
    assert.deepEqual(t.history.map((h) => h.step), [1, 2, 3, 4]);
    assert.ok(t.history[2].token > t.history[1].token, "the resumer wrote under a newer token");
  } finally {
    for (const p of procs) p.kill("SIGKILL");
    rmSync(dir, { recursive: true, force: true });
  }
});
