/**
 * LangGraph's long-term memory store on drover: `DroverStore extends
 * BaseStore` over the Agent Server's store routes (`/store/items`,
 * `/store/items/search`, `/store/namespaces`), so that a graph's nodes
 * that read `config.store` or `getStore()` share items with every run,
 * every runtime and every SDK client of the same drover namespace.
 *
 * The runtime ({@link AgentServerRuntime}) gives it to every graph it runs;
 * a graph run elsewhere takes it at compile time:
 *
 * ```ts
 * import { Drover } from "@droverhq/client";
 * import { DroverStore } from "@droverhq/client/agentserver";
 * const graph = builder.compile({ store: new DroverStore({ drover: new Drover("http://127.0.0.1:8080") }) });
 * ```
 *
 * Operations of one batch are sent in order, one request each. Vector
 * search (`query`) is not served: the server refuses it (501).
 */
import { BaseStore, type Item, type Operation, type OperationResults, type SearchItem } from "@langchain/langgraph-checkpoint";
import { Drover } from "./index.js";

export interface DroverStoreOptions {
  /** The client (default: `new Drover()`, which reads `$DROVER_URL`). */
  drover?: Drover;
}

/** An item as the server answers it. */
interface APIItem {
  namespace: string[];
  key: string;
  value: Record<string, unknown>;
  created_at: string;
  updated_at: string;
}

/** LangGraph's `BaseStore` over drover's store routes; see the module's description. */
export class DroverStore extends BaseStore {
  readonly drover: Drover;

  constructor(opts: DroverStoreOptions = {}) {
    super();
    this.drover = opts.drover ?? new Drover();
  }

  async batch<Op extends Operation[]>(operations: Op): Promise<OperationResults<Op>> {
    const out: unknown[] = [];
    for (const op of operations) out.push(await this.one(op));
    return out as OperationResults<Op>;
  }

  private async one(op: Operation): Promise<unknown> {
    const t = this.drover.transport;
    if ("namespacePrefix" in op) {
      const r = await t.post<{ items: APIItem[] }>(
        "/store/items/search",
        { namespace_prefix: op.namespacePrefix, filter: op.filter, limit: op.limit ?? 10, offset: op.offset ?? 0, query: op.query },
        { retry: true },
      );
      return r.items.map(toItem) as SearchItem[];
    }
    if ("value" in op) {
      // The server refuses an empty namespace; LangGraph deletes nothing there.
      if (op.value === null) return op.namespace.length ? void (await t.delete("/store/items", { body: { namespace: op.namespace, key: op.key } })) : undefined;
      await t.put("/store/items", { namespace: op.namespace, key: op.key, value: op.value, ...(op.index !== undefined ? { index: op.index } : {}) });
      return undefined;
    }
    if ("key" in op) {
      if (!op.namespace.length) return null;
      const r = await t.get<APIItem | null>("/store/items", { query: { namespace: op.namespace.join("."), key: op.key } });
      return r ? toItem(r) : null;
    }
    const prefix = op.matchConditions?.find((c) => c.matchType === "prefix")?.path;
    const suffix = op.matchConditions?.find((c) => c.matchType === "suffix")?.path;
    const r = await t.post<{ namespaces: string[][] }>(
      "/store/namespaces",
      { prefix: prefix?.length ? prefix : undefined, suffix: suffix?.length ? suffix : undefined, max_depth: op.maxDepth, limit: op.limit, offset: op.offset },
      { retry: true },
    );
    return r.namespaces;
  }
}

function toItem(r: APIItem): Item {
  return { namespace: r.namespace, key: r.key, value: r.value, createdAt: new Date(r.created_at), updatedAt: new Date(r.updated_at) };
}
