import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, existsSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { emptyCheckpoint, uuid6 } from "@langchain/langgraph-checkpoint";
import { Drover, ConflictError, FencedError } from "../dist/index.js";
import { DroverSaver, encodeThreadId, decodeThreadId } from "../dist/langgraph.js";
import { sharedServer, uniq, withTimeout } from "./helpers/server.mjs";

let srv;
let drover;
before(async () => {
  srv = await sharedServer();
  drover = new Drover({ url: srv.url, namespace: uniq("saver") });
});
after(async () => srv.release());

const cp = (values, versions) => ({ ...emptyCheckpoint(), id: uuid6(-3), channel_values: values, channel_versions: versions ?? Object.fromEntries(Object.keys(values).map((k) => [k, 1])) });
const meta = (step) => ({ source: "loop", step, parents: {} });

test("compare-and-swap: of two writers on one parent, the second gets ConflictError and writes nothing", async () => {
  const saver = new DroverSaver({ drover });
  const thread = uniq("th");
  const root = await saver.put({ configurable: { thread_id: thread } }, cp({ n: 0 }), meta(0), { n: 1 });
  const a = cp({ n: 1 }, { n: 2 });
  const b = cp({ n: 1 }, { n: 2 });
  await saver.put(root, a, meta(1), { n: 2 });
  await assert.rejects(saver.put(root, b, meta(1), { n: 2 }), (err) => err instanceof ConflictError && err.status === 409);
  const head = await saver.getTuple({ configurable: { thread_id: thread } });
  assert.equal(head.checkpoint.id, a.id);
  assert.equal(await saver.getTuple({ configurable: { thread_id: thread, checkpoint_id: b.id } }), undefined);
  // The same write repeated (as after a lost answer) is recognized, not a conflict.
  const again = await new DroverSaver({ drover }).put(root, a, meta(1), { n: 2 });
  assert.equal(again.configurable.checkpoint_id, a.id);
});

test("protection none accepts any parent (forks); the last writer is the head", async () => {
  const saver = new DroverSaver({ drover, protection: "none" });
  const thread = uniq("fork");
  const root = await saver.put({ configurable: { thread_id: thread } }, cp({ n: 0 }), meta(0), { n: 1 });
  const x = await saver.put(root, cp({ n: 1 }, { n: 2 }), meta(1), { n: 2 });
  const fork = await saver.put(root, cp({ n: 5 }, { n: 3 }), meta(1), { n: 3 });
  const head = await saver.getTuple({ configurable: { thread_id: thread } });
  assert.equal(head.config.configurable.checkpoint_id, fork.configurable.checkpoint_id);
  assert.equal(head.parentConfig.configurable.checkpoint_id, root.configurable.checkpoint_id);
  assert.notEqual(x.configurable.checkpoint_id, fork.configurable.checkpoint_id);
});

test("a lock fences every write: once the lock changed hands, the old holder's writes are FencedError", async () => {
  const thread = uniq("locked");
  const lockName = `thread:${thread}`;
  const s1 = await drover.session({ ttl: 5 });
  const l1 = await drover.lock(lockName, { session: s1 });
  const old = new DroverSaver({ drover }).withLock(l1);
  const c1 = await old.put({ configurable: { thread_id: thread } }, cp({ n: 0 }), meta(0), { n: 1 });
  await old.putWrites(c1, [["n", 1]], "task-1");
  await s1.close(); // the holder's session ends (a long LLM call outlived it)
  const l2 = await drover.lock(lockName, { wait: 5 });
  const fresh = new DroverSaver({ drover, lock: l2 });
  const c2 = await fresh.put(c1, cp({ n: 1 }, { n: 2 }), meta(1), { n: 2 });
  await assert.rejects(old.put(c1, cp({ n: 99 }, { n: 2 }), meta(1), { n: 2 }), FencedError);
  await assert.rejects(old.putWrites(c2, [["n", 99]], "task-x"), FencedError);
  const head = await fresh.getTuple({ configurable: { thread_id: thread } });
  assert.equal(head.checkpoint.channel_values.n, 1);
  assert.deepEqual(head.pendingWrites, []);
  await l2.release();
});

test("only the channels that changed are stored in a checkpoint; the others are read from the ancestor that has them", async () => {
  const saver = new DroverSaver({ drover, protection: "none" });
  const thread = uniq("delta");
  const big = "x".repeat(50_000);
  const c1 = await saver.put({ configurable: { thread_id: thread } }, cp({ history: big, step: 1 }, { history: 1, step: 1 }), meta(0), { history: 1, step: 1 });
  const c2 = await saver.put(c1, cp({ history: big, step: 2 }, { history: 1, step: 2 }), meta(1), { step: 2 });
  const c3 = await saver.put(c2, cp({ history: big, step: 3 }, { history: 1, step: 3 }), meta(2), { step: 3 });
  const raw = await drover.checkpoints.get(thread, c3.configurable.checkpoint_id);
  const env = JSON.parse(Buffer.from(raw.state, "base64").toString());
  assert.deepEqual(Object.keys(env.values), ["step"], "only step is stored in c3");
  assert.deepEqual(env.refs.history, [c1.configurable.checkpoint_id, 1], "history points at c1, not c2");
  assert.ok(raw.state.length < 2000, `c3 is small: ${raw.state.length} bytes`);
  const fresh = new DroverSaver({ drover }); // no cache
  const t3 = await fresh.getTuple(c3);
  assert.deepEqual(t3.checkpoint.channel_values, { history: big, step: 3 });
});

test("thread ids outside drover's name rule are encoded and come back as given", async () => {
  const saver = new DroverSaver({ drover, protection: "none" });
  const thread = `user@example.com/chat ${uniq("x")}`;
  assert.notEqual(encodeThreadId(thread), thread);
  assert.equal(decodeThreadId(encodeThreadId(thread)), thread);
  assert.equal(encodeThreadId("plain-uuid-1234"), "plain-uuid-1234");
  const c = await saver.put({ configurable: { thread_id: thread } }, cp({ a: 1 }), meta(0), { a: 1 });
  assert.equal(c.configurable.thread_id, thread);
  const t = await saver.getTuple({ configurable: { thread_id: thread } });
  assert.equal(t.config.configurable.thread_id, thread);
  const listed = [];
  for await (const x of saver.list({ configurable: { thread_id: thread } })) listed.push(x.config.configurable.thread_id);
  assert.deepEqual(listed, [thread]);
  await saver.deleteThread(thread);
  assert.equal(await saver.getTuple({ configurable: { thread_id: thread } }), undefined);
});

test("a StateGraph resumes in another process after the first is SIGKILLed mid-graph: finished nodes do not run again", async (t) => {
  const ns = drover.transport.namespace;
  const thread = uniq("resume");
  const logDir = mkdtempSync(join(tmpdir(), "drover-graph-"));
  t.after(() => rmSync(logDir, { recursive: true, force: true }));
  const logFile = join(logDir, "nodes.log");
  const fixture = fileURLToPath(new URL("./fixtures/graph-resume.mjs", import.meta.url));
  const lines = () => (existsSync(logFile) ? readFileSync(logFile, "utf8").trim().split("\n") : []);
  const first = spawn(process.execPath, [fixture, srv.url, ns, thread, logFile, "start"], { stdio: ["ignore", "pipe", "inherit"], env: { ...process.env, CRASH_IN: "b" } });
  const firstExit = new Promise((r) => first.on("exit", (code, sig) => r(sig)));
  try {
    const deadline = Date.now() + 20_000;
    while (!lines().some((l) => l.endsWith("start b")) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    assert.ok(lines().some((l) => l.endsWith("start b")), "the first process reached node b");
    first.kill("SIGKILL");
    assert.equal(await firstExit, "SIGKILL");
  } finally {
    first.kill("SIGKILL");
  }
  const second = spawn(process.execPath, [fixture, srv.url, ns, thread, logFile, "resume"], { stdio: ["ignore", "pipe", "inherit"] });
  let out = "";
  second.stdout.on("data", (d) => (out += d));
  const code = await withTimeout(new Promise((r) => second.on("exit", r)), 20_000, "the resuming process did not finish");
  assert.equal(code, 0);
  const result = JSON.parse(out.trim().split("\n").pop());
  assert.deepEqual(result.visited, ["input", "a", "b", "c"]);
  const log = lines().map((l) => l.split(" ").slice(1).join(" "));
  assert.deepEqual(log, ["start a", "end a", "start b", "start b", "end b", "start c", "end c"], "a ran once; b again (it had not finished); c once");
  const pids = new Set(lines().map((l) => l.split(" ")[0]));
  assert.equal(pids.size, 2, "two processes");
});
