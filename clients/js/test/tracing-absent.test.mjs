// @opentelemetry/api is an optional peer dependency: without it the client
// and its worker work as before, with no span and no traceparent of their
// own; a handler's requests carry its task's traceparent. The test runs the built client from a copy outside this package, in
// a child process where the module cannot be resolved.
import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { cpSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { jsRoot, sharedServer, uniq } from "./helpers/server.mjs";

let srv;
let dir;
before(async () => {
  srv = await sharedServer();
  dir = mkdtempSync(join(tmpdir(), "drover-nootel-"));
  cpSync(join(jsRoot, "dist"), join(dir, "dist"), { recursive: true });
  writeFileSync(join(dir, "package.json"), '{"type":"module"}');
});
after(async () => {
  rmSync(dir, { recursive: true, force: true });
  await srv.release();
});

const script = `
import { createServer } from "node:http";
import { Drover, Transport } from "./dist/index.js";
const out = {};
try { await import("@opentelemetry/api"); out.api = "found"; } catch (e) { out.api = e.code; }
const [url, ns, q] = process.argv.slice(2);
const seen = {};
const local = createServer((req, res) => { seen[req.url] = req.headers; res.setHeader("Content-Type", "application/json"); res.end("{}"); });
await new Promise((r) => local.listen(0, "127.0.0.1", r));
const other = new Transport({ url: "http://127.0.0.1:" + local.address().port, retries: 0 });
const drover = new Drover({ url, namespace: ns });
await drover.submit(q, [{ task_id: "a", task_type: "t", traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" }]);
const w = drover.worker(q, { wait: 1, signals: false }, async (task) => {
  await new Promise((r) => setTimeout(r, 1)); // a request after an await still knows its task
  await other.request("GET", "/in-handler");
  return task.traceparent;
});
for (let i = 0; i < 1500 && w.stats.succeeded < 1; i++) await new Promise((r) => setTimeout(r, 20));
out.stats = await w.drain();
out.result = (await drover.tasks.get(q, "a")).result;
await other.request("GET", "/x");
local.close();
out.inHandler = seen["/in-handler"]?.traceparent ?? null;
out.traceparent = seen["/x"].traceparent ?? null;
console.log(JSON.stringify(out));
`;

test("without @opentelemetry/api the client and its worker run, untraced", async () => {
  writeFileSync(join(dir, "run.mjs"), script);
  const q = uniq("nootel");
  const stdout = await new Promise((resolve, reject) =>
    execFile(process.execPath, ["run.mjs", srv.url, uniq("nootel"), q], { cwd: dir, timeout: 60_000 }, (err, out, errOut) =>
      err ? reject(new Error(`${err.message}\n${errOut}`)) : resolve(out),
    ),
  );
  const out = JSON.parse(stdout.trim().split("\n").at(-1));
  assert.equal(out.api, "ERR_MODULE_NOT_FOUND", "the module cannot be resolved there");
  assert.equal(out.stats.succeeded, 1);
  assert.equal(out.result, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "the handler still sees the task's traceparent");
  assert.equal(out.inHandler, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "the handler's requests carry its task's trace");
  assert.equal(out.traceparent, null, "no trace context of its own");
});
