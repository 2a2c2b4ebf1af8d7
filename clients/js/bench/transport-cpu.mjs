#!/usr/bin/env node
// Client CPU a request through the client's Transport, node:http (the
// default under Node) against fetch (a client given a `fetch` option): 32
// requests at once, 4000 measured after 500 warm-up, for a GET answered 200,
// a GET answered 404 (a problem document) and a POST with a JSON body; two
// rounds, alternating. Needs a running drover server and `npm run build`.
//
//   node bench/transport-cpu.mjs [URL]    (default $DROVER_URL, else http://127.0.0.1:8080)
import { Drover } from "../dist/index.js";

const url = process.argv[2] ?? process.env.DROVER_URL ?? "http://127.0.0.1:8080";
const N = 4000;
const C = 32;
const viaNode = new Drover({ url, namespace: "transport-cpu" });
const viaFetch = new Drover({ url, namespace: "transport-cpu", fetch: (u, i) => fetch(u, i) });
const ops = {
  get: (d) => d.transport.get("/v1/locks"),
  get404: (d) => d.transport.get("/v1/threads/00000000-0000-0000-0000-000000000001/head").catch(() => {}),
  post: (d) => d.transport.post("/v1/sessions", { ttl: 5, name: "transport-cpu-" + "a".repeat(200) }),
};

async function run(d, client, op) {
  let next = 0;
  const loop = (n) => Promise.all(Array.from({ length: C }, async () => { while (next++ < n) await ops[op](d); }));
  await loop(500);
  next = 0;
  const u0 = process.cpuUsage();
  const t0 = performance.now();
  await loop(N);
  const u = process.cpuUsage(u0);
  console.log(JSON.stringify({ client, op, cpu_us_per_req: Math.round((u.user + u.system) / N), req_per_s: Math.round((N / (performance.now() - t0)) * 1000) }));
}

for (let i = 0; i < 2; i++) {
  for (const op of Object.keys(ops)) {
    await run(viaFetch, "fetch", op);
    await run(viaNode, "node:http", op);
  }
}
process.exit(0);
