/**
 * The stops of running runs, pushed by the server: one stream per runtime
 * (`GET /v1/agent-server/runs/stops`, Server-Sent Events) instead of a
 * read of each running run's task every while.
 *
 * Every stop of a run (a cancel, a new run's interrupt or rollback)
 * cancels its task; the server sends a `stop` event for every task of the
 * namespace's `langgraph` queue cancelled while claimed, and
 * {@link RunStops} keeps those of the tasks watched. Nothing is missed:
 * stops that come before their task is watched are remembered (the last
 * 4096); a stream opened afresh starts with the stops of the last minute;
 * a stream that breaks is reopened with the revision it had reached
 * (`Last-Event-ID`), so the stops meanwhile come then, from whichever
 * server answers. When the server cannot resume (etcd compacted that
 * revision away) the tasks watched are read once. A server without the
 * route (404, an older drover) gets the old per-run reads instead, and the
 * stream is asked for again every while (`routeRetryMs`): once a member
 * that serves it answers (a rolling upgrade), the stream takes over and the
 * tasks watched are read once.
 */
import { ConnectionError, DroverError, GoneError, NotFoundError } from "./errors.js";
import { sleep } from "./http.js";
import type { Drover } from "./index.js";
import { parseSSE } from "./registry.js";

/** The queue that carries runs (the server's `agentserver.RunsQueue`). */
const RUNS_QUEUE = "langgraph";

/** The route of the stops stream. */
export const RUN_STOPS_PATH = "/v1/agent-server/runs/stops";

/** One stopped run, as the stream sends it (revision 0: seen by a read of its task). */
export interface RunStop {
  task_id: string;
  run_id: string;
  revision: number;
}

export interface RunStopsOptions {
  drover: Drover;
  /**
   * Whether a task is cancelled, read when the stream cannot tell what
   * happened while it was not there (a task watched before the stream was
   * first live, or across a compaction). Default: the task's status, read
   * (`GET /v1/queues/langgraph/tasks/{id}`).
   */
  check?: (taskId: string) => Promise<boolean>;
  /**
   * The per-task watch used when the server has no stops stream (it
   * answered 404): starts one and returns its stop. Default: `check`
   * every `fallbackPollMs`, stretched so that all the tasks watched read
   * at most 40 a second, each at least every 2 s.
   */
  fallback?: (taskId: string, onStop: (stop: RunStop) => void) => () => void;
  /** The fallback's interval with few tasks (default 250 ms). */
  fallbackPollMs?: number;
  /** After a 404, how long until the stream is asked for again (default 60000 ms, at least 1000; each wait 75 to 125 % of it, so that runtimes spread out). */
  routeRetryMs?: number;
  /** Seconds between the server's keepalives (default 5); a stream silent for three of them is reopened. */
  keepaliveS?: number;
  /** The longest wait before reopening a broken stream (default 5000 ms; it starts at 100 ms and doubles). */
  maxBackoffMs?: number;
  /** Stops of tasks not watched (yet) remembered (default 4096). */
  remember?: number;
  /** Called with errors the stream recovers from. */
  onError?: (err: unknown) => void;
}

/** What a {@link RunStops} did: counts since it was made. */
export interface RunStopsStats {
  /** Streams opened (the first and every reopening). */
  opened: number;
  /** Stop events received (of any task). */
  stops: number;
  /** Tasks read by `check` (after a compaction, or watched before the stream was live). */
  checks: number;
  /** Tasks watched by the fallback (the server had no stream). */
  fallbacks: number;
}

/** The most reads a second of running runs' tasks, to see a cancel, for all the runs of a runtime (the fallback). */
const CANCEL_READS_PER_S = 40;

/** The longest a run goes without a read of its task, however many runs are under way: a cancel's bound. */
const CANCEL_POLL_MAX_MS = 2_000;

/**
 * How long a run waits between reads of its task, with `running` runs under way: `pollMs`, or
 * longer so that they read at most CANCEL_READS_PER_S tasks a second, but never more than
 * CANCEL_POLL_MAX_MS (nor less than pollMs): past that many runs, a cancel is seen late no more.
 * @internal
 */
export function cancelPollEvery(pollMs: number, running: number): number {
  return Math.max(pollMs, Math.min(CANCEL_POLL_MAX_MS, (1000 * running) / CANCEL_READS_PER_S));
}


interface Watched {
  onStop: (stop: RunStop) => void;
  /** Watched while no revision was reached: a fresh stream's ready reads it. */
  unsure: boolean;
  stopFallback?: () => void;
}

/** One stops stream per runtime; see the module's description. */
export class RunStops {
  private readonly opts: RunStopsOptions;
  private readonly ac = new AbortController();
  private readonly watched = new Map<string, Watched>();
  private readonly recent = new Map<string, RunStop>();
  /** The revision reached: the stream reopens after it. */
  private last: string | undefined;
  private live = false;
  private mode: "stream" | "fallback" | "closed" = "stream";
  private readonly loop: Promise<void>;
  private readyWaiters: (() => void)[] = [];
  readonly stats: RunStopsStats = { opened: 0, stops: 0, checks: 0, fallbacks: 0 };

  /** Opens the stream at once: a runtime makes one before it claims runs. */
  constructor(opts: RunStopsOptions) {
    this.opts = opts;
    this.loop = this.run();
  }

  /** "live": the stream is open and every stop after its revision comes; "fallback": the server had none when last asked; "connecting"; "closed". */
  get state(): "live" | "connecting" | "fallback" | "closed" {
    return this.mode === "stream" ? (this.live ? "live" : "connecting") : this.mode;
  }

  /** Resolves once the stream is live, or the fallback is in use, or it is closed. */
  ready(): Promise<void> {
    if (this.state !== "connecting") return Promise.resolve();
    return new Promise((r) => this.readyWaiters.push(r));
  }

  /**
   * Calls onStop once when task taskId is stopped (cancelled), at once if
   * it was already; until {@link unwatch}. Call it once the task is
   * claimed, before its work starts.
   */
  watch(taskId: string, onStop: (stop: RunStop) => void): void {
    if (this.mode === "closed") return;
    this.unwatch(taskId);
    const seen = this.recent.get(taskId);
    if (seen) {
      queueMicrotask(() => onStop(seen));
      return;
    }
    const w: Watched = { onStop, unsure: this.last === undefined };
    this.watched.set(taskId, w);
    if (this.mode === "fallback") this.startFallback(taskId, w);
  }

  /** Stops watching taskId (its run ended). */
  unwatch(taskId: string): void {
    const w = this.watched.get(taskId);
    if (!w) return;
    this.watched.delete(taskId);
    w.stopFallback?.();
  }

  /** Closes the stream and every fallback; resolves once the stream's loop ended. */
  async close(): Promise<void> {
    if (this.mode !== "closed") {
      this.mode = "closed";
      this.ac.abort(new Error("run stops closed"));
      for (const id of [...this.watched.keys()]) this.unwatch(id);
      this.wake();
    }
    await this.loop;
  }

  private wake(): void {
    const ws = this.readyWaiters;
    this.readyWaiters = [];
    for (const r of ws) r();
  }

  private stopped(stop: RunStop): void {
    const w = this.watched.get(stop.task_id);
    if (w) {
      this.unwatch(stop.task_id);
      // A callback that throws is the caller's error, not the stream's: it must not break the
      // stream's loop (a reconnect) nor the other tasks' stops.
      try {
        w.onStop(stop);
      } catch (e) {
        this.opts.onError?.(e);
      }
      return;
    }
    this.recent.delete(stop.task_id);
    this.recent.set(stop.task_id, stop);
    const max = this.opts.remember ?? 4096;
    for (const k of this.recent.keys()) {
      if (this.recent.size <= max) break;
      this.recent.delete(k);
    }
  }

  private async check(taskId: string): Promise<boolean> {
    this.stats.checks++;
    if (this.opts.check) return this.opts.check(taskId);
    return (await this.opts.drover.tasks.get(RUNS_QUEUE, taskId)).current_status === "CANCELLED";
  }

  /** Reads the tasks watched while the stream could not say what happened to them. */
  private checkUnsure(): void {
    for (const [id, w] of this.watched) {
      if (!w.unsure) continue;
      w.unsure = false;
      this.check(id).then(
        (c) => c && this.watched.get(id) === w && this.stopped({ task_id: id, run_id: id, revision: 0 }),
        (e) => this.opts.onError?.(e),
      );
    }
  }

  private startFallback(taskId: string, w: Watched): void {
    this.stats.fallbacks++;
    const fire = (stop: RunStop) => this.watched.get(taskId) === w && this.stopped(stop);
    w.stopFallback = (this.opts.fallback ?? ((id, f) => this.poll(id, f)))(taskId, fire);
  }

  /** The default fallback: the task read every while until it is cancelled or its stop is called. */
  private poll(taskId: string, onStop: (stop: RunStop) => void): () => void {
    let timer: ReturnType<typeof setTimeout> | undefined;
    let on = true;
    const every = () => cancelPollEvery(this.opts.fallbackPollMs ?? 250, this.watched.size);
    const tick = () => {
      this.check(taskId)
        .then(
          (c) => c && on && onStop({ task_id: taskId, run_id: taskId, revision: 0 }),
          (e) => this.opts.onError?.(e),
        )
        .finally(() => {
          if (on) timer = setTimeout(tick, every());
        });
    };
    timer = setTimeout(tick, every());
    return () => {
      on = false;
      clearTimeout(timer);
    };
  }

  /** Opens the stream, and again whenever it breaks, until close; after a 404, every routeRetryMs. */
  private async run(): Promise<void> {
    let backoff = 100;
    const signal = this.ac.signal;
    while (this.mode !== "closed") {
      try {
        await this.follow();
        backoff = 100; // it was live: the next opening is at once, after a short wait
      } catch (err) {
        if (signal.aborted) return;
        if (err instanceof NotFoundError) {
          if (this.mode === "stream") {
            this.mode = "fallback";
            this.live = false;
            for (const [id, w] of this.watched) this.startFallback(id, w);
            this.wake();
          }
          const retry = Math.max(1_000, this.opts.routeRetryMs ?? 60_000);
          await sleep(retry * (0.75 + Math.random() / 2), signal).catch(() => {});
          continue;
        }
        if (err instanceof GoneError || (err instanceof DroverError && err.status === 400 && this.last !== undefined)) {
          this.reset(); // the revision is gone (or unknown to this store): a fresh stream, and the tasks read
          continue;
        }
        if (!(err instanceof ConnectionError)) this.opts.onError?.(err);
      }
      this.live = false;
      await sleep(backoff * (0.5 + Math.random() / 2), signal).catch(() => {});
      backoff = Math.min(this.opts.maxBackoffMs ?? 5000, backoff * 2);
    }
  }

  /** The stream is live after the fallback: it takes the tasks watched over, each read once (what happened before it is unknown). */
  private leaveFallback(): void {
    this.mode = "stream";
    for (const w of this.watched.values()) {
      w.stopFallback?.();
      w.stopFallback = undefined;
      w.unsure = true;
    }
    this.checkUnsure();
  }

  /** Forgets the revision reached: the next stream starts afresh, and reads the tasks watched. */
  private reset(): void {
    this.last = undefined;
    this.live = false;
    for (const w of this.watched.values()) w.unsure = true;
  }

  /** One stream, until it breaks (throws) or ends (returns). */
  private async follow(): Promise<void> {
    const keepalive = this.opts.keepaliveS ?? 5;
    const conn = new AbortController();
    const signal = AbortSignal.any([this.ac.signal, conn.signal]);
    let silent: ReturnType<typeof setTimeout> | undefined;
    const alive = () => {
      clearTimeout(silent);
      silent = setTimeout(() => conn.abort(new ConnectionError("the stops stream went silent")), 3 * keepalive * 1000 + 1000);
      (silent as { unref?: () => void }).unref?.();
    };
    this.stats.opened++;
    try {
      alive();
      const res = await this.opts.drover.transport.request<Response>("GET", RUN_STOPS_PATH, {
        headers: { Accept: "text/event-stream", ...(this.last ? { "Last-Event-ID": this.last } : {}) },
        query: { keepalive },
        signal,
        stream: true,
        retry: false,
        timeoutMs: 0,
      });
      for await (const ev of parseSSE(res.data.body!, signal, alive)) {
        if (!ev.event || !ev.data) continue;
        const data = JSON.parse(ev.data);
        if (ev.event === "stop") {
          this.stats.stops++;
          this.stopped({ task_id: data.task_id, run_id: data.run_id ?? data.task_id, revision: data.revision ?? 0 });
        } else if (ev.event === "ready") {
          this.live = true;
          if (this.mode === "fallback") this.leaveFallback();
          else if (!data.resumed) this.checkUnsure();
          this.wake();
        } else if (ev.event === "end" && data.reason === "compacted") {
          this.reset();
          return;
        }
        if (ev.id) this.last = ev.id;
      }
      if (conn.signal.aborted) throw conn.signal.reason;
    } catch (err) {
      if (conn.signal.aborted && !this.ac.signal.aborted) throw conn.signal.reason;
      throw err;
    } finally {
      clearTimeout(silent);
      this.live = false;
    }
  }
}
