import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { Drover } from "../dist/index.js";
import { sharedServer, uniq } from "./helpers/server.mjs";

let srv;
before(async () => (srv = await sharedServer()));
after(async () => srv.release());

const fixture = fileURLToPath(new URL("./fixtures/drain-worker.mjs", import.meta.url));

test("SIGTERM drains a worker: no new claims, running tasks finish and are acked, the session ends, the process exits", async () => {
  const ns = uniq("drain");
  const q = uniq("q");
  const drover = new Drover({ url: srv.url, namespace: ns });
  await drover.submit(q, [
    ...Array.from({ length: 3 }, (_, i) => ({ task_id: `slow-${i}`, task_type: "t", parameters: { ms: 1500 }, metadata: { priority: 9 } })),
    ...Array.from({ length: 10 }, (_, i) => ({ task_id: `later-${i}`, task_type: "t", parameters: { ms: 10 }, metadata: { priority: 0 } })),
  ]);
  const child = spawn(process.execPath, [fixture, srv.url, ns, q, "3"], { stdio: ["ignore", "pipe", "inherit"] });
  let out = "";
  const started = () => (out.match(/^start /gm) ?? []).length;
  child.stdout.on("data", (d) => (out += d));
  const exited = new Promise((res) => child.on("exit", (code, sig) => res({ code, sig })));
  const deadline = Date.now() + 10_000;
  while (started() < 3 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
  assert.equal(started(), 3, `three tasks started:\n${out}`);
  const termAt = Date.now();
  child.kill("SIGTERM");
  const killer = setTimeout(() => child.kill("SIGKILL"), 15_000);
  const { code, sig } = await exited;
  clearTimeout(killer);
  assert.equal(sig, null, "it exited by itself");
  assert.equal(code, 0);
  assert.ok(Date.now() - termAt < 6000, "drained promptly (it did not wait out a 2 s claim more than once)");
  const final = JSON.parse(out.trim().split("\n").pop());
  assert.equal(final.final, true);
  const startedIds = [...out.matchAll(/^start (\S+)/gm)].map((m) => m[1]);
  const endedIds = [...out.matchAll(/^end (\S+)/gm)].map((m) => m[1]);
  assert.deepEqual(endedIds.sort(), startedIds.sort(), "every task that started finished");
  assert.equal(final.claimed, startedIds.length, "nothing claimed after SIGTERM that did not run");
  assert.equal(final.succeeded, startedIds.length);
  assert.equal(final.lost, 0);
  for (const id of startedIds) assert.equal((await drover.tasks.get(q, id)).current_status, "SUCCEEDED", id);
  const sessionId = out.match(/session (\S+)/)[1];
  const r = await fetch(`${srv.url}/v1/sessions/${sessionId}`, { headers: { "Drover-Namespace": ns } });
  assert.equal(r.status, 404, "the worker's session was ended");
  const st = await drover.tasks.stats(q);
  assert.equal(st.running, 0, "no claim left behind");
  assert.equal(st.pending + st.succeeded, 13);
});
