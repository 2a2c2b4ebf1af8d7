// LangGraph's own SDK Client (@langchain/langgraph-sdk) against a real
// drover server: the Agent Server routes drover serves so far (assistants
// and threads), called exactly as a LangGraph application calls them.
import { test, after, before, describe } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Client } from "@langchain/langgraph-sdk";
import { sharedServer, startServer, uniq } from "./helpers/server.mjs";

let srv;
before(async () => {
  srv = await sharedServer();
});
after(async () => srv.release());

/** A Client in a namespace of its own; apiKey null reads no environment. */
function client(extra = {}) {
  return new Client({
    apiUrl: srv.url,
    apiKey: null,
    defaultHeaders: { "Drover-Namespace": uniq("lg") },
    callerOptions: { maxRetries: 0 },
    ...extra,
  });
}

test("langgraph sdk: assistants create, read, update, delete (LangGraph's own first test)", async () => {
  const c = client();
  const config = { configurable: { model_name: "gpt" } };
  let res = await c.assistants.create({ graphId: "agent", config, description: "foo" });
  assert.equal(res.graph_id, "agent");
  assert.deepEqual(res.config, config);
  assert.equal(res.description, "foo");
  assert.equal(res.version, 1);
  await c.assistants.update(res.assistant_id, { graphId: "agent", metadata: { name: "woof" }, description: "bar" });
  res = await c.assistants.get(res.assistant_id);
  assert.deepEqual(res.metadata, { name: "woof" });
  assert.deepEqual(res.config, config);
  assert.equal(res.description, "bar");
  assert.equal(res.version, 2);
  await c.assistants.delete(res.assistant_id);
  await assert.rejects(c.assistants.get(res.assistant_id), /HTTP 404: .*Assistant not found/);
});

test("langgraph sdk: assistant versions, set latest, ifExists", async () => {
  const c = client();
  const a = await c.assistants.create({ graphId: "agent", name: "v1", metadata: { stage: "one" } });
  await c.assistants.update(a.assistant_id, { name: "v2", metadata: { stage: "two" } });
  const versions = await c.assistants.getVersions(a.assistant_id);
  assert.deepEqual(versions.map((v) => [v.version, v.name]), [[2, "v2"], [1, "v1"]]);
  const back = await c.assistants.setLatest(a.assistant_id, 1);
  assert.equal(back.version, 1);
  assert.equal(back.name, "v1");
  assert.equal((await c.assistants.get(a.assistant_id)).metadata.stage, "one");
  await assert.rejects(c.assistants.setLatest(a.assistant_id, 7), /HTTP 404/);
  await assert.rejects(c.assistants.create({ graphId: "agent", assistantId: a.assistant_id }), /HTTP 409/);
  const same = await c.assistants.create({ graphId: "other", assistantId: a.assistant_id, ifExists: "do_nothing" });
  assert.equal(same.graph_id, "agent");
});

test("langgraph sdk: assistant search, count and pagination", async () => {
  const c = client();
  for (const [graphId, name, team] of [["agent", "alpha", "red"], ["agent", "beta", "blue"], ["weather", "gamma", "red"]]) {
    await c.assistants.create({ graphId, name, metadata: { team } });
  }
  assert.deepEqual((await c.assistants.search()).map((a) => a.name), ["gamma", "beta", "alpha"]);
  assert.deepEqual((await c.assistants.search({ graphId: "agent" })).map((a) => a.name), ["beta", "alpha"]);
  assert.deepEqual((await c.assistants.search({ metadata: { team: "red" } })).map((a) => a.name), ["gamma", "alpha"]);
  assert.deepEqual((await c.assistants.search({ sortBy: "name", sortOrder: "asc", select: ["name"] })), [{ name: "alpha" }, { name: "beta" }, { name: "gamma" }]);
  const page = await c.assistants.search({ limit: 2, includePagination: true });
  assert.equal(page.assistants.length, 2);
  assert.equal(page.next, "2");
  assert.equal(await c.assistants.count({ graphId: "agent" }), 2);
  assert.equal(await c.assistants.count(), 3);
});

test("langgraph sdk: a bad input is a 400 naming the field, and stores nothing", async () => {
  const c = client();
  await assert.rejects(c.assistants.create({ graphId: "" }), /HTTP 400: .*graph_id/);
  await assert.rejects(c.assistants.create({ graphId: "agent", assistantId: "not-a-uuid" }), /HTTP 400: .*assistant_id/);
  await assert.rejects(c.threads.create({ threadId: "not-a-uuid" }), /HTTP 400: .*thread_id/);
  await assert.rejects(c.threads.get("not-a-uuid"), /HTTP 400: .*thread_id/);
  await assert.rejects(c.assistants.search({ limit: 0 }), /HTTP 400: .*limit/);
  assert.equal(await c.assistants.count(), 0);
  assert.equal(await c.threads.count(), 0);
});

test("langgraph sdk: threads create, read, update, delete, copy", async () => {
  const c = client();
  const t = await c.threads.create({ metadata: { user: "ann" } });
  assert.equal(t.status, "idle");
  assert.deepEqual(t.metadata, { user: "ann" });
  assert.equal((await c.threads.get(t.thread_id)).thread_id, t.thread_id);
  const u = await c.threads.update(t.thread_id, { metadata: { topic: "go" } });
  assert.deepEqual(u.metadata, { user: "ann", topic: "go" });
  await assert.rejects(c.threads.create({ threadId: t.thread_id }), /HTTP 409/);
  assert.deepEqual((await c.threads.create({ threadId: t.thread_id, ifExists: "do_nothing" })).metadata, u.metadata);
  const cp = await c.threads.copy(t.thread_id);
  assert.notEqual(cp.thread_id, t.thread_id);
  assert.deepEqual(cp.metadata, { user: "ann", topic: "go", thread_id: cp.thread_id });
  await c.threads.delete(t.thread_id);
  await assert.rejects(c.threads.get(t.thread_id), new RegExp(`HTTP 404: .*Thread with ID ${t.thread_id} not found`));
  assert.equal((await c.threads.get(cp.thread_id)).thread_id, cp.thread_id);
});

test("langgraph sdk: thread search and count", async () => {
  const c = client();
  const ids = [];
  for (let n = 0; n < 3; n++) ids.push((await c.threads.create({ metadata: { n, even: n % 2 === 0 } })).thread_id);
  assert.deepEqual((await c.threads.search()).map((t) => t.metadata.n), [2, 1, 0]);
  assert.deepEqual((await c.threads.search({ sortOrder: "asc" })).map((t) => t.metadata.n), [0, 1, 2]);
  assert.deepEqual((await c.threads.search({ metadata: { even: true } })).map((t) => t.metadata.n), [2, 0]);
  assert.deepEqual((await c.threads.search({ ids: [ids[1]] })).map((t) => t.thread_id), [ids[1]]);
  assert.deepEqual((await c.threads.search({ status: "busy" })), []);
  assert.deepEqual((await c.threads.search({ limit: 1, offset: 2, select: ["thread_id"] })), [{ thread_id: ids[0] }]);
  assert.equal(await c.threads.count({ status: "idle" }), 3);
  assert.equal(await c.threads.count({ metadata: { even: false } }), 1);
});

describe("langgraph sdk with tokens", () => {
  const writeToken = "lg-writer-token-0123456789abcdef";
  const readToken = "lg-reader-token-0123456789abcdef";
  let dir;
  let sec;
  before(async () => {
    dir = mkdtempSync(join(tmpdir(), "drover-lg-"));
    writeFileSync(join(dir, "tokens.json"), JSON.stringify({
      tokens: [
        { name: "app", token: writeToken, namespaces: ["drover"], role: "write" },
        { name: "viewer", token: readToken, namespaces: ["drover"], role: "read" },
      ],
    }));
    sec = await startServer({ extraArgs: ["--auth-file", join(dir, "tokens.json")] });
  });
  after(async () => {
    await sec?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  test("the SDK's apiKey (sent as x-api-key) is a drover token, with its role", async () => {
    const mk = (apiKey) => new Client({ apiUrl: sec.url, apiKey, callerOptions: { maxRetries: 0 } });
    await assert.rejects(mk(null).threads.create(), /HTTP 401/);
    await assert.rejects(mk("not-a-token-of-this-server").threads.create(), /HTTP 401/);
    const t = await mk(writeToken).threads.create({ metadata: { by: "app" } });
    const viewer = mk(readToken);
    await assert.rejects(viewer.threads.create(), /HTTP 403/);
    assert.deepEqual((await viewer.threads.search()).map((x) => x.thread_id), [t.thread_id]);
    assert.equal((await viewer.threads.get(t.thread_id)).metadata.by, "app");
  });
});
