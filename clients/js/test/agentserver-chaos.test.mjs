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
const SEED = Number(process.env.DROVER_CHAOS_SEED ?? Date.now() % 100_000);
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
