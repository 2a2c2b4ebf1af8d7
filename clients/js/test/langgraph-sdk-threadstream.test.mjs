// The thread's join stream of LangGraph's Agent Server API on drover,
// through LangGraph's own SDK Client: client.threads.joinStream follows
// the thread's runs one after another, each from its first event, its
// events' ids run_id:n, and lastEventId resumes after one of them.
import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { Client } from "@langchain/langgraph-sdk";
import { MessagesAnnotation, StateGraph } from "@langchain/langgraph";
import { AIMessage } from "@langchain/core/messages";
import { Drover } from "../dist/index.js";
import { AgentServerRuntime } from "../dist/agentserver.js";
import { sharedServer, uniq, until, withTimeout } from "./helpers/server.mjs";

let srv;
before(async () => {
  srv = await sharedServer();
});
after(async () => srv.release());

/** Held runs wait in their node until the test opens their gate (by message). */
const gates = new Map();
const echo = new StateGraph(MessagesAnnotation)
  .addNode("agent", async (s) => {
    const content = s.messages.at(-1).content;
    if (content.startsWith("held")) await new Promise((res) => gates.set(content, res));
    return { messages: [new AIMessage(`echo ${content}`)] };
  })
  .addEdge("__start__", "agent")
  .compile();

async function setup(t) {
  const ns = uniq("lgts");
  const rt = new AgentServerRuntime({ drover: new Drover({ url: srv.url, namespace: ns }), graphs: { agent: echo }, concurrency: 2 });
  await rt.start();
  t.after(() => withTimeout(rt.stop(), 30_000, "runtime did not stop"));
  return new Client({ apiUrl: srv.url, apiKey: null, defaultHeaders: { "Drover-Namespace": ns }, callerOptions: { maxRetries: 0 } });
}

/** Follows the thread's join stream into chunks until the signal aborts it. */
function follow(client, thread, options, chunks) {
  const ac = new AbortController();
  const done = (async () => {
    try {
      for await (const c of client.threads.joinStream(thread, { ...options, signal: ac.signal })) chunks.push(c);
    } catch (err) {
      if (!ac.signal.aborted) throw err;
    }
  })();
  return async () => {
    ac.abort();
    await withTimeout(done, 30_000, "the thread's stream did not end once aborted");
  };
}

test("langgraph sdk threads.joinStream follows the thread's runs and resumes", async (t) => {
  const client = await setup(t);
  const { thread_id: th } = await client.threads.create();
  // The first run is active when the stream starts (held until its first
  // event came): the stream follows it, then the run created after it.
  const held = uniq("held");
  const first = await client.runs.create(th, "agent", { input: { messages: [{ role: "user", content: held }] } });
  const chunks = [];
  const stop = follow(client, th, {}, chunks);
  await until(() => chunks.length >= 1 && gates.has(held), 30_000, "the held run's first event on the thread's stream");
  gates.get(held)();
  await client.runs.join(th, first.run_id);
  const second = await client.runs.create(th, "agent", { input: { messages: [{ role: "user", content: "two" }] } });
  await client.runs.join(th, second.run_id);
  const runs = [first.run_id, second.run_id];
  await until(() => chunks.filter((c) => c.event === "values").length >= 4, 30_000, "both runs' values on the thread's stream");
  await stop();
  const want = runs.flatMap((r) => [`${r}:0`, `${r}:1`, `${r}:2`]);
  assert.deepEqual(chunks.map((c) => c.id), want);
  assert.deepEqual(chunks.map((c) => c.event), ["metadata", "values", "values", "metadata", "values", "values"]);
  assert.equal(chunks[0].data.run_id, runs[0]);
  assert.equal(chunks[3].data.run_id, runs[1]);
  assert.equal(chunks[5].data.messages.at(-1).content, "echo two");

  // From after the first run's first event: the rest of it, then the next run.
  const rest = [];
  const stopRest = follow(client, th, { lastEventId: `${runs[0]}:0` }, rest);
  await until(() => rest.length >= 5, 30_000, "the resumed thread stream's events");
  await stopRest();
  assert.deepEqual(rest.map((c) => c.id), want.slice(1));
});
