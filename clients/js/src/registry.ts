import { ConnectionError, DroverError, GoneError, NotFoundError } from "./errors.js";
import { seg, sleep, type Transport } from "./http.js";
import type { Session } from "./session.js";

/** A registered endpoint. */
export interface Endpoint {
  component: string;
  id: string;
  subject?: string;
  address: string;
  data?: unknown;
  create_revision: number;
  mod_revision: number;
}

/** One event of a registry watch. */
export type RegistryEvent =
  | { type: "snapshot"; revision: number; endpoints: Endpoint[] }
  | { type: "put" | "delete"; revision: number; endpoint: Endpoint };

export interface WatchOptions {
  /** Ends the watch. */
  signal?: AbortSignal;
  /** Resume after this revision (no snapshot); default: start with a snapshot. */
  lastEventId?: string | number;
  /** The longest pause between reconnections, in ms (default 5000). */
  maxBackoffMs?: number;
  /** Called when the stream broke and is being reopened. */
  onReconnect?: (err: unknown, lastEventId: string | undefined) => void;
}

/** A registration; {@link deregister} removes it (it also goes when its session ends). */
export class Registration implements AsyncDisposable {
  constructor(private readonly r: Registry, readonly endpoint: Endpoint, readonly session: Session) {}
  async deregister(): Promise<void> {
    await this.r.deregister(this.endpoint.component, this.endpoint.id, this.session);
  }
  async [Symbol.asyncDispose](): Promise<void> {
    await this.deregister();
  }
}

/** The service registry: endpoints bound to sessions, and a watch over them. */
export class Registry {
  constructor(private readonly t: Transport) {}

  /** Registers (or rewrites, under the same session) an endpoint; 409 when another session holds the id. */
  async register(component: string, id: string, opts: { session: Session; address: string; data?: unknown; subject?: string }): Promise<Registration> {
    const ep = await this.t.put<Endpoint>(`/v1/registry/${seg(component)}/${seg(id)}`, {
      session: opts.session.id,
      address: opts.address,
      ...(opts.data !== undefined ? { data: opts.data } : {}),
      ...(opts.subject ? { subject: opts.subject } : {}),
    });
    return new Registration(this, ep, opts.session);
  }

  /** Removes an endpoint (nothing to do if it is gone already). */
  async deregister(component: string, id: string, session: Session | string): Promise<void> {
    try {
      await this.t.delete(`/v1/registry/${seg(component)}/${seg(id)}`, { query: { session: typeof session === "string" ? session : session.id } });
    } catch (err) {
      if (!(err instanceof NotFoundError)) throw err;
    }
  }

  /** The live endpoints of a component. */
  async list(component: string): Promise<Endpoint[]> {
    return (await this.t.get<Endpoint[] | null>(`/v1/registry/${seg(component)}`)) ?? [];
  }

  /** One endpoint, or undefined. */
  async get(component: string, id: string): Promise<Endpoint | undefined> {
    try {
      return await this.t.get<Endpoint>(`/v1/registry/${seg(component)}/${seg(id)}`);
    } catch (err) {
      if (err instanceof NotFoundError) return undefined;
      throw err;
    }
  }

  /**
   * Watches a component's endpoints over Server-Sent Events: a `snapshot`
   * first, then a `put` or `delete` per change. When the stream breaks it
   * reconnects with `Last-Event-ID`, so no change is missed and no second
   * snapshot comes; if that history was compacted away (410) it starts
   * again with a new snapshot. Ends when `signal` fires or the loop breaks.
   */
  async *watch(component: string, opts: WatchOptions = {}): AsyncGenerator<RegistryEvent> {
    let last = opts.lastEventId === undefined ? undefined : String(opts.lastEventId);
    const stop = new AbortController();
    const signal = opts.signal ? AbortSignal.any([opts.signal, stop.signal]) : stop.signal;
    let backoff = 100;
    try {
      while (!signal.aborted) {
        let res: Response;
        try {
          const r = await this.t.request<Response>("GET", `/v1/registry/${seg(component)}/watch`, {
            headers: { Accept: "text/event-stream", ...(last ? { "Last-Event-ID": last } : {}) },
            signal,
            stream: true,
            retry: false,
            timeoutMs: 0,
          });
          res = r.data;
        } catch (err) {
          if (signal.aborted) return;
          if (err instanceof GoneError) {
            last = undefined;
            continue;
          }
          if (!(err instanceof ConnectionError) && !(err instanceof DroverError && err.status >= 500)) throw err;
          opts.onReconnect?.(err, last);
          await sleep(backoff, signal).catch(() => {});
          backoff = Math.min(opts.maxBackoffMs ?? 5000, backoff * 2);
          continue;
        }
        let broke: unknown;
        try {
          for await (const ev of parseSSE(res.body!, signal)) {
            backoff = 100;
            if (ev.id) last = ev.id;
            if (!ev.event || !ev.data) continue;
            const data = JSON.parse(ev.data);
            if (ev.event === "snapshot") yield { type: "snapshot", revision: data.revision, endpoints: data.endpoints ?? [] };
            else if (ev.event === "put" || ev.event === "delete") yield { type: ev.event, revision: data.revision, endpoint: data.endpoint };
          }
          broke = new ConnectionError("the watch stream ended");
        } catch (err) {
          if (signal.aborted) return;
          broke = err;
        }
        opts.onReconnect?.(broke, last);
        await sleep(backoff, signal).catch(() => {});
        backoff = Math.min(opts.maxBackoffMs ?? 5000, backoff * 2);
      }
    } finally {
      stop.abort();
    }
  }
}

export interface SSEEvent {
  id?: string;
  event?: string;
  data?: string;
}

/**
 * Parses a text/event-stream body into events; `onChunk` is called for
 * every chunk read (comments included: a sign the connection is alive).
 * The body is cancelled when the parse stops, early or not.
 */
export async function* parseSSE(body: ReadableStream<Uint8Array>, signal: AbortSignal, onChunk?: () => void): AsyncGenerator<SSEEvent> {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  const onAbort = () => void reader.cancel().catch(() => {});
  signal.addEventListener("abort", onAbort, { once: true });
  let buf = "";
  let ev: SSEEvent = {};
  let data: string[] = [];
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      onChunk?.();
      buf += value;
      let nl: number;
      while ((nl = buf.search(/\r\n|\r|\n/)) >= 0) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + (buf[nl] === "\r" && buf[nl + 1] === "\n" ? 2 : 1));
        if (line === "") {
          if (data.length || ev.event || ev.id) {
            yield { ...ev, data: data.join("\n") };
          }
          ev = {};
          data = [];
          continue;
        }
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (field === "data") data.push(value);
        else if (field === "event") ev.event = value;
        else if (field === "id") ev.id = value;
      }
    }
  } finally {
    signal.removeEventListener("abort", onAbort);
    await reader.cancel().catch(() => {});
    reader.releaseLock?.();
  }
}
