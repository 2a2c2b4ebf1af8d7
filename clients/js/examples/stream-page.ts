// Serves clients/examples/stream-page.html and passes GET /v1/tasks/{id}/stream on to the
// drover server, so that the page's EventSource is same-origin.
//   PORT=8081 node build/examples/stream-page.js   then open http://127.0.0.1:8081/?task=chat-1
import { readFileSync } from "node:fs";
import { createServer } from "node:http";
import { Readable } from "node:stream";

const api = (process.env.DROVER_URL ?? "http://127.0.0.1:8080").replace(/\/+$/, "");
const page = readFileSync(new URL("../../../examples/stream-page.html", import.meta.url));
const headers: Record<string, string> = { Accept: "text/event-stream" };
if (process.env.DROVER_TOKEN) headers.Authorization = `Bearer ${process.env.DROVER_TOKEN}`;
if (process.env.DROVER_NAMESPACE) headers["Drover-Namespace"] = process.env.DROVER_NAMESPACE;

const server = createServer(async (req, res) => {
  const url = new URL(req.url ?? "/", "http://x");
  if (url.pathname === "/") return void res.writeHead(200, { "Content-Type": "text/html; charset=utf-8" }).end(page);
  if (req.method !== "GET" || !/^\/v1\/tasks\/[^/]+\/stream$/.test(url.pathname)) return void res.writeHead(404).end();
  const ac = new AbortController();
  res.on("close", () => ac.abort());
  const last = req.headers["last-event-id"];
  try {
    const up = await fetch(api + url.pathname + url.search, { headers: { ...headers, ...(last ? { "Last-Event-ID": String(last) } : {}) }, signal: ac.signal });
    res.writeHead(up.status, { "Content-Type": up.headers.get("content-type") ?? "text/plain", "Cache-Control": "no-cache" });
    if (up.body) Readable.fromWeb(up.body as import("node:stream/web").ReadableStream).on("error", () => res.end()).pipe(res);
    else res.end();
  } catch {
    if (!res.headersSent) res.writeHead(502);
    res.end();
  }
});
server.listen(Number(process.env.PORT ?? 8081), "127.0.0.1", () => {
  const a = server.address();
  console.log(`open http://127.0.0.1:${typeof a === "object" && a ? a.port : ""}/?task=chat-1`);
});
process.on("SIGTERM", () => server.close(() => process.exit(0)));
