// LLM token budgets: a provider key's requests and tokens per window,
// shared by tenants; reserve before a model call, settle after it.
import { DroverError, NotFoundError, InvalidInputError } from "./errors.js";
import { seg, type Transport } from "./http.js";
import type { QueueTask } from "./queue.js";

/** A budget's limits, as set. */
export interface BudgetConfig {
  /** The most reservations per window (0 or absent: no limit). */
  requests?: number;
  /** The most tokens reserved or used per window (0 or absent: no limit). Requests, tokens or both are set. */
  tokens?: number;
  /** The window, 1 to 86400 seconds (default 60). */
  window_seconds?: number;
  /** The most tokens a tenant may take per window, by tenant. */
  caps?: Record<string, number>;
  /** Tenants' weights (above 0, at most 1000; a tenant not named weighs 1): a saturated budget is shared in proportion. */
  weights?: Record<string, number>;
  /** Default estimates by task type (1 to `tokens`): a reservation, or queue task, that names its task type and no estimate holds its type's. */
  estimates?: Record<string, number>;
}

/** One tenant's part of a budget's current window. */
export interface BudgetTenantUsage {
  /** The tenant (empty: work that named none). */
  tenant: string;
  /** Its reservations in this window. */
  requests: number;
  /** Its tokens settled in this window. */
  used: number;
  /** Its live reservations' estimates. */
  reserved: number;
}

/** A budget with its use of the current window. */
export interface BudgetUsage {
  key: string;
  requests: number;
  tokens: number;
  window_seconds: number;
  caps?: Record<string, number>;
  weights?: Record<string, number>;
  estimates?: Record<string, number>;
  /** When the current window began (RFC 3339). */
  window_start: string;
  /** Reservations made in this window. */
  requests_used: number;
  /** Tokens settled in this window, with the provider's correction. */
  used: number;
  /** Estimates of the live reservations of this window. */
  reserved: number;
  /** Tokens a reservation may still take in this window (-1: tokens are not limited). */
  remaining: number;
  /** Unsettled reservations. */
  live: number;
  /** Each tenant's part of this window. */
  tenant_usage: BudgetTenantUsage[] | null;
}

/** A held reservation: settle it with `id`. */
export interface BudgetReservation {
  id: string;
  budget: string;
  tenant: string;
  /** The task type it was made for, if any. */
  task_type?: string;
  /** Tokens held. */
  estimate: number;
  /** The window the tokens belong to. */
  window: number;
  /** The most tokens its settle may report. */
  settle_bound: number;
  /** The etcd lease it lives under (hex): when it ends unsettled, the reservation is released. */
  lease: string;
  own_lease: boolean;
  reserved_at: string;
  /** When its own lease ends: a settle from then on is a 409 and counts nothing. */
  expires_at?: string;
}

/** What a settle did. */
export interface BudgetSettlement {
  id: string;
  budget: string;
  tenant: string;
  estimate: number;
  actual: number;
  /** actual - estimate: below 0 refunded, above 0 charged. */
  difference: number;
  /** Tokens the provider's headers said were gone beyond drover's count, counted as used until the provider's reset. */
  corrected: number;
}

/** The provider headers a settle reads (OpenAI's names; others send the same). */
export const BUDGET_HEADERS = ["x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"] as const;

/** A provider's response headers: a fetch `Headers`, or a plain object. */
export type ProviderHeaders = Headers | Record<string, string | string[] | undefined>;

/** The provider's rate-limit headers of h (others dropped), lower-cased. */
export function providerHeaders(h: ProviderHeaders | undefined): Record<string, string> | undefined {
  if (!h) return undefined;
  const out: Record<string, string> = {};
  const get = (name: string): string | undefined => {
    if (typeof (h as Headers).get === "function") return (h as Headers).get(name) ?? undefined;
    for (const [k, v] of Object.entries(h as Record<string, string | string[] | undefined>)) {
      if (k.toLowerCase() === name && v !== undefined) return Array.isArray(v) ? v[0] : v;
    }
    return undefined;
  };
  for (const name of BUDGET_HEADERS) {
    const v = get(name);
    if (v !== undefined) out[name] = v;
  }
  return Object.keys(out).length ? out : undefined;
}

/**
 * LLM token budgets: requests and tokens per window under a key such as
 * `openai/gpt-4.1/key-prod`, shared by tenants by weight, with caps.
 * Reserve an estimate before a model call, settle with what it used.
 *
 * ```ts
 * await drover.budgets.set("openai/gpt-4.1/key-prod", { tokens: 30000, requests: 500, window_seconds: 60 });
 * const r = await drover.budgets.reserve("openai/gpt-4.1/key-prod", { tenant: "acme", estimate: 1200 });
 * const resp = await fetch(modelURL, ...);
 * await drover.budgets.settle(r, (await resp.json()).usage.total_tokens, resp.headers);
 * ```
 */
export class Budgets {
  constructor(private readonly t: Transport) {}

  /** Every budget with its current window's use. */
  async list(): Promise<BudgetUsage[]> {
    return (await this.t.get<{ data: BudgetUsage[] | null }>("/v1/budgets")).data ?? [];
  }

  /** One budget: limits, used, reserved, remaining, per tenant. {@link NotFoundError} when not configured. */
  get(key: string): Promise<BudgetUsage> {
    return this.t.get<BudgetUsage>(`/v1/budgets/${seg(key)}`);
  }

  /** Sets (or creates) a budget (admin role); the current window's counters and reservations stay. */
  set(key: string, config: BudgetConfig): Promise<BudgetUsage> {
    return this.t.put<BudgetUsage>(`/v1/budgets/${seg(key)}`, config);
  }

  /** Deletes a budget with its counters and reservations (admin role). */
  async delete(key: string): Promise<void> {
    await this.t.delete(`/v1/budgets/${seg(key)}`);
  }

  /**
   * Holds `estimate` tokens and one request of the budget for `tenant`,
   * for `ttlSeconds` (1 to 3600, default 60) unless settled: then it is
   * released. When the budget has no room for the tenant now, a
   * {@link DroverError} of status 429 whose `retryAfter` is the seconds
   * until the window turns (nothing is held). Without `estimate` (or 0),
   * `taskType` holds the budget's default estimate for that type. Never
   * sent twice after a connection error (a lost answer could have reserved).
   */
  reserve(key: string, opts: { tenant?: string; estimate?: number; taskType?: string; ttlSeconds?: number; signal?: AbortSignal }): Promise<BudgetReservation> {
    const body = {
      ...(opts.estimate ? { estimate: opts.estimate } : {}),
      ...(opts.taskType ? { task_type: opts.taskType } : {}),
      ...(opts.tenant ? { tenant: opts.tenant } : {}),
      ...(opts.ttlSeconds ? { ttl_seconds: opts.ttlSeconds } : {}),
    };
    return this.t.post<BudgetReservation>(`/v1/budgets/${seg(key)}/reserve`, body, { retry: false, signal: opts.signal });
  }

  /**
   * Settles a reservation with the tokens the call actually used: the
   * difference to its estimate is refunded or charged. `headers`, the
   * provider's response headers, may carry `x-ratelimit-remaining-tokens`
   * and `x-ratelimit-reset-tokens`: when the provider says fewer remain,
   * the difference counts as used until its reset. A {@link ConflictError}
   * (409) when the reservation is unknown, settled, or was released.
   */
  settle(reservation: Pick<BudgetReservation, "id" | "budget">, actual: number, headers?: ProviderHeaders): Promise<BudgetSettlement> {
    const h = providerHeaders(headers);
    return this.t.post<BudgetSettlement>(`/v1/budgets/${seg(reservation.budget)}/reservations/${seg(reservation.id)}/settle`, { actual, ...(h ? { headers: h } : {}) }, { retry: false });
  }
}

/** How long a task waits between tries when its budget is not configured or its estimate can never fit (as the Go gate). */
export const BUDGET_UNWAITABLE_SECONDS = 30;

/** The longest deferral an outcome may ask for: the server refuses the whole batch of outcomes over it. */
export const MAX_DEFER_SECONDS = 86400;

/** How long a task waits for its budget after an answer with `retryAfter`: at least a second, at most a day, whatever a proxy's Retry-After says. */
export function deferSeconds(retryAfter: number | undefined): number {
  const ra = retryAfter ?? 1;
  return ra < MAX_DEFER_SECONDS ? Math.max(1, ra) : MAX_DEFER_SECONDS;
}

/**
 * Why a task waits for budget `key`, as its deferral records it and a Go
 * worker's budget gate says it: `budget KEY: why` (a 429's detail says
 * that already). `tasks get` reads it back as the task's `budget_wait`.
 */
export function budgetWaitReason(key: string, why: string): string {
  const prefix = `budget ${key}: `;
  let reason = why.startsWith(prefix) ? why : prefix + why;
  // The server keeps 1024 bytes of a reason at most.
  while (Buffer.byteLength(reason) > 1024) reason = reason.slice(0, -1);
  return reason;
}

/** Why a task waits for budget `key` that nobody configured (a 404), as the Go gate says it. */
export function budgetNotConfigured(key: string): string {
  return `not configured (drover budgets set ${key} --tokens N)`;
}

/** The budget a claimed task spends: its metadata's `budget`, `estimated_tokens` (without it, the budget's default for the task's type) and `tenant`. */
export function taskBudget(task: QueueTask): { key: string; tenant: string; estimate: number; taskType: string } | undefined {
  const m = task.metadata as QueueTask["metadata"] & { budget?: string; estimated_tokens?: number };
  if (!m?.budget) return undefined;
  return { key: m.budget, tenant: m.tenant ?? "", estimate: m.estimated_tokens ?? 0, taskType: task.task_type ?? "" };
}

/** The most tokens a settle counts, a budget's `MaxTokens` on the server: a result's usage counting more is not read. */
export const MAX_USAGE_TOKENS = 1_000_000_000;

/** The largest result {@link resultUsage} reads: 256 KiB of JSON, the most a task keeps. */
const MAX_USAGE_RESULT = 256 << 10;

/** What {@link resultUsage} reads of a result: its tokens, or the field of its usage that is not a number of tokens. */
export type ResultUsage = { tokens: number } | { field: string; reason: string };

/** The usage counts {@link resultUsage} reads, in the order it tries them. */
const USAGE_FIELDS = ["total_tokens", "prompt_tokens", "completion_tokens", "input_tokens", "output_tokens", "cache_creation_input_tokens"] as const;

/**
 * The tokens a task's result says its model call used, as the Go worker's
 * budget gate reads them (`budget.ResultUsage`): the result, as JSON, is
 * an object of at most 256 KiB whose `usage` object has `total_tokens`
 * (OpenAI), else `prompt_tokens` plus `completion_tokens`, else
 * Anthropic's `input_tokens` plus `output_tokens` plus
 * `cache_creation_input_tokens` (its rate limit counts cache writes;
 * `cache_read_input_tokens` are not added). Undefined when the result
 * says nothing of it; `{ field, reason }` when a count is not a whole
 * number from 0 to {@link MAX_USAGE_TOKENS} (`field` is `usage` when
 * one is not a number at all). The sum counts at most MAX_USAGE_TOKENS.
 */
export function resultUsage(value: unknown): ResultUsage | undefined {
  if (value === null || typeof value !== "object" || Array.isArray(value) || !("usage" in value)) return undefined;
  let usage: unknown;
  try {
    // What the task keeps is the result's JSON: read that (toJSON, NaN as null...).
    const text = JSON.stringify(value);
    if (text === undefined || Buffer.byteLength(text) > MAX_USAGE_RESULT) return undefined;
    usage = (JSON.parse(text) as { usage?: unknown }).usage;
  } catch {
    return undefined; // not JSON (a BigInt, a cycle...): the task fails
  }
  if (usage === null || typeof usage !== "object" || Array.isArray(usage)) return undefined; // "usage" of another kind
  const u = usage as Record<string, unknown>;
  const counts: Record<string, number | undefined> = {};
  for (const f of USAGE_FIELDS) {
    const v = u[f];
    if (v === undefined || v === null) continue;
    // As JSON, only an integer a 64-bit one holds is a whole number (as in Go).
    if (typeof v !== "number" || !Number.isInteger(v) || Math.abs(v) >= 2 ** 63) return { field: "usage", reason: `its token counts must be whole numbers: ${f} is ${JSON.stringify(v)}` };
    counts[f] = v;
  }
  const shapes = [["total_tokens"], ["prompt_tokens", "completion_tokens"], ["input_tokens", "output_tokens", "cache_creation_input_tokens"]];
  for (const shape of shapes) {
    // A shape is named by its first two counts (cache writes alone are not a usage).
    if (shape.slice(0, 2).every((f) => counts[f] === undefined)) continue;
    let sum = 0;
    for (const f of shape) {
      const v = counts[f];
      if (v === undefined) continue;
      if (v < 0 || v > MAX_USAGE_TOKENS) return { field: `usage.${f}`, reason: `must be between 0 and ${MAX_USAGE_TOKENS}, not ${v}` };
      sum += v;
    }
    return { tokens: Math.min(sum, MAX_USAGE_TOKENS) };
  }
  return undefined;
}

/**
 * A task's hold on its budget in a queue worker: reserved before the
 * handler runs, settled after it with what the handler reported through
 * `ctx.usage(tokens, headers)`, else the usage of the result it returned
 * ({@link resultUsage}), else the estimate.
 */
export class TaskBudgetHold {
  private tokens?: number;
  private resultTokens?: number;
  private headers?: ProviderHeaders;
  private settled = false;

  private constructor(private readonly budgets: Budgets, readonly reservation: BudgetReservation) {}

  /**
   * Reserves the task's estimate: the hold, undefined for a task without a
   * budget, or `{ deferSeconds, reason }` when the task must wait, on a
   * 429 or a 503, or for a budget not configured (404) or an estimate it
   * cannot hold (400): the worker hands it back unrun for that long, its
   * attempt not counted, with the reason (`budget KEY: why`).
   */
  static async reserve(budgets: Budgets, task: QueueTask, ttlSeconds: number): Promise<TaskBudgetHold | { deferSeconds: number; reason: string } | undefined> {
    const b = taskBudget(task);
    if (!b) return undefined;
    try {
      return new TaskBudgetHold(budgets, await budgets.reserve(b.key, { tenant: b.tenant, estimate: b.estimate, taskType: b.taskType, ttlSeconds }));
    } catch (err) {
      // 429: no room yet; 503: the server cannot decide now (its clock
      // is behind the budget's counters, or etcd is slow). Both wait.
      if (err instanceof DroverError && (err.status === 429 || err.status === 503)) return { deferSeconds: deferSeconds(err.retryAfter), reason: budgetWaitReason(b.key, err.problem.detail || err.message) };
      if (err instanceof NotFoundError) return { deferSeconds: BUDGET_UNWAITABLE_SECONDS, reason: budgetWaitReason(b.key, budgetNotConfigured(b.key)) };
      if (err instanceof InvalidInputError) return { deferSeconds: BUDGET_UNWAITABLE_SECONDS, reason: budgetWaitReason(b.key, err.problem.detail || err.message) };
      throw err;
    }
  }

  /** Records the tokens the task used (and the provider's headers): the settle after the handler counts them. The last report wins. */
  used(tokens: number, headers?: ProviderHeaders): void {
    if (!Number.isInteger(tokens) || tokens < 0) throw new RangeError(`usage tokens must be a whole number of at least 0, not ${tokens}`);
    this.tokens = tokens;
    if (headers) this.headers = headers;
  }

  /**
   * Reads the usage of the result a handler that succeeded returned
   * ({@link resultUsage}), to settle when the handler reported nothing
   * itself (its report wins: the result is not read then). Returns a
   * warning to report when the result's usage is not usable, naming the
   * field: the estimate is settled then.
   */
  succeeded(result: unknown): string | undefined {
    if (this.tokens !== undefined) return undefined;
    const u = resultUsage(result);
    if (!u) return undefined;
    if ("tokens" in u) {
      this.resultTokens = u.tokens;
      return undefined;
    }
    return `budget ${this.reservation.budget}: the result's usage is not usable; its estimate is settled: ${u.field} ${u.reason}`;
  }

  /** Settles once: what the handler reported, else its result's usage, else the estimate. */
  async settle(): Promise<BudgetSettlement | undefined> {
    if (this.settled) return undefined;
    this.settled = true;
    const tokens = this.tokens ?? this.resultTokens ?? this.reservation.estimate;
    return this.budgets.settle(this.reservation, Math.min(tokens, this.reservation.settle_bound), this.headers);
  }
}
