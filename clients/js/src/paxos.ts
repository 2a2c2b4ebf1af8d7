/**
 * The client of drover's replicated lock service, `drover paxos serve`: a
 * group of three or five nodes that keep one lock table with Multi-Paxos
 * and serve it over a small REST API (`POST/GET/DELETE /locks/{id}`,
 * `POST /locks/{id}/renew`, `GET /locks`, `GET /status`).
 *
 * Any node serves any request. {@link PaxosLocks} sends each call to the
 * leader once an answer named it (the `Paxos-Leader` header), fails over to
 * the next node when one cannot be reached, is stopping (502, 503) or found
 * no quorum (504), and sends one `Idempotency-Key` with every attempt of a
 * call that changes state, so a call whose answer was lost is applied once.
 */
import { randomUUID } from "node:crypto";
import { ConnectionError, DroverError, FencedError, InvalidInputError, LockHeldError, NotFoundError, UnavailableError, errorFromProblem, type Problem } from "./errors.js";
import { fetchFailure, seg } from "./http.js";

/** The answer header that names the leader's `host:port`, as the group's `--peers` writes it. */
export const PAXOS_LEADER_HEADER = "Paxos-Leader";

/** The request header that names a request, so that sending it again applies it once. */
export const IDEMPOTENCY_KEY_HEADER = "Idempotency-Key";

/**
 * How long, in ms, the client does not follow an answer naming as the
 * leader an endpoint that failed it: the other nodes may name a leader this
 * client cannot reach, or one that just died, for a while.
 */
export const PAXOS_LEADER_RETRY_MS = 5_000;

/** The statuses after which a call moves on to the next node. */
const FAIL_OVER = new Set([502, 503, 504]);

/** A held lock, as the group shows it. */
export interface PaxosLock {
  /** The lock's id. */
  lockId: string;
  /** Who holds it: the owner the acquisition named (a release or renewal repeats it). */
  owner: string;
  /**
   * The fencing token: the log index of the grant. Every grant, of any
   * lock, has a greater one than the grants before it: pass it with every
   * write made under the lock, so a store can refuse a stale holder's.
   */
  token: number;
  /** When it was granted: Unix ms, by the leader's clock. */
  acquired: number;
  /** When it expires unless renewed: Unix ms, by the leader's clock. */
  expires: number;
  /** Seconds left, by the answering node's clock (in an acquisition's answer: the ttl asked for). */
  ttl: number;
  /** The JSON object stored with the grant, if the acquisition gave one. */
  holder?: Record<string, unknown>;
}

/** A renewal's answer: the same token, a later expiry. */
export type PaxosRenewal = Omit<PaxosLock, "acquired" | "holder">;

/** Options of every call. */
export interface PaxosCallOptions {
  /** Gives up on the call when it fires (the call rejects with its reason). */
  signal?: AbortSignal;
  /** Bounds the call, across every node it tries, in ms (default: the client's `timeoutMs`; 0: no bound). */
  timeoutMs?: number;
  /**
   * The `Idempotency-Key` of a call that changes state (default: a new
   * random one per call, the same on every node the call tries). Pass the
   * `idempotencyKey` of a {@link PaxosTimeoutError} or
   * {@link PaxosUnreachableError} to repeat that call: the group applies it
   * once and answers with the first answer, within five minutes of log
   * time. Reads take none.
   */
  idempotencyKey?: string;
}

/** What {@link PaxosLocks.acquire} asks for. */
export interface PaxosAcquireOptions extends PaxosCallOptions {
  /** Names the holder; the release and renewals must repeat it (at most 1024 bytes). */
  owner: string;
  /** Seconds the grant lasts unless renewed: above 0, at most 86400; fractions allowed. */
  ttl: number;
  /** A JSON object stored with the grant and shown to whoever reads the lock (at most 4096 bytes). */
  holder?: Record<string, unknown>;
}

/** How to reach a group. */
export interface PaxosLocksOptions {
  /** Bounds each call, across every node it tries, in ms (default 30000; 0: no bound). */
  timeoutMs?: number;
  /** The fetch implementation to use (default the global `fetch`). */
  fetch?: typeof fetch;
  /** An undici `Dispatcher` handed to `fetch` with every request (a custom CA, a proxy). */
  dispatcher?: unknown;
}

/** One member of the group, as a node sees it (`match`, `lag` and `last_seen` are known on the leader only). */
export interface PaxosMemberStatus {
  id: number;
  addr?: string;
  /** The highest slot the member is known to have accepted or applied. */
  match: number;
  /** The leader's commit minus `match`. */
  lag: number;
  /** When the leader last heard from it (RFC 3339). */
  last_seen?: string;
}

/** A node's own view of the group (`GET /status`). */
export interface PaxosNodeStatus {
  /** This node's id. */
  id: number;
  /** "leader", "follower", "candidate" or "removed". */
  role: string;
  /** The node this one follows (itself when leading); valid when `has_leader`. */
  leader: number;
  has_leader: boolean;
  /** The leader's address, when known. */
  leader_addr?: string;
  /** The highest ballot this node promised. */
  ballot: { r: number; n: number };
  commit: number;
  applied: number;
  snapshot_index: number;
  snapshots_sent: number;
  snapshots_installed: number;
  elections_started: number;
  timer_restarts: number;
  loop_stalls: number;
  longest_round_ms: number;
  /** The configuration in effect at `applied`. */
  members: PaxosMemberStatus[];
  /** Why the node no longer runs, on a 503 answer ({@link PaxosLocks.statusAll} only). */
  error?: string;
}

/** One node's answer to {@link PaxosLocks.statusAll}. */
export interface PaxosEndpointStatus {
  /** The node's base URL. */
  endpoint: string;
  /** Its view, when it answered 200. */
  status?: PaxosNodeStatus;
  /** Why it gave no view. */
  error?: DroverError;
}

/**
 * 409 on an acquisition: another owner (or this one, under an earlier
 * grant) holds the lock. `current` says who, with which token and until
 * when (the `holder` of a drover server's {@link LockHeldError} is
 * undefined here).
 */
export class PaxosLockHeldError extends LockHeldError {
  /** The lock asked for. */
  readonly lock: string;
  /** Its holder. */
  readonly current: PaxosLock;

  constructor(lock: string, current: PaxosLock, opts: ConstructorParameters<typeof DroverError>[1] = {}) {
    super(
      `lock "${lock}" is held by owner "${current.owner}" with token ${current.token}, for ${current.ttl} s more unless renewed: ` +
        "try again once it is released or expires (with a bounded number of attempts), or use another lock",
      opts,
    );
    this.lock = lock;
    this.current = current;
  }
}

/**
 * 409 on a release or renewal: the owner and token given do not hold the
 * lock (it expired, was released, or another grant replaced it). Stop the
 * work done under the token and write nothing more under it.
 */
export class PaxosNotHeldError extends FencedError {
  /** The lock named. */
  readonly lock: string;
  /** The owner named. */
  readonly owner: string;
  /** The token named. */
  readonly token: number;
  /** The lock's holder when someone holds it, undefined when it is free. */
  readonly current?: PaxosLock;

  constructor(lock: string, owner: string, token: number, current: PaxosLock | undefined, opts: ConstructorParameters<typeof DroverError>[1] = {}) {
    const now = current ? `owner "${current.owner}" holds it with token ${current.token}` : "it is free (released, or it expired)";
    super(
      `lock "${lock}" is not held by owner "${owner}" with token ${token}: ${now}: ` +
        `stop the work done under token ${token} and write nothing more under it; acquire the lock again to go on`,
      opts,
    );
    this.lock = lock;
    this.owner = owner;
    this.token = token;
    if (current) this.current = current;
  }
}

/**
 * 504 from every node that answered: no quorum applied the request within
 * the nodes' `--request-timeout`. A majority of the group is down or cut
 * off, or it is electing a leader. The request may still be applied:
 * repeat it with `{ idempotencyKey: err.idempotencyKey }` to learn its
 * outcome without applying it twice.
 */
export class PaxosTimeoutError extends UnavailableError {
  /** The key the call sent (none for a read). */
  readonly idempotencyKey?: string;

  constructor(message: string, opts: ConstructorParameters<typeof DroverError>[1] & { idempotencyKey?: string } = {}) {
    super(message, opts);
    if (opts.idempotencyKey !== undefined) this.idempotencyKey = opts.idempotencyKey;
  }
}

/**
 * No node answered: each could not be reached, broke the connection, was
 * stopping (502, 503), or the call's time ran out. `attempts` says what
 * each node did. A request may have been applied by a node whose answer
 * was lost: repeat it with `{ idempotencyKey: err.idempotencyKey }`.
 */
export class PaxosUnreachableError extends ConnectionError {
  /** What happened at each node tried, in order. */
  readonly attempts: string[];
  /** The key the call sent (none for a read). */
  readonly idempotencyKey?: string;

  constructor(message: string, attempts: string[], opts: ConstructorParameters<typeof DroverError>[1] & { idempotencyKey?: string } = {}) {
    super(message, opts);
    this.attempts = attempts;
    if (opts.idempotencyKey !== undefined) this.idempotencyKey = opts.idempotencyKey;
  }
}

/**
 * Checks an endpoint (`host:port`, or an http or https URL of one, with no
 * path) and returns its base URL, as the Go client's `ParseEndpoint` does:
 * `127.0.0.1:7100` is `http://127.0.0.1:7100`. Throws a TypeError otherwise.
 */
export function parsePaxosEndpoint(endpoint: string): string {
  const e = endpoint.trim();
  const raw = e.includes("://") ? e : `http://${e}`;
  const m = /^(https?):\/\/(\[[0-9A-Fa-f:.]+\]|[^\s/?#@:[\]]+):(\d{1,5})\/?$/i.exec(raw);
  if (!m || Number(m[3]) > 65535) {
    throw new TypeError(`paxos endpoint "${endpoint}": want host:port or http(s)://host:port with no path, such as 127.0.0.1:7100`);
  }
  return `${m[1]!.toLowerCase()}://${m[2]}:${m[3]}`;
}

/** A node's answer. */
interface Answer {
  endpoint: string;
  status: number;
  text: string;
  /** The Paxos-Leader header ("" without one). */
  leader: string;
  /** `METHOD /path`. */
  request: string;
}

/** The `error` of an answer's body, else its text. */
function answerMessage(a: Answer): string {
  try {
    const e = JSON.parse(a.text) as { error?: unknown };
    if (e && typeof e.error === "string" && e.error) return e.error;
  } catch {
    /* not JSON */
  }
  return a.text.trim() || `HTTP ${a.status}`;
}

/** The answer's JSON body. */
function decode<T>(a: Answer): T {
  try {
    return JSON.parse(a.text) as T;
  } catch (err) {
    throw new DroverError(`${a.request}: ${a.endpoint} answered ${a.status} with a body that is not the lock service's JSON: is this endpoint a drover paxos node?`, {
      status: a.status,
      request: a.request,
      cause: err,
    });
  }
}

/** The error of an answer the call has no better error for. */
function answerError(a: Answer, key?: string): DroverError {
  const msg = answerMessage(a);
  const problem: Problem = { status: a.status, detail: msg };
  const opts = { status: a.status, problem, request: a.request };
  const said = `${a.request}: ${a.endpoint} answered ${a.status}: ${msg}`;
  switch (a.status) {
    case 400:
      return new InvalidInputError(`${said}: fix the request (nothing was applied)`, opts);
    case 422:
      return new InvalidInputError(`${said} (nothing was applied)`, opts);
    case 504:
      return new PaxosTimeoutError(
        `${said}: no quorum applied it in time (a majority of the group is down or cut off, or a leader is being elected); ` +
          (key ? "it may still be applied: repeat the call with the error's idempotencyKey to learn its outcome" : "try again once the group has a majority"),
        { ...opts, ...(key ? { idempotencyKey: key } : {}) },
      );
  }
  return errorFromProblem(a.status, { status: a.status, detail: `${a.endpoint} answered ${a.status}: ${msg}` }, { request: a.request });
}

/** An attempt that got no answer within its share of the call's time. */
class ShareSpent extends Error {}

const lockPath = (lock: string) => `/locks/${seg(lock)}`;

/**
 * A client of a `drover paxos serve` group: fenced locks with a TTL,
 * replicated by Multi-Paxos. It mirrors the Go `client.Client` (package `paxos/client`):
 *
 * - each call goes to the leader once an answer named it (`Paxos-Leader`,
 *   when that address is one of the endpoints as written), else to the node
 *   that answered last; a follower would forward it, two hops more;
 * - it moves on to the next node when one cannot be reached, is stopping
 *   (502, 503) or found no quorum (504), never on a 4xx answer (any node
 *   would give it); each attempt but the last gets an equal share of the
 *   time left, so a node that hangs costs its share only;
 * - it does not follow an answer naming as the leader an endpoint that
 *   failed it in the last 5 s;
 * - a call that changes state sends one `Idempotency-Key`, the same on
 *   every node tried: a request whose answer was lost is applied once.
 *
 * Errors: {@link PaxosLockHeldError} (held), {@link PaxosNotHeldError}
 * (release or renewal with an owner and token that do not hold the lock),
 * {@link NotFoundError} (a free lock's `get`), {@link InvalidInputError}
 * (400, 422), {@link PaxosTimeoutError} (504 from every node that answered),
 * {@link PaxosUnreachableError} (no answer).
 *
 * ```ts
 * import { PaxosLocks, PaxosLockHeldError } from "@droverhq/client";
 * const locks = new PaxosLocks(["127.0.0.1:7100", "127.0.0.1:7101", "127.0.0.1:7102"]);
 * try {
 *   const lock = await locks.acquire("nightly-report", { owner: "worker-7", ttl: 30 });
 *   try {
 *     await writeReport({ fencingToken: lock.token });
 *   } finally {
 *     await locks.release("nightly-report", "worker-7", lock.token);
 *   }
 * } catch (err) {
 *   if (!(err instanceof PaxosLockHeldError)) throw err;
 *   console.log(`held by ${err.current.owner} for ${err.current.ttl} s more`);
 * }
 * ```
 *
 * Cheap to create, holds no connection beyond fetch's pool; calls may run
 * concurrently.
 */
export class PaxosLocks {
  /** The nodes' base URLs, in the order given. */
  readonly endpoints: readonly string[];
  /** The default bound of each call, in ms (0: none). */
  readonly timeoutMs: number;
  /** Each endpoint's host:port, to match the Paxos-Leader header. */
  private readonly hosts: string[];
  /** When each endpoint last failed a call (Date.now()). */
  private readonly failedAt: number[];
  private readonly fetchImpl: typeof fetch;
  private readonly dispatcher: unknown;
  /** The endpoint the next call tries first. */
  private next = 0;

  /**
   * A client of the nodes at `endpoints` (`host:port` or `http(s)://host:port`,
   * an array or a comma-separated string). Contacts nothing.
   */
  constructor(endpoints: readonly string[] | string, opts: PaxosLocksOptions = {}) {
    const list = typeof endpoints === "string" ? endpoints.split(",").filter((e) => e.trim() !== "") : [...endpoints];
    if (list.length === 0) throw new TypeError("PaxosLocks needs at least one endpoint, such as 127.0.0.1:7100");
    this.endpoints = list.map(parsePaxosEndpoint);
    this.hosts = this.endpoints.map((u) => u.slice(u.indexOf("://") + 3));
    this.failedAt = this.endpoints.map(() => -Infinity);
    this.timeoutMs = opts.timeoutMs ?? 30_000;
    this.fetchImpl = opts.fetch ?? globalThis.fetch.bind(globalThis);
    this.dispatcher = opts.dispatcher;
  }

  /** The endpoint the next call tries first: the leader, once an answer named it. */
  get nextEndpoint(): string {
    return this.endpoints[this.next]!;
  }

  /**
   * Makes one attempt to take `lock` for `ttl` seconds. Resolves to the
   * grant; throws {@link PaxosLockHeldError} when it is held (by anyone,
   * this owner included).
   */
  async acquire(lock: string, opts: PaxosAcquireOptions): Promise<PaxosLock> {
    const body: Record<string, unknown> = { owner: opts.owner, ttl: opts.ttl };
    if (opts.holder !== undefined) body.holder = opts.holder;
    const { ans, key } = await this.call("POST", lockPath(lock), body, opts);
    if (ans.status === 200) {
      const r = decode<{ token: number; details: Omit<PaxosLock, "token" | "ttl"> }>(ans);
      const d = r.details;
      const out: PaxosLock = { lockId: lock, owner: d.owner, token: r.token, acquired: d.acquired, expires: d.expires, ttl: opts.ttl };
      if (d.holder) out.holder = d.holder;
      return out;
    }
    if (ans.status === 409) {
      const r = decode<{ error?: string; holder: PaxosLock }>(ans);
      throw new PaxosLockHeldError(lock, r.holder, { status: 409, problem: { status: 409, detail: r.error }, request: ans.request });
    }
    throw answerError(ans, key);
  }

  /** Reads `lock` through the log (it sees every write that finished before). Throws {@link NotFoundError} when it is free. */
  async get(lock: string, opts: PaxosCallOptions = {}): Promise<PaxosLock> {
    const { ans } = await this.call("GET", lockPath(lock), undefined, opts);
    if (ans.status === 200) return decode<PaxosLock>(ans);
    if (ans.status === 404 && answerMessage(ans).startsWith("Lock not found")) {
      throw new NotFoundError(`lock "${lock}" is free (never acquired, released, or expired): acquire it to hold it`, {
        status: 404,
        problem: { status: 404, detail: answerMessage(ans) },
        request: ans.request,
      });
    }
    throw answerError(ans);
  }

  /**
   * Frees `lock` if `owner` holds it with `token`; otherwise throws
   * {@link PaxosNotHeldError} and nothing changes (a stale holder cannot
   * free the next holder's grant).
   */
  async release(lock: string, owner: string, token: number, opts: PaxosCallOptions = {}): Promise<void> {
    const { ans, key } = await this.call("DELETE", lockPath(lock), { owner, token }, opts);
    if (ans.status === 200) return;
    if (ans.status === 409) throw this.notHeld(ans, lock, owner, token);
    throw answerError(ans, key);
  }

  /**
   * Extends `lock` to `ttl` seconds from now (the leader's clock) if `owner`
   * holds it with `token`: the same token, a later expiry. Otherwise throws
   * {@link PaxosNotHeldError}: the lock was lost, stop the work under it.
   */
  async renew(lock: string, owner: string, token: number, ttl: number, opts: PaxosCallOptions = {}): Promise<PaxosRenewal> {
    const { ans, key } = await this.call("POST", `${lockPath(lock)}/renew`, { owner, token, ttl }, opts);
    if (ans.status === 200) {
      const r = decode<{ expires: number; token: number }>(ans);
      return { lockId: lock, owner, token: r.token, expires: r.expires, ttl };
    }
    if (ans.status === 409) throw this.notHeld(ans, lock, owner, token);
    throw answerError(ans, key);
  }

  /** Every held lock, ordered by id. */
  async list(opts: PaxosCallOptions = {}): Promise<PaxosLock[]> {
    const { ans } = await this.call("GET", "/locks", undefined, opts);
    if (ans.status !== 200) throw answerError(ans);
    return decode<{ data: PaxosLock[] | null }>(ans).data ?? [];
  }

  /** The view of the first node that answers (its own, without a round through the log). */
  async status(opts: PaxosCallOptions = {}): Promise<PaxosNodeStatus> {
    const { ans } = await this.call("GET", "/status", undefined, opts);
    if (ans.status !== 200) throw answerError(ans);
    return decode<PaxosNodeStatus>(ans);
  }

  /** Asks every endpoint at once for its view; never throws for a node that does not answer. */
  async statusAll(opts: Omit<PaxosCallOptions, "idempotencyKey"> = {}): Promise<PaxosEndpointStatus[]> {
    const budget = (opts.timeoutMs ?? this.timeoutMs) || Infinity;
    return Promise.all(
      this.endpoints.map(async (endpoint, i): Promise<PaxosEndpointStatus> => {
        try {
          const ans = await this.send(i, "GET", "/status", undefined, undefined, budget, opts.signal);
          if (ans.status === 200) return { endpoint, status: decode<PaxosNodeStatus>(ans) };
          return { endpoint, error: answerError(ans) };
        } catch (err) {
          if (opts.signal?.aborted) throw opts.signal.reason;
          return { endpoint, error: err instanceof DroverError ? err : new ConnectionError((err as Error).message, { request: "GET /status", cause: err }) };
        }
      }),
    );
  }

  /** The PaxosNotHeldError of a 409 on a release or renewal. */
  private notHeld(ans: Answer, lock: string, owner: string, token: number): PaxosNotHeldError {
    const r = decode<{ error?: string; holder?: PaxosLock }>(ans);
    return new PaxosNotHeldError(lock, owner, token, r.holder ?? undefined, { status: 409, problem: { status: 409, detail: r.error }, request: ans.request });
  }

  /**
   * Sends a request, failing over from endpoint to endpoint, starting with
   * {@link nextEndpoint}. Resolves to the first answer that is not a 502,
   * 503 or 504 (and moves {@link nextEndpoint} to the leader it names, or
   * to the node that answered); to a 504 when every node failed and one of
   * them answered 504; else throws {@link PaxosUnreachableError}.
   */
  private async call(method: string, path: string, body: unknown, opts: PaxosCallOptions): Promise<{ ans: Answer; key?: string }> {
    const request = `${method} ${path}`;
    const key = method === "GET" ? undefined : opts.idempotencyKey || randomUUID();
    const keyed = key ? { idempotencyKey: key } : {};
    const timeoutMs = opts.timeoutMs ?? this.timeoutMs;
    const deadline = timeoutMs > 0 ? Date.now() + timeoutMs : Infinity;
    const n = this.endpoints.length;
    const start = this.next;
    const attempts: string[] = [];
    let timedOut: Answer | undefined;
    for (let i = 0; i < n; i++) {
      const e = (start + i) % n;
      const left = deadline - Date.now();
      let ans: Answer | undefined;
      let outOfTime = false;
      try {
        ans = await this.send(e, method, path, body, key, i < n - 1 ? left / (n - i) : left, opts.signal);
        if (!FAIL_OVER.has(ans.status)) {
          this.next = this.leaderOr(ans.leader, e);
          return { ans, key };
        }
        attempts.push(`${ans.endpoint} answered ${ans.status}: ${answerMessage(ans)}`);
      } catch (err) {
        if (opts.signal?.aborted) throw opts.signal.reason;
        attempts.push((err as Error).message);
        // The last attempt's share is all the time left (a timer may fire a ms early).
        outOfTime = i === n - 1 && err instanceof ShareSpent;
      }
      if (ans?.status === 504) timedOut = ans;
      if (outOfTime || Date.now() >= deadline) {
        // A node that found no quorum says more than the time running out.
        if (timedOut) return { ans: timedOut, key };
        throw new PaxosUnreachableError(
          `${request}: no node answered within ${timeoutMs} ms (${attempts.join("; ")}): check that a majority of the group runs, or allow more time (timeoutMs)` +
            (key ? "; the request may have been applied: repeat it with the error's idempotencyKey" : ""),
          attempts,
          { request, ...keyed },
        );
      }
      this.failedAt[e] = Date.now();
    }
    if (timedOut) return { ans: timedOut, key };
    throw new PaxosUnreachableError(
      `${request}: no node of the group answered (${attempts.join("; ")}): check that the nodes run (drover paxos status --endpoints ...) ` +
        "and that these endpoints reach them" +
        (key ? "; a node may have applied the request before its answer was lost: repeat it with the error's idempotencyKey" : ""),
      attempts,
      { request, ...keyed },
    );
  }

  /**
   * The index of the endpoint at `leader` (host:port, as the Paxos-Leader
   * header names it), or `e` if none is, or if that endpoint failed a call
   * in the last {@link PAXOS_LEADER_RETRY_MS}.
   */
  private leaderOr(leader: string, e: number): number {
    if (!leader) return e;
    const i = this.hosts.indexOf(leader);
    if (i < 0 || Date.now() - this.failedAt[i]! < PAXOS_LEADER_RETRY_MS) return e;
    return i;
  }

  /** Makes one request to endpoint e within budgetMs; throws an Error saying why when no answer came. */
  private async send(e: number, method: string, path: string, body: unknown, key: string | undefined, budgetMs: number, signal?: AbortSignal): Promise<Answer> {
    const endpoint = this.endpoints[e]!;
    const headers: Record<string, string> = { Accept: "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    if (key) headers[IDEMPOTENCY_KEY_HEADER] = key;
    // A timer of its own, not AbortSignal.timeout's: that one does not keep
    // the process alive while the call waits.
    const share = Number.isFinite(budgetMs) ? new AbortController() : undefined;
    const timer = share && setTimeout(() => share.abort(new Error("share of the call's time spent")), Math.max(1, Math.floor(budgetMs)));
    const timeout = share?.signal;
    const signals = [signal, timeout].filter((s): s is AbortSignal => s !== undefined);
    const init: Record<string, unknown> = {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: signals.length > 1 ? AbortSignal.any(signals) : signals[0],
    };
    if (this.dispatcher) init.dispatcher = this.dispatcher;
    try {
      const res = await this.fetchImpl(endpoint + path, init as RequestInit);
      const text = await res.text();
      return { endpoint, status: res.status, text, leader: res.headers.get(PAXOS_LEADER_HEADER) ?? "", request: `${method} ${path}` };
    } catch (err) {
      if (signal?.aborted) throw signal.reason;
      if (timeout?.aborted) throw new ShareSpent(`${method} ${endpoint}${path}: no answer within ${Math.round(budgetMs)} ms`, { cause: err });
      throw new Error(`${method} ${endpoint}${path}: ${fetchFailure(err)}`, { cause: err });
    } finally {
      clearTimeout(timer);
    }
  }
}
