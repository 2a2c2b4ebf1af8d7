// Queue workers: claims with long polls, tasks claimed ahead while they are
// short, outcomes sent fenced by their claims' tokens, in batches.
import { ConnectionError, DroverError, InvalidInputError, Permanent, isPermanent } from "./errors.js";
import { durMs, sleep, type Transport } from "./http.js";
import { Queues, type Outcome, type OutcomeResult, type QueueTask, type ReceivedSignalRef } from "./queue.js";
import { Sleep } from "./agent.js";
import { Budgets, TaskBudgetHold, taskBudget, type ProviderHeaders } from "./budgets.js";
import { WaitSignal, receivedOf, type ReceivedSignal } from "./signals.js";
import { Session } from "./session.js";
import { StreamWriter } from "./streams.js";
import { attemptSpans, startAttemptSpan, withTaskTrace, type AttemptEnd, type AttemptSpan } from "./tracing.js";
/** What a task handler gets besides the task. */
export interface TaskContext {
  /** Fires when the claim's session is lost (the task runs again elsewhere) or the worker stops hard. */
  signal: AbortSignal;
  /** The claim's fencing token: pass it to your own systems with every write. */
  token: number;
  /** The attempt number, from 1. */
  attempt: number;
  /** The session the task is claimed under. */
  session: Session;
  /**
   * The task's stream, written under this claim: `await stream.token(text)`,
   * `await stream.emit("progress", {...})`. Events are sent in the
   * background, many per request; the worker flushes them before it sends
   * the task's outcome. Once the claim is lost, `emit` throws
   * {@link FencedError}: stop.
   */
  stream: StreamWriter;
  /**
   * The signal (or the timeout, `timedOut`) that ended the wait for a
   * signal the handler returned ({@link waitSignal}): the handler runs
   * again with it, under the same claim. Undefined on a first run.
   */
  received?: ReceivedSignal;
  /**
   * Reports the LLM tokens the task used, with the provider's response
   * headers if any, for a task whose metadata names a `budget`: the worker
   * reserved its `estimated_tokens` before the handler ran and settles
   * with this after it returns (else the `usage` of the result it
   * returned, else the estimate). The last report wins. Does nothing for
   * a task without a budget.
   */
  usage(tokens: number, headers?: ProviderHeaders): void;
}

/**
 * A task handler: what it returns is the task's result, what it throws a
 * failure. Returning {@link sleepFor} or {@link sleepUntil} instead parks
 * the task: SLEEPING with no claim, claimed again (by any worker, its
 * handler run again from the start, its attempt not counted) once the
 * sleep ends. Returning {@link waitSignal} waits for a signal
 * (`POST /v1/tasks/{id}/signals/{name}`): one sent already is answered at
 * once and the handler runs again with it in `ctx.received`, under the
 * same claim; otherwise the task parks WAITING with no claim, and once a
 * signal (or the timeout) wakes it, the worker that claims it runs the
 * handler with it. The wait costs no attempt. A signal is consumed by the
 * claim's success or park: a worker that dies first leaves it to the next
 * claim, whose handler gets it again. Any other outcome (a retry, a
 * sleep, a dead letter) consumes nothing, and the next claim resumes
 * where this one did: at the wait it was claimed after, or from the start.
 */
export type TaskHandler = (task: QueueTask, ctx: TaskContext) => unknown | Promise<unknown>;

export interface WorkerOptions {
  /** Tasks run at once (default 1). */
  concurrency?: number;
  /**
   * The most tasks one claim takes, and the most the worker holds ahead of
   * its free running slots (default 100, the server's largest claim; 1 to
   * 100). While the worker's tasks take less than 5 ms on average and none
   * running has run longer, it claims ahead of its free slots as many tasks
   * as its slots finish in about 50 ms at the measured average (at most
   * `prefetch`), so that the next claim's round trip overlaps the work:
   * they wait in the worker, in claim order, and start as slots come free.
   * Otherwise it claims only for free slots, so that it does not sit on
   * tasks other workers could run. `prefetch: concurrency` is the Go
   * worker's default.
   */
  prefetch?: number;
  /** Claim under this session (not closed by the worker). Default: the worker's own, renewed if lost. */
  session?: Session;
  /** TTL in seconds of the worker's own session (default 15). */
  ttl?: number;
  /** The worker's name, shown as the holder of its claims. */
  name?: string;
  /** How long one claim waits for tasks (default "20s", at most the server's 60 s). */
  wait?: number | string;
  /** Drain on these signals (default SIGTERM and SIGINT); false or [] to handle none. */
  signals?: NodeJS.Signals[] | false;
  /** Called with errors the worker recovers from (claim failures, outcome failures). */
  onError?: (err: unknown) => void;
  /**
   * Seconds a task's budget reservation lives unsettled (1 to 3600):
   * released then if the worker died. Default: the task's timeout plus
   * 30 s, at least 60 and at most 3600; 300 for a task without a timeout.
   */
  budgetTtl?: number;
}

export interface WorkerStats {
  /** Tasks claimed. */
  claimed: number;
  /** Outcomes accepted as a success. */
  succeeded: number;
  /** Failures accepted (retried, or dead when out of retries). */
  failed: number;
  /** Failures sent as permanent (to the dead-letter queue). */
  permanent: number;
  /** Tasks parked by a handler that returned a sleep, accepted. */
  slept: number;
  /** Tasks parked by a handler that returned a wait for a signal, accepted. */
  waited: number;
  /** Tasks handed back unrun to wait for their budget (no attempt counted), accepted. */
  deferred: number;
  /**
   * Outcomes dropped because the claim was lost (409/404, or the session
   * ended), and tasks claimed ahead that were not started because their
   * claim's session was lost.
   */
  lost: number;
  /** Tasks running now. */
  running: number;
  /** Tasks claimed ahead of a free running slot (they waited for one), so far. */
  ahead: number;
  /** Tasks claimed ahead that wait for a running slot now. */
  waiting: number;
  /** Claim requests sent. */
  claimRequests: number;
  /** Outcome requests sent (each carries up to 256 outcomes). */
  outcomeRequests: number;
  /** Outcome requests that carried the worker's next claim too (counted in outcomeRequests, not in claimRequests). */
  claimsWithOutcomes: number;
}

/** The most waits for a signal one claim's handler runs answer at once. */
const MAX_WAIT_RUNS = 1000;

/** The most signals one outcome names received (the server's bound). */
const MAX_RECEIVED = 64;

/** The largest result a task keeps (256 KiB of JSON). */
const MAX_RESULT = 256 << 10;
/** The most tasks one claim takes (the server's limit). */
const MAX_CLAIM = 100;
/** The most outcomes one request carries (the server's limit). */
const MAX_OUTCOMES = 256;
/**
 * Tasks are claimed ahead of a free running slot while the worker's tasks
 * take less than this on average (ms) and none running has run longer: a
 * claim's round trip is then most of a task's time. Longer tasks are not,
 * so that a worker does not sit on tasks that others could run.
 */
const AHEAD_BELOW_MS = 5;
/**
 * The work (ms, at the measured average task time) the tasks claimed ahead
 * may hold: the longest a task waits in the worker for a slot.
 */
const AHEAD_WORK_MS = 50;
/** How long (ms) a claim waits for half a claim's worth of room before it claims less. */
const GATHER_MS = 3;

/**
 * How an attempt whose outcome the server answered r ended, as
 * `drover.attempt.end` names it: lost when the outcome was refused (the
 * claim had gone), dead when a failure left the task DEAD.
 */
function attemptEnd(outcome: Outcome, r: OutcomeResult | undefined): AttemptEnd {
  if (!r || r.status !== 200) return "lost";
  if (outcome.ok) return "success";
  if ("defer" in outcome) return "deferred";
  if (!("error" in outcome)) return "sleep";
  return outcome.permanent || r.current_status === "DEAD" ? "dead" : "retry";
}

/** The byte length of v as JSON, or -1 when it cannot be. */
function jsonSize(v: unknown): number {
  try {
    return Buffer.byteLength(JSON.stringify(v) ?? "null");
  } catch {
    return -1;
  }
}

interface PendingOutcome {
  outcome: Outcome;
  resolve: (r: OutcomeResult | undefined) => void;
}

/** A task claimed ahead, waiting for a running slot. */
interface Waiting {
  task: QueueTask;
  session: Session;
  /** When the claim was answered (ms since the epoch): the attempt's span starts there. */
  claimed: number;
}

/**
 * A queue worker: claims tasks with long polls, runs up to `concurrency` at
 * once, and sends each outcome fenced by its claim's token (batched: one
 * outcome request in flight at a time, carrying every outcome that became
 * ready meanwhile, up to 256). While tasks are short (under 5 ms on
 * average) it claims tasks ahead of its free slots (see
 * {@link WorkerOptions.prefetch}). A handler that throws {@link Permanent}
 * sends the task to the dead-letter queue; any other error is retried with
 * the queue's backoff. On SIGTERM (or {@link drain}) it stops claiming (a
 * claim in flight is abandoned: the server hands back the tasks it claimed
 * for a request whose client left), lets the running tasks finish, runs
 * the tasks it claimed ahead (they were claimed only while tasks took
 * under 5 ms), sends their outcomes and ends its session. A task
 * claimed ahead whose session is lost before it starts is not started: it
 * runs again elsewhere.
 */
export class Worker {
  readonly queue: string;
  /** Resolves with the final counts once the worker has drained. */
  readonly done: Promise<WorkerStats>;
  private readonly q: Queues;
  private readonly t: Transport;
  private readonly handler: TaskHandler;
  private readonly concurrency: number;
  /** The most tasks one claim takes and the most held ahead of free slots (see {@link WorkerOptions.prefetch}). */
  readonly prefetch: number;
  private readonly waitMs: number;
  private readonly opts: WorkerOptions;
  private session: Session | undefined;
  private readonly drainAc = new AbortController();
  /** The running tasks, with when their handler started (performance.now()). */
  private readonly running = new Map<Promise<void>, number>();
  /** Tasks claimed ahead of a free slot, in claim order. */
  private readonly waiting: Waiting[] = [];
  /** A running average of how long handlers take, in ms (0: none ran yet). */
  private taskTime = 0;
  /** Outcomes handed to the batch sender and not yet answered. */
  private readonly sending = new Set<Promise<void>>();
  private readonly maxSending: number;
  private slotWaiter: (() => void) | undefined;
  private readonly pending = new Map<Session, PendingOutcome[]>();
  private flushing: Promise<void> | undefined;
  private readonly watched = new WeakSet<Session>();
  private readonly counts = { claimed: 0, succeeded: 0, failed: 0, permanent: 0, slept: 0, waited: 0, deferred: 0, lost: 0, ahead: 0, claimRequests: 0, outcomeRequests: 0, claimsWithOutcomes: 0 };
  /** A claim is in flight: a claim request, or an outcome request that carries one. */
  private claiming = false;
  /** Per session, the tasks claimed under it whose outcome is not yet answered (or that were dropped). */
  private readonly outstanding = new Map<Session, number>();
  /**
   * The worker's own sessions it claims under no more, because a claim's
   * answer was lost under them: each is closed once it holds nothing else,
   * which frees the tasks that claim may have taken.
   */
  private readonly retired = new Set<Session>();
  private readonly onSignal: () => void;
  private readonly signals: NodeJS.Signals[];

  /** @internal use {@link Drover.worker} */
  constructor(t: Transport, queue: string, opts: WorkerOptions, handler: TaskHandler) {
    this.t = t;
    this.q = new Queues(t);
    this.queue = queue;
    this.opts = opts;
    this.handler = handler;
    this.concurrency = Math.max(1, opts.concurrency ?? 1);
    if (opts.prefetch !== undefined && !(Number.isInteger(opts.prefetch) && opts.prefetch >= 1 && opts.prefetch <= MAX_CLAIM)) {
      throw new RangeError(`drover: prefetch must be an integer from 1 to ${MAX_CLAIM}, not ${opts.prefetch}`);
    }
    this.prefetch = opts.prefetch ?? MAX_CLAIM;
    this.maxSending = 4 * (this.concurrency + this.prefetch);
    this.waitMs = Math.min(60_000, durMs(opts.wait, 20_000));
    this.session = opts.session;
    this.signals = opts.signals === false ? [] : opts.signals ?? ["SIGTERM", "SIGINT"];
    // The first signal drains; the handler is then removed, so that a second
    // one ends the process as it would without a worker.
    this.onSignal = () => {
      for (const sig of this.signals) process.off(sig, this.onSignal);
      void this.drain();
    };
    for (const s of this.signals) process.on(s, this.onSignal);
    this.done = this.loop().finally(() => {
      for (const s of this.signals) process.off(s, this.onSignal);
    });
  }

  /** The counts so far. */
  get stats(): WorkerStats {
    return { ...this.counts, running: this.running.size, waiting: this.waiting.length };
  }

  /** The session claims are made under now (undefined before the first claim). */
  get currentSession(): Session | undefined {
    return this.session;
  }

  /** True once draining started. */
  get draining(): boolean {
    return this.drainAc.signal.aborted;
  }

  /**
   * Stops claiming, lets the running tasks finish, runs the tasks claimed
   * ahead, sends their outcomes and ends the session.
   */
  drain(): Promise<WorkerStats> {
    if (!this.drainAc.signal.aborted) this.drainAc.abort(new Error("worker draining"));
    this.wake();
    return this.done;
  }

  private report(err: unknown): void {
    try {
      this.opts.onError?.(err);
    } catch {
      /* the callback's own failure is not the worker's */
    }
  }

  private wake(): void {
    const w = this.slotWaiter;
    this.slotWaiter = undefined;
    w?.();
  }

  /** Resolves when a task ends, an outcome is answered, or the worker drains; or after ms. */
  private changed(ms?: number): Promise<void> {
    return new Promise<void>((resolve) => {
      let timer: NodeJS.Timeout | undefined;
      const done = () => {
        clearTimeout(timer);
        if (this.slotWaiter === done) this.slotWaiter = undefined;
        resolve();
      };
      this.slotWaiter = done;
      if (ms !== undefined) timer = setTimeout(done, Math.max(0, ms));
    });
  }

  private async ensureSession(): Promise<Session> {
    if (!(this.session && this.session.alive)) {
      if (this.opts.session) throw this.opts.session.signal.reason ?? new Error("the worker's session ended");
      this.session = await Session.create(this.t, { ttl: this.opts.ttl ?? 15, name: this.opts.name ?? `worker-${process.pid}` });
    }
    const s = this.session;
    if (!this.watched.has(s)) {
      this.watched.add(s);
      // The claims went with the session: tasks claimed ahead under it are not started.
      s.signal.addEventListener("abort", () => this.dropWaiting(s), { once: true });
    }
    return s;
  }

  /**
   * Counts n tasks of session as done with (answered or dropped); a
   * retired session that holds none any more is closed.
   */
  private settle(session: Session, n = 1): void {
    const left = (this.outstanding.get(session) ?? 0) - n;
    if (left > 0) {
      this.outstanding.set(session, left);
      return;
    }
    this.outstanding.delete(session);
    if (this.retired.delete(session)) void session.close().catch((e) => this.report(e));
  }

  /**
   * Claims no more under session: a claim's answer was lost, and the tasks
   * it may have taken are freed when the session ends, once the tasks it
   * holds are answered. A session the caller gave is kept.
   */
  private retire(session: Session): void {
    if (session === this.opts.session || !session.alive) return;
    if (this.session === session) this.session = undefined;
    this.retired.add(session);
    this.settle(session, 0);
  }

  /** Drops the tasks claimed ahead under a session that ended: they run again elsewhere. */
  private dropWaiting(session: Session): void {
    let dropped = 0;
    for (let i = this.waiting.length - 1; i >= 0; i--) {
      if (this.waiting[i]!.session === session) {
        this.waiting.splice(i, 1);
        dropped++;
      }
    }
    if (dropped) {
      this.counts.lost += dropped;
      this.settle(session, dropped);
      this.wake();
    }
  }

  /**
   * How many tasks may be held ahead of the running slots now: none unless
   * tasks are short (see AHEAD_BELOW_MS), else about AHEAD_WORK_MS of work,
   * at most prefetch.
   */
  private aheadLimit(): number {
    if (this.taskTime <= 0 || this.taskTime >= AHEAD_BELOW_MS) return 0;
    const since = performance.now() - AHEAD_BELOW_MS;
    for (const started of this.running.values()) if (started < since) return 0;
    return Math.min(this.prefetch, Math.max(1, Math.floor((this.concurrency * AHEAD_WORK_MS) / this.taskTime)));
  }

  /** The most tasks the worker may hold now (running and waiting). */
  private cap(): number {
    return this.concurrency + this.aheadLimit();
  }

  /** How many more tasks the worker may hold now. */
  private room(): number {
    return this.cap() - this.running.size - this.waiting.length;
  }

  private sampleTaskTime(ms: number): void {
    this.taskTime = Math.max(1e-6, this.taskTime === 0 ? ms : this.taskTime + (ms - this.taskTime) / 8);
  }

  /** Starts tasks claimed ahead while running slots are free, in claim order. */
  private pump(): void {
    while (this.running.size < this.concurrency && this.waiting.length) {
      const { task, session, claimed } = this.waiting.shift()!;
      if (!session.alive) {
        // The claim went with the session: the task runs again elsewhere.
        this.counts.lost++;
        this.settle(session);
        continue;
      }
      const started = performance.now();
      const p: Promise<void> = this.run(task, session, started, claimed).finally(() => {
        this.running.delete(p);
        this.pump();
        this.wake();
      });
      this.running.set(p, started);
    }
  }

  private async loop(): Promise<WorkerStats> {
    let backoff = 250;
    const drain = this.drainAc.signal;
    await attemptSpans(); // each claimed task's attempt is a span when OpenTelemetry is there
    try {
      while (!drain.aborted) {
        // A slot is free once its handler returned; its outcome goes out
        // in the next batch. Outcomes not yet answered are bounded too.
        if (this.room() <= 0 || this.sending.size >= this.maxSending || this.claiming) {
          await this.changed();
          continue;
        }
        // With tasks held, wait a moment for room for half a claim, so
        // that one claim takes several tasks rather than one at a time.
        if (this.running.size + this.waiting.length > 0) {
          const half = Math.max(1, Math.floor(Math.min(this.prefetch, this.cap()) / 2));
          const until = performance.now() + GATHER_MS;
          while (!drain.aborted && this.room() < half && performance.now() < until) await this.changed(until - performance.now());
          if (drain.aborted) break;
          if (this.room() <= 0) continue;
        }
        let session: Session;
        try {
          session = await this.ensureSession();
        } catch (err) {
          if (this.opts.session) throw err;
          this.report(err);
          await sleep(backoff, drain).catch(() => {});
          backoff = Math.min(5000, backoff * 2);
          continue;
        }
        const n = Math.min(this.prefetch, MAX_CLAIM, this.room());
        if (n <= 0 || this.claiming) continue;
        let tasks: QueueTask[];
        this.claiming = true;
        try {
          this.counts.claimRequests++;
          tasks = await this.q.claim(this.queue, { session, max: n, wait: this.waitMs / 1000, signal: drain });
          backoff = 250;
        } catch (err) {
          this.claiming = false;
          if (drain.aborted) break;
          if (!session.alive) continue; // a new session next round
          // Its answer may be lost with tasks claimed: claim under another session.
          if (err instanceof ConnectionError) this.retire(session);
          // A bad queue name is not something waiting fixes.
          if (err instanceof InvalidInputError) throw err;
          this.report(err);
          await sleep(backoff, drain).catch(() => {});
          backoff = Math.min(5000, backoff * 2);
          continue;
        }
        this.claiming = false;
        this.take(tasks, session);
      }
    } finally {
      // The tasks claimed ahead run too (those whose session is lost are
      // dropped): no route hands a claim back, and they are short. An
      // outcome request sent before the drain may still bring tasks (its
      // claim): they run too, before the worker ends.
      for (;;) {
        this.pump();
        if (this.running.size > 0) {
          await Promise.allSettled([...this.running.keys()]);
        } else if (this.sending.size > 0 || this.flushing || this.pending.size > 0) {
          await Promise.allSettled([...this.sending]);
          await this.flush();
        } else if (this.waiting.length === 0) {
          break;
        }
      }
      if (this.session && this.session !== this.opts.session) await this.session.close().catch((e) => this.report(e));
      for (const s of this.retired) await s.close().catch((e) => this.report(e));
      this.retired.clear();
    }
    return this.stats;
  }

  /** Takes claimed tasks: they wait for a running slot, in claim order. */
  private take(tasks: QueueTask[], session: Session): void {
    if (tasks.length === 0) return;
    this.outstanding.set(session, (this.outstanding.get(session) ?? 0) + tasks.length);
    const free = this.waiting.length ? 0 : Math.max(0, this.concurrency - this.running.size);
    this.counts.claimed += tasks.length;
    this.counts.ahead += Math.max(0, tasks.length - free);
    const claimed = Date.now();
    for (const task of tasks) this.waiting.push({ task, session, claimed });
    if (!session.alive) this.dropWaiting(session);
    this.pump();
  }

  private async run(task: QueueTask, session: Session, started: number, claimed: number): Promise<void> {
    const span = startAttemptSpan({
      queue: this.queue, namespace: this.t.namespace, taskId: task.task_id, taskType: task.task_type, tenant: task.metadata?.tenant,
      attempt: task.attempt, worker: this.opts.name ?? `worker-${process.pid}`, traceparent: task.traceparent, claimed,
    });
    try {
      await this.attempt(task, session, started, span);
    } catch (err) {
      span.end("lost", err instanceof Error ? err.message : String(err));
      throw err;
    }
  }

  /**
   * Runs one claimed task and queues its outcome. Its attempt's span ends
   * with how the attempt ended: once the server answered the outcome, or
   * here when the task parked or its claim was lost.
   */
  private async attempt(task: QueueTask, session: Session, started: number, span: AttemptSpan): Promise<void> {
    const token = task.token ?? 0;
    const stream = new StreamWriter(this.t, task.task_id, session, token);
    let hold: TaskBudgetHold | undefined;
    const ctx: TaskContext = { signal: session.signal, token, attempt: task.attempt, session, stream, usage: (n, h) => hold?.used(n, h) };
    let outcome: Outcome;
    let outcomeReceived: ReceivedSignalRef[] = [];
    let deferral: { deferSeconds: number; reason: string } | undefined;
    try {
      let result: unknown;
      // A task that names a budget reserves its estimate first; without
      // room, it is handed back unrun until the window turns (no attempt
      // counted; tasks get shows its budget_wait).
      const held = taskBudget(task) ? await TaskBudgetHold.reserve(new Budgets(this.t), task, this.budgetTtl(task)) : undefined;
      if (held instanceof TaskBudgetHold) hold = held;
      else if (held) deferral = held;
      // A task claimed after a wait for a signal: the wait is reported
      // again first, answered with what ended it.
      const wf = task.waiting_for;
      let wait: Outcome | undefined = wf?.signals?.length
        ? { task_id: task.task_id, token, wait_signal: { names: wf.signals, ...(wf.until ? { until: wf.until } : {}) } }
        : undefined;
      // The signals this claim's waits were answered with: each later
      // wait and the success name them, and a success or a park consumes
      // them (a worker that dies first leaves them to the next claim).
      const received: ReceivedSignalRef[] = [];
      outcomeReceived = received;
      for (let runs = 0; !(result instanceof Sleep) && !deferral; runs++) {
        if (wait) {
          if (received.length >= MAX_RECEIVED) throw new Permanent(`the handler received ${MAX_RECEIVED} signals in one claim, the most one outcome names`);
          if (received.length) wait.received_signals = [...received];
          ctx.received = await this.waitAnswer(session, wait, span);
          if (!ctx.received) return; // parked (or the claim was lost): counted, its span ended
          if (ctx.received.name && ctx.received.idempotencyKey) received.push({ name: ctx.received.name, idempotency_key: ctx.received.idempotencyKey });
          wait = undefined;
        }
        try {
          // Its requests go under the attempt's span, or carry the task's
          // traceparent where no span is active (no OpenTelemetry, no SDK).
          result = await span.run(() => withTaskTrace(task.traceparent, () => this.handler(task, ctx)));
        } finally {
          // Its events are stored before its outcome: the outcome closes the stream.
          await stream.flush().catch((e) => this.report(e));
        }
        if (!(result instanceof WaitSignal) || runs >= MAX_WAIT_RUNS) break;
        const timeout = result.timeout === undefined ? {} : { timeout: String(result.timeout) };
        wait = { task_id: task.task_id, token, wait_signal: { names: result.names, ...timeout } };
      }
      this.sampleTaskTime(performance.now() - started);
      const value = result === undefined ? null : result;
      const size = jsonSize(value);
      if (deferral) {
        outcome = { task_id: task.task_id, token, defer: { after: String(deferral.deferSeconds), reason: deferral.reason } };
      } else if (result instanceof WaitSignal) {
        outcome = { task_id: task.task_id, token, error: `the handler waited for signals ${MAX_WAIT_RUNS} times in one claim`, permanent: true };
      } else if (result instanceof Sleep) {
        outcome = result.until !== undefined
          ? { task_id: task.task_id, token, sleep_until: result.until instanceof Date ? result.until.toISOString() : result.until }
          : { task_id: task.task_id, token, sleep_for: String(result.duration) };
      } else if (size < 0) outcome = { task_id: task.task_id, token, error: "the handler's result is not JSON (a BigInt, a cycle...)", permanent: true };
      else if (size > MAX_RESULT) outcome = { task_id: task.task_id, token, error: `the handler's result is ${size} bytes of JSON, over the ${MAX_RESULT} a task keeps`, permanent: true };
      else {
        outcome = { task_id: task.task_id, token, ok: true, result: value };
        // A success settles its result's usage when the handler reported none.
        const unusable = hold?.succeeded(value);
        if (unusable) this.report(new Error(`drover: task ${task.task_id}: ${unusable}`));
      }
    } catch (err) {
      this.sampleTaskTime(performance.now() - started);
      const msg = err instanceof Error ? err.message || err.name : String(err);
      outcome = { task_id: task.task_id, token, error: msg.slice(0, 65536) || "error", permanent: isPermanent(err) };
    } finally {
      // Settled before the outcome: what the handler reported, else its result's usage, else the estimate.
      if (hold) await hold.settle().catch((e) => this.report(e));
    }
    if (!session.alive) {
      // The claim went with the session: the task runs again elsewhere.
      this.counts.lost++;
      this.settle(session);
      span.end("lost", "the claim's session was lost");
      return;
    }
    // The slot frees now; the outcome is counted once the server answers.
    // A task that wrote to its stream asks the server to end it (done,
    // or attempt_ended when it is retried or sleeps) with its outcome.
    if (stream.last > 0) outcome.streamed = true;
    // A success consumes the signals its waits were answered; a failure
    // or a sleep consumes nothing (the next claim resumes where this one
    // did), so it does not name them.
    if (outcomeReceived.length && outcome.ok) outcome.received_signals = outcomeReceived;
    const sent: Promise<void> = this.send(session, outcome).then((r) => {
      if (!r || r.status !== 200) this.counts.lost++;
      else if (outcome.ok) this.counts.succeeded++;
      else if ("defer" in outcome) this.counts.deferred++;
      else if (!("error" in outcome)) this.counts.slept++;
      else if (outcome.permanent) this.counts.permanent++;
      else this.counts.failed++;
      span.end(attemptEnd(outcome, r), "error" in outcome ? outcome.error : "defer" in outcome ? outcome.defer.reason : undefined);
    }).finally(() => {
      this.sending.delete(sent);
      this.settle(session);
      this.wake();
    });
    this.sending.add(sent);
  }

  /** The seconds a task's budget reservation lives (see {@link WorkerOptions.budgetTtl}). */
  private budgetTtl(task: QueueTask): number {
    if (this.opts.budgetTtl) return this.opts.budgetTtl;
    const timeout = task.timeout ? durMs(task.timeout, 0) / 1000 : 0;
    return timeout > 0 ? Math.min(3600, Math.max(60, Math.ceil(timeout) + 30)) : 300;
  }

  /**
   * Sends the wait for a signal `wait` and returns what the server
   * answered it with at once (the claim held); undefined when the task
   * parked or the claim was lost, counted and settled.
   */
  private async waitAnswer(session: Session, wait: Outcome, span: AttemptSpan): Promise<ReceivedSignal | undefined> {
    const r = session.alive ? await this.send(session, wait) : undefined;
    const got = r && r.status === 200 ? receivedOf(r.signal) : undefined;
    if (got) return got;
    if (r && r.status === 200) this.counts.waited++;
    else this.counts.lost++;
    span.end(r && r.status === 200 ? "wait" : "lost");
    this.settle(session);
    this.wake();
    return undefined;
  }

  /**
   * Queues an outcome. One outcome request is in flight at a time; it
   * carries every outcome of its session that is ready (up to 256), so
   * that under load each request carries many.
   */
  private send(session: Session, outcome: Outcome): Promise<OutcomeResult | undefined> {
    return new Promise((resolve) => {
      let list = this.pending.get(session);
      if (!list) this.pending.set(session, (list = []));
      list.push({ outcome, resolve });
      if (!this.flushing) this.flushing = this.flushLoop().finally(() => (this.flushing = undefined));
    });
  }

  private async flush(): Promise<void> {
    while (this.flushing || this.pending.size) {
      if (!this.flushing) this.flushing = this.flushLoop().finally(() => (this.flushing = undefined));
      await this.flushing;
    }
  }

  private async flushLoop(): Promise<void> {
    while (this.pending.size) {
      const [session, list] = this.pending.entries().next().value as [Session, PendingOutcome[]];
      const batch = list.splice(0, MAX_OUTCOMES);
      if (list.length === 0) this.pending.delete(session);
      const outcomes = batch.map((b) => b.outcome);
      let backoff = 200;
      let sentBefore = false;
      let claimed = false;
      for (;;) {
        try {
          this.counts.outcomeRequests++;
          let results: OutcomeResult[];
          const n = sentBefore ? 0 : this.nextClaim(session);
          claimed = n > 0;
          if (n > 0) {
            // The worker's next claim goes with the outcomes: one request
            // instead of two.
            this.claiming = true;
            this.counts.claimsWithOutcomes++;
            let r: Awaited<ReturnType<Queues["report"]>>;
            try {
              r = await this.q.report(this.queue, session, outcomes, { max: n });
            } finally {
              this.claiming = false;
              this.wake();
            }
            results = r.results;
            if (r.claimError) this.report(new Error(`drover: the claim sent with outcomes failed: ${r.claimError}`));
            this.take(r.tasks, session);
          } else {
            results = await this.q.outcomes(this.queue, session, outcomes, { sentBefore });
          }
          const byId = new Map(results.map((r) => [r.task_id, r]));
          for (const b of batch) b.resolve(byId.get(b.outcome.task_id));
          break;
        } catch (err) {
          session.observe(err);
          this.report(err);
          // A claim it carried may have taken tasks: claim under another session.
          if (claimed && err instanceof ConnectionError) this.retire(session);
          // Its answer may be lost with the outcomes written: if sent again,
          // a 409 is checked against the task.
          const unreachable = err instanceof ConnectionError || (err instanceof DroverError && err.status >= 500);
          sentBefore = sentBefore || unreachable;
          // Unreachable: try again while the claims can still hold (the session
          // is lost, and these outcomes with it, once its TTL runs out).
          if (session.alive && unreachable) {
            await sleep(backoff, session.signal).catch(() => {});
            backoff = Math.min(2000, backoff * 2);
            if (session.alive) continue;
          }
          for (const b of batch) b.resolve(undefined);
          break;
        }
      }
    }
  }

  /**
   * How many tasks the outcomes of session may claim as they go (0: none):
   * while the worker claims under that session, has room for them, and no
   * other claim is in flight; not once it drains.
   */
  private nextClaim(session: Session): number {
    if (this.claiming || this.drainAc.signal.aborted || session !== this.session || !session.alive || this.retired.has(session)) return 0;
    return Math.max(0, Math.min(this.prefetch, MAX_CLAIM, this.room()));
  }
}
