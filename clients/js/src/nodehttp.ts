// Requests over Node's own `node:http`/`node:https` with a keep-alive agent:
// under Node, a plain request (no stream either way) costs a third of the
// client CPU that the global `fetch` (undici and its WHATWG streams) costs.
// Only Node itself: Deno and Bun, which imitate `process.versions.node`,
// keep `fetch`. The modules are looked up with `process.getBuiltinModule`
// (Node 20.16 and later), so that nothing is imported where they are absent.

import type { Agent, ClientRequest, IncomingHttpHeaders, IncomingMessage, RequestOptions } from "node:http";
import type { Socket } from "node:net";

/** The most idle keep-alive connections an agent keeps to the server. */
export const MAX_IDLE_SOCKETS = 256;

/**
 * How long an idle keep-alive connection is kept, in ms: well under the
 * drover server's idle timeout (2 minutes) and the usual proxies' (60 s),
 * so that the client, not the server, closes it.
 */
export const IDLE_MS = 30_000;

/** How long a new connection may take to be established, in ms (fetch's default). */
export const CONNECT_MS = 10_000;

/** The code of a connection that was not established within {@link CONNECT_MS}. */
export const CONNECT_TIMEOUT = "ERR_DROVER_CONNECT_TIMEOUT";

type RequestFn = (url: URL, options: RequestOptions, cb: (res: IncomingMessage) => void) => ClientRequest;
type AgentCtor = new (opts: Record<string, unknown>) => Agent;

/** An answer read to its end. */
export interface NodeAnswer {
  status: number;
  statusText: string;
  /** The headers, names in lower case. */
  head: IncomingHttpHeaders;
  /** The headers as received: name, value, name, value... */
  raw: string[];
  /** The body, decoded as UTF-8. */
  text: string;
}

/**
 * Why an exchange failed: before any answer (`answer` undefined: the
 * connection, or no answer within the timeout), or while its body was read.
 */
export class NodeFailure extends Error {
  constructor(
    override readonly cause: unknown,
    readonly timedOut: boolean,
    readonly answer: Omit<NodeAnswer, "text"> | undefined,
  ) {
    super((cause as Error)?.message ?? String(cause));
  }
}

/** The statuses fetch follows (with a Location): the caller sends those through fetch instead. */
export const REDIRECTS = new Set([301, 302, 303, 307, 308]);

/** A `Headers` of an answer's raw headers. */
export function headersOf(raw: string[]): Headers {
  const h = new Headers();
  for (let i = 0; i + 1 < raw.length; i += 2) h.append(raw[i]!, raw[i + 1]!);
  return h;
}

/**
 * Sends requests to one server over one keep-alive agent. Idle connections
 * do not keep the process alive (Node unrefs an agent's free sockets) and
 * are closed after {@link IDLE_MS}.
 */
export class NodeSender {
  readonly agent: Agent;
  private readonly requestFn: RequestFn;
  /** Requests written, resends included. */
  sends = 0;
  /** Requests sent again after a reused connection turned out closed. */
  resends = 0;

  constructor(requestFn: RequestFn, AgentClass: AgentCtor) {
    this.requestFn = requestFn;
    // No cap on connections (as fetch's pool): long polls hold theirs, and a
    // cap would make a session's keepalives wait behind them.
    this.agent = new AgentClass({ keepAlive: true, maxSockets: Infinity, maxFreeSockets: MAX_IDLE_SOCKETS, timeout: IDLE_MS, scheduling: "lifo" });
  }

  /**
   * Sends one request and reads its answer to the end. Rejects with the
   * caller's abort reason once its signal fires, else with a
   * {@link NodeFailure}. A request that may be sent more than once
   * (`resend`) and fails with a reset on a reused connection before any
   * answer is sent again at once, until it fails on a new connection: most
   * likely the server had closed the idle connection. Others are not: the
   * same reset comes when the server read the request, acted on it and then
   * lost the connection (it stopped, crashed, or a proxy cut it), and a
   * claim or a lock acquisition sent twice would be taken twice.
   */
  exchange(url: string, method: string, headers: Record<string, string>, body: string | Uint8Array | undefined, timeoutMs: number, caller?: AbortSignal, resend = false): Promise<NodeAnswer> {
    return new Promise<NodeAnswer>((resolve, reject) => {
      if (caller?.aborted) return reject(caller.reason);
      let u: URL;
      try {
        u = new URL(url);
      } catch (err) {
        return reject(new NodeFailure(err, false, undefined));
      }
      let req: ClientRequest | undefined;
      let answer: NodeFailure["answer"];
      let done = false;
      let timer: ReturnType<typeof setTimeout> | undefined;
      const finish = (err: unknown, a?: NodeAnswer) => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        caller?.removeEventListener("abort", onAbort);
        if (a) resolve(a);
        else reject(err);
      };
      const fail = (cause: unknown, timedOut = false) => finish(new NodeFailure(cause, timedOut, answer));
      const onAbort = () => {
        finish(caller!.reason);
        req?.destroy();
      };
      if (timeoutMs > 0) {
        timer = setTimeout(() => {
          fail(new DOMException(`no answer within ${timeoutMs} ms`, "TimeoutError"), true);
          req?.destroy();
        }, timeoutMs);
        (timer as { unref?: () => void }).unref?.();
      }
      caller?.addEventListener("abort", onAbort, { once: true });

      const onResponse = (res: IncomingMessage) => {
        answer = { status: res.statusCode ?? 0, statusText: res.statusMessage ?? "", head: res.headers, raw: res.rawHeaders };
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => {
          let text = chunks.length === 1 ? chunks[0]!.toString() : chunks.length ? Buffer.concat(chunks).toString() : "";
          if (text.charCodeAt(0) === 0xfeff) text = text.slice(1); // as fetch's text()
          finish(undefined, { ...answer!, text });
        });
        res.on("error", (err) => fail(err));
        res.on("close", () => {
          if (!res.complete) fail(new Error("the connection closed"));
        });
      };
      const start = () => {
        let r: ClientRequest;
        try {
          r = this.requestFn(u, { method, headers, agent: this.agent }, onResponse);
        } catch (err) {
          return fail(err); // a header value Node refuses
        }
        req = r;
        this.sends++;
        r.on("error", (err: NodeJS.ErrnoException) => {
          if (done || req !== r) return;
          if (resend && answer === undefined && r.reusedSocket && (err.code === "ECONNRESET" || err.code === "EPIPE")) {
            this.resends++;
            return start();
          }
          fail(err);
        });
        r.on("socket", (s) => boundConnect(r, s));
        if (body === undefined) r.end();
        else {
          // Node frames a DELETE's body only with a length given (and fetch gives one).
          r.setHeader("Content-Length", typeof body === "string" ? Buffer.byteLength(body) : body.byteLength);
          r.end(body);
        }
      };
      start();
    });
  }
}

/** Destroys r with a {@link CONNECT_TIMEOUT} error if its new socket s is not connected within {@link CONNECT_MS}. */
function boundConnect(r: ClientRequest, s: Socket): void {
  if (!s.connecting) return;
  const t = setTimeout(() => {
    const e = Object.assign(new Error(`connect timed out after ${CONNECT_MS} ms`), { code: CONNECT_TIMEOUT });
    r.destroy(e);
  }, CONNECT_MS);
  (t as { unref?: () => void }).unref?.();
  const clear = () => clearTimeout(t);
  s.once("connect", clear).once("close", clear);
}

/**
 * A sender for the server at url when this runs under Node (not Deno or Bun)
 * with `process.getBuiltinModule`, else undefined (fetch is used). Also
 * undefined under `NODE_USE_ENV_PROXY`, which fetch honours.
 */
export function nodeSender(url: string): NodeSender | undefined {
  const p = (globalThis as { process?: NodeJS.Process }).process;
  const v = p?.versions as Record<string, string | undefined> | undefined;
  if (!p || !v?.node || v.bun || v.deno || "Deno" in globalThis || "Bun" in globalThis) return undefined;
  if (p.env?.NODE_USE_ENV_PROXY) return undefined;
  const get = (p as { getBuiltinModule?: (id: string) => unknown }).getBuiltinModule;
  if (typeof get !== "function") return undefined;
  let protocol: string;
  try {
    protocol = new URL(url).protocol;
  } catch {
    return undefined;
  }
  const id = protocol === "http:" ? "node:http" : protocol === "https:" ? "node:https" : undefined;
  const mod = id ? (get.call(p, id) as { request?: RequestFn; Agent?: AgentCtor } | undefined) : undefined;
  if (!mod?.request || !mod.Agent) return undefined;
  return new NodeSender(mod.request, mod.Agent);
}
