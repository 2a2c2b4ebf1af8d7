import { RateLimitedError } from "./errors.js";
import { durMs, seg, sleep, type Transport } from "./http.js";
import type { Session } from "./session.js";

export interface LimitInfo {
  name: string;
  rate: string;
  per_second: number;
  burst: number;
  available: number;
  used: number;
}

export interface TakeResult extends LimitInfo {
  taken: number;
}

export interface TakeOptions {
  /**
   * How long to wait for the tokens in all, in seconds or as a duration
   * ("30s"; default 30 s). The server waits up to this long for them; a 429
   * whose Retry-After still fits is waited out and tried again; past it,
   * {@link RateLimitedError} (nothing was taken).
   */
  maxWait?: number | string;
  signal?: AbortSignal;
}

/** Fleet-wide rate limits (token buckets shared by every process). */
export class Limits {
  constructor(private readonly t: Transport) {}

  /**
   * Takes n tokens of the shared bucket, waiting for them within
   * `maxWait`. Never sent twice after a connection error (a lost answer
   * could have taken them).
   */
  async take(name: string, n: number, opts: TakeOptions = {}): Promise<TakeResult> {
    const deadline = Date.now() + durMs(opts.maxWait, 30_000);
    for (;;) {
      const left = Math.max(0, deadline - Date.now());
      const w = Math.min(left, 60_000);
      try {
        return await this.t.post<TakeResult>(`/v1/limits/${seg(name)}/take`, { n, ...(w > 0 ? { wait: `${Math.floor(w)}ms` } : {}) }, {
          retry: false,
          signal: opts.signal,
          timeoutMs: w + this.t.timeoutMs,
        });
      } catch (err) {
        if (!(err instanceof RateLimitedError)) throw err;
        const ra = Math.max(50, (err.retryAfter ?? 1) * 1000);
        if (Date.now() + ra > deadline) throw err;
        await sleep(ra, opts.signal);
      }
    }
  }

  /** Gives back what was reserved and not used (a negative difference is a debt). */
  settle(name: string, reserved: number, used: number): Promise<LimitInfo> {
    return this.t.post<LimitInfo>(`/v1/limits/${seg(name)}/settle`, { reserved, used }, { retry: false });
  }

  /**
   * Takes `reserve` tokens, runs fn, and settles with what fn says it used
   * (fn returns `{ used }` or a number; the reservation when it throws).
   */
  async withTokens<T extends { used: number } | number>(name: string, reserve: number, fn: () => Promise<T>, opts: TakeOptions = {}): Promise<T> {
    await this.take(name, reserve, opts);
    let used = reserve;
    try {
      const r = await fn();
      used = typeof r === "number" ? r : r.used;
      return r;
    } finally {
      if (used !== reserve) await this.settle(name, reserve, used);
    }
  }

  get(name: string): Promise<LimitInfo> {
    return this.t.get<LimitInfo>(`/v1/limits/${seg(name)}`);
  }
  async list(): Promise<LimitInfo[]> {
    return (await this.t.get<LimitInfo[] | null>("/v1/limits")) ?? [];
  }
  /** Sets a limit, e.g. `set("openai-tokens", "90000/m", 20000)` (admin role). */
  set(name: string, rate: string, burst?: number): Promise<LimitInfo> {
    return this.t.put<LimitInfo>(`/v1/limits/${seg(name)}`, { rate, ...(burst !== undefined ? { burst } : {}) });
  }
  async delete(name: string): Promise<void> {
    await this.t.delete(`/v1/limits/${seg(name)}`);
  }
}

export interface QuotaInfo {
  name: string;
  limit: number;
  held: Record<string, unknown>;
  subjects?: Record<string, unknown>;
}

export interface Slot {
  name: string;
  subject: string;
  session: string;
  held: number;
  in_use: number;
  limit: number;
}

/** Fleet-wide concurrency quotas: slots bound to a session. */
export class Quotas {
  constructor(private readonly t: Transport) {}

  /** Takes a slot (bound to the session: it goes when the session ends); 429 {@link QuotaFullError} when none frees within `wait`. */
  acquire(name: string, opts: { session: Session; subject?: string; wait?: number | string; signal?: AbortSignal }): Promise<Slot> {
    const waitMs = opts.wait === undefined ? 0 : Math.min(60_000, durMs(opts.wait, 0));
    return this.t.post<Slot>(`/v1/quotas/${seg(name)}/acquire`, {
      session: opts.session.id,
      ...(opts.subject ? { subject: opts.subject } : {}),
      ...(waitMs > 0 ? { wait: `${Math.ceil(waitMs)}ms` } : {}),
    }, { retry: false, signal: opts.signal ? AbortSignal.any([opts.signal, opts.session.signal]) : opts.session.signal, timeoutMs: waitMs + this.t.timeoutMs });
  }
  /** Gives the slot back. */
  release(name: string, opts: { session: Session; subject?: string }): Promise<Slot> {
    return this.t.post<Slot>(`/v1/quotas/${seg(name)}/release`, { session: opts.session.id, ...(opts.subject ? { subject: opts.subject } : {}) }, { retry: false });
  }
  get(name: string): Promise<QuotaInfo> {
    return this.t.get<QuotaInfo>(`/v1/quotas/${seg(name)}`);
  }
  async list(): Promise<QuotaInfo[]> {
    return (await this.t.get<QuotaInfo[] | null>("/v1/quotas")) ?? [];
  }
  /** Sets a quota's limit (admin role). */
  set(name: string, limit: number, subject?: string): Promise<QuotaInfo> {
    return this.t.put<QuotaInfo>(`/v1/quotas/${seg(name)}`, { limit, ...(subject ? { subject } : {}) });
  }
  async delete(name: string): Promise<void> {
    await this.t.delete(`/v1/quotas/${seg(name)}`);
  }
}

export interface BreakerInfo {
  name: string;
  state: string;
  consecutive_failures: number;
  opened: number;
  since?: string;
  probe?: string;
  config: { failures: number; cooldown: string; window?: string; ratio?: number; min_calls?: number };
}

export interface AllowResult {
  allowed: boolean;
  /** On a half-open breaker's probe: the id to report the outcome with. */
  call: string;
  probe: boolean;
  breaker: BreakerInfo;
}

/** Fleet-wide circuit breakers. */
export class Breakers {
  constructor(private readonly t: Transport) {}

  /** May a call go through? Throws {@link BreakerOpenError} (503) while the breaker is open. */
  allow(name: string): Promise<AllowResult> {
    return this.t.post<AllowResult>(`/v1/breakers/${seg(name)}/allow`, {}, { retry: false });
  }
  /** Reports a call's outcome (the probe's, with its call id). */
  outcome(name: string, ok: boolean, call?: string): Promise<BreakerInfo> {
    return this.t.post<BreakerInfo>(`/v1/breakers/${seg(name)}/outcome`, { ok, ...(call ? { call } : {}) }, { retry: false });
  }
  /** Runs fn if the breaker allows it, and reports how it went. */
  async call<T>(name: string, fn: () => Promise<T>): Promise<T> {
    const a = await this.allow(name);
    try {
      const r = await fn();
      await this.outcome(name, true, a.call);
      return r;
    } catch (err) {
      await this.outcome(name, false, a.call).catch(() => {});
      throw err;
    }
  }
  get(name: string): Promise<BreakerInfo> {
    return this.t.get<BreakerInfo>(`/v1/breakers/${seg(name)}`);
  }
  async list(): Promise<BreakerInfo[]> {
    return (await this.t.get<BreakerInfo[] | null>("/v1/breakers")) ?? [];
  }
  /** Sets a breaker's thresholds (admin role), e.g. `{ failures: 5, cooldown: "30s" }`. */
  set(name: string, cfg: { failures?: number; cooldown?: string; window?: string; ratio?: number; min_calls?: number }): Promise<BreakerInfo> {
    return this.t.put<BreakerInfo>(`/v1/breakers/${seg(name)}`, cfg);
  }
  reset(name: string): Promise<BreakerInfo> {
    return this.t.post<BreakerInfo>(`/v1/breakers/${seg(name)}/reset`, undefined, { retry: true });
  }
  async delete(name: string): Promise<void> {
    await this.t.delete(`/v1/breakers/${seg(name)}`);
  }
}
