import { ConnectionError, DroverError, errorFromProblem, type Problem } from "./errors.js";
import { startRequestSpan } from "./tracing.js";
import { headersOf, NodeFailure, nodeSender, REDIRECTS, CONNECT_TIMEOUT, type NodeSender } from "./nodehttp.js";

/** How to reach a drover server. */
export interface ClientOptions {
  /** The server's base URL, e.g. `http://127.0.0.1:8080` (default `$DROVER_URL`, else `http://127.0.0.1:8080`). */
  url?: string;
  /** A bearer token of the server's `--auth-file` (default `$DROVER_TOKEN`). */
  token?: string;
  /** The namespace every request names (the `Drover-Namespace` header); default `$DROVER_NAMESPACE`, else the server's. */
  namespace?: string;
  /** Extra headers sent with every request. */
  headers?: Record<string, string>;
  /**
   * An undici `Dispatcher` handed to `fetch` with every request: the way to
   * give Node's built-in fetch a custom CA, a client certificate or a proxy,
   * e.g. `new Agent({ connect: { ca } })` from the `undici` package. Without
   * one, Node trusts its bundled CAs plus `NODE_EXTRA_CA_CERTS`. With one,
   * every request goes through fetch (else, under Node, those that stream
   * neither way go through `node:http`).
   */
  dispatcher?: unknown;
  /** The fetch implementation to use for every request (default: `node:http` under Node for requests that stream neither way, the global `fetch` for the rest). */
  fetch?: typeof fetch;
  /** How long one request may take before it is abandoned, in ms (default 30000; long polls add their wait). */
  timeoutMs?: number;
  /**
   * How many times a request that is safe to repeat (a read, a keepalive, a
   * fenced or idempotent write) is sent again after a connection error or a
   * 503 (default 3). Claims, lock acquisitions and token takes are never
   * repeated.
   */
  retries?: number;
}

/** One request. */
export interface RequestOptions {
  query?: Record<string, string | number | boolean | undefined | null | (string | number)[]>;
  /** A JSON body. */
  body?: unknown;
  /** A raw body (sent as is, with contentType). */
  rawBody?: NonNullable<RequestInit["body"]>;
  contentType?: string;
  headers?: Record<string, string>;
  signal?: AbortSignal;
  /** Whether the request may be sent again after a connection error or 503 (default: GET, HEAD, PUT, DELETE). */
  retry?: boolean;
  /** Overrides the client's timeout for this request, in ms (0: none). */
  timeoutMs?: number;
  /** Return the Response without reading it (for streams). Errors are still thrown. */
  stream?: boolean;
}

export interface ResponseOf<T> {
  status: number;
  headers: Headers;
  data: T;
  /** How many times the request was sent (more than 1 after a connection error or 503). */
  attempts: number;
}

const sleep = (ms: number, signal?: AbortSignal) =>
  new Promise<void>((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      reject(signal!.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
export { sleep };

/** Retry-After in seconds, if the header holds a number (or a date). */
function retryAfterOf(v: string | null | undefined): number | undefined {
  if (v == null) return undefined;
  const n = Number(v);
  if (Number.isFinite(n)) return n;
  const d = Date.parse(v);
  return Number.isFinite(d) ? Math.max(0, (d - Date.now()) / 1000) : undefined;
}

/** Whether a request may be sent more than once: its own say, else its method's. */
const retryRule = (method: string, opts: RequestOptions) => opts.retry ?? ["GET", "HEAD", "PUT", "DELETE"].includes(method);

/** Encodes one path segment. */
export const seg = (s: string | number) => encodeURIComponent(String(s));

/** Codes of a connection that failed before a request was sent (fetch's, and node:http's). */
const NOT_SENT = new Set(["ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN", "ENETUNREACH", "EHOSTUNREACH", "UND_ERR_CONNECT_TIMEOUT", CONNECT_TIMEOUT]);

/** Whether a {@link ConnectionError} failed while connecting: the request never left, and is safe to send again. */
export function neverSent(err: unknown): boolean {
  if (!(err instanceof ConnectionError)) return false;
  for (let e: unknown = err, i = 0; e && i < 5; e = (e as { cause?: unknown }).cause, i++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && NOT_SENT.has(code)) return true;
    const errors = (e as { errors?: unknown }).errors; // an AggregateError of every address tried
    if (Array.isArray(errors) && errors.length && errors.every((x) => NOT_SENT.has((x as { code?: string })?.code ?? ""))) return true;
  }
  return false;
}

/** Why a request failed, shortly (ECONNREFUSED, "other side closed"): fetch's error holds it in its cause, node:http's in itself. @internal */
export function fetchFailure(err: unknown): string {
  const cause = (err as { cause?: { code?: string; message?: string } })?.cause;
  const code = (err as { code?: unknown })?.code;
  return cause?.code ?? cause?.message ?? (typeof code === "string" ? code : undefined) ?? (err as Error)?.message ?? String(err);
}

export { traceHeaders } from "./tracing.js";

/**
 * The HTTP layer: base URL, bearer token, namespace, timeouts, typed errors
 * and the retry rule (only requests that are safe to repeat are repeated).
 */
export class Transport {
  readonly url: string;
  readonly namespace: string | undefined;
  private readonly token: string | undefined;
  private readonly headers: Record<string, string>;
  private readonly dispatcher: unknown;
  private readonly fetchImpl: typeof fetch;
  /** Node's http client, for requests that stream neither way (undefined: every request goes through fetch). @internal */
  readonly sender: NodeSender | undefined;
  readonly timeoutMs: number;
  readonly retries: number;

  constructor(opts: ClientOptions = {}) {
    const url = opts.url ?? process.env.DROVER_URL ?? "http://127.0.0.1:8080";
    this.url = url.replace(/\/+$/, "");
    this.namespace = opts.namespace ?? (process.env.DROVER_NAMESPACE || undefined);
    this.token = opts.token ?? process.env.DROVER_TOKEN;
    this.headers = { ...(opts.headers ?? {}) };
    this.dispatcher = opts.dispatcher;
    this.fetchImpl = opts.fetch ?? globalThis.fetch.bind(globalThis);
    this.timeoutMs = opts.timeoutMs ?? 30_000;
    this.retries = opts.retries ?? 3;
    // A fetch or dispatcher of the caller's decides how requests go: all of them through it.
    this.sender = opts.fetch || opts.dispatcher ? undefined : nodeSender(this.url);
  }

  /** The same server with another namespace. */
  withNamespace(namespace: string): Transport {
    const t = Object.create(Transport.prototype) as Transport;
    Object.assign(t, this, { namespace });
    return t;
  }

  private buildURL(path: string, query?: RequestOptions["query"]): string {
    let u = this.url + path;
    if (query) {
      const p = new URLSearchParams();
      for (const [k, v] of Object.entries(query)) {
        if (v === undefined || v === null) continue;
        if (Array.isArray(v)) for (const x of v) p.append(k, String(x));
        else p.append(k, String(v));
      }
      const s = p.toString();
      if (s) u += (u.includes("?") ? "&" : "?") + s;
    }
    return u;
  }

  /** Sends a request; throws a {@link DroverError} subclass on an error answer or none. */
  async request<T = unknown>(method: string, path: string, opts: RequestOptions = {}): Promise<ResponseOf<T>> {
    const retry = retryRule(method, opts);
    const attempts = retry ? this.retries + 1 : 1;
    const what = `${method} ${path}`;
    let lastErr: unknown;
    for (let i = 0; i < attempts; i++) {
      if (i > 0) {
        const ra = lastErr instanceof DroverError && lastErr.retryAfter !== undefined ? lastErr.retryAfter * 1000 : 0;
        const backoff = Math.min(2000, 100 * 2 ** (i - 1)) * (0.5 + Math.random() / 2);
        await sleep(Math.min(Math.max(ra, backoff), 2000), opts.signal);
      }
      try {
        const r = await this.once<T>(method, path, opts, what, i);
        r.attempts = i + 1;
        return r;
      } catch (err) {
        lastErr = err;
        if (opts.signal?.aborted) throw opts.signal.reason ?? err;
        const retryable = err instanceof ConnectionError || (err instanceof DroverError && err.status === 503 && err.kind !== "breaker-open");
        if (!retry || !retryable) throw err;
      }
    }
    throw lastErr;
  }

  /** Sends the request once, under a client span when OpenTelemetry is there (resend: the sends before). */
  private async once<T>(method: string, path: string, opts: RequestOptions, what: string, resend = 0): Promise<ResponseOf<T>> {
    const url = this.buildURL(path, opts.query);
    const span = await startRequestSpan(method, url, resend);
    let status: number | undefined;
    try {
      const r = await this.send<T>(method, url, span.headers, opts, what, (s) => (status = s));
      span.end(status);
      return r;
    } catch (err) {
      span.end(status, err);
      throw err;
    }
  }

  private async send<T>(method: string, url: string, trace: Record<string, string>, opts: RequestOptions, what: string, answered: (status: number) => void): Promise<ResponseOf<T>> {
    const headers: Record<string, string> = {
      Accept: "application/json, application/problem+json",
      ...trace,
      ...this.headers,
      ...(opts.headers ?? {}),
    };
    if (this.token) headers["Authorization"] = `Bearer ${this.token}`;
    if (this.namespace) headers["Drover-Namespace"] = this.namespace;
    let body: RequestInit["body"] | undefined;
    if (opts.rawBody !== undefined) {
      body = opts.rawBody;
      headers["Content-Type"] = opts.contentType ?? "application/octet-stream";
    } else if (opts.body !== undefined) {
      body = JSON.stringify(opts.body);
      headers["Content-Type"] = "application/json";
    }
    if (this.sender && !opts.stream && (body === undefined || typeof body === "string" || body instanceof Uint8Array)) {
      const r = await this.sendNode<T>(this.sender, method, url, headers, body, opts, what, answered);
      if (r) return r;
    }
    return this.sendFetch<T>(method, url, headers, body, opts, what, answered);
  }

  /**
   * Sends a request through node:http and reads its answer; undefined for a
   * redirect, which fetch follows (the caller sends it again through fetch).
   */
  private async sendNode<T>(sender: NodeSender, method: string, url: string, headers: Record<string, string>, body: string | Uint8Array | undefined, opts: RequestOptions, what: string, answered: (status: number) => void): Promise<ResponseOf<T> | undefined> {
    const timeoutMs = opts.timeoutMs ?? this.timeoutMs;
    const caller = opts.signal;
    let a;
    try {
      a = await sender.exchange(url, method, headers, body, timeoutMs, caller, retryRule(method, opts));
    } catch (err) {
      if (caller?.aborted) throw caller.reason;
      if (!(err instanceof NodeFailure)) throw err;
      const h = err.answer;
      if (!h) {
        if (err.timedOut) throw new ConnectionError(`${what}: no answer within ${timeoutMs} ms`, { request: what, cause: err.cause });
        throw new ConnectionError(`${what}: cannot reach ${this.url} (${fetchFailure(err.cause)})`, { request: what, cause: err.cause });
      }
      answered(h.status);
      if (h.status >= 400) throw errorFromProblem(h.status, { detail: h.statusText }, { retryAfter: retryAfterOf(h.head["retry-after"]), request: what });
      throw new ConnectionError(`${what}: the answer broke off (${(err.cause as Error)?.message})`, { request: what, cause: err.cause });
    }
    if (REDIRECTS.has(a.status) && a.head.location) return undefined;
    answered(a.status);
    if (a.status >= 400) {
      let problem: Problem = {};
      try {
        problem = a.text ? (JSON.parse(a.text) as Problem) : {};
      } catch {
        problem = { detail: a.text || a.statusText };
      }
      if (typeof problem !== "object" || problem === null) problem = { detail: String(problem) };
      throw errorFromProblem(a.status, problem, { retryAfter: retryAfterOf(a.head["retry-after"]), request: what });
    }
    let data: unknown = undefined;
    if (a.status !== 204) {
      const ct = a.head["content-type"] ?? "";
      try {
        data = a.text && ct.includes("json") ? JSON.parse(a.text) : a.text || undefined;
      } catch (err) {
        throw new ConnectionError(`${what}: the answer broke off (${(err as Error)?.message})`, { request: what, cause: err });
      }
    }
    // The Headers are made when asked for: most callers only want the data.
    const raw = a.raw;
    let h: Headers | undefined;
    return {
      status: a.status,
      get headers() {
        return (h ??= headersOf(raw));
      },
      data: data as T,
      attempts: 1,
    };
  }

  /** Sends a request through fetch (streams, a caller's fetch or dispatcher, other runtimes). */
  private async sendFetch<T>(method: string, url: string, headers: Record<string, string>, body: RequestInit["body"] | undefined, opts: RequestOptions, what: string, answered: (status: number) => void): Promise<ResponseOf<T>> {
    const timeoutMs = opts.timeoutMs ?? this.timeoutMs;
    // One controller and one timer a request, both let go of once its answer is read (a stream's
    // stay with its body): AbortSignal.timeout and AbortSignal.any each request kept a signal, a
    // timer and their listeners alive for the whole timeout, tens of thousands under load.
    const caller = opts.signal;
    const ac = timeoutMs > 0 ? new AbortController() : undefined;
    let timedOut = false;
    const onCaller = () => ac!.abort(caller!.reason);
    let timer: ReturnType<typeof setTimeout> | undefined;
    if (ac) {
      timer = setTimeout(() => {
        timedOut = true;
        ac.abort(new DOMException(`no answer within ${timeoutMs} ms`, "TimeoutError"));
      }, timeoutMs);
      (timer as { unref?: () => void }).unref?.();
      if (caller?.aborted) ac.abort(caller.reason);
      else caller?.addEventListener("abort", onCaller, { once: true });
    }
    const release = () => {
      clearTimeout(timer);
      caller?.removeEventListener("abort", onCaller);
    };
    const init: Record<string, unknown> = { method, headers, body, signal: ac?.signal ?? caller };
    if (this.dispatcher) init.dispatcher = this.dispatcher;
    if (body && typeof body === "object" && !(body instanceof Uint8Array) && !(typeof body === "string") && "getReader" in body) init.duplex = "half";
    let streaming = false;
    try {
      let res: Response;
      try {
        res = await this.fetchImpl(url, init as RequestInit);
      } catch (err) {
        if (caller?.aborted) throw caller.reason;
        if (timedOut) throw new ConnectionError(`${what}: no answer within ${timeoutMs} ms`, { request: what, cause: err });
        throw new ConnectionError(`${what}: cannot reach ${this.url} (${fetchFailure(err)})`, { request: what, cause: err });
      }
      answered(res.status);
      if (res.status >= 400) {
        let problem: Problem = {};
        let text = "";
        try {
          text = await res.text();
          problem = text ? (JSON.parse(text) as Problem) : {};
        } catch {
          problem = { detail: text || res.statusText };
        }
        if (typeof problem !== "object" || problem === null) problem = { detail: String(problem) };
        throw errorFromProblem(res.status, problem, { retryAfter: retryAfterOf(res.headers.get("retry-after")), request: what });
      }
      if (opts.stream) {
        streaming = true;
        return { status: res.status, headers: res.headers, data: res as unknown as T, attempts: 1 };
      }
      let data: unknown = undefined;
      try {
        if (res.status !== 204) {
          const text = await res.text();
          const ct = res.headers.get("content-type") ?? "";
          data = text && ct.includes("json") ? JSON.parse(text) : text || undefined;
        }
      } catch (err) {
        if (caller?.aborted) throw caller.reason;
        throw new ConnectionError(`${what}: the answer broke off (${(err as Error)?.message})`, { request: what, cause: err });
      }
      return { status: res.status, headers: res.headers, data: data as T, attempts: 1 };
    } finally {
      if (!streaming) release();
    }
  }

  async get<T>(path: string, opts?: RequestOptions): Promise<T> {
    return (await this.request<T>("GET", path, opts)).data;
  }
  async post<T>(path: string, body?: unknown, opts?: RequestOptions): Promise<T> {
    return (await this.request<T>("POST", path, { ...opts, body })).data;
  }
  async put<T>(path: string, body?: unknown, opts?: RequestOptions): Promise<T> {
    return (await this.request<T>("PUT", path, { ...opts, body })).data;
  }
  async delete<T>(path: string, opts?: RequestOptions): Promise<T> {
    return (await this.request<T>("DELETE", path, opts)).data;
  }
}

/** Formats a duration for the API: a number is seconds ("1.5s"), a string is sent as is ("20s", "1m"). */
export function dur(d: number | string | undefined): string | undefined {
  if (d === undefined) return undefined;
  if (typeof d === "string") return d;
  const ms = Math.max(0, Math.round(d * 1000));
  return `${ms}ms`;
}

/** Parses an API duration ("20s", "1.5s", "250ms", "1m", or a number of seconds) to ms. */
export function durMs(d: number | string | undefined, dflt: number): number {
  if (d === undefined) return dflt;
  if (typeof d === "number") return d * 1000;
  let total = 0;
  const re = /(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)/g;
  let m: RegExpExecArray | null;
  let matched = false;
  while ((m = re.exec(d))) {
    matched = true;
    const n = Number(m[1]);
    const unit = m[2];
    total += unit === "h" ? n * 3600e3 : unit === "m" ? n * 60e3 : unit === "s" ? n * 1e3 : unit === "ms" ? n : unit === "ns" ? n / 1e6 : n / 1e3;
  }
  if (!matched) {
    const n = Number(d);
    return Number.isFinite(n) ? n * 1000 : dflt;
  }
  return total;
}
