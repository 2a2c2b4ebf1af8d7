// The graph alone, in memory: the CPU a run of LangGraph's own work, with
// no server. The same 3-node graph as the benchmark, LangGraph's
// MemorySaver, 64 runs at once on their own threads; each run streamed,
// then its state read. EV=1 streams with streamEvents v2 and the values
// and debug modes, as drover's runtime and LangGraph's server stream;
// without it, graph.stream with values and updates.
//   node floor.mjs 2000          (in a directory whose node_modules holds package.json's packages)
//   EV=1 node floor.mjs 2000
import { MemorySaver } from "@langchain/langgraph";
import { graph } from "./graph.mjs";
graph.checkpointer = new MemorySaver();
const N = Number(process.argv[2] ?? 2000);
const C = 64;
async function one(thread) {
  const s = process.env.EV ? graph.streamEvents({ count: 1 }, { version: "v2", configurable: { thread_id: thread }, streamMode: ["values", "debug"] }) : await graph.stream({ count: 1 }, { configurable: { thread_id: thread }, streamMode: ["values", "updates"] });
  for await (const _ of s) {}
  await graph.getState({ configurable: { thread_id: thread } });
}
for (let i = 0; i < 200; i++) await one("w" + (i % C));
const u0 = process.cpuUsage(); const t0 = performance.now(); let next = 0;
await Promise.all(Array.from({ length: C }, async (_, k) => { while (next++ < N) await one("t" + k); }));
const u = process.cpuUsage(u0); const el = performance.now() - t0;
console.log(JSON.stringify({ runs: N, cpu_ms_per_run: ((u.user + u.system) / 1000 / N).toFixed(2), runs_per_s: (N / el * 1000).toFixed(1) }));
