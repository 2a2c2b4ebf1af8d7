/**
 * A LangGraph checkpoint saver on drover: `DroverSaver extends
 * BaseCheckpointSaver`, so two machines running one thread cannot lose each
 * other's updates.
 *
 * ```ts
 * import { Drover } from "@droverhq/client";
 * import { DroverSaver } from "@droverhq/client/langgraph";
 * const saver = new DroverSaver({ drover: new Drover("http://127.0.0.1:8080") });
 * const graph = builder.compile({ checkpointer: saver });
 * ```
 *
 * Protection per thread, enforced by the server in the transaction that
 * writes the checkpoint:
 *
 * - `"cas"` (the default): a checkpoint is written only if its parent is
 *   still the thread's head; otherwise `put` throws {@link ConflictError}
 *   and nothing is written. Catch it around `invoke` and invoke again: the
 *   graph reloads the new head.
 * - a lock (`lock` option or {@link DroverSaver.withLock}): every write
 *   carries the lock's fencing token and is refused with
 *   {@link FencedError} once the lock was lost. Hold the lock across the
 *   whole invocation. Its writes being the thread's only ones, the saver
 *   answers the thread's head and lists from what it read and wrote under
 *   the lock when it knows the answer (see langgraph-held.ts,
 *   {@link DroverSaver.seedHead}).
 * - `"none"`: LangGraph's own semantics (the last writer wins); what forks
 *   and `updateState` on an older checkpoint need when no lock is held.
 *
 * Storage: each checkpoint stores the values of the channels that changed
 * in it (those in `newVersions`) and, for the others, which ancestor holds
 * their current version; reading resolves them, so a long conversation
 * does not rewrite every channel at every step.
 */
import {
  BaseCheckpointSaver,
  TASKS,
  WRITES_IDX_MAP,
  maxChannelVersion,
  type ChannelVersions,
  type Checkpoint,
  type CheckpointListOptions,
  type CheckpointMetadata,
  type CheckpointPendingWrite,
  type CheckpointTuple,
  type PendingWrite,
  type SerializerProtocol,
} from "@langchain/langgraph-checkpoint";
import type { RunnableConfig } from "@langchain/core/runnables";
import { Drover } from "./index.js";
import type { CheckpointFence, CheckpointRecord, Checkpoints, PutCheckpoint } from "./checkpoints.js";
import type { Lock } from "./locks.js";
import { PutChains, type ChainSink } from "./langgraph-chain.js";
import { MAX_CARRIED_BYTES, WriteOrder, keyOf } from "./langgraph-writes.js";
import { HeldMemory, cmpCodePoints, decodeThreadId, encodeThreadId, envelopeOf, heldOf, writeEnvOf, type Envelope, type HeldCheckpoint, type HeldWrite, type SentWrite, type Typed, type WriteEnvelope } from "./langgraph-held.js";

export { ConflictError, FencedError } from "./errors.js";
export type { CheckpointRecord } from "./checkpoints.js";
export { decodeThreadId, encodeThreadId } from "./langgraph-held.js";

export interface DroverSaverOptions {
  /** The client (default: `new Drover()`, which reads `$DROVER_URL`). */
  drover?: Drover;
  /**
   * `"cas"` (default without a lock): refuse a checkpoint whose parent is
   * not the head. `"none"` (default with a lock): LangGraph's semantics,
   * any parent.
   */
  protection?: "cas" | "none";
  /** Fence every write by this lock (a {@link Lock} or its name, session and token). */
  lock?: Lock | CheckpointFence;
  /** The serializer (default LangGraph's JsonPlusSerializer). */
  serde?: SerializerProtocol;
  /** Ancestor checkpoints kept in memory to resolve carried-over channels (default 256). */
  cacheSize?: number;
  /**
   * Share the checkpoint cache of this saver (its `cacheSize` then bounds
   * it): savers of one process on one server, e.g. one fenced saver per
   * run beside the process's own, read back what the others wrote without
   * a request. Safe: a cached checkpoint is immutable (its id is unique).
   */
  shareCacheOf?: DroverSaver;
  /**
   * Chain the puts (see langgraph-chain.ts): a put answers once queued, and the puts of a thread
   * queued while one request is under way go as one request. For runs that do not wait for their
   * checkpoints (LangGraph's durability "async" or "exit"), never "sync"; await
   * {@link DroverSaver.drain} before a run counts as stored.
   */
  chainPuts?: boolean;
}

const te = new TextEncoder();
const td = new TextDecoder();
const fromB64 = (s: string) => new Uint8Array(Buffer.from(s, "base64"));
const toB64 = (b: Uint8Array) => Buffer.from(b.buffer, b.byteOffset, b.byteLength).toString("base64");

function fenceOf(l: Lock | CheckpointFence | undefined): CheckpointFence | undefined {
  if (!l) return undefined;
  if ("contender" in l) return { lock: l.name, session: l.session.id, token: l.token };
  return l;
}

/** A LangGraph checkpoint saver storing on drover; see the module's description. */
export class DroverSaver extends BaseCheckpointSaver {
  readonly drover: Drover;
  readonly protection: "cas" | "none";
  private readonly fence: CheckpointFence | undefined;
  private readonly cp: Checkpoints;
  private readonly cache: Map<string, Envelope>;
  private readonly cacheSize: number;
  private readonly opts: DroverSaverOptions;
  /** Without chainPuts: puts, and the writes that wait for them (see langgraph-writes.ts). */
  private readonly order: WriteOrder;
  /** With a lock: what this saver knows of the threads it holds (see langgraph-held.ts). */
  private readonly held: HeldMemory | undefined;
  /** With chainPuts: the puts and writes queued per thread. */
  private readonly chains: PutChains | undefined;

  constructor(opts: DroverSaverOptions = {}) {
    super(opts.serde);
    this.opts = opts;
    this.drover = opts.drover ?? new Drover();
    this.cp = this.drover.checkpoints;
    this.fence = fenceOf(opts.lock);
    this.protection = opts.protection ?? (this.fence ? "none" : "cas");
    this.cacheSize = opts.shareCacheOf?.cacheSize ?? opts.cacheSize ?? 256;
    this.cache = opts.shareCacheOf?.cache ?? new Map();
    if (this.fence) {
      const held = (this.held = new HeldMemory(this.cacheSize));
      // A lock released or whose session was lost: what was known may be stale.
      const signal = opts.lock && "contender" in opts.lock ? opts.lock.signal : undefined;
      if (signal?.aborted) held.lose();
      else signal?.addEventListener("abort", () => held.lose(), { once: true });
    }
    this.order = new WriteOrder(this.cp, this.fence, this.held, (key) => this.cache.has(key));
    this.chains = opts.chainPuts ? new PutChains(this.cp, this.chainSink(), this.fence, MAX_CARRIED_BYTES) : undefined;
  }

  /** The same saver, its writes fenced by this lock (hold it across the invocation). */
  withLock(lock: Lock | CheckpointFence, protection?: "cas" | "none"): DroverSaver {
    return new DroverSaver({ ...this.opts, drover: this.drover, lock, protection: protection ?? this.opts.protection ?? "none", serde: this.serde, shareCacheOf: this });
  }

  // ------------------------------------------------------------ encoding

  private async dump(value: unknown): Promise<Typed> {
    const [t, data] = await this.serde.dumpsTyped(value);
    if (t === "json") return { t, j: JSON.parse(typeof data === "string" ? data : td.decode(data)) };
    return { t, b: toB64(typeof data === "string" ? te.encode(data) : data) };
  }

  private async load(v: Typed): Promise<unknown> {
    if (v.t === "json") return this.serde.loadsTyped("json", JSON.stringify(v.j));
    return this.serde.loadsTyped(v.t, fromB64(v.b ?? ""));
  }


  private remember(thread: string, ns: string, id: string, env: Envelope): void {
    this.chains?.learn(thread, ns, id);
    const k = keyOf(thread, ns, id);
    this.cache.delete(k);
    this.cache.set(k, env);
    while (this.cache.size > this.cacheSize) this.cache.delete(this.cache.keys().next().value!);
  }

  private envOf(rec: CheckpointRecord): Envelope {
    const env = JSON.parse(td.decode(fromB64(rec.state))) as Envelope;
    if (env.f !== 1) throw new Error(`checkpoint ${rec.checkpoint_id} of thread ${rec.thread_id} was not written by DroverSaver (unknown format)`);
    return env;
  }

  /** The envelope of a checkpoint, from the cache or the server. */
  private async envelope(thread: string, ns: string, id: string): Promise<Envelope | undefined> {
    const hit = this.cache.get(keyOf(thread, ns, id)) ?? this.held?.env(thread, ns, id) ?? this.chains?.env(thread, ns, id);
    if (hit) return hit;
    const rec = await this.cp.get(thread, id, ns);
    if (!rec) return undefined;
    const env = this.envOf(rec);
    this.remember(thread, ns, id, env);
    return env;
  }

  /** A record as held (its state and writes decoded), its state cached. */
  private heldOf(rec: CheckpointRecord): HeldCheckpoint {
    const h = heldOf(rec, this.envOf(rec));
    this.remember(h.thread, h.ns, h.id, h.env);
    return h;
  }

  /** A checkpoint as LangGraph's tuple. */
  private async tupleOf(rec: HeldCheckpoint): Promise<CheckpointTuple> {
    const { thread, ns, env } = rec;
    const checkpoint = (await this.load(env.checkpoint)) as Checkpoint;
    const values: Record<string, unknown> = {};
    for (const [ch, v] of Object.entries(env.values)) values[ch] = await this.load(v);
    for (const [ch, [id, ver]] of Object.entries(env.refs)) {
      const anc = await this.envelope(thread, ns, id);
      if (anc && anc.stored[ch] === ver && anc.values[ch]) values[ch] = await this.load(anc.values[ch]);
    }
    checkpoint.channel_values = values;
    const metadata = (await this.serde.loadsTyped("json", JSON.stringify(rec.metadata ?? {}))) as CheckpointMetadata;
    const writes = await this.pendingWritesOf(rec.writes.values());
    const tuple: CheckpointTuple = {
      config: { configurable: { thread_id: decodeThreadId(thread), checkpoint_ns: ns, checkpoint_id: rec.id } },
      checkpoint,
      metadata,
      pendingWrites: writes,
    };
    if (rec.parentId) {
      tuple.parentConfig = { configurable: { thread_id: decodeThreadId(thread), checkpoint_ns: ns, checkpoint_id: rec.parentId } };
      if (checkpoint.v < 4) await this.migratePendingSends(checkpoint, thread, ns, rec.parentId);
    }
    return tuple;
  }

  /** Pending writes in LangGraph's order: task path, task id, index. */
  private async pendingWritesOf(writes: Iterable<HeldWrite>): Promise<CheckpointPendingWrite[]> {
    const ws = [...writes];
    ws.sort((a, b) => cmpCodePoints(a.env.p ?? "", b.env.p ?? "") || cmpCodePoints(a.task_id, b.task_id) || a.idx - b.idx);
    const out: CheckpointPendingWrite[] = [];
    for (const w of ws) out.push([w.task_id, w.channel, await this.load(w.env)]);
    return out;
  }

  /** Checkpoints of format < 4 kept pending sends in the parent's writes. */
  private async migratePendingSends(checkpoint: Checkpoint, thread: string, ns: string, parentId: string): Promise<void> {
    const parent = await this.cp.get(thread, parentId, ns);
    const writes = parent ? await this.pendingWritesOf((parent.pending_writes ?? []).map((w) => ({ task_id: w.task_id, channel: w.channel, idx: w.idx, env: writeEnvOf(w.value) }))) : [];
    const sends = writes.filter(([, ch]) => ch === TASKS).map(([, , v]) => v);
    checkpoint.channel_values ??= {};
    checkpoint.channel_values[TASKS] = sends;
    checkpoint.channel_versions ??= {};
    const versions = Object.values(checkpoint.channel_versions);
    checkpoint.channel_versions[TASKS] = versions.length > 0 ? maxChannelVersion(...versions) : this.getNextVersion(undefined);
  }

  // ------------------------------------------------------------ the saver

  async getTuple(config: RunnableConfig): Promise<CheckpointTuple | undefined> {
    const threadId = config.configurable?.thread_id as string | undefined;
    if (threadId === undefined || threadId === null) return undefined;
    const thread = encodeThreadId(String(threadId));
    const ns = (config.configurable?.checkpoint_ns as string | undefined) ?? "";
    const id = config.configurable?.checkpoint_id as string | undefined;
    const rec = await this.readOne(thread, ns, id);
    if (!rec) return undefined;
    const tuple = await this.tupleOf(rec);
    if (id) tuple.config = config.configurable?.checkpoint_ns === undefined ? { ...config, configurable: { ...config.configurable, checkpoint_ns: ns } } : config;
    return tuple;
  }

  /** Checkpoint id, else the head; under a lock, once the writes under way landed, as known (else read, and learned). */
  private async readOne(thread: string, ns: string, id: string | undefined): Promise<HeldCheckpoint | undefined> {
    await this.chains?.settle(thread, ns);
    const held = this.held?.usable(thread, ns) ? this.held : undefined;
    if (held) {
      await held.settle(thread, ns);
      const known = id ? held.get(thread, ns, id) : held.head(thread, ns);
      if (known !== undefined) return known ?? undefined;
    }
    const mark = held?.mark(thread, ns) ?? 0;
    const rec = id ? await this.cp.get(thread, id, ns) : await this.cp.head(thread, ns);
    const h = rec && this.heldOf(rec);
    if (held && h && id) held.learnOne(h, mark);
    else if (held && !id) held.learnHead(thread, ns, h ?? null, mark);
    return h;
  }

  /**
   * Tells a saver holding the thread's lock the head of thread (LangGraph's thread id) in ns as
   * GET /v1/threads/{id}/head answers it, read under the lock (null: no checkpoint): its reads
   * of that head, and lists of a thread that had none, then make no request. Without a lock,
   * or once a write of this saver there landed, it changes nothing.
   */
  seedHead(thread: string, ns: string, head: CheckpointRecord | null): void {
    if (!this.held) return;
    const t = encodeThreadId(String(thread));
    if (head && (head.thread_id !== t || (head.checkpoint_ns ?? "") !== ns)) return;
    let h: HeldCheckpoint | null = null;
    try {
      if (head) h = this.heldOf(head);
    } catch {
      return; // not a DroverSaver checkpoint: its reads will say so
    }
    this.held.learnHead(t, ns, h, 0);
  }

  async *list(config: RunnableConfig, options: CheckpointListOptions = {}): AsyncGenerator<CheckpointTuple> {
    const { limit, before, filter } = options;
    const threadId = config.configurable?.thread_id as string | undefined;
    const ns = config.configurable?.checkpoint_ns as string | undefined;
    const onlyId = config.configurable?.checkpoint_id as string | undefined;
    let beforeId = before?.configurable?.checkpoint_id as string | undefined;
    const cleanFilter = filter ? Object.fromEntries(Object.entries(filter).filter(([, v]) => v !== undefined)) : undefined;
    let left = limit === undefined ? Infinity : limit;
    if (left <= 0) return;
    const thread = threadId === undefined || threadId === null ? undefined : encodeThreadId(String(threadId));
    await this.chains?.settle(thread, ns);
    // Under a lock, one thread and namespace without a filter: from what the saver knows, once
    // the writes under way landed, when it knows all the answer holds (else listed, and learned).
    const held = thread !== undefined && ns !== undefined && !Object.keys(cleanFilter ?? {}).length && this.held?.usable(thread, ns) ? this.held : undefined;
    const known = held && !onlyId ? await held.settle(thread!, ns!).then(() => held.list(thread!, ns!, left, beforeId)) : undefined;
    if (known) {
      for (const h of known) yield await this.tupleOf(h);
      return;
    }
    for (;;) {
      const pageSize = Math.min(1000, left);
      const q = { checkpoint_ns: ns, before: beforeId, limit: pageSize, filter: cleanFilter };
      const mark = held?.mark(thread!, ns!) ?? 0;
      const page = (thread ? await this.cp.list(thread, q) : await this.cp.listAll(q)).map((rec) => this.heldOf(rec));
      held?.learnPage(thread!, ns!, beforeId, pageSize, page, mark);
      for (const rec of page) {
        if (onlyId && rec.id !== onlyId) continue;
        yield await this.tupleOf(rec);
        if (--left <= 0) return;
      }
      // One thread pages by `before`; across threads the API has no cursor.
      if (!thread || page.length < pageSize) return;
      beforeId = page[page.length - 1]!.id;
    }
  }

  put(config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata, newVersions: ChannelVersions): Promise<RunnableConfig> {
    if (!config.configurable) return Promise.reject(new Error('DroverSaver.put: the config has no "configurable" (it needs a thread_id)'));
    const threadId = config.configurable.thread_id as string | undefined;
    if (threadId === undefined || threadId === null) {
      return Promise.reject(new Error('DroverSaver.put: the config is missing "thread_id" in "configurable": pass one, e.g. graph.invoke(input, { configurable: { thread_id: "..." } })'));
    }
    let thread: string;
    try {
      thread = encodeThreadId(String(threadId));
    } catch (err) {
      return Promise.reject(err);
    }
    const ns = (config.configurable.checkpoint_ns as string | undefined) ?? "";
    if (this.chains) return this.chainPut(config, thread, ns, checkpoint, metadata, newVersions);
    // Counted as under way from the call on (writes to it wait for it).
    const key = keyOf(thread, ns, checkpoint.id);
    const tn = keyOf(thread, ns, "");
    this.order.putStarted(tn);
    const p = this.doPut(config, thread, ns, checkpoint, metadata, newVersions).then(
      (r) => (this.order.putSettled(key, tn, null), r),
      (err) => {
        this.order.putSettled(key, tn, err);
        throw err;
      },
    );
    return this.held ? this.held.track(thread, ns, p, true) : p;
  }

  private async doPut(config: RunnableConfig, thread: string, ns: string, checkpoint: Checkpoint, metadata: CheckpointMetadata, newVersions: ChannelVersions): Promise<RunnableConfig> {
    const parentId = config.configurable!.checkpoint_id as string | undefined;
    const { env, meta, body } = await this.prepare(config, thread, ns, checkpoint, metadata, newVersions);
    // The parent's pending writes go with this put: LangGraph sends a step's writes, then, once the
    // parent's put is done, the put of the next checkpoint.
    await this.order.putWith(thread, body, parentId ? await this.order.parentWrites(keyOf(thread, ns, parentId)) : []);
    this.remember(thread, ns, checkpoint.id, env);
    this.held?.putLanded({ thread, ns, id: checkpoint.id, ...(parentId ? { parentId } : {}), metadata: meta, env, writes: new Map() });
    return { configurable: { thread_id: config.configurable!.thread_id, checkpoint_ns: ns, checkpoint_id: checkpoint.id } };
  }

  /** A put queued in its thread's chain: answered now, stored with the next request. */
  private async chainPut(config: RunnableConfig, thread: string, ns: string, checkpoint: Checkpoint, metadata: CheckpointMetadata, newVersions: ChannelVersions): Promise<RunnableConfig> {
    const failed = this.chains!.error(thread, ns);
    if (failed) throw failed;
    // Counted from the call on: a chain sent meanwhile would leave out writes this put's checkpoint has.
    const queued = this.chains!.coming(thread, ns);
    let landed: Promise<void>;
    try {
      const { env, meta, body } = await this.prepare(config, thread, ns, checkpoint, metadata, newVersions);
      // Throws when a chain of the thread failed while this one was prepared.
      landed = this.chains!.put({ thread, ns, body: { ...body, checkpoint_id: checkpoint.id }, env, meta });
    } finally {
      queued();
    }
    landed.catch(() => {}); // the chain's failure is the next put's, and drain's
    this.held?.track(thread, ns, landed, false);
    return { configurable: { thread_id: config.configurable!.thread_id, checkpoint_ns: ns, checkpoint_id: checkpoint.id } };
  }

  /** What the sink of this saver's chains does as they land: what doPut does once its put is done. */
  private chainSink(): ChainSink {
    return {
      putLanded: (p) => {
        const parentId = p.body.parent_checkpoint_id;
        this.remember(p.thread, p.ns, p.body.checkpoint_id, p.env);
        this.held?.putLanded({ thread: p.thread, ns: p.ns, id: p.body.checkpoint_id, ...(parentId ? { parentId } : {}), metadata: p.meta, env: p.env, writes: new Map() });
      },
      writesLanded: (thread, ns, id, taskId, writes) => this.held?.writesLanded(thread, ns, id, taskId, writes),
      chainFailed: (thread, ns, err) => this.held?.unsure(thread, ns, err),
      stored: (thread, ns, id) => this.order.knownStored(keyOf(thread, ns, id)),
    };
  }

  /** Waits until every chained put and write of this saver landed; rejects with a chain's failure. Without chainPuts, nothing to wait for. */
  async drain(): Promise<void> {
    await this.chains?.drain();
  }

  /** A put's envelope, metadata and body (without the parent's writes). */
  private async prepare(config: RunnableConfig, thread: string, ns: string, checkpoint: Checkpoint, metadata: CheckpointMetadata, newVersions: ChannelVersions): Promise<{ env: Envelope; meta: Record<string, unknown>; body: PutCheckpoint }> {
    const parentId = config.configurable!.checkpoint_id as string | undefined;
    const env = await envelopeOf(checkpoint, newVersions, parentId, (id) => this.envelope(thread, ns, id), (v) => this.dump(v));
    const [mt, mdata] = await this.serde.dumpsTyped(metadata);
    const meta = mt === "json" ? (JSON.parse(typeof mdata === "string" ? mdata : td.decode(mdata)) as Record<string, unknown>) : { ...metadata };
    const body: PutCheckpoint = {
      checkpoint_ns: ns,
      checkpoint_id: checkpoint.id,
      ...(parentId ? { parent_checkpoint_id: parentId } : {}),
      metadata: meta,
      state: te.encode(JSON.stringify(env)),
      mode: this.protection === "cas" ? "cas" : "append",
      ...(this.fence ? { fence: this.fence } : {}),
    };
    return { env, meta, body };
  }

  async putWrites(config: RunnableConfig, writes: PendingWrite[], taskId: string, taskPath?: string): Promise<void> {
    const threadId = config.configurable?.thread_id as string | undefined;
    const id = config.configurable?.checkpoint_id as string | undefined;
    if (threadId === undefined || threadId === null) throw new Error('DroverSaver.putWrites: the config is missing "thread_id" in "configurable"');
    if (!id) throw new Error('DroverSaver.putWrites: the config is missing "checkpoint_id" in "configurable"');
    const ns = (config.configurable?.checkpoint_ns as string | undefined) ?? "";
    const thread = encodeThreadId(String(threadId));
    const send = (out: SentWrite[]) => (this.chains ? this.chains.writes(thread, ns, id, taskId, out) : this.order.writeWhenStored(thread, ns, id, taskId, out));
    // Chained: the next chain of the thread waits for these writes to be serialized and queued.
    const queued = this.chains?.coming(thread, ns) ?? (() => {});
    const serialized = this.sentWrites(writes, taskPath).finally(queued);
    if (!this.held) return send(await serialized);
    // Counted as under way from the call on: a read that comes while the values are serialized waits for them.
    const done = this.held.replacing(thread, ns, id, taskId, writes.map(([channel], i) => ({ idx: WRITES_IDX_MAP[channel] ?? i })));
    const sent = serialized.then(send);
    return this.held.track(thread, ns, sent, false).finally(done);
  }

  /** A task's writes as sent: each value serialized, at its index. */
  private sentWrites(writes: PendingWrite[], taskPath: string | undefined): Promise<SentWrite[]> {
    return Promise.all(writes.map(async ([channel, value], i) => {
      const env: WriteEnvelope = { ...(await this.dump(value)), ...(taskPath ? { p: taskPath } : {}) };
      return { channel, value: te.encode(JSON.stringify(env)), idx: WRITES_IDX_MAP[channel] ?? i, env };
    }));
  }

  async deleteThread(threadId: string): Promise<void> {
    const thread = encodeThreadId(String(threadId));
    await this.chains?.settle(thread);
    await this.cp.deleteThread(thread);
    this.chains?.forget(thread);
    this.held?.forgetThread(thread);
    const prefix = `${thread}\u0000`;
    for (const k of [...this.cache.keys()]) if (k.startsWith(prefix)) this.cache.delete(k);
  }
}
