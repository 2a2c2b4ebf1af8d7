// The Agent Server under crashes, through real processes: graph runtimes
// (`agentserver-cli.js serve -c` a fixture's langgraph.json) started as
// child processes and SIGKILLed mid-run, drover servers as a 3-member
// cluster whose etcd leader is SIGKILLed mid-run, and LangGraph's SDK
// Client creating runs and joining their streams with its last event id.
// The fixture's nodes record each execution in a file outside the runtime;
// the test counts: no run lost, no node executed twice past its
// checkpoint, no stream event received twice.
//
//   node test/run.mjs --only node test/agentserver-chaos.test.mjs
//   DROVER_CHAOS_RUNS=200 DROVER_CHAOS_SEED=7 node test/run.mjs --only node test/agentserver-chaos.test.mjs
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Client } from "@langchain/langgraph-sdk";
import { Drover } from "../dist/index.js";
import { DroverSaver } from "../dist/langgraph.js";
import { sharedServer, startCluster, startBalancer, uniq, until } from "./helpers/server.mjs";
import { follow, judge, nodeRecords, retrying, rng, startRuntime } from "./agentserver-chaos-lib.mjs";

const RUNS = Number(process.env.DROVER_CHAOS_RUNS ?? 6);
const SEED = Number(process.env.DROVER_CHAOS_SEED ?? 61245); // fixed: the same chaos each run unless asked
const TTL = 3; // seconds: a killed runtime's runs are claimed again this long after

/** The final trail and the checkpoints of thread, and the node records of run. */
async function outcome({ client, saver, nodeLog, thread, run }) {
  const state = await retrying(() => client.threads.getState(thread));
  const tuples = [];
  await retrying(async () => {
    tuples.length = 0;
    for await (const tp of saver.list({ configurable: { thread_id: thread, checkpoint_ns: "" } })) tuples.push(tp);
  });
  return { finalTrail: state.values?.trail, tuples, records: nodeRecords(nodeLog).filter((r) => r.run === run) };
}

function sdk(url, ns) {
  return new Client({ apiUrl: url, apiKey: null, defaultHeaders: { "Drover-Namespace": ns } });
}

test("agent server: a runtime SIGKILLed mid-run, another resumes from its checkpoint; the joiner sees the rest", async (t) => {
  const srv = await sharedServer();
  t.after(() => srv.release());
  const ns = uniq("lgchaos");
  const dir = mkdtempSync(join(tmpdir(), "lgchaos-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const nodeLog = join(dir, "nodes.jsonl");
  const first = await startRuntime({ url: srv.url, ns, nodeLog, ttl: TTL });
  t.after(() => first.kill());
  const client = sdk(srv.url, ns);
  const saver = new DroverSaver({ drover: new Drover({ url: srv.url, namespace: ns }) });
  const th = (await client.threads.create()).thread_id;
  const run = (await client.runs.create(th, "chain", { input: { trail: [] }, streamMode: ["updates", "values"], config: { configurable: { node_ms: 100, hang: "n3" } } })).run_id;

  // Killed once n3 (which does not return in the first attempt) runs and the checkpoint holding n2's
  // write is stored: n1 and n2 are past their checkpoints, n3 is not.
  const f = follow(client, th, run);
  const stored = async () => {
    const tp = await saver.getTuple({ configurable: { thread_id: th, checkpoint_ns: "" } });
    return (tp?.checkpoint.channel_values?.trail ?? []).some((x) => x.node === "n2");
  };
  await until(async () => nodeRecords(nodeLog).some((r) => r.node === "n3" && r.phase === "start") && (await stored()), 60_000, "n3 started after n2's checkpoint");
  first.kill("SIGKILL");
  await first.exited();
  const killedAt = Date.now();
  f.leave(); // the client goes away with the runtime, and joins again with its last event id
  const second = await startRuntime({ url: srv.url, ns, nodeLog, ttl: TTL });
  t.after(() => second.kill());
  const { events, joins, status } = await f.done;
  const resumed = nodeRecords(nodeLog).find((r) => r.run === run && r.attempt > 1 && r.phase === "start");
  const got = await outcome({ client, saver, nodeLog, thread: th, run });
  const j = judge({ status, events, ...got });
  t.diagnostic(`resumed at ${resumed?.node} by attempt ${resumed?.attempt} ${((Date.now() - killedAt) / 1000).toFixed(1)} s after the kill (TTL ${TTL} s); ${j.events} events in ${joins} joins, ${j.reexecuted} node executed again, ${j.superseded} update superseded`);
  assert.deepEqual(j.problems, []);
  assert.equal(resumed?.node, "n3", "the second attempt starts at the node the first was running");
  const starts = (n) => got.records.filter((r) => r.node === n && r.phase === "start").length;
  assert.deepEqual(["n1", "n2", "n3", "n4", "n5"].map(starts), [1, 1, 2, 1, 1], "only the node cut short ran twice");
  assert.equal(j.boundaries, 1, "one new attempt's metadata");
});

/** The most attempts any run not ended has had: a runtime is killed only while every run can take one more loss. */
async function mostAttempts(drover) {
  let most = 0;
  for (const status of ["RUNNING", "RETRYING", "PENDING"]) {
    for await (const task of drover.tasks.iterate("langgraph", { status })) most = Math.max(most, task.attempt ?? 0);
  }
  return most;
}

test("agent server chaos: runtimes SIGKILLed mid-run, the leader of 3 members SIGKILLed; an SDK client counts", { timeout: 30 * 60_000 }, async (t) => {
  const r = rng(SEED);
  t.diagnostic(`seed ${SEED}, ${RUNS} runs (DROVER_CHAOS_SEED, DROVER_CHAOS_RUNS)`);
  const cluster = await startCluster(3);
  t.after(() => cluster.stop());
  const lb = await startBalancer(cluster.members.map((m) => Number(new URL(m.url).port)));
  t.after(() => lb.close());
  const ns = uniq("lgchaos");
  const dir = mkdtempSync(join(tmpdir(), "lgchaos-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const nodeLog = join(dir, "nodes.jsonl");
  const runtimes = [];
  // A runtime still starting when the test ends (it failed early) is killed once it serves.
  let stopped = false;
  const spawnRuntime = async () => {
    const rt = await startRuntime({ url: lb.url, ns, nodeLog, ttl: TTL, concurrency: 2 });
    runtimes.push(rt);
    if (stopped) rt.kill();
  };
  t.after(() => {
    stopped = true;
    runtimes.forEach((rt) => rt.kill());
  });
  for (let i = 0; i < 3; i++) await spawnRuntime();
  const client = sdk(lb.url, ns);
  const drover = new Drover({ url: lb.url, namespace: ns });
  const saver = new DroverSaver({ drover });

  // Kills: a runtime (replaced by a new one), and the etcd leader once (not restarted: two members
  // of three keep the quorum).
  let kills = 0;
  let leaderKilled;
  const killRuntime = async (victim) => {
    if (!victim?.alive()) return;
    victim.kill("SIGKILL");
    kills++;
    await victim.exited();
    if (runtimes.filter((x) => x.alive()).length < 3) await spawnRuntime();
  };
  const killLeader = async () => {
    const leader = await cluster.leader();
    if (!leader) return;
    leader.kill("SIGKILL");
    leaderKilled = leader.name;
    t.diagnostic(`leader ${leader.name} SIGKILLed mid-run after ${ended} runs ended`);
  };
  const pending = [];
  const LEADER_RUN = Math.floor(RUNS / 3);

  // The client: PARALLEL runs at a time, each followed (and left, and joined again) until it ends.
  // Run 0's runtime is killed at its 4th event, and the leader at the 3rd event of run RUNS/3, so
  // that even the shortest run has both, mid-run; the chaos loop kills more runtimes at random.
  const PARALLEL = 3;
  const results = [];
  let next = 0;
  let ended = 0;
  const one = async (i) => {
    const th = (await retrying(() => client.threads.create())).thread_id;
    const node_ms = r.int(50, 400);
    const run = (await retrying(() => client.runs.create(th, "chain", { input: { trail: [] }, streamMode: ["updates", "values"], config: { configurable: { node_ms } } }))).run_id;
    const leaveAt = new Set([r.int(1, 12), r.int(1, 12)]); // the client goes away after these events and comes back
    const f = follow(client, th, run, {
      onEvent: (_p, evs) => {
        if (leaveAt.has(evs.length)) f.leave();
        if (i === 0 && evs.length === 4) {
          const pid = nodeRecords(nodeLog).findLast((x) => x.run === run)?.pid;
          pending.push(killRuntime(runtimes.find((x) => x.pid === pid)));
        }
        if (i === LEADER_RUN && evs.length === 3 && !leaderKilled) pending.push(killLeader());
      },
    });
    const { events, joins, status } = await f.done;
    const j = judge({ status, events, ...(await outcome({ client, saver, nodeLog, thread: th, run })) });
    if (status !== "success") {
      const task = await retrying(() => drover.tasks.get("langgraph", run)).catch((e) => ({ error: String(e) }));
      j.problems.push(`task ${task.current_status} after ${task.attempt} attempts: ${task.last_error ?? task.error ?? ""}; result ${JSON.stringify(task.result ?? null).slice(0, 300)}; ${JSON.stringify((task.transitions ?? []).map((x) => [x.status, x.attempt, x.worker, x.error ?? ""])).slice(0, 1500)}`);
    }
    if (j.problems.length) {
      const compact = events.map((e) => (e.broken ? `broken(${e.broken})` : `${e.id}:${e.event}${e.event === "metadata" ? `#${e.data?.attempt}` : e.event === "error" ? JSON.stringify(e.data) : ` ${JSON.stringify(e.data).length}b`}`));
      j.problems.push(`events ${compact.join(" ")}`);
    }
    results.push({ i, run, joins, ...j });
    ended++;
  };
  const clientSide = Promise.all(
    Array.from({ length: PARALLEL }, async () => {
      while (next < RUNS) await one(next++);
    }),
  );

  // The chaos: a runtime SIGKILLed every 0.3 to 2 s (and another started).
  let clientDone = false;
  clientSide.finally(() => (clientDone = true));
  for (let tick = 0; !clientDone && tick < 100_000; tick++) {
    await new Promise((res) => setTimeout(res, r.int(300, 2000)));
    if (clientDone) break;
    if ((await mostAttempts(drover).catch(() => 99)) > 2) continue;
    await killRuntime(r.pick(runtimes.filter((x) => x.alive())));
  }
  await clientSide;
  await Promise.all(pending);

  const sum = (k) => results.reduce((a, x) => a + x[k], 0);
  const lost = results.filter((x) => x.status !== "success").length;
  const problems = results.flatMap((x) => x.problems.map((p) => `run ${x.i} ${x.run}: ${p}`));
  const twice = problems.filter((p) => p.includes("executed twice") || p.includes("after its committed")).length;
  const line = `${results.length} runs, ${lost} lost; ${kills} runtimes SIGKILLed, leader ${leaderKilled ?? "not"} SIGKILLed; ${sum("boundaries")} attempts resumed; ${sum("reexecuted")} node executions cut short and run again, ${twice} past a checkpoint; ${sum("events")} events in ${results.reduce((a, x) => a + x.joins, 0)} joins, ${sum("duplicates")} duplicated, ${sum("missing")} committed updates missing, ${sum("superseded")} updates superseded after a boundary`;
  t.diagnostic(line);
  assert.equal(results.length, RUNS);
  assert.ok(leaderKilled, "the leader was killed");
  assert.deepEqual(problems, []);
});
