// Task streams: events a running task emits (tokens, progress, log lines),
// fenced by its claim, and followers over Server-Sent Events that resume
// with Last-Event-ID.
import { ConnectionError, DroverError, FencedError, StreamFullError } from "./errors.js";
import { seg, sleep, type Transport } from "./http.js";
import { parseSSE } from "./registry.js";
import type { Session } from "./session.js";

/** One event of a task's stream. */
export interface StreamEvent<D = unknown> {
  /** Its place in the stream: 1, 2, 3, ... with no gap (the SSE id). */
  seq: number;
  /** The task's attempt that wrote it. */
  attempt: number;
  /** The writer's own type (`token`, `progress`, `log`...) or drover's: `attempt_started`, `attempt_lost`, `attempt_ended`, `done`. */
  type: string;
  /** Any JSON value (null when the event has none). */
  data: D;
  /** When it was emitted (RFC 3339). */
  time: string;
}

/** The types drover writes itself: a writer cannot emit them. */
export const DROVER_EVENT_TYPES: readonly string[] = ["attempt_started", "attempt_lost", "attempt_ended", "done"];

/** The most events one append request carries (the server's limit). */
const MAX_EVENTS = 1000;
/** The most JSON bytes one append request carries: under the server's 768 KiB a write. */
const MAX_BYTES = 700 << 10;
/** Events that may wait in a writer before `emit` waits for the writes before. */
const MAX_WAITING = 1000;
/** The most bytes of one event's type and data (the server's limit). */
const MAX_EVENT_BYTES = 64 << 10;

/** The answer to a page read: the events stored from `from`, for clients that poll. */
export interface StreamPage {
  events: StreamEvent[];
  /** The seq to ask for next. */
  next: number;
  /** The stream ended: its last event is `done`. */
  done: boolean;
}

export interface FollowOptions {
  /** Start at this seq (default 1: the first event). */
  from?: number;
  /** Resume after this event's seq, as a browser's EventSource does (wins over `from` when later). */
  lastEventId?: number | string;
  /** Ends the iteration. */
  signal?: AbortSignal;
  /** The longest pause between reconnections, in ms (default 5000; at least 100). */
  maxBackoffMs?: number;
  /** A connection that brings nothing (not even the server's keep-alive comments) this long, in ms, is reopened (default 45000). */
  idleTimeoutMs?: number;
  /** Called when the stream broke (or the server closed it) and is reopened after `lastEventId`. */
  onReconnect?: (err: unknown, lastEventId: number) => void;
  /** Called with the server's last word when the follow ends at the stream's end (`done`, or `ended` once the task ended without one). */
  onEnd?: (end: StreamEnd) => void;
}

/** The shortest pause before a reconnection, in ms. */
const MIN_BACKOFF_MS = 100;

/** How a follow ended: the server's last SSE event. */
export interface StreamEnd {
  reason: "done" | "ended" | "closing" | "error";
  detail?: string;
}

/**
 * Writes events to a claimed task's stream, fenced by the claim (its
 * session and token). {@link emit} queues an event and returns at once
 * (it waits only while 1,000 events wait already); one write is in flight
 * at a time, and it carries every event queued meanwhile (up to 1,000), so
 * a producer of tokens is never held to one request per token.
 * {@link flush} waits until they are stored. Once a write is refused
 * because the claim no longer holds ({@link FencedError}) or the stream is
 * full ({@link StreamFullError}), every later `emit` and `flush` throws
 * that error. Any other failed write (the server away) is thrown once, by
 * the next `emit` or `flush`; its events may or may not be stored.
 */
export class StreamWriter {
  /** Events serialised by emit, with their UTF-8 bytes. */
  private queue: { json: string; bytes: number }[] = [];
  private writing: Promise<void> | undefined;
  private sticky: Error | undefined;
  private once: Error | undefined;
  private readonly session: string;
  /** The seq of the last event stored by this writer (0: none yet). */
  last = 0;
  /** How many events were queued by emit. */
  emitted = 0;

  /** @internal use {@link Streams.writer}, or a worker's `ctx.stream` */
  constructor(private readonly t: Transport, readonly taskId: string, session: Session | string, readonly claimToken: number) {
    this.session = typeof session === "string" ? session : session.id;
  }

  /**
   * Queues an event: `data` is any JSON value, serialised now (a later
   * change to it is not sent). Throws the error of a write before it (see
   * the class); a TypeError for a type that is empty, longer than 64
   * characters or one of drover's own, or data that is not JSON; and
   * {@link StreamFullError} for an event whose type and data are over 64
   * KiB (that event only: the writer goes on).
   */
  async emit(type: string, data?: unknown): Promise<void> {
    this.raise();
    if (typeof type !== "string" || type === "" || type.length > 64) throw new TypeError(`drover: an event's type must be 1 to 64 characters, not ${JSON.stringify(type)}`);
    if (DROVER_EVENT_TYPES.includes(type)) throw new TypeError(`drover: ${type} is drover's own event type: a writer cannot emit it`);
    let d: string | undefined;
    if (data !== undefined) {
      try {
        d = JSON.stringify(data);
      } catch (err) {
        throw new TypeError(`drover: the data of a ${type} event is not JSON (${(err as Error)?.message})`);
      }
      if (d === undefined) throw new TypeError(`drover: the data of a ${type} event is not JSON`);
    }
    const size = utf8Length(type) + (d === undefined ? 0 : utf8Length(d));
    if (size > MAX_EVENT_BYTES) throw new StreamFullError(`drover: a ${type} event is ${size} bytes (type and data), over the ${MAX_EVENT_BYTES}-byte limit of one event`);
    const json = d === undefined ? `{"type":${JSON.stringify(type)}}` : `{"type":${JSON.stringify(type)},"data":${d}}`;
    while (this.queue.length >= MAX_WAITING && this.writing) {
      await this.writing;
      this.raise();
    }
    this.queue.push({ json, bytes: utf8Length(json) });
    this.emitted++;
    if (!this.writing) this.writing = this.drain();
  }

  /** Queues a `token` event (`{"text": text}`): a model's output as it is written. */
  token(text: string): Promise<void> {
    return this.emit("token", { text });
  }

  /** Waits until every event queued is stored; throws the error of a write, if any. */
  async flush(): Promise<void> {
    while (this.writing || (this.queue.length && !this.sticky)) {
      if (!this.writing) this.writing = this.drain();
      await this.writing;
    }
    this.raise();
  }

  /** The error every later call throws: fenced or full (undefined while none). */
  get error(): Error | undefined {
    return this.sticky;
  }

  private raise(): void {
    if (this.sticky) throw this.sticky;
    const e = this.once;
    this.once = undefined;
    if (e) throw e;
  }

  /** Sends the queue, one write at a time; clears `writing` in the same turn it ends. */
  private async drain(): Promise<void> {
    try {
      // Never ends in the turn it starts: `writing` is set by then.
      await Promise.resolve();
      while (this.queue.length && !this.sticky) {
        let n = 0;
        let bytes = 0;
        while (n < this.queue.length && n < MAX_EVENTS) {
          const b = this.queue[n].bytes + 1;
          if (n > 0 && bytes + b > MAX_BYTES) break;
          bytes += b;
          n++;
        }
        const events = this.queue.splice(0, n);
        await this.write(events.map((e) => e.json));
      }
    } finally {
      if (this.sticky) this.queue = [];
      this.writing = undefined;
    }
  }

  private async write(events: string[]): Promise<void> {
    try {
      const body = `{"session":${JSON.stringify(this.session)},"token":${this.claimToken},"events":[${events.join(",")}]}`;
      const r = (await this.t.request<{ first: number; last: number }>("POST", `/v1/tasks/${seg(this.taskId)}/stream/events`,
        { rawBody: body, contentType: "application/json", retry: false })).data;
      this.last = r.last;
    } catch (err) {
      if (err instanceof FencedError || err instanceof StreamFullError) this.sticky = err;
      else if (err instanceof DroverError) this.once = err;
      else this.sticky = new DroverError(`drover: the stream writer of task ${this.taskId} failed: ${(err as Error)?.message ?? String(err)}`, { cause: err });
    }
  }
}

const encoder = new TextEncoder();

/** The bytes of a string in UTF-8 (what the server counts). */
function utf8Length(s: string): number {
  // ASCII (most events) is one byte a code unit: no encoding needed.
  // eslint-disable-next-line no-control-regex
  return /^[\x00-\x7f]*$/.test(s) ? s.length : encoder.encode(s).length;
}

/** Task streams: write to a claimed task's, read and follow any. */
export class Streams {
  constructor(private readonly t: Transport) {}

  /** A writer of the task's stream under its claim (the session and token its claim returned). */
  writer(taskId: string, opts: { session: Session | string; token: number }): StreamWriter {
    return new StreamWriter(this.t, taskId, opts.session, opts.token);
  }

  /**
   * Appends events at once, in one request, fenced by the claim: the seq of
   * the first and the last. {@link FencedError} when the claim no longer
   * holds, {@link StreamFullError} past a cap; nothing is stored then.
   */
  append(taskId: string, opts: { session: Session | string; token: number; events: { type: string; data?: unknown }[] }): Promise<{ first: number; last: number }> {
    return this.t.post(`/v1/tasks/${seg(taskId)}/stream/events`,
      { session: typeof opts.session === "string" ? opts.session : opts.session.id, token: opts.token, events: opts.events }, { retry: false });
  }

  /** The events stored from seq `from` on (at most 1,000), for clients that poll. */
  read(taskId: string, opts: { from?: number; signal?: AbortSignal } = {}): Promise<StreamPage> {
    return this.t.get<StreamPage>(`/v1/tasks/${seg(taskId)}/stream`, { query: { from: opts.from }, signal: opts.signal });
  }

  /**
   * Follows a task's stream over Server-Sent Events: every event stored
   * from `from` (default the first), then each as it is written, in order,
   * each once, drover's own (`attempt_started`, `attempt_lost`,
   * `attempt_ended`, `done`) included. A follower may start before the task
   * runs, while it runs or after it ended (within the stream's retention)
   * and sees the same sequence. When the connection breaks or the server
   * closes it, it reconnects with `Last-Event-ID`: nothing is missed,
   * nothing comes twice. It ends after the stream's last `done` (or once
   * the task ended without one), when `signal` fires, or when the loop
   * breaks. {@link NotFoundError} when the task is unknown and has no stream.
   */
  async *follow(taskId: string, opts: FollowOptions = {}): AsyncGenerator<StreamEvent, StreamEnd | undefined> {
    let last = opts.lastEventId === undefined ? 0 : Number(opts.lastEventId);
    if (!Number.isInteger(last) || last < 0) throw new TypeError(`drover: lastEventId must be an event's seq, not ${opts.lastEventId}`);
    last = Math.max(last, (opts.from ?? 1) - 1);
    const idleMs = opts.idleTimeoutMs ?? 45_000;
    const maxBackoff = Math.max(MIN_BACKOFF_MS, opts.maxBackoffMs ?? 5000);
    const stop = new AbortController();
    const signal = opts.signal ? AbortSignal.any([opts.signal, stop.signal]) : stop.signal;
    let backoff = MIN_BACKOFF_MS;
    const pause = async (err: unknown) => {
      opts.onReconnect?.(err, last);
      await sleep(backoff, signal).catch(() => {});
      backoff = Math.max(MIN_BACKOFF_MS, Math.min(maxBackoff, backoff * 2));
    };
    try {
      while (!signal.aborted) {
        // One connection: aborted when it stays silent for idleMs.
        const conn = new AbortController();
        const idle = new ConnectionError(`the stream of task ${taskId} was silent for ${idleMs} ms`);
        let timer: ReturnType<typeof setTimeout> | undefined;
        const alive = () => {
          if (timer !== undefined) clearTimeout(timer);
          if (idleMs > 0) timer = setTimeout(() => conn.abort(idle), idleMs);
        };
        const connSignal = AbortSignal.any([signal, conn.signal]);
        alive();
        try {
          let res: Response;
          try {
            res = (await this.t.request<Response>("GET", `/v1/tasks/${seg(taskId)}/stream`, {
              headers: { Accept: "text/event-stream", ...(last > 0 ? { "Last-Event-ID": String(last) } : {}) },
              signal: connSignal, stream: true, retry: false, timeoutMs: 0,
            })).data;
          } catch (err) {
            if (signal.aborted) return undefined;
            if (conn.signal.aborted) err = idle;
            if (!(err instanceof ConnectionError) && !(err instanceof DroverError && err.status >= 500)) throw err;
            await pause(err);
            continue;
          }
          let broke: unknown = new ConnectionError(`the stream of task ${taskId} broke off`);
          try {
            for await (const ev of parseSSE(res.body!, connSignal, alive)) {
              if (!ev.data) continue;
              if (ev.event === "end") {
                const end = JSON.parse(ev.data) as StreamEnd;
                if (end.reason === "done" || end.reason === "ended") {
                  opts.onEnd?.(end);
                  return end;
                }
                broke = new ConnectionError(`the server ended the stream of task ${taskId}: ${end.reason} (${end.detail ?? ""})`);
                break;
              }
              const e = JSON.parse(ev.data) as StreamEvent;
              if (e.seq <= last) continue;
              backoff = MIN_BACKOFF_MS;
              last = e.seq;
              // A slow consumer is not a silent server.
              if (timer !== undefined) clearTimeout(timer);
              yield e;
              alive();
            }
          } catch (err) {
            if (signal.aborted) return undefined;
            broke = err;
          }
          if (signal.aborted) return undefined;
          if (conn.signal.aborted) broke = idle;
          await pause(broke);
        } finally {
          if (timer !== undefined) clearTimeout(timer);
          conn.abort();
        }
      }
      return undefined;
    } finally {
      stop.abort();
    }
  }
}
