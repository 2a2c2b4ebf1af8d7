import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { fileURLToPath } from "node:url";
import { sharedServer } from "./helpers/server.mjs";

let srv;
before(async () => (srv = await sharedServer()));
after(async () => srv.release());

test("the benchmark runs end to end (small: 400 no-op tasks, 2 worker processes)", async () => {
  const script = fileURLToPath(new URL("../bench/bench.mjs", import.meta.url));
  const { stdout } = await promisify(execFile)(process.execPath, [script, "--url", srv.url, "--tasks", "400", "--workers", "2", "--concurrency", "4", "--timeout-seconds", "60"], { timeout: 90_000 });
  const lines = stdout.trim().split("\n");
  assert.match(lines[0], /^tasks\/s: \d+$/);
  const r = JSON.parse(lines[1]);
  assert.equal(r.tasks, 400);
  assert.equal(r.succeeded, 400, "every task acked once by the workers");
  assert.equal(r.lost, 0);
  assert.equal(r.per_worker.length, 2);
});
