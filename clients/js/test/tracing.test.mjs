// The client sends the caller's OpenTelemetry trace context as a
// traceparent header when @opentelemetry/api is installed (an optional peer
// dependency, installed here as a dev dependency), through the global
// propagator and context manager the application registered. The test
// registers a W3C propagator and an AsyncLocalStorage context manager of
// its own: the SDK packages that ship them are not dependencies.
import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { AsyncLocalStorage } from "node:async_hooks";
import { context, propagation, trace, ROOT_CONTEXT, TraceFlags } from "@opentelemetry/api";
import { Transport } from "../dist/index.js";

const TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736";
const SPAN_ID = "00f067aa0ba902b7";

class ALSContextManager {
  als = new AsyncLocalStorage();
  active() {
    return this.als.getStore() ?? ROOT_CONTEXT;
  }
  with(ctx, fn, thisArg, ...args) {
    return this.als.run(ctx, () => fn.call(thisArg, ...args));
  }
  bind(_ctx, target) {
    return target;
  }
  enable() {
    return this;
  }
  disable() {
    this.als.disable();
    return this;
  }
}

const w3c = {
  inject(ctx, carrier, setter) {
    const sc = trace.getSpanContext(ctx);
    if (!sc) return;
    setter.set(carrier, "traceparent", `00-${sc.traceId}-${sc.spanId}-0${sc.traceFlags & 1}`);
  },
  extract(ctx) {
    return ctx;
  },
  fields() {
    return ["traceparent"];
  },
};

let server;
let url;
const seen = [];

before(async () => {
  server = createServer((req, res) => {
    seen.push(req.headers);
    res.setHeader("Content-Type", "application/json");
    res.end("{}");
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  url = `http://127.0.0.1:${server.address().port}`;
  context.setGlobalContextManager(new ALSContextManager());
  propagation.setGlobalPropagator(w3c);
});

after(() => {
  server.close();
  propagation.disable();
  context.disable();
});

test("a request inside a span carries its traceparent", async () => {
  const t = new Transport({ url, retries: 0 });
  const span = trace.wrapSpanContext({ traceId: TRACE_ID, spanId: SPAN_ID, traceFlags: TraceFlags.SAMPLED });
  await context.with(trace.setSpan(context.active(), span), () => t.request("GET", "/inside"));
  assert.equal(seen.at(-1).traceparent, `00-${TRACE_ID}-${SPAN_ID}-01`);
});

test("a request outside any span carries none", async () => {
  const t = new Transport({ url, retries: 0 });
  await t.request("GET", "/outside");
  assert.equal(seen.at(-1).traceparent, undefined);
});

test("a caller's own traceparent header wins", async () => {
  const own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  const t = new Transport({ url, retries: 0, headers: { traceparent: own } });
  const span = trace.wrapSpanContext({ traceId: TRACE_ID, spanId: SPAN_ID, traceFlags: TraceFlags.SAMPLED });
  await context.with(trace.setSpan(context.active(), span), () => t.request("GET", "/own"));
  assert.equal(seen.at(-1).traceparent, own);
});
