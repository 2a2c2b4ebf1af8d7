// `drover-langgraph serve --processes N` against a real drover server:
// the runtime processes it starts share the concurrency and each claims
// runs; a SIGTERM to the command drains them all (the runs under way
// end, then every process exits, 0); one process dying stops the others
// and the command exits 1, one draining (SIGTERMed alone) drains the
// others and the command exits 0. A runtime process whose parent goes
// away, even while it starts, drains and exits.
import { test } from "node:test";
import assert from "node:assert/strict";
import { fork, spawn } from "node:child_process";
import { mkdtempSync, readFileSync, existsSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Client } from "@langchain/langgraph-sdk";
import { jsRoot, sharedServer, uniq, until, withTimeout } from "./helpers/server.mjs";

const fixtureDir = join(jsRoot, "test", "fixtures", "agentserver-procs");
const cli = join(jsRoot, "dist", "agentserver-cli.js");

/** Starts `serve --processes` with args; returns { proc, log(), exit, pids() (the processes' pids it logged) }. */
function serve(t, { url, ns, dir, args, concurrency }) {
  const env = { ...process.env, DROVER_URL: url, DROVER_NAMESPACE: ns, DROVER_LANGGRAPH_TTL: "3", DROVER_LANGGRAPH_CONCURRENCY: String(concurrency), PROCS_LOG: join(dir, "nodes.jsonl"), PROCS_RELEASE: join(dir, "release") };
  const proc = spawn(process.execPath, [cli, "serve", "-c", join(fixtureDir, "langgraph.json"), ...args], { cwd: fixtureDir, env, stdio: ["ignore", "ignore", "pipe"] });
  let log = "";
  proc.stderr.on("data", (d) => (log += d));
  const exit = new Promise((res) => proc.on("exit", (code, signal) => res({ code, signal })));
  // by process number: "process i/N (pid P) serves"
  const pids = () => [...log.matchAll(/process (\d+)\/\d+ \(pid (\d+)\) serves/g)].sort((a, b) => a[1] - b[1]).map((m) => Number(m[2]));
  t.after(() => {
    for (const pid of pids()) if (alive(pid)) process.kill(pid, "SIGKILL");
    if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGKILL");
  });
  return { proc, log: () => log, exit, pids };
}

function alive(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

const records = (dir) => (existsSync(join(dir, "nodes.jsonl")) ? readFileSync(join(dir, "nodes.jsonl"), "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l)) : []);

function setup(t) {
  const dir = mkdtempSync(join(tmpdir(), "lgprocs-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  return { dir, ns: uniq("lgprocs") };
}

test("serve --processes 2: both processes claim runs, and a SIGTERM drains both", async (t) => {
  const srv = await sharedServer();
  t.after(() => srv.release());
  const { dir, ns } = setup(t);
  // Two runs at once in all, one each: both runs can be under way together only in two processes.
  const s = serve(t, { url: srv.url, ns, dir, args: ["--processes", "2"], concurrency: 2 });
  await until(() => s.log().includes("drover-langgraph: serving hold with 2 processes"), 60_000, () => s.log());
  const children = s.pids();
  assert.equal(children.length, 2);
  const client = new Client({ apiUrl: srv.url, apiKey: null, defaultHeaders: { "Drover-Namespace": ns } });
  const runs = [];
  for (let i = 0; i < 2; i++) {
    const th = (await client.threads.create()).thread_id;
    runs.push({ th, run: (await client.runs.create(th, "hold", { input: {} })).run_id });
  }
  // Each run holds its process's only slot until released: both start, in two processes.
  await until(() => records(dir).filter((r) => r.phase === "start").length === 2, 30_000, () => JSON.stringify(records(dir)));
  const started = records(dir).filter((r) => r.phase === "start");
  assert.deepEqual(new Set(started.map((r) => r.pid)), new Set(children));

  // SIGTERM while both runs are under way: each process drains (its run ends), then all exit 0.
  s.proc.kill("SIGTERM");
  await until(() => (s.log().match(/process \d\/2 draining, 1 runs under way/g) ?? []).length === 2, 30_000, () => s.log());
  writeFileSync(join(dir, "release"), "");
  const { code } = await s.exit;
  assert.equal(code, 0, s.log());
  assert.equal((s.log().match(/process \d\/2 stopped/g) ?? []).length, 2, s.log());
  for (const pid of children) assert.equal(alive(pid), false, `process ${pid} still alive`);
  for (const { th, run } of runs) assert.equal((await client.runs.get(th, run)).status, "success");
  const ended = records(dir).filter((r) => r.phase === "end");
  assert.deepEqual(new Set(ended.map((r) => r.pid)), new Set(children)); // each run ended where it started
  assert.equal(records(dir).length, 4); // no run started twice
});

test("serve --processes 2: a process that dies stops the other, and the command exits 1", async (t) => {
  const srv = await sharedServer();
  t.after(() => srv.release());
  const { dir, ns } = setup(t);
  const s = serve(t, { url: srv.url, ns, dir, args: ["--processes=2"], concurrency: 4 });
  await until(() => s.log().includes("drover-langgraph: serving hold with 2 processes"), 60_000, () => s.log());
  const [first, second] = s.pids();
  process.kill(first, "SIGKILL");
  const { code } = await s.exit;
  assert.equal(code, 1, s.log());
  assert.match(s.log(), /process 1\/2 \(pid \d+\) exited \(SIGKILL\); stopping the others/);
  assert.match(s.log(), /process 2\/2 stopped/);
  assert.equal(alive(second), false);
});

test("serve --processes 2: one process SIGTERMed alone drains, the other drains too, and the command exits 0", async (t) => {
  const srv = await sharedServer();
  t.after(() => srv.release());
  const { dir, ns } = setup(t);
  const s = serve(t, { url: srv.url, ns, dir, args: ["--processes", "2"], concurrency: 4 });
  await until(() => s.log().includes("drover-langgraph: serving hold with 2 processes"), 60_000, () => s.log());
  const [first, second] = s.pids();
  // As a service manager stopping every process of the service at once may.
  process.kill(first, "SIGTERM");
  const { code } = await s.exit;
  assert.equal(code, 0, s.log());
  assert.match(s.log(), /process 1\/2 \(pid \d+\) exited \(0\); stopping the others/);
  assert.equal((s.log().match(/process \d\/2 stopped/g) ?? []).length, 2, s.log());
  assert.equal(alive(second), false);
});

test("a runtime process whose parent went away while it started drains and exits 0", async (t) => {
  const srv = await sharedServer();
  t.after(() => srv.release());
  const { dir, ns } = setup(t);
  // As `--processes` starts it, from a parent that is gone (disconnected) before it serves.
  const env = { ...process.env, DROVER_URL: srv.url, DROVER_NAMESPACE: ns, DROVER_LANGGRAPH_TTL: "3", DROVER_LANGGRAPH_CONCURRENCY: "1", DROVER_LANGGRAPH_PROCESS: "1/2", PROCS_LOG: join(dir, "nodes.jsonl"), PROCS_RELEASE: join(dir, "release") };
  const child = fork(cli, ["serve", "-c", join(fixtureDir, "langgraph.json")], { cwd: fixtureDir, env, stdio: ["ignore", "ignore", "pipe", "ipc"] });
  t.after(() => child.exitCode === null && child.signalCode === null && child.kill("SIGKILL"));
  let log = "";
  child.stderr.on("data", (d) => (log += d));
  const exit = new Promise((res) => child.on("exit", (code, signal) => res({ code, signal })));
  child.disconnect();
  const { code } = await withTimeout(exit, 30_000, "the process serves on, with no parent");
  assert.equal(code, 0, log);
  assert.match(log, /process 1\/2 \(pid \d+\) serves hold/);
  assert.match(log, /process 1\/2 draining/);
});

test("serve --help shows --processes with an example; a bad count is a usage error", async () => {
  const run = (args, env = {}) =>
    new Promise((res) => {
      const p = spawn(process.execPath, [cli, ...args], { env: { ...process.env, ...env }, stdio: ["ignore", "ignore", "pipe"] });
      let err = "";
      p.stderr.on("data", (d) => (err += d));
      p.on("exit", (code) => res({ code, err }));
    });
  const help = await run(["serve", "--help"]);
  assert.equal(help.code, 0);
  assert.match(help.err, /--processes N/);
  assert.match(help.err, /serve -c langgraph\.json --processes 2/);
  const zero = await run(["serve", "--processes", "0"]);
  assert.equal(zero.code, 2);
  assert.match(zero.err, /--processes must be a whole number/);
  const few = await run(["serve", "--processes", "3"], { DROVER_LANGGRAPH_CONCURRENCY: "2" });
  assert.equal(few.code, 2);
  assert.match(few.err, /at least the processes/);
});
