#!/usr/bin/env node
/**
 * `drover-langgraph serve [-c langgraph.json] [--processes N]`: serves the
 * graphs of a LangGraph project (`langgraph.json`'s `graphs`, `env` and
 * its `LANGGRAPH_CONFIG`) to a drover server ($DROVER_URL, $DROVER_TOKEN,
 * $DROVER_NAMESPACE) with {@link AgentServerRuntime}: runs at once
 * $DROVER_LANGGRAPH_CONCURRENCY (default 8) in all, its session's TTL in
 * seconds $DROVER_LANGGRAPH_TTL (default 15). With `--processes N`
 * ($DROVER_LANGGRAPH_PROCESSES) it starts N runtime processes that share
 * the concurrency (one Node event loop each), forwards SIGTERM and SIGINT
 * to them (each drains), and exits non-zero once one of them dies: it
 * restarts none. TypeScript graphs need a loader:
 * `node --import tsx .../agentserver-cli.js serve`.
 */
import { fork, type ChildProcess } from "node:child_process";
import { readFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import type { GraphSource } from "./agentserver.js";
import type { GraphSourceSpec } from "./agentserver-schema.js";

interface LangGraphJson {
  graphs: Record<string, string>;
  env?: Record<string, string> | string;
}

const USAGE = `usage: drover-langgraph serve [-c langgraph.json] [--processes N]

Serves a LangGraph project's graphs to a drover server: claims its runs,
runs them, writes their checkpoints and outcomes.

  -c FILE          the project's langgraph.json (default ./langgraph.json)
  --processes N    N runtime processes sharing the runs at once (default 1,
                   or $DROVER_LANGGRAPH_PROCESSES); one dying stops them all
                   and the command exits 1 (none is restarted)

Environment: DROVER_URL, DROVER_TOKEN, DROVER_NAMESPACE (the server);
DROVER_LANGGRAPH_CONCURRENCY (runs at once in all, default 8, split among
the processes), DROVER_LANGGRAPH_TTL (session TTL, seconds, default 15).
SIGTERM or SIGINT: stop claiming, let the runs under way end, exit 0.

Example, two processes running 32 runs at once each:
  DROVER_URL=http://127.0.0.1:7070 DROVER_LANGGRAPH_CONCURRENCY=64 \\
    drover-langgraph serve -c langgraph.json --processes 2
`;

/** `serve`'s options, from its arguments and the environment. */
export interface ServeOptions {
  config: string;
  processes: number;
  concurrency: number;
}

/** Parses `serve`'s arguments; a string is a usage error to print. */
export function parseServe(argv: string[], env: NodeJS.ProcessEnv = process.env): ServeOptions | { help: true } | string {
  if (argv.includes("--help") || argv.includes("-h")) return { help: true };
  if (argv[0] !== "serve") return "expected the command serve";
  let config = "langgraph.json";
  let processes = env.DROVER_LANGGRAPH_PROCESSES || "1";
  for (let i = 1; i < argv.length; i++) {
    const a = argv[i];
    const eq = a.indexOf("=");
    const [flag, inline] = a.startsWith("--") && eq > 0 ? [a.slice(0, eq), a.slice(eq + 1)] : [a, undefined];
    const value = () => inline ?? argv[++i];
    if (flag === "-c" || flag === "--config") config = value();
    else if (flag === "--processes" || flag === "--workers") processes = value();
    else return `unknown argument ${a}`;
    if (config === undefined || processes === undefined) return `${flag} needs a value`;
  }
  const n = Number(processes);
  const concurrency = Number(env.DROVER_LANGGRAPH_CONCURRENCY ?? 8);
  if (!Number.isInteger(n) || n < 1) return `--processes must be a whole number of at least 1, not ${processes}`;
  if (!Number.isInteger(concurrency) || concurrency < n) return `DROVER_LANGGRAPH_CONCURRENCY (${concurrency}) must be a whole number of at least the processes (${n})`;
  return { config, processes: n, concurrency };
}

/** Splits total runs at once among n processes, as evenly as it goes: the first ones take one more. */
export function shares(total: number, n: number): number[] {
  return Array.from({ length: n }, (_, i) => Math.floor(total / n) + (i < total % n ? 1 : 0));
}

/**
 * Registers the logger LangGraph's SDK gives graphs (`getLogger()` of
 * `@langchain/langgraph-sdk/logging`), as LangGraph's own server does:
 * leveled lines on stderr.
 */
export function registerLogger(): void {
  const key = Symbol.for("langgraph.api.sdk-logger");
  const g = globalThis as Record<symbol, unknown>;
  if (key in g) return;
  const line = (level: string) => (msg: unknown, meta?: unknown) => console.error(`${level} ${typeof msg === "string" ? msg : JSON.stringify(msg)}${meta ? " " + JSON.stringify(meta) : ""}`);
  g[key] = { error: line("error"), warn: line("warn"), info: line("info"), debug: line("debug"), verbose: line("verbose"), child: () => g[key] };
}

/** Loads a langgraph.json's graphs: `"agent": "./agent.mts:graph"` (a graph, or a function making one). */
export async function loadGraphs(configPath: string): Promise<{ graphs: Record<string, GraphSource>; assistants: Record<string, Record<string, unknown>>; sources: Record<string, GraphSourceSpec>; projectDir: string }> {
  const cfg = JSON.parse(readFileSync(configPath, "utf8")) as LangGraphJson;
  const base = dirname(resolve(configPath));
  if (cfg.env && typeof cfg.env === "object") for (const [k, v] of Object.entries(cfg.env)) process.env[k] ??= v;
  const graphs: Record<string, GraphSource> = {};
  const sources: Record<string, GraphSourceSpec> = {};
  for (const [id, spec] of Object.entries(cfg.graphs)) {
    const [file, name = "default"] = spec.split(":");
    sources[id] = { sourceFile: resolve(base, file), exportSymbol: name };
    const mod = (await import(pathToFileURL(resolve(base, file)).href)) as Record<string, unknown>;
    graphs[id] = mod[name] as GraphSource; // compiled, a StateGraph, a promise or a factory: resolved per run
  }
  const assistants = process.env.LANGGRAPH_CONFIG ? (JSON.parse(process.env.LANGGRAPH_CONFIG) as Record<string, Record<string, unknown>>) : {};
  return { graphs, assistants, sources, projectDir: base };
}

/** Set in the processes `--processes` starts: "i/N". */
const CHILD_ENV = "DROVER_LANGGRAPH_PROCESS";

/** Messages a runtime process started by `--processes` sends its parent. */
type ChildMessage = { serving: string[] } | { schemas: true };

/** Runs one runtime in this process until SIGTERM or SIGINT (or, started by `--processes`, its parent going away). */
async function serveHere(opts: ServeOptions): Promise<void> {
  const child = process.env[CHILD_ENV];
  // Imported here, not above: a parent of `--processes` runs no graph and stays small.
  const [{ Drover }, { AgentServerRuntime }] = await Promise.all([import("./index.js"), import("./agentserver.js")]);
  registerLogger();
  const { graphs, assistants, sources, projectDir } = await loadGraphs(opts.config);
  const rt = new AgentServerRuntime({ drover: new Drover(), graphs, assistants, sources, projectDir, concurrency: opts.concurrency, ttl: process.env.DROVER_LANGGRAPH_TTL ? Number(process.env.DROVER_LANGGRAPH_TTL) : undefined, onError: (e) => console.error(e) });
  await rt.start();
  const names = Object.keys(graphs);
  // Sent only while the parent is there: a send on a closed channel throws an 'error' on process.
  const tell = (m: ChildMessage) => process.connected && process.send?.(m);
  if (child) {
    console.error(`drover-langgraph: process ${child} (pid ${process.pid}) serves ${names.join(", ")}, ${opts.concurrency} runs at once`);
    tell({ serving: names });
  } else console.error(`drover-langgraph: serving ${names.join(", ")}`);
  void rt.schemasRegistered.then(() => (child ? tell({ schemas: true }) : console.error("drover-langgraph: schemas registered")));
  let stopping = false;
  const stop = () => {
    if (stopping) return;
    stopping = true;
    console.error(`drover-langgraph: ${child ? `process ${child} ` : ""}draining, ${rt.stats?.running ?? 0} runs under way`);
    void rt.stop().then(
      () => {
        console.error(`drover-langgraph: ${child ? `process ${child} ` : ""}stopped ${JSON.stringify(rt.stats)}`);
        process.exit(0);
      },
      (e) => {
        console.error(e);
        process.exit(1);
      },
    );
  };
  process.on("SIGTERM", stop);
  if (child) {
    // A terminal's Ctrl-C reaches the whole process group: the parent forwards it as SIGTERM.
    process.on("SIGINT", () => {});
    process.on("disconnect", stop); // the parent is gone
    if (!process.connected) stop(); // it went while this one started
  } else process.on("SIGINT", stop);
}

/**
 * `--processes N`: starts N runtime processes (this script, with this
 * Node's options), each running its share of the concurrency. Resolves
 * to the exit code once all have exited: 0 when they drained on a
 * signal, 1 when one died (exited non-zero or killed; the others are
 * then drained).
 */
async function supervise(opts: ServeOptions): Promise<number> {
  const self = fileURLToPath(import.meta.url);
  const n = opts.processes;
  const procs: ChildProcess[] = shares(opts.concurrency, n).map((c, i) =>
    fork(self, ["serve", "-c", opts.config], {
      env: { ...process.env, [CHILD_ENV]: `${i + 1}/${n}`, DROVER_LANGGRAPH_CONCURRENCY: String(c), DROVER_LANGGRAPH_PROCESSES: "1" },
      stdio: ["ignore", "inherit", "inherit", "ipc"],
    }),
  );
  let stopping = false;
  let failed = false;
  let signals = 0;
  const stopAll = (sig: NodeJS.Signals) => procs.forEach((p) => p.exitCode === null && p.signalCode === null && p.kill(sig));
  const onSignal = () => {
    // The first signal drains every process; a second one kills them.
    if (signals++ === 0) console.error(`drover-langgraph: draining ${n} processes`);
    stopping = true;
    stopAll(signals > 1 ? "SIGKILL" : "SIGTERM");
  };
  process.on("SIGTERM", onSignal);
  process.on("SIGINT", onSignal);
  const serving = new Set<number>();
  const schemas = new Set<number>();
  const exits = procs.map(
    (p, i) =>
      new Promise<void>((res) => {
        p.on("message", (m: ChildMessage) => {
          if ("serving" in m && (serving.add(i), serving.size === n)) console.error(`drover-langgraph: serving ${m.serving.join(", ")} with ${n} processes`);
          if ("schemas" in m && (schemas.add(i), schemas.size === n)) console.error("drover-langgraph: schemas registered");
        });
        // A process that could not start (or whose IPC failed): the command fails and the others
        // drain. Without a listener the error would end this parent at once, the others orphaned.
        p.on("error", (err) => {
          failed = true;
          console.error(`drover-langgraph: process ${i + 1}/${n}: ${err.message}; stopping the others`);
          if (!stopping) {
            stopping = true;
            stopAll("SIGTERM");
          }
          if (p.pid === undefined) res(); // never started: no exit comes
        });
        p.on("exit", (code, signal) => {
          // One that died fails the command; one that drained (a SIGTERM of its own, as a service
          // manager may send every process at once) exits 0: either way the others drain.
          if (code !== 0) failed = true;
          if (!stopping) {
            console.error(`drover-langgraph: process ${i + 1}/${n} (pid ${p.pid}) exited (${code ?? signal}); stopping the others`);
            stopping = true;
            stopAll("SIGTERM");
          }
          res();
        });
      }),
  );
  await Promise.all(exits);
  return failed ? 1 : 0;
}

async function main(argv: string[]): Promise<void> {
  const opts = parseServe(argv);
  if (typeof opts === "string" || "help" in opts) {
    process.stderr.write((typeof opts === "string" ? `drover-langgraph: ${opts}\n` : "") + USAGE);
    process.exit(typeof opts === "string" ? 2 : 0);
  }
  if (opts.processes > 1) process.exit(await supervise(opts));
  await serveHere(opts);
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  main(process.argv.slice(2)).catch((e) => {
    console.error(e);
    process.exit(1);
  });
}
