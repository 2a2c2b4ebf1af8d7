// OpenTelemetry spans of the client, when `@opentelemetry/api` is installed
// (an optional peer dependency, loaded at run time): a client span per HTTP
// request and a `process <queue>` span per task a worker claims. Without
// the API, or with no SDK registered, nothing is recorded and nothing fails.

import { AsyncLocalStorage } from "node:async_hooks";

/** What drover uses of a span. */
export interface OtelSpan {
  spanContext(): { traceId: string; spanId: string; traceFlags: number };
  setAttribute(key: string, value: string | number | boolean): unknown;
  setStatus(status: { code: number; message?: string }): unknown;
  recordException(exception: { name?: string; message: string }): unknown;
  end(endTime?: number): void;
  isRecording(): boolean;
}

interface SpanContextLike {
  traceId: string;
  spanId: string;
  traceFlags: number;
  isRemote?: boolean;
}

/** What drover uses of `@opentelemetry/api`. */
interface OtelAPI {
  context: { active(): unknown; with<T>(ctx: unknown, fn: () => T): T };
  propagation: { inject(context: unknown, carrier: Record<string, string>): void };
  trace: {
    getTracer(name: string, version?: string): {
      startSpan(name: string, options: Record<string, unknown>, context?: unknown): OtelSpan;
    };
    setSpan(ctx: unknown, span: OtelSpan): unknown;
    getSpan(ctx: unknown): OtelSpan | undefined;
    setSpanContext(ctx: unknown, sc: SpanContextLike): unknown;
  };
  ROOT_CONTEXT: unknown;
}

/** The span kinds and status codes of the API (stable numbers). */
const KIND_CLIENT = 2;
const KIND_CONSUMER = 4;
const STATUS_ERROR = 2;

/** The instrumentation scope of the client's spans. */
export const SCOPE = "@droverhq/client";

// The API once looked up: undefined before, null when it is not installed.
let api: OtelAPI | null | undefined;
let loading: Promise<void> | undefined;

/** Loads `@opentelemetry/api` once, when it is installed. */
export function loadOtel(): Promise<void> {
  const name = "@opentelemetry/api"; // a variable: no static dependency on it
  loading ??= import(name).then(
    (m: OtelAPI & { default?: OtelAPI }) => {
      const a = m.propagation ? m : m.default;
      api = a && a.trace && a.context ? a : null;
    },
    () => {
      api = null;
    },
  );
  return loading;
}

/** Whether `@opentelemetry/api` was found (after {@link loadOtel}). @internal */
export function otelLoaded(): boolean {
  return !!api;
}

function tracer(a: OtelAPI) {
  return a.trace.getTracer(SCOPE);
}

/** The trace context of ctx as headers, as the global propagator writes them; none when it fails. */
function inject(a: OtelAPI, ctx: unknown): Record<string, string> {
  const carrier: Record<string, string> = {};
  try {
    a.propagation.inject(ctx, carrier);
  } catch {
    return {};
  }
  return carrier;
}

/**
 * The caller's current trace context as HTTP headers (`traceparent`, and
 * `tracestate` and `baggage` when set), as the global OpenTelemetry
 * propagator writes them, when `@opentelemetry/api` is installed; none
 * otherwise, or when the propagator fails: tracing never stops a request.
 */
export async function traceHeaders(): Promise<Record<string, string>> {
  if (api === undefined) await loadOtel();
  if (!api) return {};
  return inject(api, api.context.active());
}

/**
 * The traceparent of the caller's context: its active span's, or, in a
 * worker's handler outside any span, its task's; undefined when none.
 * @internal
 */
export async function callerTraceparent(): Promise<string | undefined> {
  return (await traceHeaders()).traceparent ?? taskTrace.getStore();
}

/** One HTTP request's client span, or nothing to do without the API. */
export interface RequestSpan {
  /** The headers that carry the span's context (the caller's when it does not record). */
  headers: Record<string, string>;
  /** Ends the span with the response's status, or the error that stopped it. */
  end(status?: number, err?: unknown): void;
}

/** Whether a span has a valid context (a no-op span outside any trace has not). */
function valid(span: OtelSpan): boolean {
  return !/^0*$/.test(span.spanContext().traceId);
}

const noRequestSpan: RequestSpan = { headers: {}, end() {} };

// The creation context (traceparent) of the task whose handler runs, for
// its requests made outside any span of the caller's: without
// OpenTelemetry, or without an SDK, they still join the task's trace.
const taskTrace = new AsyncLocalStorage<string>();

/** Runs fn with traceparent as the trace its requests carry when no span of the caller's is active. @internal */
export function withTaskTrace<T>(traceparent: string | undefined, fn: () => T): T {
  return parseTraceparent(traceparent) ? taskTrace.run(traceparent!.trim(), fn) : fn();
}

/** headers, with the running handler's task's traceparent when they carry none. */
function orTaskTrace(headers: Record<string, string>): Record<string, string> {
  const tp = taskTrace.getStore();
  return tp && !headers.traceparent ? { ...headers, traceparent: tp } : headers;
}

/** A request that makes no span: it carries headers, or the running task's trace. */
function untraced(headers: Record<string, string>): RequestSpan {
  const h = orTaskTrace(headers);
  return h === headers && !Object.keys(h).length ? noRequestSpan : { headers: h, end() {} };
}

/**
 * Starts the client span of one HTTP request (kind client, named after its
 * method, with the `http.*`, `url.full` and `server.*` attributes of the
 * HTTP conventions) under the caller's active span, and returns the
 * headers that carry it to the server; outside any span, none (the
 * headers carry what the caller's context holds, baggage say, and in a
 * worker's handler its task's traceparent, as without the API). resend
 * counts the sends before this one of the same request.
 */
export async function startRequestSpan(method: string, url: string, resend: number): Promise<RequestSpan> {
  if (api === undefined) await loadOtel();
  const a = api;
  if (!a) return untraced({});
  let span: OtelSpan;
  let ctx: unknown;
  try {
    const u = new URL(url);
    const attributes: Record<string, string | number> = {
      "http.request.method": method,
      "url.full": u.origin + u.pathname, // no query: it may name tokens
      "server.address": u.hostname,
      "server.port": Number(u.port || (u.protocol === "https:" ? 443 : 80)),
    };
    if (resend > 0) attributes["http.request.resend_count"] = resend;
    const parent = a.context.active();
    // Only under a span of the caller's: a worker's claims and outcomes,
    // made outside any, would otherwise each start a trace of their own.
    if (!a.trace.getSpan(parent)) return untraced(inject(a, parent));
    span = tracer(a).startSpan(method, { kind: KIND_CLIENT, attributes }, parent);
    // Without an SDK the span is a no-op one: the caller's context goes on.
    ctx = valid(span) ? a.trace.setSpan(parent, span) : parent;
  } catch {
    return untraced({});
  }
  return {
    headers: inject(a, ctx),
    end(status?: number, err?: unknown) {
      try {
        if (status !== undefined) span.setAttribute("http.response.status_code", status);
        if (status !== undefined && status >= 400) {
          span.setAttribute("error.type", String(status));
          span.setStatus({ code: STATUS_ERROR });
        } else if (err !== undefined) {
          const e = err as { name?: string; message?: string };
          span.setAttribute("error.type", e?.name ?? "Error");
          span.setStatus({ code: STATUS_ERROR, message: e?.message });
        }
        span.end();
      } catch {
        /* tracing never stops a request */
      }
    },
  };
}

const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(?:-|$)/;

/** The span context a W3C traceparent names, or undefined when it is not valid. */
export function parseTraceparent(tp: string | undefined): SpanContextLike | undefined {
  const m = tp ? TRACEPARENT.exec(tp.trim().toLowerCase()) : null;
  if (!m || m[1] === "ff" || /^0+$/.test(m[2]) || /^0+$/.test(m[3])) return undefined;
  return { traceId: m[2], spanId: m[3], traceFlags: parseInt(m[4], 16) & 1, isRemote: true };
}

/**
 * How an attempt ended, as `drover.attempt.end` names it (the Go worker's
 * words); an agent task's claim also ends `failed` (a step threw) or
 * `handed_back` (the run stopped without an error of its steps).
 */
export type AttemptEnd = "success" | "retry" | "dead" | "lost" | "deferred" | "sleep" | "wait" | "failed" | "handed_back";

/** The ends whose span is an error. */
const FAILED_ENDS: readonly AttemptEnd[] = ["retry", "dead", "lost", "failed"];

/** One claimed task's attempt span, or nothing to do without the API. */
export interface AttemptSpan {
  /** Runs fn with the attempt's span as the active context: the handler's spans and requests go under it. */
  run<T>(fn: () => T): T;
  /** Ends the span with how the attempt ended and, for a failure, its error (cut to 256 bytes). */
  end(end: AttemptEnd, error?: string): void;
}

const noAttemptSpan: AttemptSpan = { run: (fn) => fn(), end() {} };

/** What an attempt span names. */
export interface AttemptInfo {
  queue: string;
  namespace?: string;
  taskId: string;
  taskType?: string;
  tenant?: string;
  attempt: number;
  worker?: string;
  traceparent?: string;
  /** When the claim was answered (ms since the epoch). */
  claimed: number;
}

/** Cuts an error text to 256 bytes, as the Go worker does. */
export function cutError(s: string): string {
  const b = Buffer.from(s);
  if (b.length <= 256) return s;
  return b.subarray(0, 253).toString().replace(/\uFFFD$/, "") + "...";
}

/**
 * Starts the span of one attempt of a claimed task: `process <queue>`, of
 * kind consumer, from the claim. As drover's Go worker does, it is a child
 * of the task's creation context (its stored traceparent) and links to it,
 * so that the submission and every attempt are one trace; without a valid
 * traceparent it starts a trace of its own (under the caller's context).
 * Its attributes follow the messaging conventions.
 */
export function startAttemptSpan(info: AttemptInfo): AttemptSpan {
  const attributes: Record<string, string | number | boolean> = { "drover.attempt.number": info.attempt };
  if (info.taskType) attributes["drover.task.type"] = info.taskType;
  if (info.tenant) attributes["drover.tenant"] = info.tenant;
  return startProcessSpan(info.queue, info, attributes);
}

/** The destination an agent task's attempt spans name: agent tasks are claimed by id, from no queue. */
export const AGENT_TASKS = "agent-tasks";

/** What the attempt span of an agent task's claim names. */
export interface AgentAttemptInfo {
  namespace?: string;
  taskId: string;
  /** The holder of the claim (its session's name). */
  worker?: string;
  /** The task's stored creation context, which the claim answered. */
  traceparent?: string;
  /** The last step checkpointed before the claim: its steps run after it. */
  resumedAfter: number;
  /** When the claim was answered (ms since the epoch). */
  claimed: number;
}

/**
 * Starts the span of one claim of an agent task (`runSteps`): `process
 * agent-tasks`, of kind consumer, from the claim to the write that
 * completed or parked the task (or the error that stopped the run), with
 * `drover.task.kind=agent`; a child of the task's stored traceparent and
 * linked to it, as a queue task's attempt span is.
 */
export function startAgentAttemptSpan(info: AgentAttemptInfo): AttemptSpan {
  return startProcessSpan(AGENT_TASKS, info, { "drover.task.kind": "agent", "drover.step.resumed_after": info.resumedAfter });
}

/** Starts a `process <destination>` span of kind consumer, child of and linked to info's traceparent. */
function startProcessSpan(
  destination: string,
  info: { namespace?: string; taskId: string; worker?: string; traceparent?: string; claimed: number },
  extra: Record<string, string | number | boolean>,
): AttemptSpan {
  const a = api;
  if (!a) return noAttemptSpan;
  let span: OtelSpan;
  let ctx: unknown;
  try {
    const sc = parseTraceparent(info.traceparent);
    const parent = sc ? a.trace.setSpanContext(a.ROOT_CONTEXT, sc) : a.context.active();
    const attributes: Record<string, string | number | boolean> = {
      "messaging.system": "drover",
      "messaging.destination.name": destination,
      "messaging.operation.type": "process",
      "messaging.operation.name": "process",
      "messaging.message.id": info.taskId,
      "messaging.consumer.group.name": destination,
      ...extra,
    };
    if (info.namespace) attributes["drover.namespace"] = info.namespace;
    if (info.worker) attributes["messaging.client.id"] = info.worker;
    const links = sc ? [{ context: sc }] : [];
    span = tracer(a).startSpan(`process ${destination}`, { kind: KIND_CONSUMER, attributes, links, startTime: info.claimed }, parent);
    ctx = a.trace.setSpan(parent, span);
  } catch {
    return noAttemptSpan;
  }
  let ended = false;
  return {
    run: (fn) => a.context.with(ctx, fn),
    end(end, error) {
      if (ended) return;
      ended = true;
      try {
        span.setAttribute("drover.attempt.end", end);
        if (error !== undefined && end !== "success") {
          const text = cutError(error);
          span.recordException({ name: "Error", message: text });
          if (FAILED_ENDS.includes(end)) span.setStatus({ code: STATUS_ERROR, message: text });
        }
        span.end();
      } catch {
        /* tracing never stops a task */
      }
    },
  };
}

/** Loads the API (once) so that {@link startAttemptSpan} can use it. */
export async function attemptSpans(): Promise<void> {
  if (api === undefined) await loadOtel();
}
