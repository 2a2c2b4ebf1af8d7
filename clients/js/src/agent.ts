import { DroverError, FencedError, LockHeldError, type Holder, type LockStatus } from "./errors.js";
import { dur, durMs, seg, sleep, type Transport } from "./http.js";
import { Session } from "./session.js";
import { WaitSignal, receivedOf, type ReceivedSignal } from "./signals.js";
import { SpawnChildren, childOf, childrenPage, putSpawn, readChildren, type ChildOutcome, type ChildrenPage, type SpawnWrite, type StepChildren } from "./children.js";
import { StreamWriter } from "./streams.js";
import { attemptSpans, callerTraceparent, startAgentAttemptSpan, withTaskTrace, type AttemptEnd, type AttemptSpan } from "./tracing.js";

/** What a task parked on a signal wait waits for. */
export interface TaskWait {
  /** The signals it waits for: the first sent ends the wait. */
  signals?: string[];
  /** When the wait began (RFC 3339). */
  since: string;
  /** When it times out (RFC 3339); absent: no timeout. */
  until?: string;
  /** For a wait for the children a step spawned: which step, how many it spawned, how many must end. */
  children?: { step: number; n: number; wait: number; collect?: boolean };
}

/** The signal a claim resumes a waiting task with, as the server answers it. */
export interface ClaimSignal {
  name?: string;
  data?: unknown;
  idempotency_key?: string;
  sent_at?: string;
  timed_out?: boolean;
}

/** The answer to an agent task's claim. */
export interface AgentTaskClaim {
  task_id: string;
  session: string;
  holder: Holder;
  /** The claim's fencing token (absent when the task is completed). */
  token?: number;
  expires_at?: string;
  /** The last checkpointed step (0: none). */
  step: number;
  step_name?: string;
  steps?: number;
  next_step?: number;
  /** The last checkpointed state, base64. */
  state?: string;
  /** A completed task's result as the JSON value it is, when its final state is JSON text. */
  result?: unknown;
  completed: boolean;
  /** The task sleeps until then (RFC 3339): nothing is claimed; claim again at that time. */
  sleep_until?: string;
  /** The task waits for a signal that has not come (nor has the wait timed out): nothing is claimed. */
  waiting_for?: TaskWait;
  /** The signal (or timeout) that ended the wait the last step asked for: the next step runs with it, and its write consumes it. */
  signal?: ClaimSignal;
  /** The W3C traceparent kept with the task (its first claim's context): each claim's attempt span continues it. */
  traceparent?: string;
}

/** An agent task as the server shows it. */
export interface AgentTask {
  task_id: string;
  step: number;
  step_name?: string;
  steps?: number;
  next_step?: number;
  completed: boolean;
  /** The last checkpointed state (the result once completed), base64. */
  state?: string;
  /** A completed task's result as the JSON value it is, when its final state is JSON text. */
  result?: unknown;
  written_by?: string;
  written_token?: number;
  written_at?: string;
  /** When the sleep the last step ended with ends (RFC 3339); absent when it does not sleep. */
  sleep_until?: string;
  /** What the wait the last step ended with waits for; absent when it does not wait. */
  waiting_for?: TaskWait;
  history?: { step: number; name: string; worker: string; token: number; started_at: string; finished_at: string }[] | null;
  claim?: LockStatus;
}

/** What a step gets besides the state. */
export interface StepContext {
  /** Fires when the claim's session is lost: stop, another worker resumes from the last written step. */
  signal: AbortSignal;
  /** The claim's fencing token. */
  token: number;
  /** This step's number, from 1. */
  step: number;
  session: Session;
  /**
   * The signal the step before waited for ({@link waitSignal}), or its
   * timeout (`timedOut`); undefined when the step before did not wait.
   */
  received?: ReceivedSignal;
  /**
   * The outcomes of the children the step before spawned
   * ({@link spawnChildren}), read from the server on the first call;
   * undefined when the step before spawned none.
   */
  children(): Promise<StepChildren | undefined>;
  /**
   * The task's stream, written under this claim: `await stream.token(text)`,
   * `await stream.emit("progress", {...})`. Events are sent in the
   * background, together; the step's events are stored before its
   * checkpoint is written. Once the claim is lost, `emit` throws
   * {@link FencedError} and nothing more is stored.
   */
  stream: StreamWriter;
}

/**
 * What a step returns to end with a sleep: its state is checkpointed with
 * the time the sleep ends, the claim is released, and the next step runs
 * no earlier than that, wherever the task is run next. Make one with
 * {@link sleepFor} or {@link sleepUntil}.
 */
export class Sleep<S = unknown> {
  /** @internal use {@link sleepFor} or {@link sleepUntil} */
  constructor(
    readonly state: S,
    /** How long, in seconds or as a duration ("10m"). */
    readonly duration?: number | string,
    /** Until when: a Date, or an RFC 3339 time with its zone. */
    readonly until?: Date | string,
  ) {}
}

/** Ends a step with `state` and a sleep of `d` (seconds, or a duration such as "10m") before the next step. */
export function sleepFor<S>(d: number | string, state?: S): Sleep<S> {
  if (typeof d === "number" && !(Number.isFinite(d) && d >= 0)) throw new RangeError(`drover: sleepFor: the duration must be a number of seconds, not negative, not ${d}`);
  return new Sleep(state as S, d);
}

/** Ends a step with `state` and a sleep until `t` (a Date, or an RFC 3339 time with its zone) before the next step. */
export function sleepUntil<S>(t: Date | string, state?: S): Sleep<S> {
  if (t instanceof Date && Number.isNaN(t.getTime())) throw new RangeError("drover: sleepUntil: the time is an invalid Date");
  return new Sleep(state as S, undefined, t);
}

/**
 * One step: a function of the previous step's state (the input for step
 * 1); return {@link sleepFor} or {@link sleepUntil} to sleep before the
 * next, {@link waitSignal} to wait for a signal, {@link spawnChildren} to
 * spawn child tasks and wait for them.
 */
export type StepFn<S = unknown> = (state: S, ctx: StepContext) => S | Sleep<S> | WaitSignal<S> | SpawnChildren<S> | Promise<S | Sleep<S> | WaitSignal<S> | SpawnChildren<S>>;
export type Step<S = unknown> = StepFn<S> | { name: string; run: StepFn<S> };

export interface RunStepsOptions<S> {
  /** The state step 1 starts from (default undefined). */
  input?: S;
  /** Claim under this session; default one of the run's own (closed at the end). */
  session?: Session;
  /** TTL in seconds of the run's own session (default 15). */
  ttl?: number;
  /** The holder's name shown to others. */
  name?: string;
  /**
   * How long to wait in line when another process runs the task, in seconds
   * or as a duration ("30s"). Default: do not wait ({@link LockHeldError}).
   */
  wait?: number | string;
  /** Turns a state into the bytes checkpointed (default JSON). */
  encode?: (state: S) => Uint8Array;
  /** Turns checkpointed bytes back into a state (default JSON). */
  decode?: (bytes: Uint8Array) => S;
  signal?: AbortSignal;
  /**
   * When the task waits for a signal (a step returned {@link waitSignal},
   * or it waited when claimed) or for its children ({@link spawnChildren}):
   * how long this call keeps claiming it again (every 0.2 to 2 s, holding
   * nothing between) to resume it here once the signal came (the wait
   * timed out, the children ended), in seconds or as a duration ("5m"),
   * counted from each wait's start. A task another process holds
   * meanwhile counts as still waiting; one that process moved on is taken
   * up after its last step. Default 0: return at once with `waitingFor`.
   */
  resumeWithin?: number | string;
}

export interface RunStepsResult<S> {
  /** The final state (the last step's). */
  state: S;
  /** The steps this call ran (numbers from 1); empty when the task was already complete. */
  ran: number[];
  /** The step this call resumed after (0: it started from the beginning). */
  resumedAfter: number;
  /** True when the task was already complete and nothing ran. */
  alreadyComplete: boolean;
  /**
   * Set when the run stopped because the task sleeps until then: a step
   * ended with a sleep (its state written), or the task was asleep when
   * claimed (nothing ran). Nothing is held: run it again at that time.
   */
  sleepingUntil?: Date;
  /**
   * Set when the run stopped because the task waits for a signal (a step
   * ended with {@link waitSignal}, its state written) that had not come
   * within `resumeWithin`, or for children ({@link spawnChildren}; then
   * `children` is set) that had not ended within it. Nothing is held: run
   * it again once the signal was sent (the wait's timeout passed, the
   * children ended), from any process.
   */
  waitingFor?: TaskWait;
}

const te = new TextEncoder();
const td = new TextDecoder();
const b64 = (b: Uint8Array) => Buffer.from(b.buffer, b.byteOffset, b.byteLength).toString("base64");
const unb64 = (s: string) => new Uint8Array(Buffer.from(s, "base64"));
// resultBody is a completion's result as the server takes it: a JSON string
// is base64 of the bytes, any other JSON value is kept as its JSON text (so
// a string result goes as the base64 of its JSON text).
const resultBody = (r: unknown): unknown =>
  r instanceof Uint8Array ? b64(r) : typeof r === "string" ? b64(te.encode(JSON.stringify(r))) : r;

/** The agent-task routes: one claim per task, step checkpoints fenced by its token. */
export class AgentTasks {
  constructor(private readonly t: Transport) {}

  /**
   * Claims the task (never sent twice). `wait` waits in line; throws {@link LockHeldError} when held.
   * `traceparent` is kept with the task by the first claim that gives one, and answered by every claim.
   */
  async claim(id: string, opts: { session: Session; steps?: number; wait?: number | string; signal?: AbortSignal; traceparent?: string }): Promise<AgentTaskClaim> {
    const waitMs = opts.wait === undefined ? 0 : durMs(opts.wait, 0);
    const deadline = Date.now() + waitMs;
    const signal = opts.signal ? AbortSignal.any([opts.signal, opts.session.signal]) : opts.session.signal;
    let traceparent = opts.traceparent;
    for (;;) {
      const w = Math.min(Math.max(0, deadline - Date.now()), 60_000);
      try {
        return await this.t.post<AgentTaskClaim>(`/v1/agent-tasks/${seg(id)}/claim`,
          { session: opts.session.id, ...(opts.steps ? { steps: opts.steps } : {}), ...(traceparent ? { traceparent } : {}) },
          { query: w > 0 ? { wait: `${Math.ceil(w)}ms` } : undefined, retry: false, signal, timeoutMs: w + this.t.timeoutMs });
      } catch (err) {
        if (traceparent && err instanceof DroverError && err.status === 400 && /traceparent/.test(err.message)) {
          traceparent = undefined; // a server of an older build, or a malformed one: tracing never stops a claim
          continue;
        }
        opts.session.observe(err);
        if (err instanceof LockHeldError && deadline - Date.now() > 50) {
          await sleep(20, signal);
          continue;
        }
        throw err;
      }
    }
  }

  /**
   * Writes step n's checkpoint, fenced by the token (n must be the next
   * step; the same write again changes nothing). Writing the last step
   * (n = steps) completes the task and releases the claim.
   */
  writeStep(
    id: string,
    n: number,
    opts: {
      session: Session | string; token: number; state: Uint8Array; name?: string; steps?: number; sleepFor?: number | string; sleepUntil?: Date | string;
      /** End the step with a wait for a signal: the first of `names` sent, at most `timeout` (seconds or a duration). */
      waitSignal?: { names: string[]; timeout?: number | string };
    },
  ): Promise<AgentTask> {
    return this.t.put<AgentTask>(`/v1/agent-tasks/${seg(id)}/steps/${n}`, {
      session: typeof opts.session === "string" ? opts.session : opts.session.id,
      token: opts.token,
      state: b64(opts.state),
      ...(opts.name ? { name: opts.name.slice(0, 200) } : {}),
      ...(opts.steps ? { steps: opts.steps } : {}),
      ...(opts.sleepFor !== undefined ? { sleep_for: String(opts.sleepFor) } : {}),
      ...(opts.sleepUntil !== undefined ? { sleep_until: opts.sleepUntil instanceof Date ? opts.sleepUntil.toISOString() : opts.sleepUntil } : {}),
      ...(opts.waitSignal ? { wait_signal: { names: opts.waitSignal.names, ...(opts.waitSignal.timeout !== undefined ? { timeout: dur(opts.waitSignal.timeout) } : {}) } } : {}),
    });
  }

  /**
   * Marks the task complete and releases the claim. `result` is kept as its
   * final state: bytes as they are, any other value (as a queue ack's
   * result) as its JSON text, which the answer's `result` then gives back.
   * Without it the last step's state is kept.
   */
  complete(id: string, opts: { session: Session | string; token: number; result?: unknown }): Promise<AgentTask> {
    return this.t.post<AgentTask>(`/v1/agent-tasks/${seg(id)}/complete`, {
      session: typeof opts.session === "string" ? opts.session : opts.session.id,
      token: opts.token,
      ...(opts.result === undefined || opts.result === null ? {} : { result: resultBody(opts.result) }),
    });
  }

  /**
   * Writes step n's checkpoint with children to spawn, fenced by the token:
   * their plan is checkpointed with the step before any is submitted, then
   * they are submitted and the claim released (the answer's
   * `waiting_for.children`). The same write again spawns nothing new.
   * An empty list is a plain step write.
   */
  writeSpawn(id: string, n: number, opts: SpawnWrite): Promise<AgentTask> {
    return putSpawn<AgentTask>(this.t, id, n, opts);
  }

  /** A page of the outcomes of the children step `step` spawned (default: the last checkpointed step). */
  children(id: string, opts: { step?: number; after?: string; limit?: number } = {}): Promise<ChildrenPage> {
    return childrenPage(this.t, id, opts);
  }

  /** One child: its outcome once it ended, its queue status before; {@link NotFoundError} for an id none of the task's steps spawned. */
  child(id: string, childId: string): Promise<ChildOutcome> {
    return childOf(this.t, id, childId);
  }

  /** Gives the claim up without completing. */
  async release(id: string, opts: { session: Session | string; token: number }): Promise<void> {
    await this.t.delete(`/v1/agent-tasks/${seg(id)}/claim`, { query: { session: typeof opts.session === "string" ? opts.session : opts.session.id, token: opts.token } });
  }

  /** The task's last step, state, history and current claim. */
  get(id: string): Promise<AgentTask> {
    return this.t.get<AgentTask>(`/v1/agent-tasks/${seg(id)}`);
  }

  /**
   * Claims a task that waits for a signal (claim: the claim that said so;
   * undefined: claim it now, `waiting` being what the task waits for),
   * again every 0.2 to 2 s until the claim holds it (the signal came, or
   * the wait timed out) or `within` ms passed: the last claim's answer. A
   * claim refused because another process holds the task
   * ({@link LockHeldError}) counts as still waiting.
   */
  private async awaitSignal(id: string, session: Session, steps: number, claim: AgentTaskClaim | undefined, waiting: AgentTaskClaim | undefined, within: number, signal?: AbortSignal): Promise<AgentTaskClaim> {
    const by = Date.now() + within;
    let pause = 200;
    let last = (claim ?? waiting)!; // the task as last seen: waiting
    let tried = claim !== undefined;
    for (;;) {
      if (claim && !claim.waiting_for) return claim;
      if (tried && Date.now() >= by) return claim ?? last;
      if (tried) {
        await sleep(Math.min(pause, Math.max(0, by - Date.now())), signal);
        pause = Math.min(2000, pause * 2);
      }
      tried = true;
      try {
        claim = await this.claim(id, { session, steps, signal });
        last = claim;
      } catch (err) {
        if (!(err instanceof LockHeldError)) throw err;
        claim = undefined; // held elsewhere for now: still waiting
      }
    }
  }

  /** A step's ctx.children: the outcomes of the children step `step` spawned, read once, on the first call. */
  private childrenFor(id: string, step: number): () => Promise<StepChildren | undefined> {
    let read: Promise<StepChildren | undefined> | undefined;
    return () => (read ??= readChildren(this.t, id, step));
  }

  /**
   * Runs an agent task step by step under a claim: claims the task by id,
   * reads its last checkpoint, runs only the steps after it, and writes
   * each step's state, fenced by the claim's token; writing the last step
   * completes the task. A process that dies mid-step leaves the task to
   * another, which resumes at that step once the dead one's session
   * expired. A step that finds its claim lost ({@link FencedError}) stops
   * the run: the steps it wrote stay written, and nothing runs twice that
   * was checkpointed. A step that returns {@link waitSignal} ends with a
   * wait for a signal: its state is written with the wait, the claim
   * released, and the task claimed again at once (a signal sent before the
   * wait is kept for it) and for `resumeWithin`; once the signal came or
   * the wait timed out, the next step runs with it in `ctx.received`,
   * otherwise the run returns with `waitingFor`. A step that returns
   * {@link spawnChildren} is written with its children's plan, they are
   * submitted and the claim released, and the task is claimed again the
   * same way until enough children ended; the next step reads their
   * outcomes with `await ctx.children()`.
   */
  async runSteps<S = unknown>(id: string, steps: Step<S>[], opts: RunStepsOptions<S> = {}): Promise<RunStepsResult<S>> {
    if (steps.length === 0) throw new TypeError("runSteps needs at least one step");
    const encode = opts.encode ?? ((s: S) => te.encode(JSON.stringify(s ?? null)));
    const decode = opts.decode ?? ((b: Uint8Array) => JSON.parse(td.decode(b)) as S);
    const own = !opts.session;
    const session = opts.session ?? (await Session.create(this.t, { ttl: opts.ttl ?? 15, ...(opts.name ? { name: opts.name } : {}) }));
    let held: number | undefined;
    // Each claim that runs steps is an attempt span, when OpenTelemetry is there.
    let span: AttemptSpan | undefined;
    let traced: string | undefined; // the task's traceparent, as the last claim answered it
    const begin = (c: AgentTaskClaim) => {
      traced = c.traceparent;
      span = startAgentAttemptSpan({
        namespace: this.t.namespace, taskId: id, worker: opts.name ?? `runner-${process.pid}`, traceparent: c.traceparent, resumedAfter: c.step, claimed: Date.now(),
      });
    };
    const finish = (end: AttemptEnd, error?: string) => {
      span?.end(end, error);
      span = undefined;
    };
    try {
      // Each wait may take resumeWithin, counted from its start.
      const within = durMs(opts.resumeWithin, 0);
      await attemptSpans();
      // The caller's context: the first claim keeps it with the task, as a submission keeps its traceparent.
      const traceparent = await callerTraceparent();
      let claim = await this.claim(id, { session, steps: steps.length, wait: opts.wait, signal: opts.signal, traceparent });
      const stateOf = (b64s: string | undefined): S => (b64s ? decode(unb64(b64s)) : (opts.input as S));
      if (claim.waiting_for) claim = await this.awaitSignal(id, session, steps.length, claim, undefined, within, opts.signal);
      if (claim.completed) {
        return { state: stateOf(claim.state), ran: [], resumedAfter: claim.step, alreadyComplete: true };
      }
      if (claim.sleep_until || claim.waiting_for) {
        const st = claim.step > 0 ? stateOf(claim.state) : (opts.input as S);
        return claim.sleep_until
          ? { state: st, ran: [], resumedAfter: claim.step, alreadyComplete: false, sleepingUntil: new Date(claim.sleep_until) }
          : { state: st, ran: [], resumedAfter: claim.step, alreadyComplete: false, waitingFor: claim.waiting_for };
      }
      let token = claim.token!;
      held = token;
      begin(claim);
      let received = receivedOf(claim.signal);
      let state: S = claim.step > 0 ? stateOf(claim.state) : (opts.input as S);
      const ran: number[] = [];
      const signal = opts.signal ? AbortSignal.any([opts.signal, session.signal]) : session.signal;
      for (let n = claim.step + 1; n <= steps.length; n++) {
        signal.throwIfAborted();
        const step = steps[n - 1]!;
        const fn = typeof step === "function" ? step : step.run;
        const name = typeof step === "function" ? step.name || `step ${n}` : step.name;
        const stream = new StreamWriter(this.t, id, session, token);
        let out: Awaited<ReturnType<typeof fn>>;
        try {
          const ctx: StepContext = { signal, token, step: n, session, stream, ...(received ? { received } : {}), children: this.childrenFor(id, n - 1) };
          const run = () => withTaskTrace(traced, () => fn(state, ctx));
          out = await (span ? span.run(run) : run());
        } finally {
          // The step's events are stored before its checkpoint, or before the claim is released when
          // the step threw (a fenced or full stream is the step's to see).
          await stream.flush().catch(() => {});
        }
        const nap = out instanceof Sleep ? out : undefined;
        const wait = out instanceof WaitSignal ? out : undefined;
        const kids = out instanceof SpawnChildren ? out : undefined;
        state = nap ? nap.state : wait ? wait.state : kids ? kids.state : (out as S);
        signal.throwIfAborted();
        const bytes = encode(state);
        let written: AgentTask | undefined;
        try {
          written = kids
            ? await this.writeSpawn(id, n, { session, token, state: bytes, name, steps: steps.length, children: kids.children, wait: kids.wait, collect: kids.collect })
            : await this.writeStep(id, n, {
                session, token, state: bytes, name, steps: steps.length, sleepFor: nap?.duration, sleepUntil: nap?.until,
                ...(wait ? { waitSignal: { names: wait.names, timeout: wait.timeout } } : {}),
              });
        } catch (err) {
          session.observe(err);
          // A repeated last (or sleeping, or waiting) write finds the claim released by the first: check that it landed.
          if (err instanceof FencedError) written = await this.get(id).catch(() => undefined);
          if (!(err instanceof FencedError && written && written.step >= n && written.written_token === token)) throw err;
        }
        ran.push(n);
        if (written?.sleep_until && !written.completed) {
          finish("sleep");
          held = undefined; // the sleeping write released the claim
          return { state, ran, resumedAfter: claim.step, alreadyComplete: false, sleepingUntil: new Date(written.sleep_until) };
        }
        if (written?.waiting_for && !written.completed) {
          finish("wait");
          held = undefined; // the waiting write released the claim: claim again, for a signal sent before it
          const waiting = { task_id: id, session: session.id, step: n, completed: false, waiting_for: written.waiting_for } as AgentTaskClaim;
          const again = await this.awaitSignal(id, session, steps.length, undefined, waiting, within, opts.signal);
          if (again.step !== n) state = again.step > 0 ? stateOf(again.state) : (opts.input as S);
          if (!again.token) {
            return { state, ran, resumedAfter: claim.step, alreadyComplete: again.completed, ...(again.waiting_for ? { waitingFor: again.waiting_for } : {}), ...(again.sleep_until ? { sleepingUntil: new Date(again.sleep_until) } : {}) };
          }
          token = again.token;
          held = token;
          begin(again);
          received = receivedOf(again.signal);
          // Another process may have run steps meanwhile: go on after the last one written.
          n = again.step;
          continue;
        }
        received = undefined;
      }
      held = undefined; // the last write completed the task and released the claim
      finish("success");
      return { state, ran, resumedAfter: claim.step, alreadyComplete: false };
    } catch (err) {
      const lost = err instanceof FencedError || !session.alive;
      finish(lost ? "lost" : opts.signal?.aborted ? "handed_back" : "failed", err instanceof Error ? err.message : String(err));
      // A failed step gives the task up, so that another process can take it now.
      if (!own && held !== undefined && session.alive) await this.release(id, { session, token: held }).catch(() => {});
      throw err;
    } finally {
      if (own) await session.close().catch(() => {});
    }
  }
}
