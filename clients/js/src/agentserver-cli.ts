#!/usr/bin/env node
/**
 * `drover-langgraph serve [-c langgraph.json]`: serves the graphs of a
 * LangGraph project (`langgraph.json`'s `graphs`, `env` and its
 * `LANGGRAPH_CONFIG`) to a drover server ($DROVER_URL, $DROVER_TOKEN,
 * $DROVER_NAMESPACE) with {@link AgentServerRuntime}: runs at once
 * $DROVER_LANGGRAPH_CONCURRENCY (default 8), its session's TTL in seconds
 * $DROVER_LANGGRAPH_TTL (default 15). TypeScript graphs
 * need a loader: `node --import tsx .../agentserver-cli.js serve`.
 */
import { readFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { Drover } from "./index.js";
import { AgentServerRuntime, type GraphSource } from "./agentserver.js";
import type { GraphSourceSpec } from "./agentserver-schema.js";

interface LangGraphJson {
  graphs: Record<string, string>;
  env?: Record<string, string> | string;
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

async function main(argv: string[]): Promise<void> {
  if (argv[0] !== "serve") {
    process.stderr.write("usage: drover-langgraph serve [-c langgraph.json]\n");
    process.exit(2);
  }
  const i = argv.indexOf("-c");
  const path = i >= 0 ? argv[i + 1] : "langgraph.json";
  registerLogger();
  const { graphs, assistants, sources, projectDir } = await loadGraphs(path);
  const rt = new AgentServerRuntime({ drover: new Drover(), graphs, assistants, sources, projectDir, concurrency: Number(process.env.DROVER_LANGGRAPH_CONCURRENCY ?? 8), ttl: process.env.DROVER_LANGGRAPH_TTL ? Number(process.env.DROVER_LANGGRAPH_TTL) : undefined, onError: (e) => console.error(e) });
  await rt.start();
  console.error(`drover-langgraph: serving ${Object.keys(graphs).join(", ")}`);
  void rt.schemasRegistered.then(() => console.error("drover-langgraph: schemas registered"));
  const stop = () =>
    void rt.stop().then(
      () => process.exit(0),
      (e) => {
        console.error(e);
        process.exit(1);
      },
    );
  process.once("SIGTERM", stop);
  process.once("SIGINT", stop);
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  main(process.argv.slice(2)).catch((e) => {
    console.error(e);
    process.exit(1);
  });
}
