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

/** One outcome of the batch outcome route. */
export type Outcome =
  | { task_id: string; token: number; ok: true; result?: unknown }
  | { task_id: string; token: number; ok?: false; error: string; permanent?: boolean }
  /** Neither: the task sleeps (SLEEPING, no claim) and is claimed again when the sleep ends, its attempt not counted. */
  | { task_id: string; token: number; ok?: undefined; sleep_for?: string; sleep_until?: string };

/** The server's answer for one outcome: 200, 409 (the claim was lost), 404. */
export interface OutcomeResult {
  task_id: string;
  status: number;
  current_status?: string;
  attempt?: number;
  scheduled_at?: string;
  detail?: string;
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

  /** Cancels a task that has not finished. */
  cancel(queue: string, id: string): Promise<QueueTask> {
    return this.t.post<QueueTask>(`/v1/queues/${seg(queue)}/tasks/${seg(id)}/cancel`, undefined, { retry: false });
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

  /** Says a task is still running (and renews the session). */
  heartbeat(queue: string, session: Session | string, task: { task_id: string; token?: number }): Promise<{ task_id: string; attempt: number; token: number; expires_at: string }> {
    return this.t.post(`/v1/queues/${seg(queue)}/tasks/${seg(task.task_id)}/heartbeat`,
      { session: typeof session === "string" ? session : session.id, token: task.token }, { retry: true });
  }
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
