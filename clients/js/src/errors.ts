/**
 * Errors of the drover client. Every error the server answers with is an
 * RFC 9457 problem document; the client turns it into a subclass of
 * {@link DroverError} chosen by the problem's `type` (and its status), so
 * callers can write `if (err instanceof LockHeldError)`.
 */

/** One input at fault, as the server names it (`body.ttl`, `path.name`). */
export interface ProblemDetail {
  location?: string;
  message?: string;
  value?: unknown;
}

/** A submission's rejected line. */
export interface LineError {
  line: number;
  error: string;
}

/** Who holds a lock, on a lock route's 409. */
export interface LockStatus {
  name: string;
  held: boolean;
  token?: number;
  holder?: Holder;
  waiters: number;
  ttl_left?: number;
}

/** The process that holds a lock or claim. */
export interface Holder {
  id: string;
  host: string;
  pid: number;
  acquired_at: string;
}

/** The RFC 9457 problem document every error answer carries. */
export interface Problem {
  type?: string;
  title?: string;
  status?: number;
  detail?: string;
  instance?: string;
  errors?: ProblemDetail[] | null;
  holder?: LockStatus;
  lines?: LineError[] | null;
  [key: string]: unknown;
}

const PROBLEM_BASE = "https://drover.dev/problems/";

/**
 * The base class of every error this client throws about drover: an answer
 * of the server (status > 0, with its problem document) or a failure to
 * reach it (status 0).
 */
export class DroverError extends Error {
  /** The HTTP status; 0 when no answer came (a connection error, a timeout). */
  readonly status: number;
  /** The problem document the server answered with ({} when there was none). */
  readonly problem: Problem;
  /** The problem's kind: the last segment of its `type` URI (`lock-held`), or "". */
  readonly kind: string;
  /** Seconds the server asked to wait before trying again (Retry-After), if any. */
  readonly retryAfter?: number;
  /** The request that failed, as `METHOD /path`. */
  readonly request?: string;

  constructor(message: string, opts: { status?: number; problem?: Problem; retryAfter?: number; request?: string; cause?: unknown } = {}) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = new.target.name;
    this.status = opts.status ?? 0;
    this.problem = opts.problem ?? {};
    const type = this.problem.type ?? "";
    this.kind = type.startsWith(PROBLEM_BASE) ? type.slice(PROBLEM_BASE.length) : "";
    if (opts.retryAfter !== undefined) this.retryAfter = opts.retryAfter;
    if (opts.request !== undefined) this.request = opts.request;
  }
}

/** 400: the request was malformed or a value out of range (`problem.errors` names each input at fault). */
export class InvalidInputError extends DroverError {}

/** 401 (no or an unknown bearer token); {@link ForbiddenError} (403) is a subclass. */
export class UnauthorizedError extends DroverError {}

/** 403: the token may not use this namespace, or its role is below the route's. */
export class ForbiddenError extends UnauthorizedError {}

/** 404: no such session, task, lock holder, limit, endpoint... */
export class NotFoundError extends DroverError {}

/** 404 of kind `session-not-found`: the session ended (expired, deleted, or never was). */
export class SessionNotFoundError extends NotFoundError {}

/** 409: a write that lost (a compare-and-swap on a checkpoint, a step out of order, a duplicate registration). */
export class ConflictError extends DroverError {}

/** 409 of kind `lock-held` or `task-busy`: someone else holds the lock or runs the task. `holder` says who. */
export class LockHeldError extends ConflictError {
  get holder(): LockStatus | undefined {
    return this.problem.holder;
  }
}

/**
 * 409 of kind `fenced` or `lock-not-held`: the token or claim this request
 * wrote under no longer holds (its session expired, or another holder took
 * over). Stop, and do not write anything else under it.
 */
export class FencedError extends ConflictError {}

/**
 * 409 of kind `inbox-full`: the task's inbox holds as many signals not yet
 * consumed as it may (1,000); nothing was stored. Send again once its steps
 * consumed some.
 */
export class InboxFullError extends ConflictError {}

/**
 * 409 on a signal to a task that is finished (SUCCEEDED, DEAD, CANCELLED,
 * or a completed agent task): it takes no signal, nothing was stored.
 */
export class TaskFinishedError extends ConflictError {}

/** 410: the history a registry watch asked to resume from was compacted away. */
export class GoneError extends DroverError {}

/** 413: the body is over the route's limit. */
export class TooLargeError extends DroverError {}

/**
 * 413 of kind `stream-full`: the events would take the task's stream past
 * its caps (64 KiB an event, 768 KiB a write, 100,000 events, 16 MiB);
 * none of them was stored.
 */
export class StreamFullError extends TooLargeError {}

/** 429 of kind `queue-full`: the queue is at its maximum depth. */
export class QueueFullError extends DroverError {}

/** 429 of kind `rate-limited`: the tokens could not come within the wait (nothing was taken). */
export class RateLimitedError extends DroverError {}

/** 429 of kind `quota-full`: no slot of the quota freed within the wait. */
export class QuotaFullError extends DroverError {}

/** 503: etcd did not answer in time, or the server is not ready. */
export class UnavailableError extends DroverError {}

/** 503 of kind `breaker-open`: the circuit breaker refuses calls for now. */
export class BreakerOpenError extends UnavailableError {}

/** 507: etcd's database is past its high-water mark; submissions, checkpoints and signals are refused. */
export class StoreFullError extends DroverError {}

/** No answer: the server could not be reached, the connection broke, or the request timed out. */
export class ConnectionError extends DroverError {}

/** The reason a {@link Session}'s signal fires when the session is lost. */
export class SessionLostError extends DroverError {}

/** The reason a {@link Session}'s signal fires when the session was closed by its owner. */
export class SessionClosedError extends DroverError {}

/**
 * Throw this from a queue task handler for a failure that retrying cannot
 * help: the task goes to the dead-letter queue at once instead of being
 * retried.
 */
export class Permanent extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "Permanent";
  }
}

/** Is err a {@link Permanent} failure (also across copies of this package)? */
export function isPermanent(err: unknown): boolean {
  return err instanceof Permanent || (err instanceof Error && err.name === "Permanent");
}

type ErrorClass = new (message: string, opts: ConstructorParameters<typeof DroverError>[1]) => DroverError;

const byKind: Record<string, ErrorClass> = {
  "invalid-input": InvalidInputError,
  unauthorized: UnauthorizedError,
  forbidden: ForbiddenError,
  "session-not-found": SessionNotFoundError,
  "not-found": NotFoundError,
  "lock-held": LockHeldError,
  "task-busy": LockHeldError,
  fenced: FencedError,
  conflict: ConflictError,
  "inbox-full": InboxFullError,
  "stream-full": StreamFullError,
  "no-slot": ConflictError,
  compacted: GoneError,
  "too-large": TooLargeError,
  "queue-full": QueueFullError,
  "rate-limited": RateLimitedError,
  "quota-full": QuotaFullError,
  "breaker-open": BreakerOpenError,
  unavailable: UnavailableError,
  unready: UnavailableError,
  "store-full": StoreFullError,
};

const byStatus: Record<number, ErrorClass> = {
  400: InvalidInputError,
  401: UnauthorizedError,
  403: ForbiddenError,
  404: NotFoundError,
  409: ConflictError,
  410: GoneError,
  413: TooLargeError,
  415: InvalidInputError,
  422: InvalidInputError,
  503: UnavailableError,
  507: StoreFullError,
};

/** The error for an answer of status with the problem document given. */
export function errorFromProblem(status: number, problem: Problem, opts: { retryAfter?: number; request?: string } = {}): DroverError {
  const type = problem.type ?? "";
  const kind = type.startsWith(PROBLEM_BASE) ? type.slice(PROBLEM_BASE.length) : "";
  let cls: ErrorClass = byStatus[status] ?? DroverError;
  const k = byKind[kind];
  if (k) cls = k;
  // lock-not-held is a 404 on a lock's status and a 409 on a release or fenced write.
  if (kind === "lock-not-held") cls = status === 409 ? FencedError : NotFoundError;
  // A 404 for a session must stay a NotFoundError subclass even if a kind is unknown.
  if (status === 429 && !k) cls = DroverError;
  const detail = problem.detail || problem.title || `HTTP ${status}`;
  const message = opts.request ? `${opts.request}: ${detail}` : detail;
  return new cls(message, { status, problem, ...opts });
}
