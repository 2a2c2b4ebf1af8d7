import { InvalidInputError, type LineError } from "./errors.js";
import { durMs, seg, type Transport } from "./http.js";
import { Session } from "./session.js";

/** A task as submitted. */
export interface SubmittedTask {
  task_id: string;
  task_type: string;
  parameters?: unknown;
  input_data_uri?: string;
  output_data_uri?: string;
  max_retries?: number;
  backoff_base?: string;
  backoff_max?: string;
  timeout?: string;
  metadata?: { priority?: number; tenant?: string; source_system?: string; [k: string]: unknown };
  /** Run the task at this time (RFC 3339), not before: SCHEDULED until then. Not with delay. */
  run_at?: string;
  /** Run the task after this long ("10m", or seconds), not before: SCHEDULED until then. Not with run_at. */
  delay?: string | number;
  /** The W3C traceparent of the task's creation context; by default the request's (when the server traces). */
  traceparent?: string;
  [key: string]: unknown;
}

/** A task transition in its history. */
export interface QueueTransition {
  status: string;
  at: string;
  attempt?: number;
  worker?: string;
  error?: string;
}

/** A task as the server shows it. */
export interface QueueTask {
  task_id: string;
  task_type: string;
  queue: string;
  parameters?: unknown;
  metadata: { created_at: string; priority: number; tenant?: string; source_system?: string };
  current_status: "SCHEDULED" | "PENDING" | "RUNNING" | "RETRYING" | "SUCCEEDED" | "DEAD" | "CANCELLED" | string;
  attempt: number;
  /** On a claimed task: the claim's fencing token, sent back with its outcome. */
  token?: number;
  retries_attempted: number;
  max_retries: number;
  last_error?: string;
  result?: unknown;
  result_base64?: string;
  /** When a RETRYING task runs again, or a SCHEDULED one falls due. */
  scheduled_at?: string;
  transitions?: QueueTransition[] | null;
  input_data_uri?: string;
  output_data_uri?: string;
  timeout?: string;
  backoff_base?: string;
  backoff_max?: string;
  /**
   * What a WAITING task waits for; on a task claimed after a wait for a
   * signal (RUNNING), that wait: the worker reports it again to get what
   * ended it.
   */
  waiting_for?: { signals?: string[]; since: string; until?: string };
  /**
   * Set while the task (PENDING, or RETRYING until its delay ends) waits
   * for its LLM budget: a worker handed it back unrun, its attempt not
   * counted. Which budget, since when, how many deferrals in a row, when
   * it is tried again, and why.
   */
  budget_wait?: { budget: string; since: string; deferrals: number; next?: string; reason: string };
  /**
   * The W3C traceparent of the task's submission, when it was traced: a
   * handler that uses OpenTelemetry starts its attempt's span under it
   * (`propagation.extract(context.active(), { traceparent })`).
   */
  traceparent?: string;
}

/** The answer to a submission. */
export interface SubmitResult {
  submitted: number;
  duplicates: number;
  /** The rejected lines (NDJSON), by line number starting at 1. */
  rejected: LineError[];
}

export interface QueueStats {
  queue: string;
  pending: number;
  running: number;
  retrying: number;
  succeeded: number;
  dead: number;
  cancelled: number;
  /** Tasks submitted to run later whose time has not come. */
  scheduled: number;
  /** Tasks parked until the sleep they asked for ends. */
  sleeping: number;
  /** The queue is paused: it takes submissions, but no worker claims its tasks. */
  paused: boolean;
}

/** A queue's pause state after {@link Queues.pause} or {@link Queues.resume}. */
export interface PauseResult {
  queue: string;
  paused: boolean;
  /** When the queue was paused (RFC 3339), while it is. */
  since?: string;
  /** False when the queue already was in that state (not an error). */
  changed: boolean;
}

export interface TaskPage {
  tasks: QueueTask[];
  /** The cursor of the next page (pass as `after`), absent on the last. */
  next?: string;
}

export interface BulkResult {
  queue: string;
  status: string;
  action: string;
  count: number;
}

/** The answer of {@link Queues.runNow}: how many scheduled tasks became due. */
export interface RunNowResult {
  queue: string;
  moved: number;
}

/** A signal a claim's waits were answered with: its name and idempotency key. */
export interface ReceivedSignalRef {
  name: string;
  idempotency_key: string;
}

/**
 * One outcome of the batch outcome route. `streamed`: the attempt wrote
 * events to the task's stream, and the server ends it once the outcome is
 * stored (`done`, or `attempt_ended` when the task is retried or sleeps).
 * `received_signals`: the signals the claim's waits were answered with so
 * far (at most 64); a success or a wait that parks consumes them, fenced
 * by the claim, and a wait answered at once skips them. Any other outcome
 * consumes nothing: the next claim resumes where this one did.
 */
export type Outcome = (
  | { task_id: string; token: number; ok: true; result?: unknown; streamed?: boolean }
  | { task_id: string; token: number; ok?: false; error: string; permanent?: boolean; streamed?: boolean }
  /** Neither: the task sleeps (SLEEPING, no claim) and is claimed again when the sleep ends, its attempt not counted. */
  | { task_id: string; token: number; ok?: undefined; sleep_for?: string; sleep_until?: string; streamed?: boolean }
  /**
   * Neither: a wait for the first of the signals named. One in the task's
   * inbox already, not named received (or the timeout of a wait past its
   * until), is answered at once in `signal`, not consumed, the claim held;
   * otherwise the task parks WAITING.
   */
  | { task_id: string; token: number; ok?: undefined; wait_signal: { names: string[]; timeout?: string; until?: string }; streamed?: boolean }
  /**
   * Neither: the task was not run and waits (its budget has no room): it
   * goes back PENDING, its attempt not counted, claimable again after
   * `after` (seconds, or a duration such as 30s), its history and
   * `budget_wait` saying why (a reason `budget KEY: why`).
   */
  | { task_id: string; token: number; ok?: undefined; defer: { after: string; reason: string }; streamed?: boolean }
) & { received_signals?: ReceivedSignalRef[] };

/** The server's answer for one outcome: 200, 409 (the claim was lost), 404. */
export interface OutcomeResult {
  task_id: string;
  status: number;
  current_status?: string;
  attempt?: number;
  scheduled_at?: string;
  detail?: string;
  /** A wait_signal answered at once: the first signal waited for (not consumed: name it in the claim's later outcomes' received_signals), or timed_out; the task is still claimed. */
  signal?: { name?: string; data?: unknown; idempotency_key?: string; sent_at?: string; timed_out?: boolean };
}

const enc = new TextEncoder();

/** The queue routes: submission, inspection, claims, outcomes and the dead-letter queue. */
export class Queues {
  constructor(private readonly t: Transport) {}

  /**
   * Submits tasks. An array is sent as one JSON array (checked whole: one
   * invalid task rejects the request with {@link InvalidInputError}, its
   * `problem.lines` naming the positions, and nothing is stored). An async
   * iterable or a stream is sent as NDJSON while it is produced: bad lines
   * are reported in `rejected` by line number while the valid ones go in.
   * Resubmitting a task with the same id and content counts it as a
   * duplicate, so an array submission is repeated after a connection error.
   */
  async submit(queue: string, tasks: SubmittedTask[] | AsyncIterable<SubmittedTask | string> | Iterable<string> | ReadableStream<Uint8Array>, opts: { signal?: AbortSignal } = {}): Promise<SubmitResult> {
    const path = `/v1/queues/${seg(queue)}/tasks`;
    if (Array.isArray(tasks) && tasks.every((x) => typeof x === "object")) {
      const r = await this.t.post<SubmitResult>(path, tasks, { retry: true, signal: opts.signal, timeoutMs: 0 });
      return { ...r, rejected: r.rejected ?? [] };
    }
    const stream = tasks instanceof ReadableStream ? tasks : ndjsonStream(tasks as AsyncIterable<SubmittedTask | string>);
    const r = await this.t.request<SubmitResult>("POST", path, {
      rawBody: stream,
      contentType: "application/x-ndjson",
      retry: false,
      signal: opts.signal,
      timeoutMs: 0,
    });
    return { ...r.data, rejected: r.data.rejected ?? [] };
  }

  /** One task, with its status, attempts, history and result. */
  get(queue: string, id: string): Promise<QueueTask> {
    return this.t.get<QueueTask>(`/v1/queues/${seg(queue)}/tasks/${seg(id)}`);
  }

  /** A page of tasks by status. */
  async list(queue: string, opts: { status?: string; limit?: number; after?: string } = {}): Promise<TaskPage> {
    const p = await this.t.get<TaskPage>(`/v1/queues/${seg(queue)}/tasks`, { query: opts });
    return { ...p, tasks: p.tasks ?? [] };
  }

  /** Every task of a status, page by page. */
  async *iterate(queue: string, opts: { status?: string; pageSize?: number } = {}): AsyncGenerator<QueueTask> {
    let after: string | undefined;
    for (;;) {
      const page = await this.list(queue, { status: opts.status, limit: opts.pageSize ?? 500, after });
      yield* page.tasks;
      if (!page.next || page.tasks.length === 0) return;
      after = page.next;
    }
  }

  /** Counts by status. */
  stats(queue: string): Promise<QueueStats> {
    return this.t.get<QueueStats>(`/v1/queues/${seg(queue)}/stats`);
  }

  /**
   * Pauses a queue: from the moment this resolves no claim of its tasks
   * commits, for any worker (Go, HTTP, this client's). Submissions are
   * accepted and running tasks finish and are acknowledged as usual.
   * Pausing a paused queue is not an error (`changed` false); an unknown
   * queue is a `NotFoundError`. Needs an admin token.
   */
  pause(queue: string): Promise<PauseResult> {
    return this.t.post<PauseResult>(`/v1/queues/${seg(queue)}/pause`, undefined, { retry: true });
  }

  /** Resumes a paused queue: its workers claim again at once. Resuming a running queue is not an error. */
  resume(queue: string): Promise<PauseResult> {
    return this.t.post<PauseResult>(`/v1/queues/${seg(queue)}/resume`, undefined, { retry: true });
  }

  /** Cancels a task that has not finished. */
  cancel(queue: string, id: string): Promise<QueueTask> {
    return this.t.post<QueueTask>(`/v1/queues/${seg(queue)}/tasks/${seg(id)}/cancel`, undefined, { retry: false });
  }

  /**
   * Makes scheduled tasks due now (PENDING at once): `ids`, or every
   * SCHEDULED task of the queue when `ids` is absent or empty. A task named
   * that is not scheduled in the queue is a `ConflictError` (one id alone:
   * a `NotFoundError`), an unknown queue a `NotFoundError`.
   */
  runNow(queue: string, ids?: string[]): Promise<RunNowResult> {
    if (ids !== undefined && ids.length === 1) {
      return this.t.post<RunNowResult>(`/v1/queues/${seg(queue)}/tasks/${seg(ids[0])}/run-now`, undefined, { retry: false });
    }
    // Only the run-now of every one answers the same when sent twice.
    const all = ids === undefined || ids.length === 0;
    return this.t.post<RunNowResult>(`/v1/queues/${seg(queue)}/tasks/run-now`, { ids: ids ?? [] }, { retry: all });
  }

  /**
   * Claims up to `max` tasks under the session: a long poll woken by the
   * queue's watch, answered empty when `wait` runs out. Never sent twice (a
   * claim whose answer is lost stays claimed until the session ends).
   */
  async claim(queue: string, opts: { session: Session; max?: number; wait?: number | string; signal?: AbortSignal }): Promise<QueueTask[]> {
    const waitMs = durMs(opts.wait, 20_000);
    const signal = opts.signal ? AbortSignal.any([opts.signal, opts.session.signal]) : opts.session.signal;
    try {
      const r = await this.t.post<{ tasks: QueueTask[] | null }>(`/v1/queues/${seg(queue)}/claim`,
        { session: opts.session.id, max: opts.max ?? 1, wait: `${Math.round(waitMs)}ms` },
        { retry: false, signal, timeoutMs: waitMs + this.t.timeoutMs });
      return r.tasks ?? [];
    } catch (err) {
      opts.session.observe(err);
      throw err;
    }
  }

  /**
   * Sends up to 256 outcomes in one request, each fenced by its claim's
   * token and answered on its own (409: the claim was lost, drop the
   * result). Repeated after a connection error: an outcome that landed the
   * first time is answered 409 the second, and changes nothing.
   */
  async outcomes(queue: string, session: Session | string, outcomes: Outcome[], opts: { signal?: AbortSignal; sentBefore?: boolean } = {}): Promise<OutcomeResult[]> {
    const r = await this.t.request<{ results: OutcomeResult[] | null }>("POST", `/v1/queues/${seg(queue)}/outcomes`,
      { body: { session: typeof session === "string" ? session : session.id, outcomes }, retry: true, signal: opts.signal });
    return this.settled(queue, outcomes, r.data.results ?? [], r.attempts > 1 || opts.sentBefore === true);
  }

  /**
   * Sends outcomes as {@link outcomes} does, then claims up to `claim.max`
   * more tasks under the same session in the same request (one attempt, or
   * a long poll of `claim.wait`): a worker's next claim without a request
   * of its own. Never sent twice, since its claim is not safe to repeat:
   * after a {@link ConnectionError} send the outcomes again with
   * `outcomes(..., { sentBefore: true })` (an outcome that landed is then
   * told apart from a lost claim). `claimError` says why the claim failed
   * when the outcomes were written all the same.
   */
  async report(queue: string, session: Session, outcomes: Outcome[], claim: { max: number; wait?: number | string }, opts: { signal?: AbortSignal } = {}): Promise<{ results: OutcomeResult[]; tasks: QueueTask[]; claimError?: string }> {
    const waitMs = claim.wait === undefined ? 0 : durMs(claim.wait, 0);
    const signal = opts.signal ? AbortSignal.any([opts.signal, session.signal]) : session.signal;
    try {
      const r = await this.t.post<{ results: OutcomeResult[] | null; tasks?: QueueTask[] | null; claim_error?: string }>(`/v1/queues/${seg(queue)}/outcomes`,
        { session: session.id, outcomes, claim: { max: claim.max, ...(waitMs > 0 ? { wait: `${Math.round(waitMs)}ms` } : {}) } },
        { retry: false, signal, timeoutMs: waitMs + this.t.timeoutMs });
      return { results: r.results ?? [], tasks: r.tasks ?? [], ...(r.claim_error ? { claimError: r.claim_error } : {}) };
    } catch (err) {
      session.observe(err);
      throw err;
    }
  }

  /**
   * results, with each 409 that may be the outcome's own earlier write (the
   * request was sent before) checked against the task: it counts as
   * written when the task holds that token in the state the outcome leads
   * to.
   */
  private async settled(queue: string, outcomes: Outcome[], results: OutcomeResult[], sentBefore: boolean): Promise<OutcomeResult[]> {
    if (sentBefore) {
      // Sent again after a lost answer: a 409 may be this outcome's own first write.
      const byId = new Map(outcomes.map((o) => [o.task_id, o]));
      await Promise.all(results.map(async (res, i) => {
        const o = byId.get(res.task_id);
        if (res.status !== 409 || !o) return;
        const t = await this.get(queue, res.task_id).catch(() => undefined);
        const want = o.ok ? ["SUCCEEDED"] : ["RETRYING", "DEAD", "PENDING", "SLEEPING"];
        if (t && t.token === o.token && want.includes(t.current_status)) results[i] = { task_id: res.task_id, status: 200, current_status: t.current_status, attempt: t.attempt };
      }));
    }
    return results;
  }

  /** Acks one task (SUCCEEDED, with a JSON result). Throws {@link FencedError} when the claim was lost. */
  ack(queue: string, session: Session | string, task: { task_id: string; token?: number }, result?: unknown): Promise<QueueTask> {
    return this.t.post<QueueTask>(`/v1/queues/${seg(queue)}/tasks/${seg(task.task_id)}/ack`,
      { session: typeof session === "string" ? session : session.id, token: task.token, result: result ?? null }, { retry: true });
  }

  /** Fails one task: retried with the queue's backoff, or to the dead-letter queue (permanent, or out of retries). */
  fail(queue: string, session: Session | string, task: { task_id: string; token?: number }, error: string, permanent = false): Promise<QueueTask> {
    return this.t.post<QueueTask>(`/v1/queues/${seg(queue)}/tasks/${seg(task.task_id)}/fail`,
      { session: typeof session === "string" ? session : session.id, token: task.token, error, permanent }, { retry: true });
  }

  /**
   * Hands one claimed task back unrun (its LLM budget has no room, a quota
   * is full): PENDING again, its attempt not counted, claimable after
   * `after` (a duration such as "30s", or seconds). A reason `budget KEY:
   * why` (KEY the task's metadata.budget) shows as its `budget_wait`.
   * Throws {@link FencedError} when the claim was lost.
   */
  defer(queue: string, session: Session | string, task: { task_id: string; token?: number }, d: { after: string | number; reason: string }): Promise<QueueTask> {
    return this.t.post<QueueTask>(`/v1/queues/${seg(queue)}/tasks/${seg(task.task_id)}/fail`,
      { session: typeof session === "string" ? session : session.id, token: task.token, defer: { after: String(d.after), reason: d.reason } }, { retry: true });
  }

  /** Says a task is still running (and renews the session). */
  heartbeat(queue: string, session: Session | string, task: { task_id: string; token?: number }): Promise<{ task_id: string; attempt: number; token: number; expires_at: string }> {
    return this.t.post(`/v1/queues/${seg(queue)}/tasks/${seg(task.task_id)}/heartbeat`,
      { session: typeof session === "string" ? session : session.id, token: task.token }, { retry: true });
  }

  /**
   * The queue's history, a bucket per minute of the last hour (`window:
   * "1h"`, the default) or day (`"24h"`): processed, failed, retried,
   * deferred, depth, and the latency from submission to first claim.
   * Every server of a cluster answers the same; the minutes after
   * `closed_through` are not closed yet. Throws NotFoundError for a queue
   * nothing was submitted to.
   */
  history(queue: string, opts: { window?: "1h" | "24h" } = {}): Promise<QueueHistory> {
    return this.t.get<QueueHistory>(`/v1/queues/${seg(queue)}/history`, { query: { window: opts.window ?? "1h" } });
  }
}

/** Tasks a queue counted, in a minute or a window. */
export interface QueueHistoryCounts {
  /** Tasks that succeeded. */
  processed: number;
  /** Tasks that failed for good (moved to the dead-letter queue). */
  failed: number;
  /** Failed attempts scheduled for a retry. */
  retried: number;
  /** Tasks handed back by flow control, not charged an attempt. */
  deferred: number;
  /** Tasks claimed for the first time (the latency's samples). */
  started: number;
}

/** Time from submission (or due time) to first claim. */
export interface QueueHistoryLatency {
  p50_seconds: number;
  p99_seconds: number;
  samples: number;
}

/** One minute of a queue's history. */
export interface QueueHistoryBucket extends QueueHistoryCounts {
  /** The minute's start (RFC 3339). */
  at: string;
  /** Depth at the minute's end. */
  pending: number;
  running: number;
  retrying: number;
  latency: QueueHistoryLatency;
  /** The minute was closed: its counts are final. */
  closed: boolean;
  /** The counts may be short (see the server's docs). */
  gap?: boolean;
}

/** A queue's history over a window, a minute at a time. */
export interface QueueHistory {
  queue: string;
  window_seconds: number;
  bucket_seconds: number;
  /** The start of the last minute closed; absent before any. */
  closed_through?: string;
  totals: QueueHistoryCounts;
  latency: QueueHistoryLatency;
  /** One per minute, oldest first. */
  buckets: QueueHistoryBucket[];
}

/** The dead-letter queue of a queue. */
export class DeadLetters {
  constructor(private readonly t: Transport) {}

  /** A page of dead tasks. */
  async list(queue: string, opts: { limit?: number; after?: string } = {}): Promise<TaskPage> {
    const p = await this.t.get<TaskPage>(`/v1/queues/${seg(queue)}/dlq`, { query: opts });
    return { ...p, tasks: p.tasks ?? [] };
  }
  /** One dead task. */
  show(queue: string, id: string): Promise<QueueTask> {
    return this.t.get<QueueTask>(`/v1/queues/${seg(queue)}/dlq/${seg(id)}`);
  }
  /** Runs a dead task again; without an id, every dead task of the queue. */
  requeue(queue: string, id?: string): Promise<BulkResult> {
    const path = id === undefined ? `/v1/queues/${seg(queue)}/dlq/requeue` : `/v1/queues/${seg(queue)}/dlq/${seg(id)}/requeue`;
    return this.t.post<BulkResult>(path, undefined, { retry: false });
  }
  /** Deletes a dead task; without an id, every dead task of the queue (admin role). */
  purge(queue: string, id?: string): Promise<BulkResult> {
    const path = id === undefined ? `/v1/queues/${seg(queue)}/dlq` : `/v1/queues/${seg(queue)}/dlq/${seg(id)}`;
    return this.t.delete<BulkResult>(path);
  }
}

function ndjsonStream(src: AsyncIterable<SubmittedTask | string> | Iterable<SubmittedTask | string>): ReadableStream<Uint8Array> {
  const it = (Symbol.asyncIterator in src ? (src as AsyncIterable<SubmittedTask | string>)[Symbol.asyncIterator]() : (src as Iterable<SubmittedTask | string>)[Symbol.iterator]()) as AsyncIterator<SubmittedTask | string> | Iterator<SubmittedTask | string>;
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      // Up to 256 lines a chunk.
      const parts: string[] = [];
      for (let i = 0; i < 256; i++) {
        const r = await it.next();
        if (r.done) {
          if (parts.length) controller.enqueue(enc.encode(parts.join("")));
          controller.close();
          return;
        }
        const v = r.value;
        const line = typeof v === "string" ? v.replace(/\r?\n$/, "") : JSON.stringify(v);
        parts.push(line + "\n");
      }
      controller.enqueue(enc.encode(parts.join("")));
    },
    async cancel() {
      await it.return?.();
    },
  });
}

/** The filters of {@link Queues.search}: every one given must hold. */
export interface SearchQuery {
  /** Only tasks in this status (indexed). */
  status?: string;
  /** Only tasks of this task_type (checked on the tasks read). */
  type?: string;
  /** Only tasks whose id starts with this (a range read of the id index). */
  idPrefix?: string;
  /** Only tasks whose parameters hold each key with its value (the value as JSON when it parses, else as a string). */
  params?: Record<string, string | number | boolean>;
  /** Only tasks created at or after this: a Date, RFC 3339, or a duration back from now ("1h"). */
  since?: Date | string;
  /** Only tasks created before this: a Date, RFC 3339, or a duration back from now. */
  until?: Date | string;
  /** The most tasks on a page (1 to 1000, default 100). */
  limit?: number;
  /** The `nextCursor` of the page before, from the same query. */
  cursor?: string;
  signal?: AbortSignal;
}

/** A page of a search: it may be short, or empty, while `nextCursor` is set (the page read its budget of tasks first). */
export interface SearchPage {
  tasks: QueueTask[];
  /** Pass as `cursor`, with the same query, for the next page; absent once every task was walked. */
  nextCursor?: string;
  /** How many tasks (and index keys) the page read. */
  scanned: number;
}

export interface Queues {
  /**
   * One page of a queue's tasks that match `query`. A cursor given with
   * another query is refused ({@link InvalidInputError} naming `query.cursor`);
   * an unknown queue is a {@link NotFoundError}.
   */
  search(queue: string, query?: SearchQuery): Promise<SearchPage>;
  /** Every task that matches `query`, page by page (empty pages included). */
  searchAll(queue: string, query?: Omit<SearchQuery, "cursor">): AsyncGenerator<QueueTask>;
}

Queues.prototype.search = async function (this: Queues, queue: string, query: SearchQuery = {}): Promise<SearchPage> {
  const time = (v?: Date | string) => (v instanceof Date ? v.toISOString() : v);
  const params = Object.entries(query.params ?? {}).map(([k, v]) => `${k}=${v}`);
  const t = (this as unknown as { t: Transport }).t;
  const p = await t.get<{ data?: QueueTask[]; next_cursor?: string; scanned: number }>(`/v1/queues/${seg(queue)}/search`, {
    query: { status: query.status, type: query.type, id_prefix: query.idPrefix, param: params.length ? params : undefined,
      since: time(query.since), until: time(query.until), limit: query.limit, cursor: query.cursor },
    signal: query.signal,
  });
  return { tasks: p.data ?? [], nextCursor: p.next_cursor, scanned: p.scanned };
};

Queues.prototype.searchAll = async function* (this: Queues, queue: string, query: Omit<SearchQuery, "cursor"> = {}): AsyncGenerator<QueueTask> {
  let cursor: string | undefined;
  for (;;) {
    const page = await this.search(queue, { ...query, cursor });
    yield* page.tasks;
    if (!page.nextCursor) return;
    cursor = page.nextCursor;
  }
};
