#!/usr/bin/env node
// Runs every test against one real drover server: the binary from
// $DROVER_BIN (else built once from this repository), started on free
// loopback ports and stopped at the end. First the node:test files
// (test/*.test.mjs), then LangGraph's conformance suite under vitest
// (test/validation). Prints one closing line "N passed, N failed, N skipped"
// and exits non-zero if anything failed.
//
//   node test/run.mjs [--only node|vitest] [FILE...]
import { spawn } from "node:child_process";
import { readdirSync, readFileSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { droverBin, jsRoot, startServer } from "./helpers/server.mjs";

const args = process.argv.slice(2);
const only = args[0] === "--only" ? args[1] : undefined;
const files = args.filter((x, i) => !(args[0] === "--only" && i < 2));

const t0 = Date.now();
droverBin(); // $DROVER_BIN, or go build ./cmd/drover once
const server = await startServer();
const env = { ...process.env, DROVER_URL: server.url, DROVER_ETCD: server.etcd, DROVER_BIN: droverBin() };
console.log(`# drover server ${server.url} (etcd ${server.etcd}), ready after ${((Date.now() - t0) / 1000).toFixed(1)} s`);

function run(cmd, argv, opts = {}) {
  return new Promise((resolve) => {
    const child = spawn(cmd, argv, { cwd: jsRoot, env, stdio: ["ignore", "pipe", "inherit"], ...opts });
    let out = "";
    child.stdout.on("data", (d) => {
      out += d;
      process.stdout.write(d);
    });
    child.on("exit", (code, signal) => resolve({ code: code ?? (signal ? 1 : 0), out }));
  });
}

const totals = { passed: 0, failed: 0, skipped: 0 };
let failed = false;
try {
  if (only !== "vitest") {
    const testDir = fileURLToPath(new URL(".", import.meta.url));
    const list = files.length ? files : readdirSync(testDir).filter((f) => f.endsWith(".test.mjs")).sort().map((f) => join("test", f));
    const t = Date.now();
    const r = await run(process.execPath, ["--test", "--test-concurrency=2", "--test-timeout=120000", ...list]);
    const num = (re) => Number(r.out.match(re)?.[1] ?? 0);
    totals.passed += num(/^# pass (\d+)/m);
    totals.failed += num(/^# fail (\d+)/m) + num(/^# cancelled (\d+)/m);
    totals.skipped += num(/^# skipped (\d+)/m) + num(/^# todo (\d+)/m);
    if (r.code !== 0) failed = true;
    console.log(`# node --test: ${((Date.now() - t) / 1000).toFixed(1)} s`);
  }
  if (only !== "node" && files.length === 0) {
    const dir = mkdtempSync(join(tmpdir(), "drover-vitest-"));
    const json = join(dir, "results.json");
    const t = Date.now();
    const vitest = join(jsRoot, "node_modules", "vitest", "vitest.mjs");
    const r = await run(process.execPath, [vitest, "run", "--reporter=default", "--reporter=json", `--outputFile.json=${json}`]);
    try {
      const res = JSON.parse(readFileSync(json, "utf8"));
      totals.passed += res.numPassedTests;
      totals.failed += res.numFailedTests;
      totals.skipped += res.numPendingTests + res.numTodoTests;
      console.log(`# vitest (LangGraph checkpoint conformance suite): ${res.numPassedTests} passed, ${res.numFailedTests} failed, ${res.numPendingTests} skipped, ${((Date.now() - t) / 1000).toFixed(1)} s`);
    } catch {
      totals.failed += 1;
      console.log("# vitest wrote no results");
    }
    rmSync(dir, { recursive: true, force: true });
    if (r.code !== 0) failed = true;
  }
} finally {
  await server.stop();
}
if (failed && totals.failed === 0) totals.failed = 1;
console.log(`# total ${((Date.now() - t0) / 1000).toFixed(1)} s`);
console.log(`${totals.passed} passed, ${totals.failed} failed, ${totals.skipped} skipped`);
process.exit(failed ? 1 : 0);
