/**
 * A LangGraph runtime for drover's Agent Server API: it registers the
 * graphs it serves (so that their system assistants appear), claims runs
 * from the namespace's `langgraph` queue as any drover worker, runs each
 * graph with {@link DroverSaver} as its checkpointer, emits every chunk of
 * the run's stream modes to the run's task stream, and reports how the
 * run ended with the thread's state, under the claim's fencing token.
 *
 * ```ts
 * import { Drover } from "@droverhq/client";
 * import { AgentServerRuntime } from "@droverhq/client/agentserver";
 * const rt = new AgentServerRuntime({ drover: new Drover("http://127.0.0.1:8080"), graphs: { agent: graph } });
 * await rt.start();   // registers, then claims runs
 * // ... new Client({ apiUrl: "http://127.0.0.1:8080" }).runs.wait(null, "agent", { input })
 * await rt.stop();
 * ```
 */
import { Command } from "@langchain/langgraph";
import type { RunnableConfig } from "@langchain/core/runnables";
import { Drover } from "./index.js";
import { DroverStore } from "./agentstore.js";
import { runEvents, type EventStreamingGraph } from "./agentserver-stream.js";
import { graphRegistrationSchemas, schemaParser, staticSchemas, type GraphSchema, type GraphSourceSpec, type SubgraphGraph } from "./agentserver-schema.js";
import { ConflictError, DroverError, NotFoundError } from "./errors.js";
import { EarlierEvents, RunStreamWriter, isTransient } from "./agentserver-writer.js";
import { RunStops } from "./agentserver-cancels.js";
import { LENT_CHECKPOINTER, NEW_STATES_PAGE, RunSaver, checkpointOf, historyOf, newStates, plain, threadConfig, threadState, type RunnableGraph } from "./agentserver-state.js";
import { Lock, type LockAcquired } from "./locks.js";
import type { CheckpointRecord } from "./checkpoints.js";
import type { QueueTask } from "./queue.js";
import type { TaskContext, Worker, WorkerStats } from "./worker.js";

export { DroverStore } from "./agentstore.js";
export { plain, type RunnableGraph } from "./agentserver-state.js";
export { RunStops, cancelPollEvery, type RunStop } from "./agentserver-cancels.js";

/** The queue that carries runs (the server's `agentserver.RunsQueue`). */
export const RUNS_QUEUE = "langgraph";


/** Checkpoints the runtime's savers keep in memory, together (see DroverSaverOptions.shareCacheOf). */
const RUNTIME_CACHE = 2048;

/** LangGraph's durabilities of a run's checkpoints (the SDK's `durability`). */
const DURABILITIES = new Set(["sync", "async", "exit"]);

/** How many times a runtime sends a run's outcome before it fails the task (which runs the graph again, resumed). */
const OUTCOME_ATTEMPTS = 4;


/** A state update's task parameters, as the server submits them. */
interface UpdateTask {
  op: "update_state";
  thread_id: string;
  graph_id: string;
  values?: unknown;
  as_node?: string;
  checkpoint_id?: string;
  assistant_config?: RunnableConfig;
}


/** A graph as `langgraph.json` may export it. */
export type GraphSource = RunnableGraph | Promise<RunnableGraph> | ((config: RunnableConfig) => RunnableGraph | Promise<RunnableGraph>);

/** The graph of source, for a run with config. */
async function graphOf(source: GraphSource, config: RunnableConfig): Promise<RunnableGraph> {
  let g: unknown = await source;
  if (typeof g === "function") g = await (g as (c: RunnableConfig) => unknown)(config);
  const b = g as { compile?: () => unknown; stream?: unknown };
  if (b && typeof b.compile === "function" && typeof b.stream !== "function") g = b.compile();
  return g as RunnableGraph;
}

export interface AgentServerRuntimeOptions {
  /** The client (default `new Drover()`, which reads `$DROVER_URL`). */
  drover?: Drover;
  /**
   * The graphs served, by graph id (the names of `langgraph.json`): a
   * compiled graph, a promise of one, or a function of the run's config
   * making one (called for each run, as LangGraph's server does).
   */
  graphs: Record<string, GraphSource>;
  /** The config of the graphs' system assistants, unless `assistants` gives one. */
  config?: Record<string, unknown>;
  /** Per graph id, its system assistant's config and context (LangGraph's `LANGGRAPH_CONFIG`). */
  assistants?: Record<string, { config?: Record<string, unknown>; context?: unknown; configurable?: Record<string, unknown> }>;
  /** Per graph id, where it is exported (for LangGraph's schema parser, which reads its TypeScript types). */
  sources?: Record<string, GraphSourceSpec>;
  /** The project's directory (langgraph.json's), where LangGraph's schema parser may be installed. */
  projectDir?: string;
  /** Runs at once (default 4). */
  concurrency?: number;
  /**
   * TTL in seconds of the worker's session (default 15): a runtime that
   * dies loses its runs' claims and the threads' locks this long after,
   * and another runtime resumes them.
   */
  ttl?: number;
  /** States of a thread's history kept after each run (default 100; the server keeps at most 100). */
  historyLimit?: number;
  /** The most bytes (as JSON) of history an outcome sends beside the state; default 1 MiB. */
  historyBytes?: number;
  /**
   * How often a running run's task is read to see whether it was cancelled
   * (default 250 ms); with many runs under way, less often: the runtime
   * reads at most 40 tasks a second in all (64 runs: each every 1.6 s),
   * but each run's task at least every 2 s (more runs: more reads).
   */
  cancelPollMs?: number;
  /** Called with errors the runtime recovers from. */
  onError?: (err: unknown) => void;
}

/** A run's task parameters, as the server submits them. */
interface RunTask {
  run: {
    run_id: string;
    thread_id: string;
    assistant_id: string;
    metadata: Record<string, unknown>;
    kwargs: {
      input?: unknown;
      command?: { resume?: unknown; update?: unknown; goto?: unknown } | null;
      config?: RunnableConfig;
      context?: unknown;
      stream_mode?: string[];
      interrupt_before?: unknown;
      interrupt_after?: unknown;
      checkpoint_id?: string;
      checkpoint?: { checkpoint_id?: string; checkpoint_ns?: string } | null;
      subgraphs?: boolean;
      durability?: string;
    };
  };
  graph_id: string;
  assistant_config?: RunnableConfig;
  assistant_context?: unknown;
}

/** Runs registered LangGraph graphs for a drover server; see the module's description. */
export class AgentServerRuntime {
  readonly drover: Drover;
  private readonly opts: AgentServerRuntimeOptions;
  private readonly saver: RunSaver;
  private readonly store: DroverStore;
  private worker?: Worker;
  /** The stops of the runs, pushed by the server (one stream for all the runs). */
  private stops?: RunStops;
  /** Runs under way (their graphs, not state updates). */
  private running = 0;

  constructor(opts: AgentServerRuntimeOptions) {
    this.opts = opts;
    this.drover = opts.drover ?? new Drover();
    // One checkpoint cache for the runtime: each run's fenced saver shares it, so that what a run
    // wrote is not read back from drover for its outcome (its state and history) or the next run.
    this.saver = new RunSaver({ drover: this.drover, protection: "none", cacheSize: RUNTIME_CACHE });
    this.store = new DroverStore({ drover: this.drover });
  }

  /**
   * Registers every graph (creating its system assistant), then claims
   * runs. The graphs' schemas, slower to extract (LangGraph's parser may
   * compile their TypeScript), are registered after, while runs go on.
   */
  async start(): Promise<void> {
    const bodies: [string, GraphSource, Record<string, unknown>][] = [];
    for (const [id, source] of Object.entries(this.opts.graphs)) {
      let drawing: unknown;
      try {
        const graph = await graphOf(source, { configurable: {} });
        drawing = graph.getGraphAsync ? (await graph.getGraphAsync()).toJSON() : undefined;
      } catch {
        drawing = undefined;
      }
      const a = this.opts.assistants?.[id];
      // LANGGRAPH_CONFIG gives a graph's config as is ({configurable, ...}) or with its context beside it.
      const { context, ...config } = (a?.config ? { ...a.config, context: a.context } : a) ?? { ...this.opts.config };
      const body = { config, ...(context !== undefined ? { context } : {}), ...(drawing ? { graph: drawing } : {}) };
      await this.drover.transport.put(`/v1/agent-server/graphs/${encodeURIComponent(id)}`, body);
      bodies.push([id, source, body]);
    }
    // Live before the first claim, so that no run's task is read for a stop (bounded: a server
    // without the stream answers 404 at once, and the runs' tasks are then read as before).
    this.stops = new RunStops({ drover: this.drover, fallbackPollMs: this.opts.cancelPollMs, onError: this.opts.onError });
    await Promise.race([this.stops.ready(), new Promise((r) => setTimeout(r, 5_000).unref())]);
    this.worker = this.drover.worker(RUNS_QUEUE, { concurrency: this.opts.concurrency ?? 4, ttl: this.opts.ttl, signals: false, onError: this.opts.onError }, (t, ctx) => this.run(t, ctx));
    this.schemasRegistered = this.registerSchemas(bodies);
  }

  /** Resolves once the graphs' schemas are registered (or could not be extracted). */
  schemasRegistered: Promise<void> = Promise.resolve();

  /** Registers the schemas extracted at runtime, then, once LangGraph's parser compiled the graphs, the others. */
  private async registerSchemas(bodies: [string, GraphSource, Record<string, unknown>][]): Promise<void> {
    const p = await schemaParser(this.opts.projectDir);
    const pass = async (statics: Record<string, Record<string, GraphSchema>> | undefined) => {
      for (const [id, source, body] of bodies) {
        try {
          if (statics && !statics[id]) continue;
          const graph = await graphOf(source, { configurable: {} });
          const schemas = await graphRegistrationSchemas(graph as SubgraphGraph, p, statics?.[id]);
          if (Object.keys(schemas).length) await this.drover.transport.put(`/v1/agent-server/graphs/${encodeURIComponent(id)}`, { ...body, ...schemas });
        } catch (e) {
          this.opts.onError?.(e);
        }
      }
    };
    await pass(undefined);
    if (p && this.opts.sources) await pass(await staticSchemas(p, this.opts.sources));
  }

  /** The worker's counts: runs claimed, running, ended (undefined before {@link start}). */
  get stats(): WorkerStats | undefined {
    return this.worker?.stats;
  }

  /** Stops claiming, lets the runs under way end, and resolves then. */
  async stop(): Promise<void> {
    await this.worker?.drain();
    await this.stops?.close();
  }

  /**
   * Runs one run's task, ended early when the task is cancelled (a run's
   * stop cancels its task): the server pushes the stop on the runtime's
   * stream of stops (an older server: the task is read every
   * `cancelPollMs`), and the graph's signal fires, so that the graph stops
   * before its next step writes a checkpoint.
   */
  private async run(task: QueueTask, ctx: TaskContext): Promise<unknown> {
    const op = task.parameters as UpdateTask;
    if (op?.op === "update_state") return this.updateState(op);
    const ac = new AbortController();
    const onLost = () => ac.abort(ctx.signal.reason);
    if (ctx.signal.aborted) onLost();
    else ctx.signal.addEventListener("abort", onLost, { once: true });
    // A stop (cancel, interrupt, rollback) cancels the task: the server pushes it on the runtime's
    // stream of stops (from a server without one, the task is read every cancelPollMs).
    this.stops?.watch(task.task_id, () => ac.abort(new Error("the run was cancelled")));
    this.running++;
    let held: HeldLock | undefined;
    try {
      // The thread's lock (checkpoint admission's) fences the run's checkpoints: a run the server
      // stops for another (interrupt, rollback, cancel) has it taken away, and its late writes are
      // refused. Taken after the claim, then the task read again: a stop that came first is seen.
      // One request does both, and reads the thread's head (the graph's first read): see begin.
      const p = task.parameters as RunTask;
      const run = p.run;
      // The run's first event goes with its start (a graph not served emits none).
      const first = this.opts.graphs[p.graph_id] === undefined ? [] : [{ type: "metadata", data: { run_id: run.run_id, attempt: ctx.attempt } }];
      const begun = await this.begin(run, ctx, ac.signal, first);
      held = begun.held;
      if (begun.cancelled) ac.abort(new Error("the run was cancelled"));
      ac.signal.throwIfAborted();
      // A run that does not wait for its checkpoints (durability async, the default, or exit) has
      // them chained: those queued while one request is under way go together (langgraph-chain.ts).
      const chainPuts = run.kwargs.durability !== "sync";
      const saver = new RunSaver({ drover: this.drover, protection: "none", lock: held!.lock, shareCacheOf: this.saver, chainPuts });
      // The head the start read: the graph's first read and the outcome's walk need no request.
      if (begun.head !== undefined) saver.seedHead(run.thread_id, "", begun.head);
      return await this.runGraph(task, { ...ctx, signal: ac.signal }, saver, held, begun.stored);
    } finally {
      this.running--;
      this.stops?.unwatch(task.task_id);
      ctx.signal.removeEventListener("abort", onLost);
      // Waited for before the task ends: a task that ended with its release still on its way lost
      // the ends of its streams to a client that followed it across a member's failure (the
      // agent server chaos test, 4 of 4 runs, and none of 6 with the release waited for). The
      // outcome released it already when it took it along.
      if (held && !held.released) await held.lock.release().catch(() => false);
    }
  }

  /** Until when the server is taken not to serve the run start route (an older one answered 404). */
  private startRouteMissingUntil = 0;
  /** The server refused events with a run's start, or with its outcome (an older one): they go through the run's writer. */
  private startEventsRefused = false;
  private outcomeEventsRefused = false;

  /**
   * Starts a run: takes its thread's lock under the claim's session (waiting in line), learns
   * whether the run was cancelled before, and reads the thread's head, in one request (`POST
   * .../runs/{run}/start`). A server without that route (404) gets the requests it answers: the
   * lock, then the task's read (the head is then read by the graph); the route is tried again a
   * minute later. The run's first events (`events`) go with the start, which appends them to the
   * run's stream under the claim: `stored` is the seq of the last, undefined when they were not
   * (no start route, or an older server that refused them: the run's writer sends them).
   */
  private async begin(run: RunTask["run"], ctx: TaskContext, signal: AbortSignal, events: { type: string; data: unknown }[] = []): Promise<{ held?: HeldLock; cancelled: boolean; head?: CheckpointRecord | null; stored?: number }> {
    const t = this.drover.transport;
    if (Date.now() >= this.startRouteMissingUntil) {
      try {
        const path = `/v1/agent-server/threads/${run.thread_id}/runs/${run.run_id}/start`;
        const body = { token: ctx.token, session: ctx.session.id, wait: 60 };
        // Never repeated: a lost answer could mean the lock is ours unknowingly (the task's retry frees it with the session).
        // Not the run's signal: a stop pushed while the start is under way must not abandon it
        // (the server may have taken the lock); the server answers a stopped run cancelled.
        const opts = { retry: false, signal: ctx.session.signal, timeoutMs: 60_000 + t.timeoutMs };
        let a: RunStartAnswer;
        try {
          a = await t.post<RunStartAnswer>(path, events.length && !this.startEventsRefused ? { ...body, events } : body, opts);
        } catch (e) {
          // An older server refuses the field before it takes the lock: the start without it.
          if (!refusesEvents(e)) throw e;
          this.startEventsRefused = true;
          a = await t.post<RunStartAnswer>(path, body, opts);
        }
        if (a.cancelled || !a.lock) return { cancelled: true };
        return { held: { lock: new Lock(t, a.lock, ctx.session, false), viaOutcome: true, released: false }, cancelled: false, head: a.head ?? null, stored: a.events?.last };
      } catch (e) {
        ctx.session.observe(e);
        if (!(e instanceof NotFoundError) || (e.kind !== "no-route" && e.kind !== "")) throw e;
        this.startRouteMissingUntil = Date.now() + 60_000;
      }
    }
    const lock = await this.drover.lock(`thread:${run.thread_id}`, { session: ctx.session, wait: 60, signal });
    const held = { lock, viaOutcome: false, released: false };
    try {
      return { held, cancelled: (await this.drover.tasks.get(RUNS_QUEUE, run.run_id)).current_status === "CANCELLED" };
    } catch (e) {
      await lock.release().catch(() => false);
      throw e;
    }
  }

  /** A state update: graph.updateState on the thread, answered with the new checkpoint and the state. */
  private async updateState(u: UpdateTask): Promise<unknown> {
    const source = this.opts.graphs[u.graph_id];
    if (source === undefined) throw new Error(`graph ${u.graph_id} is not served by this runtime`);
    const config: RunnableConfig = { ...u.assistant_config, configurable: { ...u.assistant_config?.configurable, thread_id: u.thread_id, checkpoint_ns: "", ...(u.checkpoint_id ? { checkpoint_id: u.checkpoint_id } : {}) } };
    const graph = await graphOf(source, config);
    graph.checkpointer = this.saver;
    graph.store = this.store;
    if (!graph.updateState) throw new Error(`graph ${u.graph_id} cannot update state`);
    const next = await graph.updateState(config, u.values ?? null, u.as_node || undefined);
    return { checkpoint: checkpointOf(next), state: await threadState(graph, config) };
  }

  private async runGraph(task: QueueTask, ctx: TaskContext, saver: RunSaver = this.saver, held?: HeldLock, metadataStored?: number): Promise<unknown> {
    const p = task.parameters as RunTask;
    const { run } = p;
    const kw = run.kwargs;
    let config = runConfig(p, run);
    const source = this.opts.graphs[p.graph_id];
    const graph = source === undefined ? undefined : await graphOf(source, config);
    let status = "success";
    let error: { error: string; message: string } | undefined;
    const out = new RunStreamWriter(this.drover, task.task_id, ctx.session.id, ctx.token, ctx.attempt);
    if (!graph) {
      status = "error";
      error = { error: "GraphNotFound", message: `graph ${p.graph_id} is not served by this runtime` };
    } else {
      // The graph object is shared by the runs under way (a module's export): the run's own saver,
      // fenced by its thread's lock, is lent through its config, never set on the graph, or a run
      // would write its checkpoints under another run's lock. The graph's own reads the state.
      graph.checkpointer = this.saver;
      graph.store = this.store;
      try {
        if (metadataStored !== undefined) out.stored(metadataStored); // the start stored it
        else await out.emit("metadata", { run_id: run.run_id, attempt: ctx.attempt });
        // A retry of a run whose graph already wrote checkpoints resumes from them: sending the input
        // again would run its first node twice (a duplicate turn).
        const resumed = ctx.attempt > 1 && ((await saver.getTuple(threadConfig(run.thread_id)))?.metadata as { run_id?: string } | undefined)?.run_id === run.run_id;
        const input = resumed ? null : kw.command ? new Command(kw.command as ConstructorParameters<typeof Command>[0]) : kw.input;
        // A resumed run continues from the thread's latest checkpoint, its own: the checkpoint it
        // forked from would run its continuation again, without its input.
        if (resumed) config = { ...config, configurable: withoutCheckpoint(config.configurable) };
        const options = omitUndefined({
          ...config,
          configurable: { ...config.configurable, [LENT_CHECKPOINTER]: saver },
          metadata: { ...config.metadata, run_attempt: ctx.attempt },
          interruptBefore: kw.interrupt_before,
          interruptAfter: kw.interrupt_after,
          context: { ...(p.assistant_context as object), ...(kw.context as object) },
          // As LangGraph's server: "sync" waits for each step's checkpoint, "async" (LangGraph's
          // default) writes it while the next step runs, "exit" writes one when the run ends.
          durability: kw.durability && DURABILITIES.has(kw.durability) ? kw.durability : undefined,
          signal: ctx.signal,
        });
        // A later attempt replays, before its first task runs, what the checkpoint holds (its state,
        // the writes of tasks that finished): what an earlier attempt sent already is not sent again.
        const earlier = ctx.attempt > 1 ? await this.earlierEvents(task.task_id, ctx.attempt) : undefined;
        let replaying = earlier !== undefined;
        const events = runEvents(graph as RunnableGraph & EventStreamingGraph, input ?? null, options, kw.stream_mode ?? ["values"], run.run_id, kw.subgraphs ?? false, () => (replaying = false));
        for await (const ev of events) {
          const data = plain(ev.data);
          if (replaying && earlier?.replay(ev.event, data)) continue;
          await out.emit(ev.event, data);
        }
        // Its chained checkpoints stored before its outcome: a failed one fails the run as a put would.
        await saver.drain();
      } catch (e) {
        await saver.drain().catch(() => {}); // what was queued before the error is stored still
        if (ctx.signal.aborted) throw e; // cancelled or lost: the task's status says so
        // drover away (a member failing over): not the graph's error. The task fails and is retried,
        // and the next attempt resumes from the checkpoint, rather than the run ending in error.
        if (isTransient(e)) throw e;
        status = "error";
        error = { error: (e as Error)?.constructor?.name ?? "Error", message: String((e as Error)?.message ?? e) };
        await out.emit("error", error);
      }
    }
    // The run's last events, still queued, go with its outcome, which stores them before it ends the
    // run (each once, however often it is sent); the writes under way are waited for first.
    const rest = this.outcomeEventsRefused ? { events: [], from: 0, out } : { ...(await out.takeRest()), out };
    if (this.outcomeEventsRefused) await out.flush();
    // Once the graph ran, only the outcome is retried (a few times): a failure of the task would run
    // the graph again.
    for (let attempt = 1; ; attempt++) {
      try {
        // An earlier attempt's states are not counted by this run's saver.
        await this.putOutcome(graph, config, run, ctx, status, error, ctx.attempt === 1 && saver !== this.saver ? saver.rootPuts(run.thread_id) : undefined, held, saver !== this.saver ? saver : undefined, rest);
        break;
      } catch (e) {
        // The run (or its thread) was deleted while it ran: nothing to record, and nothing to retry.
        if (e instanceof NotFoundError) return { status: "deleted" };
        // A refusal (409 fenced, 413 too large, 400 …) comes again on a retry: only a lost answer, a
        // server error or a rate limit is retried.
        if (isFinal(e) || attempt >= OUTCOME_ATTEMPTS || ctx.signal.aborted) throw e;
        this.opts.onError?.(e);
        await new Promise((res) => setTimeout(res, 200 * 2 ** attempt));
      }
    }
    return { status };
  }

  /** The events the attempts before `attempt` stored in the task's stream; undefined when it could not be read (then nothing is left out). */
  private async earlierEvents(taskId: string, attempt: number): Promise<EarlierEvents | undefined> {
    try {
      return await EarlierEvents.read(this.drover, taskId, attempt);
    } catch (e) {
      this.opts.onError?.(e);
      return undefined;
    }
  }

  /**
   * Reports the run's outcome: its status, the thread's state and its history. The server keeps
   * the thread's history, so the outcome carries only the states the run added, down to one the
   * server holds (`history_append`); should the server not hold that one (a run stopped before
   * its outcome wrote states in between), the whole history, as far as the server keeps it.
   */
  private async putOutcome(graph: RunnableGraph | undefined, config: RunnableConfig, run: RunTask["run"], ctx: TaskContext, status: string, error: unknown, written = NEW_STATES_PAGE, held?: HeldLock, saver?: RunSaver, rest?: OutcomeEvents): Promise<void> {
    // Read through the run's saver (when given): it holds the thread's lock and knows what it
    // wrote, so that the state and the new states cost no request.
    const state = graph ? await threadState(graph, config, saver) : undefined;
    const limit = this.opts.historyLimit ?? 100;
    // The server keeps the history that fits 1 MiB beside the state; send no more than it can keep.
    const room = (this.opts.historyBytes ?? 1 << 20) - JSON.stringify(state ?? null).length;
    const path = `/v1/agent-server/threads/${run.thread_id}/runs/${run.run_id}/outcome`;
    // The thread's lock, when the run's start took it: the outcome releases it in its transaction.
    const lock = held?.viaOutcome ? { lock: { name: held.lock.name, token: held.lock.token, contender: held.lock.contender } } : {};
    const body = { token: ctx.token, status, ...(state ? { state } : {}), ...(error ? { error } : {}), ...lock };
    const put = async (b: Record<string, unknown>) => {
      const events = rest?.events.length ? { events: rest.events, events_from: rest.from } : {};
      try {
        await this.drover.transport.put(path, { ...b, ...events });
      } catch (e) {
        // An older server refuses the field (nothing recorded): the events go through the writer, before.
        // Kept until the writer stored them: a retry of an outcome whose writer failed carries them again
        // (and fails so), rather than being recorded without them.
        if (!rest?.events.length || !refusesEvents(e)) throw e;
        this.outcomeEventsRefused = true;
        await rest.out.putBack(rest.events);
        rest.events.splice(0);
        await this.drover.transport.put(path, b);
      }
      if (held?.viaOutcome) held.released = true;
    };
    // The states it wrote and the one before them, when the run's saver counted them: no more read.
    const page = Math.min(limit, NEW_STATES_PAGE, written + 1);
    const added = graph ? await newStates(graph, run.thread_id, run.run_id, page, room, saver) : undefined;
    if (added?.joins) {
      try {
        await put({ ...body, history: added.states, history_append: true, history_limit: limit });
        return;
      } catch (e) {
        if (!(e instanceof DroverError && e.status === 412)) throw e;
      }
    }
    // Not joined: the states read are the whole history when they are all there is or all that is kept.
    const whole = added && !added.joins && (added.states.length < page || page === limit);
    const history = whole ? added.states : graph ? await historyOf(graph, run.thread_id, limit, room, saver) : [];
    await put({ ...body, ...(history.length ? { history } : {}) });
  }
}

/** The thread's lock a run holds; `viaOutcome`: its start took it, and its outcome releases it (then `released`). */
interface HeldLock {
  lock: Lock;
  viaOutcome: boolean;
  released: boolean;
}

/** The answer of the run start route. */
interface RunStartAnswer {
  cancelled?: boolean;
  lock?: LockAcquired;
  head: CheckpointRecord | null;
  /** Where the start's events went in the stream (absent from an older server). */
  events?: { first: number; last: number };
}

/** A run's last events, sent with its outcome (see RunStreamWriter.takeRest), and the writer they came from. */
interface OutcomeEvents {
  events: { type: string; data: unknown }[];
  from: number;
  out: RunStreamWriter;
}

/** Whether e is a server refusing a body's `events` (or `events_from`) as unknown: an older one, which took nothing. */
function refusesEvents(e: unknown): boolean {
  return e instanceof DroverError && (e.status === 400 || e.status === 422) && (e.problem.errors ?? []).some((d) => d.location === "body.events" || d.location === "body.events_from");
}

/** obj without its undefined keys: LangGraph spreads run options over a graph's bound config. */
function omitUndefined<T extends Record<string, unknown>>(obj: T): T {
  return Object.fromEntries(Object.entries(obj).filter(([, v]) => v !== undefined)) as T;
}

/** configurable without the checkpoint a run named (checkpoint_id, checkpoint). */
function withoutCheckpoint(c: RunnableConfig["configurable"]): RunnableConfig["configurable"] {
  const { checkpoint_id: _id, checkpoint: _cp, ...rest } = c ?? {};
  return rest;
}

/** Whether an answer to the outcome PUT would come again on a retry: a 4xx other than 408 and 429. */
function isFinal(e: unknown): boolean {
  return e instanceof ConflictError || (e instanceof DroverError && e.status >= 400 && e.status < 500 && e.status !== 408 && e.status !== 429);
}

/** The run's config: the assistant's, then the run's, then the thread. */
function runConfig(p: RunTask, run: RunTask["run"]): RunnableConfig {
  // The SDK's config is LangGraph's JSON (recursion_limit); LangGraph.js reads recursionLimit.
  const js = (c: RunnableConfig & { recursion_limit?: number }): RunnableConfig => {
    const { recursion_limit, ...rest } = c;
    return recursion_limit !== undefined ? { recursionLimit: recursion_limit, ...rest } : rest;
  };
  const a = js(p.assistant_config ?? {});
  const r = js(run.kwargs.config ?? {});
  const cp = run.kwargs.checkpoint_id ?? run.kwargs.checkpoint?.checkpoint_id;
  return {
    ...a,
    ...r,
    tags: [...(a.tags ?? []), ...(r.tags ?? [])],
    metadata: { ...a.metadata, ...r.metadata, ...run.metadata, run_id: run.run_id, thread_id: run.thread_id, assistant_id: run.assistant_id, graph_id: p.graph_id },
    configurable: {
      ...a.configurable,
      ...r.configurable,
      thread_id: run.thread_id,
      run_id: run.run_id,
      assistant_id: run.assistant_id,
      graph_id: p.graph_id,
      ...(cp ? { checkpoint_id: cp } : {}),
    },
  };
}
