/**
 * The runtime's reading of a thread's state for the Agent Server: LangGraph
 * snapshots as the API answers them, the states a run added, and the saver
 * a run writes its checkpoints with (see agentserver.ts).
 */
import type { RunnableConfig } from "@langchain/core/runnables";
import type { ChannelVersions, Checkpoint, CheckpointMetadata } from "@langchain/langgraph-checkpoint";
import { DroverSaver } from "./langgraph.js";
import type { CheckpointRecord } from "./checkpoints.js";

/** The configurable key by which LangGraph lends a graph a checkpointer for one run (its CONFIG_KEY_CHECKPOINTER). */
export const LENT_CHECKPOINTER = "__pregel_checkpointer";

/** What a compiled LangGraph graph offers the runtime (a `CompiledStateGraph`). */
export interface RunnableGraph {
  checkpointer?: unknown;
  store?: unknown;
  stream(input: unknown, options: Record<string, unknown>): Promise<AsyncIterable<unknown>>;
  getState(config: RunnableConfig, options?: Record<string, unknown>): Promise<StateSnapshotLike>;
  getStateHistory(config: RunnableConfig, options?: Record<string, unknown>): AsyncIterableIterator<StateSnapshotLike>;
  getGraphAsync?(config?: RunnableConfig): Promise<{ toJSON(): unknown }>;
  updateState?(config: RunnableConfig, values: unknown, asNode?: string): Promise<RunnableConfig>;
}

/** What the runtime reads of LangGraph's StateSnapshot. */
export interface StateSnapshotLike {
  values: unknown;
  next: string[];
  tasks: { id: string; name: string; error?: unknown; interrupts?: unknown[]; path?: unknown; state?: unknown; result?: unknown }[];
  metadata?: Record<string, unknown>;
  createdAt?: string;
  config: RunnableConfig;
  parentConfig?: RunnableConfig;
}

/** How many of a thread's newest states a run's outcome reads first, looking for the newest one the run did not write. */
export const NEW_STATES_PAGE = 16;

/**
 * The thread's newest states (at most `limit`, and `room` bytes as JSON) down to the first that
 * run did not write, that one included (`joins`: the server's stored history holds it, as far as
 * this runtime knows). Without such a state among them, they are the thread's newest states
 * (all of its history when fewer than `limit`), as LangGraph's history lists them: by id, forks
 * included, without the head's pending writes applied.
 *
 * Through a run's saver that was told the thread's head at the run's start, they are first read
 * along the head's parents, each by its id, from what the saver knows: no request. That is the
 * list only when the parents lead to that head (no checkpoint of another branch is newer); else,
 * as without such a saver, they are listed.
 */
export async function newStates(graph: RunnableGraph, thread: string, runId: string, limit: number, room: number, saver?: RunSaver): Promise<{ states: unknown[]; joins: boolean }> {
  const start = saver?.startHead(thread);
  const walked = saver && start !== undefined ? await walkStates(graph, thread, runId, limit, room, saver, start) : undefined;
  if (walked) return walked;
  const states: unknown[] = [];
  for await (const s of graph.getStateHistory(threadConfig(thread, saver), { limit })) {
    const st = toThreadState(s);
    room -= JSON.stringify(st).length;
    if (room < 0) return { states, joins: false };
    states.push(st);
    if ((s.metadata as { run_id?: unknown } | undefined)?.run_id !== runId) return { states, joins: true };
  }
  return { states, joins: false };
}

/**
 * newStates along the head's parents, each read by id (as LangGraph's history reads it: no
 * pending writes applied), or undefined when they may not be what the list answers: they do not
 * lead to start (the head at the run's start; null: the thread had none), a parent is missing,
 * or room ran out first.
 */
async function walkStates(graph: RunnableGraph, thread: string, runId: string, limit: number, room: number, saver: RunSaver, start: string | null): Promise<{ states: unknown[]; joins: boolean } | undefined> {
  const states: unknown[] = [];
  let id = (await saver.getTuple(threadConfig(thread)))?.config.configurable?.checkpoint_id as string | undefined;
  while (id && states.length < limit) {
    const s = await graph.getState(threadConfig(thread, saver, id));
    // Not found: an empty snapshot (no creation time), never a state to send.
    if (s.createdAt === undefined) return undefined;
    const st = toThreadState(s);
    room -= JSON.stringify(st).length;
    if (room < 0) return undefined;
    states.push(st);
    // Not the run's: the newest state before the run's own, when it is the head the run started on.
    if ((s.metadata as { run_id?: unknown } | undefined)?.run_id !== runId) return id === start ? { states, joins: true } : undefined;
    id = s.parentConfig?.configurable?.checkpoint_id as string | undefined;
  }
  // The run's own states only: all of them when the thread had none before, or the newest limit.
  return id && states.length >= limit ? { states, joins: false } : start === null ? { states, joins: false } : undefined;
}

/** The thread's newest states, at most `limit` and `room` bytes as JSON. */
export async function historyOf(graph: RunnableGraph, thread: string, limit: number, room: number, saver?: DroverSaver): Promise<unknown[]> {
  const history: unknown[] = [];
  for await (const s of graph.getStateHistory(threadConfig(thread, saver), { limit })) {
    const st = toThreadState(s);
    room -= JSON.stringify(st).length;
    if (room < 0) break;
    history.push(st);
  }
  return history;
}

/** Keys of a run's configurable that LangGraph's server leaves out of a checkpoint's metadata. */
const notInMetadata = new Set(["checkpoint_ns", "checkpoint_id", "run_id", "thread_id"]);

/**
 * DroverSaver that writes into each checkpoint's metadata what LangGraph's
 * server writes there: the run's configurable (but its internal keys and
 * the checkpoint's own coordinates), the run's metadata (the SDK's
 * `metadata` of the run: a thread's history filters on it), and the run's
 * id, by which a retried run finds its own checkpoints.
 */
export class RunSaver extends DroverSaver {
  /** Checkpoints put per thread in the root namespace. */
  private readonly puts = new Map<string, number>();
  /** Per thread: the root namespace's head its run's start read (null: none). */
  private readonly starts = new Map<string, string | null>();

  /** The id of thread's head at the run's start, as seeded (null: none; undefined: not known). */
  startHead(thread: string): string | null | undefined {
    return this.starts.get(thread);
  }

  override seedHead(thread: string, ns: string, head: CheckpointRecord | null): void {
    if (ns === "") this.starts.set(String(thread), head?.checkpoint_id ?? null);
    super.seedHead(thread, ns, head);
  }

  /** How many checkpoints of thread's root namespace this saver put (LangGraph's thread id). */
  rootPuts(thread: string): number {
    return this.puts.get(thread) ?? 0;
  }

  override put(config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata, newVersions: ChannelVersions): Promise<RunnableConfig> {
    const id = config.configurable?.run_id;
    const fromConfig = Object.fromEntries(
      Object.entries(config.configurable ?? {}).filter(([k, v]) => !k.startsWith("__") && !notInMetadata.has(k) && isJSONValue(v)),
    );
    const merged = { ...fromConfig, ...(config.metadata ?? {}), ...metadata, ...(typeof id === "string" ? { run_id: id } : {}) };
    const thread = String(config.configurable?.thread_id);
    const root = !config.configurable?.checkpoint_ns;
    return super.put(config, checkpoint, merged as CheckpointMetadata, newVersions).then((r) => {
      if (root) this.puts.set(thread, (this.puts.get(thread) ?? 0) + 1);
      return r;
    });
  }
}

/** Whether v is JSON as it is (no function, class instance or cycle): what metadata can hold. */
function isJSONValue(v: unknown): boolean {
  if (v === null || ["string", "number", "boolean"].includes(typeof v)) return true;
  if (typeof v !== "object" || (Object.getPrototypeOf(v) !== Object.prototype && !Array.isArray(v))) return false;
  try {
    JSON.stringify(v);
    return true;
  } catch {
    return false;
  }
}

/**
 * The config of thread's root namespace (of checkpoint id when given), with the saver lent for
 * the read: a run's saver, which holds the thread's lock, answers from what it knows.
 */
export function threadConfig(thread: string, saver?: DroverSaver, id?: string): RunnableConfig {
  return { configurable: { thread_id: thread, checkpoint_ns: "", ...(id ? { checkpoint_id: id } : {}), ...(saver ? { [LENT_CHECKPOINTER]: saver } : {}) } };
}

/** The thread's state after a run, read through saver when given (see threadConfig). */
export async function threadState(graph: RunnableGraph, config: RunnableConfig, saver?: DroverSaver): Promise<unknown> {
  // With subgraphs: the server answers each subgraph task's state, or its reference, as asked.
  const s = await graph.getState(threadConfig(String(config.configurable?.thread_id), saver), { subgraphs: true });
  return toThreadState(s);
}

/** A config as a checkpoint reference, or null without a checkpoint id. */
export function checkpointOf(c: RunnableConfig | undefined): unknown {
  const cf = c?.configurable;
  if (!cf?.checkpoint_id) return null;
  return { thread_id: cf.thread_id, checkpoint_ns: cf.checkpoint_ns ?? "", checkpoint_id: cf.checkpoint_id, checkpoint_map: cf.checkpoint_map ?? null };
}

/** A LangGraph StateSnapshot as the Agent Server answers it (LangGraph's stateSnapshotToThreadState). */
export function toThreadState(s: StateSnapshotLike, depth = 0): unknown {
  return {
    values: plain(s.values ?? {}),
    next: s.next ?? [],
    tasks: (s.tasks ?? []).map((t) => {
      // A subgraph task: its state (read with subgraphs) or its config; both are reported, the
      // server answers one of them as the request asks.
      const st = t.state as (StateSnapshotLike & { configurable?: Record<string, unknown> }) | undefined;
      const nested = st != null && "values" in st && "next" in st && depth < 32 ? st : undefined;
      const cf = nested ? nested.config?.configurable : st?.configurable;
      return {
        id: t.id,
        name: t.name,
        error: t.error != null ? String((t.error as Error)?.message ?? t.error) : null,
        interrupts: plain(t.interrupts ?? []),
        path: plain(t.path ?? null),
        checkpoint: cf ? { thread_id: cf.thread_id, checkpoint_ns: cf.checkpoint_ns ?? "" } : null,
        state: nested ? toThreadState(nested, depth + 1) : null,
        result: plain(t.result ?? null),
      };
    }),
    metadata: plain(s.metadata ?? {}),
    created_at: s.createdAt ?? null,
    checkpoint: checkpointOf(s.config),
    parent_checkpoint: checkpointOf(s.parentConfig),
  };
}

/** A value as JSON the way LangGraph's server writes it: messages as `{type, content, ...}`. */
export function plain(v: unknown, depth = 0): unknown {
  if (v == null || typeof v !== "object" || depth > 64) return v;
  if (Array.isArray(v)) return v.map((x) => plain(x, depth + 1));
  const m = v as { toDict?: () => { type: string; data: Record<string, unknown> }; lc_serializable?: boolean };
  if (typeof m.toDict === "function" && m.lc_serializable) {
    const d = m.toDict();
    return plain({ ...d.data, type: d.type }, depth + 1);
  }
  if (v instanceof Date) return v.toISOString();
  const out: Record<string, unknown> = {};
  for (const [k, x] of Object.entries(v)) if (x !== undefined && typeof x !== "function") out[k] = plain(x, depth + 1);
  return out;
}
