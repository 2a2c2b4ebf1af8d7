/**
 * A run's events written to its task's stream, in order, none lost when
 * drover fails to answer a write (a member failing over): the write's
 * events may or may not be stored then, so the writer reads how many of
 * its attempt's events the stream holds and sends the rest again. The
 * client's StreamWriter drops such a batch and goes on, so that a run's
 * client would miss events of steps whose checkpoints were stored.
 *
 * Bounded: a writer whose writes fail RECOVER_TRIES times in a row with
 * nothing stored stops with the last error, and the reads that count
 * start after the last event known stored. Not exact: a write that drover
 * stores after the count read it (a member slow rather than dead) is
 * stored twice, since an append carries no expected seq.
 */
import { createHash } from "node:crypto";
import type { Drover } from "./index.js";
import { DroverError, FencedError, StreamFullError } from "./errors.js";
import { DROVER_EVENT_TYPES } from "./streams.js";

/** The most events, and JSON bytes, one append carries (under the server's limits). */
const MAX_EVENTS = 1000;
const MAX_BYTES = 700 << 10;
/** The most bytes of one event's type and data (the server's limit). */
const MAX_EVENT_BYTES = 64 << 10;
/**
 * The most bytes of events an outcome carries (takeRest): beside the thread's state and history,
 * under the outcome's 3 MiB body limit; more are written as flush writes them.
 */
const MAX_OUTCOME_BYTES = 128 << 10;
/** How many times a count is tried after a write drover did not answer, and how many such writes in a row store nothing before the writer stops. */
const RECOVER_TRIES = 8;

/**
 * Whether e is drover failing to answer rather than a refusal: no answer
 * (status 0: a connection error, a timeout), a timeout (408), a rate
 * limit (429) or a server error (5xx).
 */
export function isTransient(e: unknown): boolean {
  return e instanceof DroverError && !(e instanceof FencedError) && !(e instanceof StreamFullError) && (e.status === 0 || e.status === 408 || e.status === 429 || e.status >= 500);
}

/** Writes one attempt's events to its task's stream, under its claim; see the module. */
export class RunStreamWriter {
  private queue: { type: string; data: unknown; bytes: number }[] = [];
  private writing: Promise<void> | undefined;
  private failed: unknown;
  /** The seq after the last of this attempt's events known stored: where a count starts. */
  private from = 1;
  /** Set while {@link takeRest} waits for the write under way: the queue is not written on. */
  private closing = false;

  constructor(
    private readonly drover: Drover,
    private readonly taskId: string,
    private readonly session: string,
    private readonly token: number,
    private readonly attempt: number,
  ) {}

  /** Queues an event; throws the error that stopped the writer (fenced, full, drover away too long). */
  async emit(type: string, data: unknown): Promise<void> {
    if (this.failed) throw this.failed;
    const bytes = Buffer.byteLength(type) + Buffer.byteLength(JSON.stringify(data ?? null));
    if (bytes > MAX_EVENT_BYTES) throw new StreamFullError(`drover: a ${type} event is ${bytes} bytes (type and data), over the ${MAX_EVENT_BYTES}-byte limit of one event`);
    while (this.queue.length >= MAX_EVENTS && this.writing) await this.writing;
    if (this.failed) throw this.failed;
    this.queue.push({ type, data: data ?? null, bytes });
    if (!this.writing) this.writing = this.drain();
  }

  /** Waits until every event queued is stored; throws the error that stopped the writer. */
  async flush(): Promise<void> {
    while (this.writing) await this.writing;
    if (this.failed) throw this.failed;
  }

  /** Events of this attempt stored by another request (the run's start), the last at seq `last`. */
  stored(last: number): void {
    this.from = Math.max(this.from, last + 1);
  }

  /**
   * The end of the attempt's events, for another request (the run's outcome) to carry: waits for
   * the write under way (none is begun after it), then takes the events still queued out of the writer, with `from`, the
   * seq the first of them is to take as far as the writer knows (the one after the last of this
   * attempt's events known stored): a server that counts this attempt's events from there stores
   * them once, however often that request is sent. More than an outcome carries (128 KiB, or
   * more events than one write holds) are written as {@link flush} writes them, and none is taken. Throws the error that stopped the writer.
   */
  async takeRest(): Promise<{ events: { type: string; data: unknown }[]; from: number }> {
    this.closing = true;
    try {
      while (this.writing) await this.writing;
    } finally {
      this.closing = false;
    }
    if (this.failed) throw this.failed;
    let bytes = 0;
    for (const e of this.queue) bytes += e.bytes;
    if (this.queue.length > MAX_EVENTS || bytes >= MAX_OUTCOME_BYTES) {
      this.writing = this.drain();
      await this.flush();
    }
    return { events: this.queue.splice(0).map(({ type, data }) => ({ type, data })), from: this.from };
  }

  /** Writes events {@link takeRest} took (a server that refused them with the other request), as flush does. */
  async putBack(events: { type: string; data: unknown }[]): Promise<void> {
    this.queue.unshift(...events.map(({ type, data }) => ({ type, data, bytes: Buffer.byteLength(type) + Buffer.byteLength(JSON.stringify(data ?? null)) })));
    if (events.length && !this.writing) this.writing = this.drain();
    await this.flush();
  }

  private async drain(): Promise<void> {
    try {
      await Promise.resolve(); // `writing` is set before this runs
      let stalls = 0; // writes in a row that drover did not answer and that stored nothing
      while (this.queue.length && !this.failed && !this.closing) {
        let n = 0;
        let bytes = 0;
        while (n < this.queue.length && n < MAX_EVENTS && (n === 0 || bytes + this.queue[n].bytes < MAX_BYTES)) bytes += this.queue[n++].bytes;
        const batch = this.queue.slice(0, n);
        try {
          const { last } = await this.drover.streams.append(this.taskId, { session: this.session, token: this.token, events: batch.map(({ type, data }) => ({ type, data })) });
          this.queue.splice(0, n);
          this.from = Math.max(this.from, last + 1);
          stalls = 0;
        } catch (e) {
          if (!isTransient(e)) this.failed = e;
          else if ((await this.recover(e, n, stalls)) > 0) stalls = 0;
          else if (++stalls >= RECOVER_TRIES) this.failed = e;
        }
      }
    } finally {
      this.writing = undefined;
    }
  }

  /**
   * After a write of `sent` events drover did not answer: counts this
   * attempt's events stored since the last known, and drops those (at most
   * `sent`) from the queue; how many.
   * Waits longer the more writes in a row stored nothing (stalls).
   */
  private async recover(cause: unknown, sent: number, stalls: number): Promise<number> {
    for (let i = 0; i < RECOVER_TRIES; i++) {
      await new Promise((res) => setTimeout(res, Math.min(2000, 100 * 2 ** (i + stalls))));
      try {
        const { n, next } = await this.count();
        const done = Math.min(n, sent, this.queue.length);
        this.queue.splice(0, done);
        this.from = next;
        return done;
      } catch (e) {
        if (!isTransient(e)) {
          this.failed = e;
          return 0;
        }
      }
    }
    this.failed = cause;
    return 0;
  }

  /** How many events of this attempt the task's stream holds from `from` on (drover's own left out), and the seq after them. */
  private async count(): Promise<{ n: number; next: number }> {
    let n = 0;
    let from = this.from;
    for (let page = 0; page < 10_000; page++) {
      const p = await this.drover.streams.read(this.taskId, { from });
      for (const e of p.events) if (e.attempt === this.attempt && !DROVER_EVENT_TYPES.includes(e.type)) n++;
      const more = p.events.length > 0 && !p.done && p.next > from;
      if (p.next > from) from = p.next;
      if (!more) break;
    }
    return { n, next: from };
  }
}

/**
 * What the attempts of a run before this one stored in its task's stream,
 * for the events a resumed attempt replays from its checkpoint before its
 * first task starts (its state, the writes of tasks that finished): a
 * replayed event identical (type and data) to one an earlier attempt
 * stored, or to one replayed before in this attempt (a graph resumed
 * before its first step replays its input's state twice), is left out.
 * Identical is not the same: an update equal to an earlier step's whose
 * own event was never stored (a runtime killed after the checkpoint,
 * before the event) is left out as well; the next `values` event carries
 * the state. Keys are hashes: about 50 bytes an earlier event.
 */
export class EarlierEvents {
  private constructor(private readonly seen: Set<string>) {}

  /** Reads the task's stream: its events of attempts before `attempt`, drover's own left out. */
  static async read(drover: Drover, taskId: string, attempt: number): Promise<EarlierEvents> {
    const seen = new Set<string>();
    let from = 1;
    for (let page = 0; page < 10_000; page++) {
      const p = await drover.streams.read(taskId, { from });
      for (const e of p.events) if (e.attempt < attempt && !DROVER_EVENT_TYPES.includes(e.type)) seen.add(eventKey(e.type, e.data));
      if (!p.events.length || p.done || p.next <= from) break;
      from = p.next;
    }
    return new EarlierEvents(seen);
  }

  /** Whether a replayed event is left out (see the class); remembers it. */
  replay(type: string, data: unknown): boolean {
    const k = eventKey(type, data);
    if (this.seen.has(k)) return true;
    this.seen.add(k);
    return false;
  }
}

/** An event as a key: a hash of its type and its data as JSON. */
function eventKey(type: string, data: unknown): string {
  return createHash("sha256").update(type).update("\n").update(JSON.stringify(data ?? null)).digest("base64");
}
