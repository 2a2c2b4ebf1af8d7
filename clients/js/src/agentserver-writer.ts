/**
 * A run's events written to its task's stream, in order, none lost when
 * drover fails to answer a write (a member failing over): the write's
 * events may or may not be stored then, so the writer reads how many of
 * its attempt's events the stream holds and sends the rest again. The
 * client's StreamWriter drops such a batch and goes on, so that a run's
 * client would miss events of steps whose checkpoints were stored.
 */
import type { Drover } from "./index.js";
import { DroverError, FencedError, StreamFullError } from "./errors.js";
import { DROVER_EVENT_TYPES } from "./streams.js";

/** The most events, and JSON bytes, one append carries (under the server's limits). */
const MAX_EVENTS = 1000;
const MAX_BYTES = 700 << 10;
/** The most bytes of one event's type and data (the server's limit). */
const MAX_EVENT_BYTES = 64 << 10;
/** How many times a write that drover did not answer is checked and sent again. */
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
  /** This attempt's events known to be stored. */
  private stored = 0;

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

  private async drain(): Promise<void> {
    try {
      await Promise.resolve(); // `writing` is set before this runs
      while (this.queue.length && !this.failed) {
        let n = 0;
        let bytes = 0;
        while (n < this.queue.length && n < MAX_EVENTS && (n === 0 || bytes + this.queue[n].bytes < MAX_BYTES)) bytes += this.queue[n++].bytes;
        const batch = this.queue.slice(0, n);
        try {
          await this.drover.streams.append(this.taskId, { session: this.session, token: this.token, events: batch.map(({ type, data }) => ({ type, data })) });
          this.queue.splice(0, n);
          this.stored += n;
        } catch (e) {
          if (!isTransient(e)) this.failed = e;
          else await this.recover(e);
        }
      }
    } finally {
      this.writing = undefined;
    }
  }

  /** After a write drover did not answer: counts this attempt's events stored, and drops those from the queue. */
  private async recover(cause: unknown): Promise<void> {
    for (let i = 0; i < RECOVER_TRIES; i++) {
      await new Promise((res) => setTimeout(res, Math.min(2000, 100 * 2 ** i)));
      try {
        const n = await this.count();
        const done = Math.min(Math.max(n - this.stored, 0), this.queue.length);
        this.queue.splice(0, done);
        this.stored += done;
        return;
      } catch (e) {
        if (!isTransient(e)) {
          this.failed = e;
          return;
        }
      }
    }
    this.failed = cause;
  }

  /** How many events of this attempt the task's stream holds (drover's own left out). */
  private async count(): Promise<number> {
    let n = 0;
    let from = 1;
    for (let page = 0; page < 10_000; page++) {
      const p = await this.drover.streams.read(this.taskId, { from });
      for (const e of p.events) if (e.attempt === this.attempt && !DROVER_EVENT_TYPES.includes(e.type)) n++;
      if (!p.events.length || p.done || p.next <= from) break;
      from = p.next;
    }
    return n;
  }
}
