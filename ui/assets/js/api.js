// The dashboard's door to the HTTP API: every read and change goes through
// the API's own routes, with the token of the login (sessionStorage) as a
// bearer token and the chosen namespace as Drover-Namespace.

const TOKEN_KEY = "drover.token";
const NS_KEY = "drover.namespace";

// session holds what the tab remembers: the token (sessionStorage: gone when
// the tab closes) and the namespace.
export const session = {
  token() { return sessionStorage.getItem(TOKEN_KEY) || ""; },
  setToken(t) {
    if (t) sessionStorage.setItem(TOKEN_KEY, t); else sessionStorage.removeItem(TOKEN_KEY);
  },
  namespace() { return sessionStorage.getItem(NS_KEY) || ""; },
  setNamespace(ns) {
    if (ns) sessionStorage.setItem(NS_KEY, ns); else sessionStorage.removeItem(NS_KEY);
  },
};

// ApiError is an answer that is not 2xx: its status and problem document.
export class ApiError extends Error {
  constructor(status, problem, text) {
    super((problem && (problem.detail || problem.title)) || text || "HTTP " + status);
    this.status = status;
    this.problem = problem;
  }
}

const listeners = { unauthorized: [] };

// onUnauthorized registers f, called whenever the API answers 401.
export function onUnauthorized(f) { listeners.unauthorized.push(f); }

function headers(extra) {
  const h = { Accept: "application/json", ...extra };
  const t = session.token();
  if (t) h.Authorization = "Bearer " + t;
  const ns = session.namespace();
  if (ns) h["Drover-Namespace"] = ns;
  return h;
}

// api sends method path (with body as JSON) and returns the decoded answer
// (null for 204); anything but 2xx throws an ApiError.
export async function api(method, path, body) {
  const init = { method, headers: headers(body === undefined ? {} : { "Content-Type": "application/json" }), cache: "no-store" };
  if (body !== undefined) init.body = JSON.stringify(body);
  let r;
  try {
    r = await fetch(path, init);
  } catch (e) {
    throw new ApiError(0, null, "the server did not answer (" + e.message + ")");
  }
  if (r.status === 204) return null;
  const text = await r.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (e) { data = null; }
  if (!r.ok) {
    if (r.status === 401) listeners.unauthorized.forEach((f) => f());
    throw new ApiError(r.status, data, text);
  }
  return data;
}

export const get = (path) => api("GET", path);

// enc escapes one path segment.
export const enc = encodeURIComponent;

// follow reads a Server-Sent Events stream with fetch (EventSource cannot
// send a bearer token) and calls onEvent(name, data) for each event. It
// resolves when the stream ends and throws an ApiError for an answer that is
// not a stream; signal aborts it; onOpen, if given, is called once the
// stream is open.
export async function follow(path, onEvent, signal, onOpen) {
  const r = await fetch(path, { headers: headers({ Accept: "text/event-stream" }), signal, cache: "no-store" });
  if (!r.ok) {
    const text = await r.text();
    let data = null;
    try { data = JSON.parse(text); } catch (e) { data = null; }
    if (r.status === 401) listeners.unauthorized.forEach((f) => f());
    throw new ApiError(r.status, data, text);
  }
  if (onOpen) onOpen();
  const reader = r.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
    let cut = buf.indexOf("\n\n");
    while (cut >= 0) {
      dispatch(buf.slice(0, cut), onEvent);
      buf = buf.slice(cut + 2);
      cut = buf.indexOf("\n\n");
    }
  }
}

// dispatch parses one SSE block: comments are skipped, data lines joined.
function dispatch(block, onEvent) {
  let name = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (line === "" || line.startsWith(":")) continue;
    const i = line.indexOf(":");
    const field = i < 0 ? line : line.slice(0, i);
    const value = i < 0 ? "" : line.slice(i + 1).replace(/^ /, "");
    if (field === "event") name = value;
    else if (field === "data") data.push(value);
  }
  if (data.length === 0) return;
  let parsed;
  try { parsed = JSON.parse(data.join("\n")); } catch (e) { return; }
  onEvent(name, parsed);
}
