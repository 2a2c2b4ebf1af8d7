// With @opentelemetry/api installed and an SDK registered (the real
// sdk-trace-base with an in-memory exporter, the AsyncLocalStorage context
// manager and the W3C propagator), the client records a client span per
// HTTP request and a worker a "process <queue>" span per claimed task,
// against a real drover server. The attempt span is a child of the task's
// creation context (its stored traceparent) and links to it, as drover's
// Go worker's is; the handler's own requests are its children.
import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { context, propagation, trace, SpanKind, SpanStatusCode } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";
import { Drover, Permanent, Transport } from "../dist/index.js";
import { sharedServer, uniq, until } from "./helpers/server.mjs";

const exporter = new InMemorySpanExporter();
let srv;
let drover;

before(async () => {
  const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
  trace.setGlobalTracerProvider(provider);
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  srv = await sharedServer();
  drover = new Drover({ url: srv.url, namespace: uniq("spans") });
});

after(async () => {
  await srv.release();
  trace.disable();
  context.disable();
  propagation.disable();
});

const parentOf = (s) => s.parentSpanContext?.spanId ?? s.parentSpanId;
const spans = () => exporter.getFinishedSpans();

test("each HTTP request is a client span under the caller's, and carries it", async () => {
  const seen = [];
  const local = createServer((req, res) => {
    seen.push(req.headers);
    res.statusCode = req.url.startsWith("/missing") ? 404 : 200;
    res.setHeader("Content-Type", "application/json");
    res.end(res.statusCode === 200 ? "{}" : '{"title":"not found"}');
  });
  await new Promise((r) => local.listen(0, "127.0.0.1", r));
  const port = local.address().port;
  try {
    const t = new Transport({ url: `http://127.0.0.1:${port}`, retries: 0 });
    const tracer = trace.getTracer("test");
    const root = tracer.startSpan("caller");
    await context.with(trace.setSpan(context.active(), root), async () => {
      await t.request("GET", "/v1/things", { query: { token: "secret" } });
      await assert.rejects(t.request("GET", "/missing"));
    });
    root.end();
    const sid = root.spanContext().spanId;
    const mine = spans().filter((s) => s.kind === SpanKind.CLIENT && parentOf(s) === sid);
    assert.equal(mine.length, 2, "one client span per request");
    const [ok, missing] = mine;
    const before = spans().length;
    await t.request("GET", "/v1/outside");
    assert.equal(spans().length, before, "outside any span of the caller's, a request starts no trace");
    assert.equal(ok.name, "GET");
    assert.equal(ok.spanContext().traceId, root.spanContext().traceId);
    assert.equal(ok.attributes["http.request.method"], "GET");
    assert.equal(ok.attributes["http.response.status_code"], 200);
    assert.equal(ok.attributes["url.full"], `http://127.0.0.1:${port}/v1/things`, "no query: it may name tokens");
    assert.equal(ok.attributes["server.address"], "127.0.0.1");
    assert.equal(ok.attributes["server.port"], port);
    assert.equal(seen[0].traceparent, `00-${ok.spanContext().traceId}-${ok.spanContext().spanId}-01`, "the request carries its client span");
    assert.equal(missing.attributes["http.response.status_code"], 404);
    assert.equal(missing.status.code, SpanStatusCode.ERROR);
    assert.equal(missing.attributes["error.type"], "404");
  } finally {
    local.close();
  }
});

test("a worker's attempt is a process span: child of the creation context, linked to it, ended how it ended", async () => {
  const q = uniq("traced");
  const tracer = trace.getTracer("test");
  // The creation context: a producer span of the submitter's, given as the
  // tasks' traceparent (a server that does not trace stores only that).
  const send = tracer.startSpan("send", { kind: SpanKind.PRODUCER });
  const sc = send.spanContext();
  const traceparent = `00-${sc.traceId}-${sc.spanId}-01`;
  await drover.submit(q, [
    { task_id: "flaky", task_type: "t", max_retries: 3, backoff_base: "10ms", backoff_max: "20ms", metadata: { tenant: "acme" }, traceparent },
    { task_id: "bad", task_type: "t", traceparent },
  ]);
  send.end();
  const inHandler = new Map();
  const w = drover.worker(q, { wait: 1, signals: false, name: "w-test" }, async (task, { attempt }) => {
    inHandler.set(`${task.task_id}/${attempt}`, trace.getActiveSpan()?.spanContext().spanId);
    await drover.tasks.stats(q); // a request of the handler's: under the attempt
    if (task.task_id === "bad") throw new Permanent("no");
    if (attempt === 1) throw new Error("flaky");
    return "ok";
  });
  try {
    await until(() => w.stats.succeeded === 1 && w.stats.permanent === 1, 30_000, () => JSON.stringify(w.stats));
  } finally {
    await w.drain();
  }
  const attempts = spans().filter((s) => s.name === `process ${q}`);
  const find = (id, n) => attempts.find((s) => s.attributes["messaging.message.id"] === id && s.attributes["drover.attempt.number"] === n);
  const first = find("flaky", 1);
  const second = find("flaky", 2);
  const dead = find("bad", 1);
  assert.ok(first && second && dead, `attempt spans: ${attempts.map((s) => JSON.stringify(s.attributes)).join("\n")}`);
  for (const s of [first, second, dead]) {
    assert.equal(s.kind, SpanKind.CONSUMER);
    assert.equal(s.spanContext().traceId, sc.traceId, "in the submission's trace");
    assert.equal(parentOf(s), sc.spanId, "a child of the creation context");
    assert.equal(s.links.length, 1);
    assert.equal(s.links[0].context.spanId, sc.spanId, "linked to the creation context");
    assert.equal(s.attributes["messaging.system"], "drover");
    assert.equal(s.attributes["messaging.destination.name"], q);
    assert.equal(s.attributes["messaging.operation.type"], "process");
    assert.equal(s.attributes["messaging.client.id"], "w-test");
    const id = `${s.attributes["messaging.message.id"]}/${s.attributes["drover.attempt.number"]}`;
    assert.equal(inHandler.get(id), s.spanContext().spanId, `${id}: the handler runs under its attempt's span`);
    const own = spans().filter((c) => c.kind === SpanKind.CLIENT && parentOf(c) === s.spanContext().spanId);
    assert.ok(own.some((c) => c.attributes["url.full"]?.endsWith(`/v1/queues/${q}/stats`)), `${id}: the handler's request is a child of its attempt`);
  }
  assert.equal(first.attributes["drover.tenant"], "acme");
  assert.equal(first.attributes["drover.attempt.end"], "retry");
  assert.equal(first.status.code, SpanStatusCode.ERROR);
  assert.match(first.status.message, /flaky/);
  assert.equal(second.attributes["drover.attempt.end"], "success");
  assert.notEqual(second.status.code, SpanStatusCode.ERROR);
  assert.equal(dead.attributes["drover.attempt.end"], "dead");
  assert.equal(dead.status.code, SpanStatusCode.ERROR);
});

test("an agent task's claims are process spans: children of the context its first claim kept, linked to it", async () => {
  const id = uniq("agent");
  const tracer = trace.getTracer("test");
  // The caller's span: runSteps' first claim keeps its context with the task.
  const root = tracer.startSpan("agent run");
  const rsc = root.spanContext();
  const inStep = [];
  let fail = true;
  const steps = [
    { name: "one", run: async (st) => {
      inStep.push(trace.getActiveSpan()?.spanContext().spanId);
      await drover.agentTasks.get(id); // a request of the step's: under its claim's span
      if (fail) throw new Error("step one broke");
      return st + 1;
    } },
    { name: "two", run: async (st) => { inStep.push(trace.getActiveSpan()?.spanContext().spanId); return st + 1; } },
  ];
  await context.with(trace.setSpan(context.active(), root), () => assert.rejects(drover.runSteps(id, steps, { input: 0 }), /step one broke/));
  root.end();
  fail = false;
  // Outside any span: the claim answers the context kept by the first.
  const r = await drover.runSteps(id, steps, { input: 0, name: "r-test" });
  assert.equal(r.state, 2);
  const claims = spans().filter((s) => s.name === "process agent-tasks" && s.attributes["messaging.message.id"] === id);
  const failed = claims.find((s) => s.attributes["drover.attempt.end"] === "failed");
  const ok = claims.find((s) => s.attributes["drover.attempt.end"] === "success");
  assert.ok(claims.length === 2 && failed && ok, `claim spans: ${claims.map((s) => JSON.stringify(s.attributes)).join("\n")}`);
  for (const s of [failed, ok]) {
    assert.equal(s.kind, SpanKind.CONSUMER);
    assert.equal(s.spanContext().traceId, rsc.traceId, "in the first claim's trace");
    assert.equal(parentOf(s), rsc.spanId, "a child of the context the task kept");
    assert.equal(s.links.length, 1);
    assert.equal(s.links[0].context.spanId, rsc.spanId, "linked to it");
    assert.equal(s.attributes["messaging.system"], "drover");
    assert.equal(s.attributes["messaging.destination.name"], "agent-tasks");
    assert.equal(s.attributes["messaging.operation.type"], "process");
    assert.equal(s.attributes["drover.task.kind"], "agent");
    const own = spans().filter((c) => c.kind === SpanKind.CLIENT && parentOf(c) === s.spanContext().spanId);
    assert.ok(own.some((c) => c.attributes["url.full"]?.endsWith(`/v1/agent-tasks/${id}`)), "the step's request is a child of its claim's span");
  }
  assert.equal(failed.status.code, SpanStatusCode.ERROR);
  assert.match(failed.status.message, /step one broke/);
  assert.notEqual(ok.status.code, SpanStatusCode.ERROR);
  assert.equal(ok.attributes["messaging.client.id"], "r-test");
  assert.equal(ok.attributes["drover.step.resumed_after"], 0);
  // Steps one, one, two: each under its claim's span.
  assert.deepEqual(inStep, [failed.spanContext().spanId, ok.spanContext().spanId, ok.spanContext().spanId]);
});
