/**
 * The JSON schemas of a graph and of its subgraphs, as LangGraph's server
 * answers them (`/assistants/{id}/schemas`, `/assistants/{id}/subgraphs`).
 * LangGraph extracts them with `@langchain/langgraph-api/schema`: from the
 * graph's Zod or StateSchema at runtime, else from its TypeScript types by
 * compiling its source file. That package is an optional peer of this
 * runtime: installed beside it (or in the project of `langgraph.json`),
 * schemas are registered; otherwise graphs are registered with their
 * subgraphs' names only and no schemas.
 */
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";

/** A graph's schemas, as LangGraph's parser gives them. */
export interface GraphSchema {
  state?: unknown;
  input?: unknown;
  output?: unknown;
  config?: unknown;
}

/** Where a graph is exported: its file and the name of its export (langgraph.json's `./agent.ts:graph`). */
export interface GraphSourceSpec {
  sourceFile: string;
  exportSymbol: string;
}

interface SchemaModule {
  getRuntimeGraphSchema(graph: unknown): Promise<GraphSchema | undefined>;
  getStaticGraphSchema(spec: GraphSourceSpec, options?: { timeoutMs?: number }): Promise<Record<string, GraphSchema>>;
}

/** What the schemas need of a compiled graph. */
export interface SubgraphGraph {
  getSubgraphsAsync?(namespace?: string, recurse?: boolean): AsyncIterable<[string, unknown]>;
}

let parser: Promise<SchemaModule | undefined> | undefined;

/** LangGraph's schema parser, from this package's place or from `from` (a project's directory); undefined when absent. */
export function schemaParser(from?: string): Promise<SchemaModule | undefined> {
  parser ??= (async () => {
    const name = "@langchain/langgraph-api/schema";
    try {
      return (await import(name)) as SchemaModule;
    } catch {
      if (!from) return undefined;
    }
    try {
      const path = createRequire(pathToFileURL(`${from}/`).href).resolve(name);
      return (await import(pathToFileURL(path).href)) as SchemaModule;
    } catch {
      return undefined;
    }
  })();
  return parser;
}

/**
 * Every graph's schemas from its TypeScript types, by graph id then by
 * `graph` or `graph|namespace` (LangGraph's parser, in one worker: one
 * compilation for all; it may take minutes). Empty when the parser is
 * absent or fails.
 */
export async function staticSchemas(p: SchemaModule | undefined, specs: Record<string, GraphSourceSpec>, timeoutMs = 600_000): Promise<Record<string, Record<string, GraphSchema>>> {
  if (!p || !Object.keys(specs).length) return {};
  const get = p.getStaticGraphSchema as unknown as (s: Record<string, GraphSourceSpec>, o: { timeoutMs: number }) => Promise<Record<string, Record<string, GraphSchema>>>;
  return get(specs, { timeoutMs }).catch(() => ({}));
}

/**
 * The registration's schemas of a graph: its own (`input_schema`, …,
 * `context_schema`, which LangGraph.js answers as the config schema) and
 * its subgraphs' by namespace (`a|b` for b inside a), at every depth:
 * extracted at runtime (Zod, StateSchema), else from `statics` (the
 * graph's entry of {@link staticSchemas}), else none.
 */
export async function graphRegistrationSchemas(graph: SubgraphGraph, p: SchemaModule | undefined, statics?: Record<string, GraphSchema>): Promise<Record<string, unknown>> {
  const names: [string, unknown][] = [];
  if (typeof graph.getSubgraphsAsync === "function") for await (const s of graph.getSubgraphsAsync(undefined, true)) names.push(s);
  const root = Object.keys(statics ?? {}).find((k) => !k.includes("|"));
  const staticOf = (ns?: string): GraphSchema | undefined => (root ? ((ns ? statics![`${root}|${ns}`] : undefined) ?? statics![root]) : undefined);
  const schemaOf = async (g: unknown, ns?: string) => (p ? await p.getRuntimeGraphSchema(g).catch(() => undefined) : undefined) ?? staticOf(ns);
  const out: Record<string, unknown> = {};
  const own = await schemaOf(graph);
  if (own) Object.assign(out, { input_schema: own.input, output_schema: own.output, state_schema: own.state, config_schema: own.config, context_schema: own.config });
  if (names.length) {
    const subs: Record<string, unknown> = {};
    for (const [ns, g] of names) subs[ns] = (await schemaOf(g, ns)) ?? {};
    out.subgraphs = subs;
  }
  return out;
}
