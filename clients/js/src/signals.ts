// Signals: named messages to a task (a human's approval, a reply), kept in
// its inbox until a step that waits for them consumes them.
import { ConflictError, InboxFullError, TaskFinishedError } from "./errors.js";
import { neverSent, seg, sleep, type Transport } from "./http.js";

/** What a signal did. */
export interface SignalResult {
  task_id: string;
  name: string;
  /** The key it is stored under: the one given, or a random one. */
  idempotency_key: string;
  /** Stored in the task's inbox; false when a signal of this name and key was sent before (nothing written). */
  stored: boolean;
  /** The task was parked waiting for it and is now PENDING. */
  woke: boolean;
  /** The task's state as the signal found it. */
  current_status: string;
}

export interface SignalOptions {
  /** Any JSON value, at most 64 KiB: the waiting step gets it. */
  data?: unknown;
  /**
   * Sent again with the same name and key, the signal is stored and
   * delivered once. Without one the server makes a random key: give one
   * when a retry must not count twice.
   */
  idempotencyKey?: string;
  signal?: AbortSignal;
}

/**
 * Sends task `taskId` the signal `name`. With an idempotency key the
 * request is safe to repeat, and is repeated after a connection error;
 * without one it is repeated only when it never left (the connection
 * could not be made).
 * Throws {@link NotFoundError} for an unknown task, {@link TaskFinishedError}
 * for a finished one, {@link InboxFullError} when its inbox is full, and
 * {@link InvalidInputError} for a bad name, key or data.
 */
export async function sendSignal(t: Transport, taskId: string, name: string, opts: SignalOptions = {}): Promise<SignalResult> {
  const body = { ...(opts.data === undefined ? {} : { data: opts.data }), ...(opts.idempotencyKey ? { idempotency_key: opts.idempotencyKey } : {}) };
  try {
    for (let i = 0; ; i++) {
      try {
        return await t.post<SignalResult>(`/v1/tasks/${seg(taskId)}/signals/${seg(name)}`, body, { retry: !!opts.idempotencyKey, signal: opts.signal });
      } catch (err) {
        if (opts.idempotencyKey || i >= t.retries || !neverSent(err)) throw err;
        await sleep(Math.min(2000, 100 * 2 ** i), opts.signal);
      }
    }
  } catch (err) {
    // A finished task's 409 is the only plain conflict this route answers.
    if (err instanceof ConflictError && !(err instanceof InboxFullError) && err.kind === "conflict") {
      throw new TaskFinishedError(err.message, { status: err.status, problem: err.problem, request: err.request, cause: err });
    }
    throw err;
  }
}

/** The signal a step resumed with, or the timeout of its wait. */
export interface ReceivedSignal {
  /** The signal's name (absent on a timeout). */
  name?: string;
  /** Its data, as sent. */
  data?: unknown;
  idempotencyKey?: string;
  /** When it was sent (RFC 3339). */
  sentAt?: string;
  /** The wait timed out: no signal came. */
  timedOut: boolean;
}

/**
 * What a step returns to end with a wait for a signal: its state is
 * checkpointed with the wait and the claim released; the next step runs
 * with the first of the signals named that is sent (a signal sent before
 * the wait is kept for it), or with `timedOut` once the timeout passed.
 * Make one with {@link waitSignal}.
 */
export class WaitSignal<S = unknown> {
  /** @internal use {@link waitSignal} */
  constructor(
    readonly state: S,
    readonly names: string[],
    /** How long at most: seconds, or a duration ("24h"); undefined waits without end. */
    readonly timeout?: number | string,
  ) {}
}

/**
 * Ends a step with `state` and a wait for the signal `names` (one name, or
 * up to 16: the first sent ends the wait), at most `timeout` (seconds or a
 * duration such as "24h"; none: no end). The next step gets the signal (or
 * the timeout) as `ctx.received`.
 */
export function waitSignal<S>(names: string | string[], opts: { timeout?: number | string } = {}, state?: S): WaitSignal<S> {
  const list = typeof names === "string" ? [names] : [...names];
  if (list.length === 0 || list.length > 16) throw new RangeError("drover: waitSignal: give 1 to 16 signal names");
  if (typeof opts.timeout === "number" && !(Number.isFinite(opts.timeout) && opts.timeout > 0)) throw new RangeError(`drover: waitSignal: the timeout must be seconds above 0, not ${opts.timeout}`);
  return new WaitSignal(state as S, list, opts.timeout);
}

/** A claim's `signal` as a step gets it. @internal */
export function receivedOf(s: { name?: string; data?: unknown; idempotency_key?: string; sent_at?: string; timed_out?: boolean } | undefined): ReceivedSignal | undefined {
  if (!s) return undefined;
  const out: ReceivedSignal = { timedOut: !!s.timed_out };
  if (s.name) out.name = s.name;
  if (s.data !== undefined) out.data = s.data;
  if (s.idempotency_key) out.idempotencyKey = s.idempotency_key;
  if (s.sent_at) out.sentAt = s.sent_at;
  return out;
}
