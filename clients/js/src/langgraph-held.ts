/**
 * What a {@link DroverSaver} holding a lock knows of the threads it writes,
 * so that it answers their reads without a request.
 *
 * While a saver holds the lock that fences a thread's checkpoints, its own
 * writes are the thread's only ones: what the server would answer is what
 * the saver read under the lock, plus what it wrote since. Per thread and
 * checkpoint namespace it keeps:
 *
 * - the checkpoints it read (a head, a page of a list, one by id) or put,
 *   each with its pending writes as the server holds them (those read, those
 *   it sent alone or carried with a put, merged as the server merges them);
 * - the head: the checkpoint of the last put that landed, or the one read;
 * - a floor: every checkpoint whose id is at or above it is known (null:
 *   all of them, the namespace was read empty or listed to its end). A list
 *   is answered from memory only down to the floor, for the server lists by
 *   id, forks included, not along the head's chain.
 *
 * Only what landed is applied (a put or writes once the server answered),
 * and a read first waits for the writes of its thread and namespace under
 * way when it came: it answers what the server would answer once they
 * landed. A write of unknown outcome (no answer, a server error) makes the
 * namespace read from the server again for the saver's life; a fenced one
 * (the lock was lost), or the lock's signal, makes the saver forget all.
 * @internal
 */
import { copyCheckpoint, type ChannelVersions, type Checkpoint } from "@langchain/langgraph-checkpoint";
import type { CheckpointRecord } from "./checkpoints.js";
import { DroverError, FencedError, SessionNotFoundError } from "./errors.js";

/** A serialized value: JSON inline when the serializer produced JSON, base64 otherwise. */
export type Typed = { t: string; j?: unknown; b?: string };

/** What a checkpoint's state bytes hold. */
export interface Envelope {
  /** Format version. */
  f: 1;
  /** The checkpoint without its channel values. */
  checkpoint: Typed;
  /** Channels stored in this checkpoint: channel → version (null: no version). */
  stored: Record<string, string | number | null>;
  /** Their values (a stored channel without a value is empty). */
  values: Record<string, Typed>;
  /** Channels carried from an ancestor: channel → [checkpoint id, version]. */
  refs: Record<string, [string, string | number]>;
}

/** A pending write's value bytes hold this. */
export interface WriteEnvelope extends Typed {
  /** The task path given to putWrites. */
  p?: string;
}

/** A pending write as sent: its value's bytes, and what they hold. */
export interface SentWrite {
  channel: string;
  value: Uint8Array;
  idx: number;
  env: WriteEnvelope;
}

/** A pending write as held: the server's fields, its value decoded. */
export interface HeldWrite {
  task_id: string;
  channel: string;
  idx: number;
  env: WriteEnvelope;
}

/** A checkpoint as the server would answer it, its state and writes decoded. */
export interface HeldCheckpoint {
  thread: string;
  ns: string;
  id: string;
  parentId?: string;
  metadata: Record<string, unknown>;
  env: Envelope;
  /** By task id and index. */
  writes: Map<string, HeldWrite>;
}

const td = new TextDecoder();

const THREAD_RE = /^[A-Za-z0-9._:-]{1,128}$/;
const ENCODED_PREFIX = "_x.";

/** A thread id as drover takes it: ids outside its name rule are encoded (base64url). */
export function encodeThreadId(id: string): string {
  if (THREAD_RE.test(id) && !id.startsWith(ENCODED_PREFIX)) return id;
  const e = ENCODED_PREFIX + Buffer.from(id, "utf8").toString("base64url");
  if (e.length > 128) throw new Error(`thread_id ${JSON.stringify(id.slice(0, 40))}... is too long for drover (at most 128 characters of letters, digits, '.', '_', '-', ':', or about 90 bytes of other text)`);
  return e;
}

/** The inverse of {@link encodeThreadId}. */
export function decodeThreadId(id: string): string {
  return id.startsWith(ENCODED_PREFIX) ? Buffer.from(id.slice(ENCODED_PREFIX.length), "base64url").toString("utf8") : id;
}

/** Strings by code point, as LangGraph orders a superstep's writes and Go orders map keys. */
export function cmpCodePoints(a: string, b: string): number {
  if (a === b) return 0;
  const ai = a[Symbol.iterator]();
  const bi = b[Symbol.iterator]();
  for (;;) {
    const x = ai.next();
    const y = bi.next();
    if (x.done) return y.done ? 0 : -1;
    if (y.done) return 1;
    const d = x.value.codePointAt(0)! - y.value.codePointAt(0)!;
    if (d !== 0) return d;
  }
}

/** A stored write's value decoded ("" is an empty value). */
export function writeEnvOf(value: string): WriteEnvelope {
  return (value ? JSON.parse(td.decode(Buffer.from(value, "base64"))) : { t: "json", j: null }) as WriteEnvelope;
}

/** Metadata as the server answers it: one object, its top-level keys in order. */
function metadataAsServed(m: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const k of Object.keys(m).sort(cmpCodePoints)) if (m[k] !== undefined) out[k] = m[k];
  return out;
}

/** A record read from the server as held. */
export function heldOf(rec: CheckpointRecord, env: Envelope): HeldCheckpoint {
  const writes = new Map<string, HeldWrite>();
  for (const w of rec.pending_writes ?? []) writes.set(`${w.task_id}\u0000${w.idx}`, { task_id: w.task_id, channel: w.channel, idx: w.idx, env: writeEnvOf(w.value) });
  return {
    thread: rec.thread_id,
    ns: rec.checkpoint_ns ?? "",
    id: rec.checkpoint_id,
    ...(rec.parent_checkpoint_id ? { parentId: rec.parent_checkpoint_id } : {}),
    metadata: rec.metadata ?? {},
    env,
    writes,
  };
}

/**
 * A checkpoint's envelope: the values of the channels written in its step (those in newVersions)
 * and of values without a version, and, for the others, the ancestor that holds their version,
 * found through the parent's envelope (parentEnv).
 */
export async function envelopeOf(checkpoint: Checkpoint, newVersions: ChannelVersions, parentId: string | undefined, parentEnv: (id: string) => Promise<Envelope | undefined>, dump: (v: unknown) => Promise<Typed>): Promise<Envelope> {
  const prepared = copyCheckpoint(checkpoint);
  const channelValues = (prepared.channel_values ?? {}) as Record<string, unknown>;
  const versions = (prepared.channel_versions ?? {}) as Record<string, string | number>;
  const env: Envelope = { f: 1, checkpoint: { t: "json" }, stored: {}, values: {}, refs: {} };
  // Channels written in this step, and values with no version at all.
  const toStore = new Set([...Object.keys(newVersions ?? {}), ...Object.keys(channelValues).filter((ch) => !(ch in versions))]);
  for (const ch of toStore) {
    env.stored[ch] = (newVersions?.[ch] ?? versions[ch] ?? null) as string | number | null;
    if (ch in channelValues && channelValues[ch] !== undefined) env.values[ch] = await dump(channelValues[ch]);
  }
  // The others are where the parent found them.
  const carried = Object.keys(versions).filter((ch) => !toStore.has(ch));
  const parent = carried.length && parentId ? await parentEnv(parentId) : undefined;
  if (parent) {
    for (const ch of carried) {
      const ver = versions[ch]!;
      if (ch in parent.stored && parent.stored[ch] === ver) env.refs[ch] = [parentId!, ver];
      else if (parent.refs[ch] && parent.refs[ch]![1] === ver) env.refs[ch] = parent.refs[ch]!;
    }
  }
  env.checkpoint = await dump({ ...prepared, channel_values: {} });
  return env;
}

/** Merges a call's writes as the server does: a write at an index >= 0 is kept once (the first), one at a negative index replaces. */
function mergeWrites(into: Map<string, HeldWrite>, taskId: string, writes: SentWrite[]): void {
  for (const w of writes) {
    const k = `${taskId}\u0000${w.idx}`;
    if (w.idx >= 0 && into.has(k)) continue;
    into.set(k, { task_id: taskId, channel: w.channel, idx: w.idx, env: w.env });
  }
}

/** A checkpoint as it is now (its writes may grow after). */
function snap(cp: HeldCheckpoint | undefined): HeldCheckpoint | undefined {
  return cp && { ...cp, writes: new Map(cp.writes) };
}

/** Whether a failed write certainly wrote nothing: a refusal (4xx but a timeout). */
function refused(err: unknown): boolean {
  return err instanceof DroverError && err.status >= 400 && err.status < 500 && err.status !== 408;
}

/** One thread and namespace. */
class NsMemory {
  readonly cps = new Map<string, HeldCheckpoint>();
  /** The head's id; null: none; undefined: not known. */
  head: string | null | undefined;
  /** Every checkpoint with an id at or above it is known; null: all; undefined: none. */
  floor: string | null | undefined;
  /** Writes that landed (answers read meanwhile are not learned: they may predate them). */
  landed = 0;
  /** Writes under way. */
  readonly ops = new Set<Promise<unknown>>();
  puts = 0;
  /** Puts overlapped: which landed last on the server is not known. */
  putsOverlap = false;
  /** Writes under way, by checkpoint, task and index. */
  readonly replacing = new Map<string, number>();
  /** A write's outcome is not known: read from the server. */
  tainted = false;
}

/** @internal */
export class HeldMemory {
  private readonly nss = new Map<string, NsMemory>();
  private lost = false;

  /** @param max the most checkpoints held per thread and namespace. */
  constructor(private readonly max: number) {}

  private ns(thread: string, ns: string): NsMemory {
    const k = `${thread}\u0000${ns}`;
    let m = this.nss.get(k);
    if (!m) {
      this.nss.set(k, (m = new NsMemory()));
      if (this.nss.size > 4096) {
        for (const [key, v] of this.nss) {
          if (this.nss.size <= 4096) break;
          if (v.ops.size === 0 && key !== k) this.nss.delete(key);
        }
      }
    }
    return m;
  }

  /** The lock was lost: forget everything, and read from the server from now on. */
  lose(): void {
    this.lost = true;
    this.nss.clear();
  }

  /** Whether reads of thread and ns may be answered from memory. */
  usable(thread: string, ns: string): boolean {
    return !this.lost && !this.nss.get(`${thread}\u0000${ns}`)?.tainted;
  }

  /** A mark to pass to the learn methods: what landed before a read was sent. */
  mark(thread: string, ns: string): number {
    return this.ns(thread, ns).landed;
  }

  /** Waits for the writes of thread and ns under way now. */
  async settle(thread: string, ns: string): Promise<void> {
    const m = this.nss.get(`${thread}\u0000${ns}`);
    if (m && m.ops.size) await Promise.allSettled([...m.ops]);
  }

  /** Counts a put (or the writes) under way until p settles; a failure is judged by its error. */
  track<T>(thread: string, ns: string, p: Promise<T>, put: boolean): Promise<T> {
    if (this.lost) return p;
    const m = this.ns(thread, ns);
    if (put && m.puts++ > 0) m.putsOverlap = true;
    const done = p.then(
      () => undefined,
      (err) => this.failed(m, err),
    ).finally(() => {
      m.ops.delete(done);
      if (put && --m.puts === 0) m.putsOverlap = false;
    });
    m.ops.add(done);
    return p;
  }

  /**
   * Counts writes under way by checkpoint, task and index: two of one task and index at once land
   * in an order not known (the server keeps the first to land at an index >= 0, the last at a
   * negative one), so the namespace is read from the server from then on.
   */
  replacing(thread: string, ns: string, id: string, taskId: string, writes: { idx: number }[]): () => void {
    if (this.lost) return () => {};
    const m = this.ns(thread, ns);
    const keys = [...new Set(writes.map((w) => `${id}\u0000${taskId}\u0000${w.idx}`))];
    for (const k of keys) {
      const n = m.replacing.get(k) ?? 0;
      if (n > 0) m.tainted = true;
      m.replacing.set(k, n + 1);
    }
    return () => {
      for (const k of keys) {
        const n = (m.replacing.get(k) ?? 1) - 1;
        if (n > 0) m.replacing.set(k, n);
        else m.replacing.delete(k);
      }
    };
  }

  private failed(m: NsMemory, err: unknown): void {
    if (refused(err)) {
      // A fenced write (or its session gone): the lock is lost, and what was known may be stale.
      if (err instanceof FencedError || err instanceof SessionNotFoundError) this.lose();
      return;
    }
    m.tainted = true;
  }

  /** Writes of thread and ns failed having stored what is not known (a chain stored in part): read from the server from now on. */
  unsure(thread: string, ns: string, err: unknown): void {
    if (this.lost) return;
    if (err instanceof FencedError || err instanceof SessionNotFoundError) this.lose();
    else this.ns(thread, ns).tainted = true;
  }

  /** A put landed, with the writes of its parent it carried. */
  putLanded(cp: HeldCheckpoint): void {
    if (this.lost) return;
    const m = this.ns(cp.thread, cp.ns);
    m.landed++;
    // A checkpoint put again keeps its writes (the server's writes are a key of their own).
    const old = m.cps.get(cp.id);
    m.cps.delete(cp.id);
    m.cps.set(cp.id, { ...cp, metadata: metadataAsServed(cp.metadata), writes: old?.writes ?? cp.writes });
    m.head = m.putsOverlap ? undefined : cp.id;
    this.trim(m);
  }

  /** Writes of checkpoint id landed. */
  writesLanded(thread: string, ns: string, id: string, taskId: string, writes: SentWrite[]): void {
    if (this.lost) return;
    const m = this.ns(thread, ns);
    m.landed++;
    const cp = m.cps.get(id);
    if (cp) mergeWrites(cp.writes, taskId, writes);
  }

  /** The server answered the head (null: the namespace has no checkpoint) for a read sent at mark. */
  learnHead(thread: string, ns: string, cp: HeldCheckpoint | null, mark: number): void {
    if (!this.usable(thread, ns)) return;
    const m = this.ns(thread, ns);
    if (m.landed !== mark) return;
    if (cp === null) {
      m.cps.clear();
      m.head = null;
      m.floor = null;
      return;
    }
    if (!m.cps.has(cp.id)) m.cps.set(cp.id, cp);
    m.head = cp.id;
    this.trim(m);
  }

  /** The server answered one checkpoint for a read sent at mark. */
  learnOne(cp: HeldCheckpoint, mark: number): void {
    if (!this.usable(cp.thread, cp.ns)) return;
    const m = this.ns(cp.thread, cp.ns);
    if (m.landed !== mark || m.cps.has(cp.id)) return;
    m.cps.set(cp.id, cp);
    this.trim(m);
  }

  /**
   * The server answered a page of a list (no filter) of at most limit checkpoints older than
   * before, for a read sent at mark: all of them from the page's last down are known, up to
   * before, and all below it too when the page was short.
   */
  learnPage(thread: string, ns: string, before: string | undefined, limit: number, page: HeldCheckpoint[], mark: number): void {
    if (!this.usable(thread, ns)) return;
    const m = this.ns(thread, ns);
    if (m.landed !== mark) return;
    for (const cp of page) if (!m.cps.has(cp.id)) m.cps.set(cp.id, cp);
    const low = page.length < limit ? null : page[page.length - 1]!.id;
    // The page joins what is known when it starts at (or above) the floor.
    const joins = before === undefined || (m.floor !== undefined && (m.floor === null || before >= m.floor));
    if (joins && (m.floor === undefined || low === null || (m.floor !== null && low < m.floor))) m.floor = low;
    this.trim(m);
  }

  /** The head as the server would answer it: null when there is none, undefined when not known. */
  head(thread: string, ns: string): HeldCheckpoint | null | undefined {
    if (!this.usable(thread, ns)) return undefined;
    const m = this.nss.get(`${thread}\u0000${ns}`);
    if (!m || m.head === undefined) return undefined;
    return m.head === null ? null : snap(m.cps.get(m.head));
  }

  /** The state of checkpoint id, when known. */
  env(thread: string, ns: string, id: string): Envelope | undefined {
    return this.lost ? undefined : this.nss.get(`${thread}\u0000${ns}`)?.cps.get(id)?.env;
  }

  /** Checkpoint id, when known. */
  get(thread: string, ns: string, id: string): HeldCheckpoint | undefined {
    if (!this.usable(thread, ns)) return undefined;
    return snap(this.nss.get(`${thread}\u0000${ns}`)?.cps.get(id));
  }

  /** What the server would list (newest first, at most limit, older than before), or undefined when not all of it is known. */
  list(thread: string, ns: string, limit: number, before: string | undefined): HeldCheckpoint[] | undefined {
    if (!this.usable(thread, ns)) return undefined;
    const m = this.nss.get(`${thread}\u0000${ns}`);
    if (!m || m.floor === undefined) return undefined;
    const ids = [...m.cps.keys()].filter((id) => before === undefined || id < before).sort((a, b) => (a < b ? 1 : a > b ? -1 : 0));
    const out = ids.slice(0, limit);
    if (m.floor !== null && (out.length < limit || out[out.length - 1]! < m.floor)) return undefined;
    return out.map((id) => snap(m.cps.get(id))!);
  }

  /** The thread was deleted: read it from the server again. */
  forgetThread(thread: string): void {
    for (const [k, m] of this.nss) {
      if (!k.startsWith(`${thread}\u0000`)) continue;
      m.cps.clear();
      m.head = undefined;
      m.floor = undefined;
      m.landed++;
    }
  }

  /** Keeps at most max checkpoints, the newest (and the head); the floor rises above those dropped. */
  private trim(m: NsMemory): void {
    if (m.cps.size <= this.max) return;
    const ids = [...m.cps.keys()].filter((id) => id !== m.head).sort();
    const drop = ids.slice(0, m.cps.size - this.max);
    for (const id of drop) m.cps.delete(id);
    const last = drop[drop.length - 1]!;
    if (m.floor === undefined || (m.floor !== null && m.floor > last)) return;
    const above = [...m.cps.keys()].filter((id) => id > last).sort();
    m.floor = above.length ? above[0]! : undefined;
  }
}
