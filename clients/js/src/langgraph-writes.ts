/**
 * The order of an unchained saver's puts and writes (DroverSaver without chainPuts). LangGraph
 * sends a step's writes without waiting for the put of their checkpoint (its puts are chained, its
 * writes are not), and drover refuses writes to a checkpoint it does not have yet (404). So a write
 * waits while puts of its thread are under way here; once stored, its checkpoint's next put takes
 * it along (parent_writes), else it goes alone a turn of the event loop later.
 */
import { DroverError, NotFoundError } from "./errors.js";
import type { CheckpointFence, Checkpoints, PutCheckpoint } from "./checkpoints.js";
import type { HeldMemory, SentWrite } from "./langgraph-held.js";

/**
 * The most bytes of state and writes a put carries together: drover takes a body of its state
 * bound (1 MiB) in base64 and 64 KiB more; a put past this goes without the writes.
 */
export const MAX_CARRIED_BYTES = (15 << 20) / 16;

/** The key of checkpoint id of thread in ns (id "": the thread and namespace). */
export const keyOf = (thread: string, ns: string, id: string): string => `${thread}\u0000${ns}\u0000${id}`;

/** A task's pending writes for a stored checkpoint, sent with the put of a child or alone. */
interface ReadyWrite {
  thread: string;
  ns: string;
  id: string;
  taskId: string;
  writes: SentWrite[];
  /** Failed puts of its thread before it was made. */
  failuresBefore: number;
  resolve: () => void;
  reject: (err: unknown) => void;
}

/** See the module's description. */
export class WriteOrder {
  /** Outcomes of recent puts (key → the error, or null), for writes that arrived first. */
  private readonly putOutcomes = new Map<string, unknown>();
  /** Writes waiting for a put on their thread and namespace to settle. */
  private readonly putWaiters = new Map<string, (() => void)[]>();
  /** Per thread and namespace: puts under way, and how the last one ended. */
  private readonly putState = new Map<string, { inflight: number; lastError: unknown; failures: number }>();
  /** Per checkpoint: writes ready to send, which the put of a child takes along (else they go alone, a moment later). */
  private readonly readyWrites = new Map<string, ReadyWrite[]>();
  /** Per checkpoint: writes waiting for its put to settle. */
  private readonly waitingWrites = new Map<string, number>();

  /** @param cached whether a checkpoint's key is in the saver's cache (read, listed or put) */
  constructor(
    private readonly cp: Checkpoints,
    private readonly fence: CheckpointFence | undefined,
    private readonly held: HeldMemory | undefined,
    private readonly cached: (key: string) => boolean,
  ) {}

  /** A put of thread and namespace tn is under way from now on (writes to it wait for it). */
  putStarted(tn: string): void {
    const st = this.putState.get(tn) ?? { inflight: 0, lastError: null, failures: 0 };
    st.inflight++;
    this.putState.set(tn, st);
  }

  /** The ready writes of the parent (key) a put takes along; those still waiting for the parent's put get a turn of the event loop to join. */
  async parentWrites(parentKey: string): Promise<ReadyWrite[]> {
    if ((this.waitingWrites.get(parentKey) ?? 0) > 0) await new Promise((r) => setImmediate(r));
    const withPut = this.readyWrites.get(parentKey) ?? [];
    this.readyWrites.delete(parentKey);
    return withPut;
  }

  /** Sends a task's writes of checkpoint id once it is stored, or with the put of its child. */
  async writeWhenStored(thread: string, ns: string, id: string, taskId: string, out: SentWrite[]): Promise<void> {
    const key = keyOf(thread, ns, id);
    const tn = keyOf(thread, ns, "");
    // LangGraph sends a step's writes without waiting for the put of its
    // checkpoint (its puts are chained, its writes are not); drover refuses
    // writes to a checkpoint it does not have yet (404). So: wait while puts
    // of this thread are under way here; once none is, a failed last put
    // means the chain stopped and this checkpoint will never come.
    const deadline = Date.now() + 30_000;
    const failuresBefore = this.putState.get(tn)?.failures ?? 0;
    // A checkpoint not known stored here while puts of its thread are under way is most likely
    // one of them, or the next in LangGraph's chain: wait for them rather than send a write that
    // drover refuses (a round trip for nothing, and its retry). Bounded by the deadline; a
    // checkpoint stored elsewhere (or evicted from the cache) is written once no put is under way.
    if (!this.knownStored(key)) {
      this.waitingWrites.set(key, (this.waitingWrites.get(key) ?? 0) + 1);
      try {
        while (!this.knownStored(key) && (this.putState.get(tn)?.inflight ?? 0) > 0 && Date.now() < deadline) {
          await this.untilPutSettled(tn, 5_000);
        }
      } finally {
        const n = (this.waitingWrites.get(key) ?? 1) - 1;
        if (n > 0) this.waitingWrites.set(key, n);
        else this.waitingWrites.delete(key);
      }
    }
    if (!this.knownStored(key)) return this.sendWrites(thread, ns, id, taskId, out, failuresBefore, deadline);
    // Stored: the put of its child, if one comes in this turn of the event loop, takes them along.
    return new Promise<void>((resolve, reject) => {
      let list = this.readyWrites.get(key);
      if (!list) {
        this.readyWrites.set(key, (list = []));
        setImmediate(() => this.flushWrites(key, list!));
      }
      list.push({ thread, ns, id, taskId, writes: out, failuresBefore, resolve, reject });
    });
  }

  /**
   * Puts a checkpoint with its parent's ready writes. Refused for carrying them (a server of an
   * older build answers 400 naming parent_writes; state and writes together past the body's
   * bound, 413), nothing was written: the writes go alone, then the put.
   */
  async putWith(thread: string, body: PutCheckpoint, withPut: ReadyWrite[]): Promise<void> {
    const bytes = withPut.reduce((n, w) => w.writes.reduce((m, x) => m + x.value.byteLength, n), body.state.byteLength);
    const carry = withPut.length > 0 && bytes <= MAX_CARRIED_BYTES;
    // Too large to go along: alone, as the writes no put took.
    if (!carry) for (const w of withPut) this.sendWrites(w.thread, w.ns, w.id, w.taskId, w.writes, w.failuresBefore).then(w.resolve, w.reject);
    try {
      await this.cp.put(thread, carry ? { ...body, parent_writes: withPut.map((w) => ({ task_id: w.taskId, writes: w.writes })) } : body);
    } catch (err) {
      if (!carry) throw err;
      // Whether the writes were saved is not known: they are sent alone (safe to repeat).
      const alone = Promise.all(withPut.map((w) => this.sendWrites(w.thread, w.ns, w.id, w.taskId, w.writes, w.failuresBefore).then(w.resolve, w.reject)));
      if (!(err instanceof DroverError && (err.status === 413 || (err.status === 400 && /parent_writes/.test(err.message))))) throw err;
      await alone;
      await this.cp.put(thread, body);
      return;
    }
    if (carry) {
      for (const w of withPut) {
        this.held?.writesLanded(w.thread, w.ns, w.id, w.taskId, w.writes);
        w.resolve();
      }
    }
  }

  /** Sends the ready writes of a checkpoint that no put took along. */
  private flushWrites(key: string, list: ReadyWrite[]): void {
    if (this.readyWrites.get(key) !== list) return; // taken by a put
    this.readyWrites.delete(key);
    for (const w of list) this.sendWrites(w.thread, w.ns, w.id, w.taskId, w.writes, w.failuresBefore).then(w.resolve, w.reject);
  }

  /** Sends a task's writes of checkpoint id; while its put may still come, a 404 is waited out. */
  private async sendWrites(thread: string, ns: string, id: string, taskId: string, out: ReadyWrite["writes"], failuresBefore: number, deadline = Date.now() + 30_000): Promise<void> {
    const key = keyOf(thread, ns, id);
    const tn = keyOf(thread, ns, "");
    let waits = 0;
    for (;;) {
      // Whether the put of this checkpoint had ended before this write was
      // sent: a refusal of a write sent while the put was under way says
      // nothing about the checkpoint once the put is done.
      const putDoneBefore = this.putOutcomes.has(key);
      try {
        await this.cp.putWrites(thread, id, { checkpoint_ns: ns, task_id: taskId, writes: out, ...(this.fence ? { fence: this.fence } : {}) });
        this.held?.writesLanded(thread, ns, id, taskId, out);
        return;
      } catch (err) {
        if (!(err instanceof NotFoundError)) throw err;
        if (this.putOutcomes.has(key)) {
          const putErr = this.putOutcomes.get(key);
          if (putErr) throw putErr; // the checkpoint was never written
          if (putDoneBefore) throw err; // written, and gone since (the thread was deleted)
          continue; // written while this write was on its way: send it again
        }
        const st = this.putState.get(tn);
        // No put of this thread under way here, and one failed: the chain
        // this checkpoint belonged to stopped (LangGraph puts in order).
        if (st && st.inflight === 0 && (st.lastError || st.failures > failuresBefore)) throw st.lastError ?? err;
        if (Date.now() > deadline) throw err;
        await this.untilPutSettled(tn, st && st.inflight > 0 ? 5_000 : Math.min(500, 10 * 2 ** waits++));
      }
    }
  }

  /** Whether checkpoint key is known to be stored: put here, or read or listed (cached). */
  knownStored(key: string): boolean {
    return this.putOutcomes.get(key) === null || this.cached(key);
  }

  putSettled(key: string, tn: string, err: unknown): void {
    this.putOutcomes.delete(key);
    this.putOutcomes.set(key, err);
    while (this.putOutcomes.size > 1024) this.putOutcomes.delete(this.putOutcomes.keys().next().value!);
    const st = this.putState.get(tn);
    if (st) {
      st.inflight--;
      st.lastError = err;
      if (err) st.failures++;
    }
    if (this.putState.size > 4096) {
      for (const [k, v] of this.putState) if (v.inflight <= 0 && !this.putWaiters.has(k)) this.putState.delete(k);
    }
    // Wake the writes waiting on this thread once the chain had a microtask to call its next put.
    const ws = this.putWaiters.get(tn);
    this.putWaiters.delete(tn);
    if (ws) setImmediate(() => ws.forEach((w) => w()));
  }

  private untilPutSettled(tn: string, ms: number): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(t);
        const list = this.putWaiters.get(tn);
        if (list) {
          const i = list.indexOf(done);
          if (i >= 0) list.splice(i, 1);
          if (list.length === 0) this.putWaiters.delete(tn);
        }
        resolve();
      };
      // Unref'd: a write whose checkpoint never comes does not hold the process.
      const t = setTimeout(done, ms);
      t.unref();
      let list = this.putWaiters.get(tn);
      if (!list) this.putWaiters.set(tn, (list = []));
      list.push(done);
    });
  }
}
