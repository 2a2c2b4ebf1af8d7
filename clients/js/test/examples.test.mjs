// Runs every example of the README (examples/*.ts, compiled to
// build/examples by `npm run build`) against the real server, each in a
// namespace of its own: they must exit 0 by themselves.
import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readdirSync } from "node:fs";
import { promisify } from "node:util";
import { fileURLToPath } from "node:url";
import { sharedServer, uniq } from "./helpers/server.mjs";

let srv;
before(async () => (srv = await sharedServer()));
after(async () => srv.release());

const dir = fileURLToPath(new URL("../build/examples/", import.meta.url));
const examples = readdirSync(dir).filter((f) => f.endsWith(".js")).sort();

test("every example was built", () => {
  assert.deepEqual(examples, ["approval.js", "fanout.js", "langgraph.js", "limits.js", "llm-tokens.js", "lock.js", "paxos.js", "registry.js", "search-history.js", "session.js", "steps.js", "stream-page.js", "submit-ndjson.js", "worker.js"]);
});

// paxos.js needs a `drover paxos serve` group, not this server:
// test/paxos.test.mjs runs it against the group it starts. stream-page.js
// serves until stopped: test/streams.test.mjs runs it.
for (const f of examples.filter((f) => f !== "paxos.js" && f !== "stream-page.js")) {
  test(`example ${f} runs`, async () => {
    const env = { ...process.env, DROVER_URL: srv.url, DROVER_NAMESPACE: uniq("ex") };
    const { stdout } = await promisify(execFile)(process.execPath, [dir + f], { env, timeout: 60_000 });
    assert.ok(stdout.length > 0);
    if (f === "worker.js") assert.match(stdout, /welcome-2/);
    if (f === "submit-ndjson.js") assert.match(stdout, /^10000 0 \[/m);
    if (f === "langgraph.js") assert.match(stdout, /count: 2/);
    if (f === "approval.js") assert.match(stdout, /\[ 1 \] \[ 'approval' \]\ntrue false\n\[ 2 \] done, approved by ana\nfinished: it takes no signal\n/);
    if (f === "llm-tokens.js") assert.match(stdout, /#13 done .*\n.*\n.*\nsame: true\n/);
    if (f === "fanout.js") assert.match(stdout, /^\[ 1, 2 \] 270\n/);
    if (f === "steps.js") assert.match(stdout, /\[ 1, 2, 3 \]/);
    if (f === "search-history.js") assert.match(stdout, /\[ 'report-1', 'report-3' \] true\nreport-1\nreport-3\nreport-5\n.*moved: 2 }\n.*moved: 4 }\n60 0 0\n/);
  });
}
