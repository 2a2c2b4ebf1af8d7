/**
 * A run's events as LangGraph's Agent Server streams them, from a graph's
 * `streamEvents` (v2), or its `stream` when no mode needs callbacks: the
 * chunks of the stream modes asked for (`values`,
 * `updates`, `debug`, `tasks`, `checkpoints`, `custom`, `messages-tuple`
 * as `messages`), `events` (every callback event of the run, the graph's
 * own chunks left out), and `messages`: `messages/metadata` when a chat
 * model starts a message, `messages/partial` with the message so far at
 * each token, `messages/complete` with the messages a step of the graph
 * added to its state.
 */
import type { RunnableConfig } from "@langchain/core/runnables";

/** One event of a run's stream: its SSE name and its data. */
export interface RunEvent {
  event: string;
  data: unknown;
}

/** What the stream needs of a graph: LangChain's `streamEvents`, and LangGraph's `stream` when no callback event is asked for. */
export interface EventStreamingGraph {
  streamEvents(input: unknown, options: Record<string, unknown>): AsyncIterable<unknown>;
  stream?(input: unknown, options: Record<string, unknown>): Promise<AsyncIterable<unknown>>;
}

/**
 * Whether the modes asked need the graph's callback events: `events`, and
 * `messages` (a chat model's tokens). Only then is the graph run with
 * `streamEvents`, whose callbacks cost about as much again as LangGraph's
 * own work a run; the other modes are the graph's own chunks, the same
 * from `stream`.
 */
export function needsCallbacks(asked: string[]): boolean {
  return asked.includes("events") || asked.includes("messages");
}

/** A callback event of `streamEvents` v2. */
interface StreamEvent {
  event: string;
  run_id?: string;
  tags?: string[];
  metadata?: Record<string, unknown>;
  data: { chunk?: unknown };
}

/** A message chunk as a chat model streams it. */
interface MessageChunk {
  id?: string;
  concat(other: MessageChunk): MessageChunk;
}

/** What the graph streams for the modes asked for (`events` and `messages` come from callbacks). */
export function graphStreamModes(asked: string[]): string[] {
  const modes = new Set(asked.filter((m) => m !== "events" && m !== "messages-tuple"));
  if (asked.includes("messages-tuple")) modes.add("messages");
  if (asked.includes("messages")) modes.add("values"); // complete messages come from the state
  modes.add("debug"); // checkpoints of each step, kept out of the stream unless asked
  return [...modes];
}

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null;

/** A RunnableConfig as a checkpoint reference ({thread_id, checkpoint_ns, checkpoint_id, checkpoint_map}), or null. */
export function checkpointRef(c: unknown, idRequired = true): unknown {
  const cf = isObject(c) && isObject(c.configurable) ? c.configurable : undefined;
  if (!cf || typeof cf.thread_id !== "string" || !cf.thread_id) return null;
  if (idRequired && typeof cf.checkpoint_id !== "string") return null;
  return {
    thread_id: cf.thread_id,
    checkpoint_ns: (cf.checkpoint_ns as string) || "",
    checkpoint_id: (cf.checkpoint_id as string) || null,
    checkpoint_map: cf.checkpoint_map ?? null,
  };
}

/** A task of a debug chunk: the config of its subgraph's state becomes a checkpoint reference. */
function debugTask(task: unknown): unknown {
  if (!isObject(task)) return task;
  const cp = checkpointRef(task.state, false);
  if (!cp) return task;
  const { state: _state, ...rest } = task;
  return { ...rest, checkpoint: cp };
}

/** A config without LangGraph's internal configurable keys (`__pregel_…`) and without callbacks. */
function publicConfig(c: unknown): unknown {
  if (!isObject(c) || !isObject(c.configurable)) return c;
  // run_name: a task's config carries its node's name, which LangChain drops when callbacks are
  // set (always under streamEvents): left out, so that both paths of runEvents answer alike.
  const { callbacks: _cb, run_name: _rn, runName: _rN, ...rest } = c;
  return { ...rest, configurable: Object.fromEntries(Object.entries(c.configurable).filter(([k]) => !k.startsWith("__"))) };
}

/** A debug checkpoint's payload as the Agent Server sends it: checkpoint references beside the configs. */
function debugCheckpoint(p: Record<string, unknown>): Record<string, unknown> {
  const { parentConfig, ...rest } = p;
  return {
    ...rest,
    checkpoint: checkpointRef(p.config),
    parent_checkpoint: checkpointRef(parentConfig),
    tasks: Array.isArray(p.tasks) ? p.tasks.map(debugTask) : p.tasks,
    config: publicConfig(p.config),
    parent_config: publicConfig(parentConfig),
  };
}

/** A graph chunk's data as the Agent Server sends it for its mode. */
function chunkData(mode: string, chunk: unknown): unknown {
  if (mode === "debug" && isObject(chunk)) {
    if (chunk.type === "checkpoint" && isObject(chunk.payload)) return { ...chunk, payload: debugCheckpoint(chunk.payload) };
    if (chunk.type === "task_result") return { ...chunk, payload: debugTask(chunk.payload) };
  }
  if (mode === "tasks") return debugTask(chunk);
  if (mode === "checkpoints" && isObject(chunk)) {
    const d = debugCheckpoint(chunk);
    return { values: d.values, metadata: d.metadata, next: d.next };
  }
  return chunk;
}

/** A chunk the graph streams: its subgraph's namespace (null: the root's), its mode and its data. */
type GraphChunk = [string[] | null, string, unknown];

/** The event of a graph's chunk, if its mode was asked for. */
function chunkEvent([ns, mode, chunk]: GraphChunk, asked: string[], subgraphs: boolean, onTaskStart?: () => void): RunEvent | undefined {
  const name = (m: string) => (subgraphs && ns?.length ? `${m}|${ns.join("|")}` : m);
  // The graph's debug chunks (always streamed) say when a task starts: its callback events
  // come earlier than the chunks streamed before it.
  if (mode === "debug" && isObject(chunk) && chunk.type === "task") onTaskStart?.();
  if (mode === "messages") return asked.includes("messages-tuple") ? { event: name("messages"), data: chunk } : undefined;
  return asked.includes(mode) ? { event: name(mode), data: chunkData(mode, chunk) } : undefined;
}

/**
 * The run's events: the graph run with `streamEvents` under `options`
 * (the run's config and its graph options), its chunks and callback
 * events mapped to the modes asked for; with `stream` when no mode asked
 * needs callback events (see needsCallbacks), the same chunks at about
 * half the CPU. `runId` names the graph's root
 * run: only its chunks are the run's own unless subgraphs are streamed.
 * `onTaskStart` is called when a task of the graph starts (its debug
 * `task` chunk, each time): the events before the first are what the
 * graph replays from its checkpoint (its state, the writes of tasks that
 * finished).
 */
export async function* runEvents(graph: EventStreamingGraph, input: unknown, options: RunnableConfig & Record<string, unknown>, asked: string[], runId: string, subgraphs: boolean, onTaskStart?: () => void): AsyncGenerator<RunEvent> {
  if (!needsCallbacks(asked) && typeof graph.stream === "function") {
    const chunks = await graph.stream(input, { ...options, runId, streamMode: graphStreamModes(asked), subgraphs });
    for await (const raw of chunks) {
      const ev = chunkEvent((subgraphs ? raw : [null, ...(raw as unknown[])]) as GraphChunk, asked, subgraphs, onTaskStart);
      if (ev) yield ev;
    }
    return;
  }
  const events = graph.streamEvents(input, { ...options, version: "v2", runId, streamMode: graphStreamModes(asked), subgraphs });
  const partial: Record<string, MessageChunk> = {};
  const completed = new Set<string>();
  const wantMessages = asked.includes("messages");
  for await (const raw of events) {
    const ev = raw as StreamEvent;
    if (ev.tags?.includes("langsmith:hidden")) continue;
    const own = ev.event === "on_chain_stream" && (subgraphs || ev.run_id === runId);
    if (own) {
      const out = chunkEvent((subgraphs ? ev.data.chunk : [null, ...(ev.data.chunk as unknown[])]) as GraphChunk, asked, subgraphs, onTaskStart);
      if (out) yield out;
    } else if (asked.includes("events")) {
      yield { event: "events", data: ev };
    }
    if (!wantMessages) continue;
    if (own) {
      const done = completeMessages((ev.data.chunk as unknown[])[1], completed);
      if (done.length) yield { event: "messages/complete", data: done };
    } else if (ev.event === "on_chat_model_stream" && !ev.tags?.includes("nostream")) {
      const m = ev.data.chunk as MessageChunk;
      if (!m?.id) continue;
      const seen = partial[m.id];
      if (!seen) yield { event: "messages/metadata", data: { [m.id]: { metadata: ev.metadata } } };
      partial[m.id] = seen ? seen.concat(m) : m;
      yield { event: "messages/partial", data: [partial[m.id]] };
    }
  }
}

/** The messages of a state chunk not yet sent as complete (those with an id). */
function completeMessages(chunk: unknown, completed: Set<string>): unknown[] {
  if (!isObject(chunk) || !("messages" in chunk) || typeof (chunk as { lc_serializable?: unknown }).lc_serializable === "boolean") return [];
  const list = Array.isArray(chunk.messages) ? chunk.messages : [chunk.messages];
  const out: unknown[] = [];
  for (const m of list) {
    const id = isObject(m) ? m.id : undefined;
    if (typeof id !== "string" || !id || completed.has(id)) continue;
    completed.add(id);
    out.push(m);
  }
  return out;
}
