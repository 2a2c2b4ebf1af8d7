import { ConflictError, FencedError, NotFoundError } from "./errors.js";
import { seg, type Transport } from "./http.js";

/** A pending write as stored. `value` is base64. */
export interface PendingWriteRecord {
  task_id: string;
  channel: string;
  value: string;
  idx: number;
}

/** A checkpoint as stored. `state` is base64. */
export interface CheckpointRecord {
  thread_id: string;
  checkpoint_ns: string;
  checkpoint_id: string;
  parent_checkpoint_id?: string;
  metadata: Record<string, unknown>;
  state: string;
  created_at: string;
  token?: number;
  pending_writes: PendingWriteRecord[] | null;
}

export interface CheckpointPutResult {
  thread_id: string;
  checkpoint_ns: string;
  checkpoint_id: string;
  parent_checkpoint_id?: string;
  created_at: string;
  token?: number;
}

/** A lock fencing checkpoint writes: its name, session and token. */
export interface CheckpointFence {
  lock: string;
  session: string;
  token: number;
}

export interface PutCheckpoint {
  checkpoint_ns?: string;
  checkpoint_id?: string;
  parent_checkpoint_id?: string;
  metadata?: Record<string, unknown>;
  /** The state bytes. */
  state: Uint8Array;
  /** "cas" (default): refused with 409 unless the parent is the head. "append": any parent. */
  mode?: "cas" | "append";
  fence?: CheckpointFence;
  /**
   * Pending writes of the parent, saved before the checkpoint in the same
   * request (each task's as {@link Checkpoints.putWrites} saves them): a
   * step's writes and the next checkpoint in one round trip.
   */
  parent_writes?: TaskWrites[];
}

/** A task's pending writes, as a put or a chain carries them. */
export interface TaskWrites {
  task_id: string;
  writes: { channel: string; value?: Uint8Array; idx: number }[];
}

/** One checkpoint of a chain: each the parent of the next. */
export interface ChainLink {
  checkpoint_id: string;
  /** For the first: the checkpoint the chain follows; for the others, the link before. */
  parent_checkpoint_id?: string;
  metadata?: Record<string, unknown>;
  state: Uint8Array;
  /** Pending writes of its parent, saved with it. */
  parent_writes?: TaskWrites[];
}

/** A chain of checkpoints to put in one request ({@link Checkpoints.putChain}). */
export interface PutChain {
  checkpoint_ns?: string;
  /** "cas" (default): the first link's parent must be the head. "append": any. */
  mode?: "cas" | "append";
  fence?: CheckpointFence;
  checkpoints: ChainLink[];
  /** Pending writes of the last link. */
  writes?: TaskWrites[];
}

export interface ListCheckpoints {
  /** undefined: every namespace of the thread. */
  checkpoint_ns?: string;
  before?: string;
  limit?: number;
  /** Metadata filter: top-level keys compared by deep equality. */
  filter?: Record<string, unknown>;
}

const b64 = (b: Uint8Array) => Buffer.from(b.buffer, b.byteOffset, b.byteLength).toString("base64");

/** A pending write as the routes take it. */
const writeBody = (x: { channel: string; value?: Uint8Array; idx: number }) => ({ channel: x.channel, idx: x.idx, ...(x.value && x.value.byteLength ? { value: b64(x.value) } : {}) });

function filterQuery(filter?: Record<string, unknown>): string[] | undefined {
  if (!filter) return undefined;
  const out = Object.entries(filter)
    .filter(([, v]) => v !== undefined)
    .map(([k, v]) => `${k}=${JSON.stringify(v)}`);
  return out.length ? out : undefined;
}

/**
 * The checkpoint routes: per thread and namespace, a chain of checkpoints
 * with pending writes, protected by compare-and-swap on the parent or by a
 * lock's fencing token.
 */
export class Checkpoints {
  constructor(private readonly t: Transport) {}

  /**
   * Writes a checkpoint. Mode cas (the default) is refused with
   * ConflictError (409) unless `parent_checkpoint_id` is the thread's head;
   * a fence makes a write after the lock was lost a FencedError. A repeated
   * write of the same id after a connection error is recognized.
   */
  async put(thread: string, cp: PutCheckpoint): Promise<CheckpointPutResult> {
    const body: Record<string, unknown> = {
      state: b64(cp.state),
      mode: cp.mode ?? "cas",
      checkpoint_ns: cp.checkpoint_ns ?? "",
      ...(cp.checkpoint_id ? { checkpoint_id: cp.checkpoint_id } : {}),
      ...(cp.parent_checkpoint_id ? { parent_checkpoint_id: cp.parent_checkpoint_id } : {}),
      ...(cp.metadata ? { metadata: cp.metadata } : {}),
      ...(cp.fence ? { lock: cp.fence.lock, session: cp.fence.session, token: cp.fence.token } : {}),
      ...(cp.parent_writes?.length ? { parent_writes: cp.parent_writes.map((tw) => ({ task_id: tw.task_id, writes: tw.writes.map(writeBody) })) } : {}),
    };
    // Only a write naming its id can be recognized when repeated.
    const retry = !!cp.checkpoint_id;
    try {
      return await this.t.post<CheckpointPutResult>(`/v1/threads/${seg(thread)}/checkpoints`, body, { retry });
    } catch (err) {
      // A compare-and-swap repeated after a lost answer loses to its own first
      // write: the checkpoint is there, with the parent it was given.
      if (err instanceof ConflictError && !(err instanceof FencedError) && retry && body.mode === "cas") {
        const got = await this.get(thread, cp.checkpoint_id!, cp.checkpoint_ns ?? "").catch(() => undefined);
        if (got && (got.parent_checkpoint_id ?? "") === (cp.parent_checkpoint_id ?? "") && got.state === body.state) {
          return { thread_id: got.thread_id, checkpoint_ns: got.checkpoint_ns, checkpoint_id: got.checkpoint_id, created_at: got.created_at, ...(got.parent_checkpoint_id ? { parent_checkpoint_id: got.parent_checkpoint_id } : {}) };
        }
      }
      throw err;
    }
  }

  /**
   * Puts checkpoints that follow one another, each with its parent's writes, and writes of the
   * last, in one request: in one etcd transaction, whole or not at all, while they fit in one
   * (at most 32 checkpoints and about 1.4 MiB); larger, checkpoint by checkpoint. The last becomes
   * the head. Mode append is repeated after a lost answer (it stores the same again).
   */
  async putChain(thread: string, chain: PutChain): Promise<CheckpointPutResult[]> {
    const tasks = (key: string, ws: TaskWrites[] | undefined) => (ws?.length ? { [key]: ws.map((tw) => ({ task_id: tw.task_id, writes: tw.writes.map(writeBody) })) } : {});
    const body = {
      checkpoint_ns: chain.checkpoint_ns ?? "",
      mode: chain.mode ?? "cas",
      checkpoints: chain.checkpoints.map((l) => ({
        checkpoint_id: l.checkpoint_id,
        ...(l.parent_checkpoint_id ? { parent_checkpoint_id: l.parent_checkpoint_id } : {}),
        ...(l.metadata ? { metadata: l.metadata } : {}),
        state: b64(l.state),
        ...tasks("parent_writes", l.parent_writes),
      })),
      ...tasks("writes", chain.writes),
      ...(chain.fence ? { lock: chain.fence.lock, session: chain.fence.session, token: chain.fence.token } : {}),
    };
    const r = await this.t.post<{ checkpoints: CheckpointPutResult[] }>(`/v1/threads/${seg(thread)}/checkpoint-chains`, body, { retry: chain.mode === "append" });
    return r.checkpoints;
  }

  /** Adds pending writes to a checkpoint (idx >= 0 kept once, idx < 0 replaced): safe to repeat. */
  async putWrites(thread: string, checkpointId: string, w: { checkpoint_ns?: string; task_id: string; writes: { channel: string; value?: Uint8Array; idx: number }[]; fence?: CheckpointFence }): Promise<void> {
    await this.t.post(`/v1/threads/${seg(thread)}/checkpoints/${seg(checkpointId)}/writes`, {
      checkpoint_ns: w.checkpoint_ns ?? "",
      task_id: w.task_id,
      writes: w.writes.map(writeBody),
      ...(w.fence ? { lock: w.fence.lock, session: w.fence.session, token: w.fence.token } : {}),
    }, { retry: true });
  }

  /** The thread's latest checkpoint in a namespace, or undefined. */
  async head(thread: string, checkpointNs = ""): Promise<CheckpointRecord | undefined> {
    try {
      return await this.t.get<CheckpointRecord>(`/v1/threads/${seg(thread)}/head`, { query: { checkpoint_ns: checkpointNs } });
    } catch (err) {
      if (err instanceof NotFoundError) return undefined;
      throw err;
    }
  }

  /** One checkpoint by id, or undefined. */
  async get(thread: string, checkpointId: string, checkpointNs = ""): Promise<CheckpointRecord | undefined> {
    try {
      return await this.t.get<CheckpointRecord>(`/v1/threads/${seg(thread)}/checkpoints/${seg(checkpointId)}`, { query: { checkpoint_ns: checkpointNs } });
    } catch (err) {
      if (err instanceof NotFoundError) return undefined;
      throw err;
    }
  }

  /** A thread's checkpoints, newest first (at most 1000 a call; default 100). */
  async list(thread: string, opts: ListCheckpoints = {}): Promise<CheckpointRecord[]> {
    return (await this.t.get<CheckpointRecord[] | null>(`/v1/threads/${seg(thread)}/checkpoints`, {
      query: { checkpoint_ns: opts.checkpoint_ns, before: opts.before, limit: opts.limit, filter: filterQuery(opts.filter) },
    })) ?? [];
  }

  /** Checkpoints of every thread: threads in key order, each newest first (at most 1000 a call; default 100). */
  async listAll(opts: ListCheckpoints = {}): Promise<CheckpointRecord[]> {
    return (await this.t.get<CheckpointRecord[] | null>(`/v1/checkpoints`, {
      query: { checkpoint_ns: opts.checkpoint_ns, before: opts.before, limit: opts.limit, filter: filterQuery(opts.filter) },
    })) ?? [];
  }

  /** Deletes a thread's checkpoints and writes, in every namespace. */
  async deleteThread(thread: string): Promise<void> {
    await this.t.delete(`/v1/threads/${seg(thread)}`);
  }
}
