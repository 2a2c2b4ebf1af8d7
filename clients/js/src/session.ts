import { hostname } from "node:os";
import { ConnectionError, DroverError, SessionClosedError, SessionLostError, SessionNotFoundError } from "./errors.js";
import { seg, type Transport } from "./http.js";

/** A session as the server describes it. */
export interface SessionInfo {
  id: string;
  ttl: number;
  expires_at: string;
  name?: string;
  /** The host the session's creator gave (this process's). */
  host?: string;
  /** The process id the session's creator gave (this process's). */
  pid?: number;
}

export interface SessionOptions {
  /** Seconds the session lives without a keepalive (1 to 86400; default 15). */
  ttl?: number;
  /**
   * Shown as the holder of what the session holds (default `HOST:PID`, this
   * process); this process's host and pid are sent with it, so an operator
   * can tell which agent holds a lock.
   */
  name?: string;
  /** Milliseconds between keepalives (default TTL/3). */
  keepaliveIntervalMs?: number;
}

/**
 * A session: an etcd lease on the server, kept alive from here in the
 * background (a keepalive every TTL/3). Everything held under it (locks,
 * claims, registrations, quota slots) is released by the server when it
 * ends.
 *
 * {@link Session.signal} fires the moment the session is lost: a keepalive
 * answered 404 (it expired or was deleted), or no keepalive succeeded before
 * the TTL ran out while the server could not be reached. Pass it to `fetch`
 * and to LLM calls so that work stops when the right to do it is gone. It
 * also fires, with a {@link SessionClosedError}, when {@link Session.close}
 * ends the session.
 *
 * The keepalive timer does not keep the process alive (it is unref'd) and
 * stops on close or loss.
 */
export class Session implements AsyncDisposable {
  readonly id: string;
  readonly ttl: number;
  readonly name: string;
  /** When the session ends if no keepalive succeeds from now on, by this process's clock. */
  expiresAt: Date;
  private readonly t: Transport;
  private readonly ac = new AbortController();
  private readonly intervalMs: number;
  private timer: NodeJS.Timeout | undefined;
  private deadline: NodeJS.Timeout | undefined;
  private inflight: AbortController | undefined;
  private state: "alive" | "lost" | "closed" = "alive";
  private closing: Promise<void> | undefined;

  /** @internal use {@link Drover.session} */
  constructor(t: Transport, info: SessionInfo, sentAt: number, opts: SessionOptions = {}) {
    this.t = t;
    this.id = info.id;
    this.ttl = info.ttl;
    this.name = info.name ?? opts.name ?? "";
    this.intervalMs = Math.max(50, opts.keepaliveIntervalMs ?? (info.ttl * 1000) / 3);
    this.expiresAt = new Date(sentAt + info.ttl * 1000);
    this.armDeadline();
    this.schedule(this.intervalMs);
  }

  /** Creates a session on the server and starts keeping it alive. */
  static async create(t: Transport, opts: SessionOptions = {}): Promise<Session> {
    const sentAt = Date.now();
    const host = (hostname() || "unknown").slice(0, 255);
    const body = { ttl: opts.ttl ?? 15, name: opts.name ?? `${host.slice(0, 100)}:${process.pid}`, host, pid: process.pid };
    // A lost answer only leaves an unused lease that expires after its TTL: safe to repeat.
    const info = await t.post<SessionInfo>("/v1/sessions", body, { retry: true });
    return new Session(t, info, sentAt, opts);
  }

  /** Fires when the session is lost (reason: {@link SessionLostError}) or closed ({@link SessionClosedError}). */
  get signal(): AbortSignal {
    return this.ac.signal;
  }
  /** True once the session was lost (not closed by its owner). */
  get lost(): boolean {
    return this.state === "lost";
  }
  /** True once {@link close} was called. */
  get closed(): boolean {
    return this.state === "closed";
  }
  /** True while the session is neither lost nor closed. */
  get alive(): boolean {
    return this.state === "alive";
  }

  /** Throws the signal's reason if the session is no longer alive. */
  throwIfEnded(): void {
    if (this.state !== "alive") throw this.ac.signal.reason;
  }

  private schedule(ms: number): void {
    if (this.state !== "alive") return;
    clearTimeout(this.timer);
    this.timer = setTimeout(() => void this.tick(), ms);
    this.timer.unref();
  }

  private armDeadline(): void {
    clearTimeout(this.deadline);
    const ms = Math.max(0, this.expiresAt.getTime() - Date.now());
    this.deadline = setTimeout(() => {
      this.lose(new SessionLostError(`session ${this.short()} lost: no keepalive succeeded within its ${this.ttl} s TTL (the server could not be reached)`));
    }, ms);
    this.deadline.unref();
  }

  private short(): string {
    return this.id.split(".")[0] ?? this.id;
  }

  private async tick(): Promise<void> {
    if (this.state !== "alive") return;
    try {
      await this.keepalive();
      this.schedule(this.intervalMs);
    } catch (err) {
      if (this.state !== "alive") return;
      // Not reachable (or 5xx): try again soon, within what is left of the TTL.
      const left = this.expiresAt.getTime() - Date.now();
      this.schedule(Math.max(50, Math.min(1000, this.intervalMs / 2, left / 3)));
    }
  }

  /**
   * Sends one keepalive now. The background loop calls it every TTL/3; call
   * it yourself only to renew earlier. Throws {@link SessionLostError} if
   * the server says the session is gone.
   */
  async keepalive(): Promise<void> {
    this.throwIfEnded();
    const sentAt = Date.now();
    const ac = new AbortController();
    this.inflight = ac;
    try {
      const budget = Math.max(200, Math.min(this.intervalMs, this.expiresAt.getTime() - sentAt));
      await this.t.post<SessionInfo>(`/v1/sessions/${seg(this.id)}/keepalive`, undefined, { retry: false, signal: ac.signal, timeoutMs: budget });
      if (this.state !== "alive") return;
      this.expiresAt = new Date(sentAt + this.ttl * 1000);
      this.armDeadline();
    } catch (err) {
      if (err instanceof SessionNotFoundError) {
        const lost = new SessionLostError(`session ${this.short()} lost: the server says it ended (expired or deleted)`, { status: 404, problem: err.problem, cause: err });
        this.lose(lost);
        throw lost;
      }
      if (this.state !== "alive") throw this.ac.signal.reason;
      throw err;
    } finally {
      if (this.inflight === ac) this.inflight = undefined;
    }
  }

  /**
   * @internal Called with an error another request under this session got:
   * a session-not-found answer means the session is lost.
   */
  observe(err: unknown): void {
    if (err instanceof SessionNotFoundError && this.state === "alive") {
      this.lose(new SessionLostError(`session ${this.short()} lost: the server says it ended (expired or deleted)`, { status: 404, problem: err.problem, cause: err }));
    }
  }

  private lose(reason: DroverError): void {
    if (this.state !== "alive") return;
    this.state = "lost";
    this.stopTimers();
    this.ac.abort(reason);
  }

  private stopTimers(): void {
    clearTimeout(this.timer);
    clearTimeout(this.deadline);
    this.inflight?.abort(new SessionClosedError("session ended"));
  }

  /**
   * Ends the session (DELETE): everything held under it is released at once.
   * Stops the keepalives and fires {@link signal}. Safe to call twice, and
   * after the session was lost.
   */
  close(): Promise<void> {
    if (this.closing) return this.closing;
    const wasAlive = this.state === "alive";
    if (wasAlive) this.state = "closed";
    this.stopTimers();
    if (wasAlive) this.ac.abort(new SessionClosedError(`session ${this.short()} closed`));
    this.closing = (async () => {
      try {
        await this.t.delete(`/v1/sessions/${seg(this.id)}`, { timeoutMs: 5000 });
      } catch (err) {
        // Gone already is what close wants; unreachable means it expires by itself within its TTL.
        if (!(err instanceof SessionNotFoundError) && !(err instanceof ConnectionError) && !(err instanceof DroverError && err.status === 404)) throw err;
      }
    })();
    return this.closing;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  /** The session as the server sees it now. */
  async info(): Promise<SessionInfo> {
    return this.t.get<SessionInfo>(`/v1/sessions/${seg(this.id)}`);
  }
}
