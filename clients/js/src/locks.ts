import { FencedError, LockHeldError, NotFoundError, type Holder, type LockStatus } from "./errors.js";
import { durMs, seg, sleep, type Transport } from "./http.js";
import { Session } from "./session.js";

/** The server's answer to an acquisition. */
export interface LockAcquired {
  status: string;
  name: string;
  token: number;
  holder: Holder;
  session?: string;
  contender: string;
  expires_at: string;
}

export interface LockOptions {
  /**
   * Hold it under this session (its keepalives keep the lock). Without one,
   * the lock gets a session of its own with `ttl`, closed on release.
   */
  session?: Session;
  /** TTL in seconds of the lock's own session (default 15). */
  ttl?: number;
  /**
   * How long to wait in line when the lock is held, in seconds or as a
   * duration ("30s"); first come, first served. Default: do not wait (throw
   * {@link LockHeldError} at once). Waits past the server's 60 s bound are
   * made of several requests.
   */
  wait?: number | string;
  /** The holder's name shown to others (the own session's name). */
  name?: string;
  /** Gives up waiting when it fires. */
  signal?: AbortSignal;
}

/**
 * A held lock. Pass {@link token} with every write made under it (the
 * checkpoint routes and your own systems can refuse a stale one), and
 * {@link signal} to the work it protects: it fires when the lock's session
 * is lost or the lock is released.
 *
 * `await using lock = await drover.lock("x")` releases it at the end of the
 * block; or call {@link release} in a `finally`.
 */
export class Lock implements AsyncDisposable {
  readonly name: string;
  /** The fencing token: strictly increases each time the lock changes hands. */
  readonly token: number;
  /** The contender id the release needs (only this client knows it). */
  readonly contender: string;
  readonly holder: Holder;
  readonly session: Session;
  private readonly t: Transport;
  private readonly ownSession: boolean;
  private readonly releasedAc = new AbortController();
  private releasing: Promise<boolean> | undefined;
  /** Fires when the lock's session is lost or the lock is released. */
  readonly signal: AbortSignal;

  /** @internal */
  constructor(t: Transport, a: LockAcquired, session: Session, ownSession: boolean) {
    this.t = t;
    this.name = a.name;
    this.token = a.token;
    this.contender = a.contender;
    this.holder = a.holder;
    this.session = session;
    this.ownSession = ownSession;
    this.signal = AbortSignal.any([session.signal, this.releasedAc.signal]);
  }

  /** True once released, or once its session is no longer alive. */
  get released(): boolean {
    return this.releasedAc.signal.aborted || !this.session.alive;
  }

  /**
   * Releases the lock (and closes its own session, if it has one). Resolves
   * to false when the lock was no longer held with this token (it was lost
   * meanwhile): nothing to release. Safe to call twice.
   */
  release(): Promise<boolean> {
    if (this.releasing) return this.releasing;
    this.releasing = (async () => {
      this.releasedAc.abort(new Error(`lock ${this.name} released`));
      let held = true;
      try {
        if (this.session.alive) {
          await this.t.delete(`/v1/locks/${seg(this.name)}`, {
            query: { token: this.token, contender: this.contender, session: this.session.id },
          });
        } else held = false;
      } catch (err) {
        if (err instanceof FencedError || err instanceof NotFoundError) held = false;
        else throw err;
      } finally {
        if (this.ownSession) await this.session.close();
      }
      return held;
    })();
    return this.releasing;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.release();
  }
}

const SERVER_MAX_WAIT_MS = 60_000;

/** Acquires a lock; see {@link LockOptions}. */
export async function acquireLock(t: Transport, name: string, opts: LockOptions = {}): Promise<Lock> {
  const own = !opts.session;
  const session = opts.session ?? (await Session.create(t, { ttl: opts.ttl ?? 15, ...(opts.name ? { name: opts.name } : {}) }));
  try {
    const waitMs = opts.wait === undefined ? 0 : durMs(opts.wait, 0);
    const deadline = Date.now() + waitMs;
    const signal = opts.signal ? AbortSignal.any([opts.signal, session.signal]) : session.signal;
    for (;;) {
      const left = deadline - Date.now();
      const w = Math.min(Math.max(0, left), SERVER_MAX_WAIT_MS);
      try {
        // Never repeated: a lost answer could mean the lock is ours unknowingly.
        const a = await t.post<LockAcquired>(`/v1/locks/${seg(name)}`, { session: session.id }, {
          query: w > 0 ? { wait: `${Math.ceil(w)}ms` } : undefined,
          retry: false,
          signal,
          timeoutMs: w + t.timeoutMs,
        });
        return new Lock(t, a, session, own);
      } catch (err) {
        session.observe(err);
        if (err instanceof LockHeldError && deadline - Date.now() > 50) {
          await sleep(20, signal);
          continue;
        }
        throw err;
      }
    }
  } catch (err) {
    // A lock acquired under the own session whose answer was lost is released with it.
    if (own) await session.close().catch(() => {});
    throw err;
  }
}

/** Who holds a lock, or undefined when nobody does. */
export async function lockStatus(t: Transport, name: string): Promise<LockStatus | undefined> {
  try {
    return await t.get<LockStatus>(`/v1/locks/${seg(name)}`);
  } catch (err) {
    if (err instanceof NotFoundError) return undefined;
    throw err;
  }
}
