// The runtime of agentserver-cli.js `serve`, with two of its options open to
// an experiment: DROVER_BENCH_CANCEL_POLL_MS (how often each running run's
// task is read for a cancel; 250 by default) and DROVER_BENCH_HISTORY_LIMIT
// (states of history sent with each outcome; 100 by default). Used by
// run-agentserver.sh when either is set.
import { Drover } from "@droverhq/client";
import { AgentServerRuntime } from "@droverhq/client/agentserver";
// Not among the package's exports: imported by its path.
const { loadGraphs, registerLogger } = await import(new URL("node_modules/@droverhq/client/dist/agentserver-cli.js", import.meta.url).href);

registerLogger();
const { graphs, assistants, sources, projectDir } = await loadGraphs(process.argv[2] ?? "langgraph.json");
const num = (v) => (v === undefined || v === "" ? undefined : Number(v));
const rt = new AgentServerRuntime({
  drover: new Drover(),
  graphs,
  assistants,
  sources,
  projectDir,
  concurrency: Number(process.env.DROVER_LANGGRAPH_CONCURRENCY ?? 8),
  cancelPollMs: num(process.env.DROVER_BENCH_CANCEL_POLL_MS),
  historyLimit: num(process.env.DROVER_BENCH_HISTORY_LIMIT),
  onError: (e) => console.error(e),
});
await rt.start();
console.error(`drover-langgraph: serving ${Object.keys(graphs).join(", ")}`);
void rt.schemasRegistered.then(() => console.error("drover-langgraph: schemas registered"));
const stop = () => void rt.stop().then(() => process.exit(0), (e) => (console.error(e), process.exit(1)));
process.once("SIGTERM", stop);
process.once("SIGINT", stop);
