/**
 * Chained checkpoint puts: what DroverSaver does for a run that does not wait for its
 * checkpoints (LangGraph's durability "async" or "exit").
 *
 * LangGraph calls a saver's puts one after another, the next once the last answered, so each
 * checkpoint of a run is its own request even when the run does not wait for them. Chained, a
 * put answers as soon as it is queued; per thread and namespace one request is under way at a
 * time, and it carries every checkpoint queued before it (each the parent of the next) with the
 * pending writes of each: one request and, while they fit, one etcd transaction for what took
 * one request each. A failed request fails every later put and write of its thread and
 * namespace, and {@link PutChains.drain}, which the run awaits before it ends.
 */
import { DroverError, NotFoundError } from "./errors.js";
import type { ChainLink, CheckpointFence, Checkpoints, PutCheckpoint, TaskWrites } from "./checkpoints.js";
import type { Envelope, SentWrite } from "./langgraph-held.js";

/** The most checkpoints a chain request carries (what the server stores in one transaction). */
const MAX_LINKS = 32;

/**
 * How long writes of a checkpoint neither queued, sent nor known stored wait for its put before
 * they go alone: LangGraph may call putWrites before the put of their checkpoint (at a run's exit,
 * its pending writes are flushed before the last put is called; a put waiting for DeltaChannel
 * writes comes after the next step's writes).
 */
const HOLD_MS = 1000;

/** Ids of checkpoints known stored, remembered per thread and namespace (their writes go alone). */
const STORED_IDS = 1024;

/** How long writes of a checkpoint not stored (404) are sent again while their put may still come. */
const WRITES_DEADLINE_MS = 30_000;

/** A task's writes of a checkpoint, waiting for a chain to carry them. */
interface QueuedWrites {
  id: string;
  taskId: string;
  writes: SentWrite[];
  resolve: () => void;
  reject: (err: unknown) => void;
  /** When it was queued, or queued again after a 404 (Date.now()). */
  at: number;
  /** When it was first queued. */
  first: number;
}

/** A checkpoint waiting for a chain, with the writes of tasks of its step. */
export interface QueuedPut {
  thread: string;
  ns: string;
  body: PutCheckpoint & { checkpoint_id: string };
  env: Envelope;
  meta: Record<string, unknown>;
  /** Writes of this checkpoint, given to it by a flush. */
  own: QueuedWrites[];
  resolve: () => void;
  reject: (err: unknown) => void;
}

/** What a queue's owner learns as its chains land. */
export interface ChainSink {
  /** A checkpoint landed (called in chain order). */
  putLanded(p: QueuedPut): void;
  /** Writes of checkpoint id landed. */
  writesLanded(thread: string, ns: string, id: string, taskId: string, writes: SentWrite[]): void;
  /** A chain failed: what it stored is not known. */
  chainFailed(thread: string, ns: string, err: unknown): void;
  /** Whether checkpoint id is known stored (read, or put by another saver of the process). */
  stored(thread: string, ns: string, id: string): boolean;
}

/** One thread and namespace. */
interface Queue {
  thread: string;
  ns: string;
  puts: QueuedPut[];
  /** The puts of the request under way. */
  sent: QueuedPut[];
  /** Writes of checkpoints not in puts: the first put's parent's, or landed ones'. */
  loose: QueuedWrites[];
  /** Writes being serialized and puts being prepared, whose queueing a chain waits for. */
  coming: number;
  /** Ids of checkpoints known stored (its chains', and those the saver read), the newest last. */
  stored: Set<string>;
  /** A flush set for when held writes go alone. */
  timer: NodeJS.Timeout | undefined;
  scheduled: boolean;
  sending: Promise<void> | undefined;
  /** A chain that failed: what every later put and write fails with. */
  error: unknown;
}

const bytesOf = (ws: SentWrite[]) => ws.reduce((n, w) => n + w.value.byteLength, 0);
const taskWrites = (qs: QueuedWrites[]): TaskWrites[] => qs.map((q) => ({ task_id: q.taskId, writes: q.writes }));

/** The queues of one saver; see the module's description. */
export class PutChains {
  private readonly queues = new Map<string, Queue>();
  /** Set once the server answered that it has no chain route (an older build): puts go one by one. */
  private noRoute = false;

  /**
   * @param fence the saver's fence, on every request
   * @param maxBytes the most bytes of states and writes a chain request carries
   */
  constructor(
    private readonly cp: Checkpoints,
    private readonly sink: ChainSink,
    private readonly fence: CheckpointFence | undefined,
    private readonly maxBytes: number,
  ) {}

  private queue(thread: string, ns: string): Queue {
    const k = `${thread}\u0000${ns}`;
    let q = this.queues.get(k);
    if (!q && this.queues.size >= 4096) {
      for (const [key, v] of this.queues) if (this.idle(v) && v.error === undefined) this.queues.delete(key);
    }
    if (!q) this.queues.set(k, (q = { thread, ns, puts: [], sent: [], loose: [], coming: 0, stored: new Set(), timer: undefined, scheduled: false, sending: undefined, error: undefined }));
    return q;
  }

  /** Checkpoint id of thread and ns is known stored (read, or stored): its writes go alone. */
  learn(thread: string, ns: string, id: string): void {
    remember(this.queue(thread, ns).stored, id);
  }

  /** Forgets thread (deleted): its queues that hold nothing, their failure with them. */
  forget(thread: string): void {
    for (const [k, q] of this.queues) if (q.thread === thread && this.idle(q)) this.queues.delete(k);
  }

  private idle(q: Queue): boolean {
    return !q.sending && !q.puts.length && !q.loose.length && !q.coming;
  }

  /** The envelope of a checkpoint queued and not landed yet. */
  env(thread: string, ns: string, id: string): Envelope | undefined {
    const q = this.queues.get(`${thread}\u0000${ns}`);
    const is = (p: QueuedPut) => p.body.checkpoint_id === id;
    return (q?.puts.find(is) ?? q?.sent.find(is))?.env;
  }

  /** The failure of a chain of thread and ns, which every later put and write fails with (undefined: none). */
  error(thread: string, ns: string): unknown {
    return this.queues.get(`${thread}\u0000${ns}`)?.error;
  }

  /** Queues a put; the promise settles once it landed. A chain of its thread that failed before fails it now (throws). */
  put(p: Omit<QueuedPut, "own" | "resolve" | "reject">): Promise<void> {
    const q = this.queue(p.thread, p.ns);
    if (q.error) throw q.error;
    return new Promise<void>((resolve, reject) => {
      q.puts.push({ ...p, own: [], resolve, reject });
      this.schedule(q);
    });
  }

  /** Counts writes of thread and ns being serialized, or a put being prepared: a chain waits for them (call the result once queued or failed). */
  coming(thread: string, ns: string): () => void {
    const q = this.queue(thread, ns);
    q.coming++;
    let done = false;
    return () => {
      if (done) return;
      done = true;
      if (--q.coming === 0) this.schedule(q);
    };
  }

  /** Queues a task's writes of checkpoint id; the promise settles once they landed. */
  writes(thread: string, ns: string, id: string, taskId: string, writes: SentWrite[]): Promise<void> {
    const q = this.queue(thread, ns);
    if (q.error) return Promise.reject(q.error);
    return new Promise<void>((resolve, reject) => {
      const now = Date.now();
      // The next flush gives them to their checkpoint's put, queued before or after them.
      q.loose.push({ id, taskId, writes, resolve, reject, at: now, first: now });
      this.schedule(q);
    });
  }

  /**
   * Waits until the queued puts and writes of thread (every thread when undefined) in ns (every
   * namespace when undefined) landed or failed: a read after them sees them. Failures are drain's.
   */
  async settle(thread?: string, ns?: string, mode: "settle" | "drain" = "settle"): Promise<void> {
    const of = () => [...this.queues.values()].filter((q) => (thread === undefined || q.thread === thread) && (ns === undefined || q.ns === ns) && (q.sending || q.puts.length || q.loose.length));
    for (let round = 0, busy = of(); busy.length && round < 1000; round++, busy = of()) {
      for (const q of busy) if (!q.sending) this.flush(q, mode);
      const sending = busy.map((q) => q.sending).filter((p) => p !== undefined);
      if (sending.length) await Promise.allSettled(sending);
      else {
        // Only writes waiting for their checkpoint's put (a read while they wait): until it comes, or they go alone.
        await new Promise((r) => setTimeout(r, 20));
      }
    }
  }

  /** Waits until every queued put and write landed; rejects with a chain's failure (once). Writes whose put never came go alone. */
  async drain(): Promise<void> {
    await this.settle(undefined, undefined, "drain");
    let err: unknown;
    for (const [k, q] of this.queues) {
      if (q.error && err === undefined) err = q.error;
      if (this.idle(q)) this.queues.delete(k);
    }
    if (err !== undefined) throw err;
  }

  private schedule(q: Queue): void {
    if (q.scheduled || q.sending) return;
    q.scheduled = true;
    setImmediate(() => {
      q.scheduled = false;
      this.flush(q, "auto");
    });
  }

  /**
   * Sends what q holds as one chain, unless one is under way. auto: not while writes or puts are
   * still coming; settle: now; drain: now, and writes whose put has not come go alone once
   * nothing more is coming.
   */
  private flush(q: Queue, mode: "auto" | "settle" | "drain"): void {
    if (q.sending || (mode === "auto" && q.coming > 0) || (!q.puts.length && !q.loose.length)) return;
    // Writes of a queued put go with it, whether they came before it, after it, or again after a 404.
    for (const w of q.loose) q.puts.find((p) => p.body.checkpoint_id === w.id)?.own.push(w);
    q.loose = q.loose.filter((w) => !q.puts.some((p) => p.own.includes(w)));
    const first = q.puts[0]?.body.parent_checkpoint_id;
    const withFirst = q.puts.length ? q.loose.filter((w) => w.id === first) : [];
    const puts = (q.sent = this.takeChain(q, withFirst));
    // Writes of a checkpoint stored go alone; those of one not known yet wait for its put a while.
    const now = Date.now();
    const known = q.loose.filter((w) => !withFirst.includes(w) && (q.stored.has(w.id) || this.sink.stored(q.thread, q.ns, w.id)));
    const last = mode === "drain" && q.coming === 0;
    // Sent alone though not known stored: a 404 queues them again (their put may still come), unless draining.
    const aged = q.loose.filter((w) => !withFirst.includes(w) && !known.includes(w) && (last || now - w.at >= HOLD_MS));
    const alone = [...known, ...aged];
    q.loose = q.loose.filter((w) => !withFirst.includes(w) && !alone.includes(w));
    if (q.loose.length && !q.timer) {
      const wait = Math.max(1, HOLD_MS - (now - Math.min(...q.loose.map((w) => w.at))));
      q.timer = setTimeout(() => {
        q.timer = undefined;
        this.schedule(q);
      }, wait);
    }
    if (!puts.length && !withFirst.length && !alone.length) {
      q.sent = [];
      return;
    }
    q.sending = this.send(q, puts, withFirst, known, last ? [] : aged, last ? aged : []).then(
      () => undefined,
      (err) => this.fail(q, err, puts, [...withFirst, ...alone]),
    ).finally(() => {
      q.sending = undefined;
      q.sent = [];
      if (q.error) this.fail(q, q.error, q.puts.splice(0), q.loose.splice(0));
      else this.schedule(q);
    });
  }

  /** The puts of q's next request: as many as fit in one. */
  private takeChain(q: Queue, withFirst: QueuedWrites[]): QueuedPut[] {
    let bytes = withFirst.reduce((m, w) => m + bytesOf(w.writes), 0);
    let n = 0;
    for (const p of q.puts) {
      const b = p.body.state.byteLength + p.own.reduce((m, w) => m + bytesOf(w.writes), 0);
      // A chain's checkpoints follow one another: a put on another parent (a fork) starts the next.
      const follows = n === 0 || p.body.parent_checkpoint_id === q.puts[n - 1]!.body.checkpoint_id;
      if (n > 0 && (!follows || n >= MAX_LINKS || bytes + b > this.maxBytes)) break;
      bytes += b;
      n++;
    }
    return q.puts.splice(0, n);
  }

  private async send(q: Queue, puts: QueuedPut[], withFirst: QueuedWrites[], known: QueuedWrites[], aged: QueuedWrites[], last: QueuedWrites[]): Promise<void> {
    // Writes of checkpoints stored before (a chain landed, one read, another writer's): alone.
    await Promise.all([...known.map((w) => this.sendWrites(q, w)), ...aged.map((w) => this.sendWrites(q, w, true)), ...last.map((w) => this.sendWrites(q, w))]);
    if (!puts.length) return;
    if (!this.noRoute) {
      try {
        await this.cp.putChain(q.thread, this.chainOf(q, puts, withFirst));
      } catch (err) {
        if (!routeMissing(err)) throw err;
        this.noRoute = true;
        return this.oneByOne(q, puts, withFirst);
      }
      this.landed(q, puts, withFirst);
      for (const p of puts) this.wrote(q, p.own);
      return;
    }
    return this.oneByOne(q, puts, withFirst);
  }

  private chainOf(q: Queue, puts: QueuedPut[], withFirst: QueuedWrites[]) {
    const b = puts[0]!.body;
    const links: ChainLink[] = puts.map((p, i) => ({
      checkpoint_id: p.body.checkpoint_id,
      ...(p.body.parent_checkpoint_id ? { parent_checkpoint_id: p.body.parent_checkpoint_id } : {}),
      ...(p.body.metadata ? { metadata: p.body.metadata } : {}),
      state: p.body.state,
      parent_writes: taskWrites(i === 0 ? withFirst : puts[i - 1]!.own),
    }));
    return { checkpoint_ns: q.ns, mode: b.mode ?? "cas", ...(this.fence ? { fence: this.fence } : {}), checkpoints: links, writes: taskWrites(puts[puts.length - 1]!.own) };
  }

  /** A server without the chain route: each put with its parent's writes, then the last one's writes. */
  private async oneByOne(q: Queue, puts: QueuedPut[], withFirst: QueuedWrites[]): Promise<void> {
    for (const [i, p] of puts.entries()) {
      const carried = i === 0 ? withFirst : puts[i - 1]!.own;
      await this.cp.put(q.thread, { ...p.body, ...(carried.length ? { parent_writes: taskWrites(carried) } : {}) });
      this.landed(q, [p], carried);
    }
    for (const w of puts[puts.length - 1]!.own) await this.sendWrites(q, w);
  }

  /** Sends a task's writes alone. */
  private async sendWrites(q: Queue, w: QueuedWrites, again = false): Promise<void> {
    try {
      await this.cp.putWrites(q.thread, w.id, { checkpoint_ns: q.ns, task_id: w.taskId, writes: w.writes, ...(this.fence ? { fence: this.fence } : {}) });
    } catch (err) {
      // Not stored yet, and its put may still come: queued again, to go with it or alone later.
      if (!again || !(err instanceof NotFoundError) || Date.now() - w.first >= WRITES_DEADLINE_MS) throw err;
      w.at = Date.now();
      q.loose.push(w);
      return;
    }
    remember(q.stored, w.id);
    this.wrote(q, [w]);
  }

  /** Tells the sink that writes landed, and settles their promises. */
  private wrote(q: Queue, ws: QueuedWrites[]): void {
    for (const w of ws) {
      this.sink.writesLanded(q.thread, q.ns, w.id, w.taskId, w.writes);
      w.resolve();
    }
  }

  /** Tells the sink that puts landed, in order, after the writes before them, and settles their promises. */
  private landed(q: Queue, puts: QueuedPut[], before: QueuedWrites[]): void {
    this.wrote(q, before);
    for (const p of puts) {
      remember(q.stored, p.body.checkpoint_id);
      this.sink.putLanded(p);
      p.resolve();
    }
  }

  /** A chain failed: it and what is queued after it fail with err, and so will later puts. */
  private fail(q: Queue, err: unknown, puts: QueuedPut[], writes: QueuedWrites[]): void {
    if (q.error === undefined) this.sink.chainFailed(q.thread, q.ns, err);
    q.error ??= err;
    for (const w of writes) w.reject(err);
    for (const p of puts) {
      p.reject(err);
      for (const w of p.own) w.reject(err);
    }
  }
}

/** Whether err is a server's answer that it has no such route (an older build), not a missing checkpoint. */
function routeMissing(err: unknown): boolean {
  return err instanceof DroverError && err.status === 404 && err.kind === "no-route";
}

/** Adds id to ids, the oldest forgotten past STORED_IDS. */
function remember(ids: Set<string>, id: string): void {
  ids.delete(id);
  ids.add(id);
  if (ids.size > STORED_IDS) ids.delete(ids.values().next().value!);
}
