// Child tasks of agent tasks: a step spawns children into any queues and
// the task waits for them (all, or the first N); the next step reads their
// outcomes. The server checkpoints the children's plan with the step,
// fenced by the claim, before it submits any of them, so a step that runs
// again spawns nothing twice.
import { DroverError, NotFoundError } from "./errors.js";
import { dur, seg, type Transport } from "./http.js";
import type { Session } from "./session.js";

/** A child task a step spawns. */
export interface ChildSpec {
  /** The queue it is submitted to: it must exist (submitted to, or configured). */
  queue: string;
  /** Its task type: what its worker does with it. */
  taskType: string;
  /** Its input: any JSON value. */
  parameters?: unknown;
  /**
   * Names it within its step: its id is `{task}.{step}.{key}` (default its
   * 0-based position). Letters, digits, `_`, `-`, `:`; no `.`.
   */
  key?: string;
  /** 0 to 1000, higher first. */
  priority?: number;
  /** Its retry budget, 0 to 100 (default 3). */
  maxRetries?: number;
  /** What one attempt may take: seconds, or a duration ("10m"). */
  timeout?: number | string;
  /** Not cancelled with its parent. */
  detached?: boolean;
}

/** How a child ended, or where it is. */
export interface ChildOutcome {
  id: string;
  /** SUCCEEDED, DEAD or CANCELLED once it ended; before that its queue status, or PLANNED while not submitted. */
  status: string;
  /** It ended: its outcome is final. */
  ended: boolean;
  /** What it returned (JSON; other text as a JSON string), at most 64 KiB. */
  result?: unknown;
  /** Why it ended DEAD or CANCELLED. */
  error?: string;
  /** Its queue (reads of one child). */
  queue?: string;
}

/** A page of the outcomes of the children a step spawned, as the server answers it. */
export interface ChildrenPage {
  task_id: string;
  step: number;
  n: number;
  wait?: number;
  collect?: boolean;
  submitted: boolean;
  ended: number;
  failed: number;
  ready: boolean;
  failed_child?: ChildOutcome;
  outcomes: ChildOutcome[];
  next?: string;
}

/** A child ended DEAD or CANCELLED and the step spawned without `collect`. */
export class ChildFailedError extends DroverError {
  constructor(readonly child: ChildOutcome, readonly taskId: string, readonly step: number) {
    super(`drover: child ${child.id} of task ${taskId} (step ${step}) ended ${child.status}${child.error ? `: ${child.error}` : ""}`);
  }
}

/** The children the step before spawned, as the next step gets them. */
export class StepChildren {
  constructor(
    /** The step that spawned them. */
    readonly step: number,
    /** How many it spawned. */
    readonly n: number,
    /** How many ended (SUCCEEDED, DEAD or CANCELLED). */
    readonly ended: number,
    /** How many of those ended DEAD or CANCELLED. */
    readonly failed: number,
    /** The children that ended, in id order. */
    readonly outcomes: ChildOutcome[],
    /**
     * Without `collect`: the child that ended DEAD or CANCELLED and so
     * ended the wait (the others may not have ended). An agent task has no
     * DEAD state of its own: the step decides ({@link throwIfFailed}).
     */
    readonly failedChild: ChildOutcome | undefined,
    private readonly taskId: string,
  ) {}

  /** The results of the children that succeeded, in id order. */
  results(): unknown[] {
    return this.outcomes.filter((o) => o.status === "SUCCEEDED").map((o) => o.result);
  }

  /** Throws {@link ChildFailedError} when a child failed the wait (spawned without `collect`). */
  throwIfFailed(): void {
    if (this.failedChild) throw new ChildFailedError(this.failedChild, this.taskId, this.step);
  }
}

/**
 * What a step returns to spawn children and wait for them: its state is
 * checkpointed with the children's plan, the children submitted and the
 * claim released; the next step runs once `wait` of them ended (0: all),
 * or, without `collect`, once one ended DEAD or CANCELLED. Make one with
 * {@link spawnChildren}.
 */
export class SpawnChildren<S = unknown> {
  /** @internal use {@link spawnChildren} */
  constructor(
    readonly state: S,
    readonly children: ChildSpec[],
    readonly wait: number,
    readonly collect: boolean,
  ) {}
}

/**
 * Ends a step with `state` and the children to spawn (at most 10,000). The
 * next step reads their outcomes with `await ctx.children()`. `wait`: how
 * many must end before the next step (0: all); `collect`: wait for every
 * outcome whatever it is (without it, the first child that ends DEAD or
 * CANCELLED ends the wait). A step that runs again after a crash spawns
 * nothing twice: once its write committed, the step never runs again.
 */
export function spawnChildren<S>(children: ChildSpec[], opts: { wait?: number; collect?: boolean } = {}, state?: S): SpawnChildren<S> {
  if (!Array.isArray(children)) throw new TypeError("drover: spawnChildren: children must be an array");
  const wait = opts.wait ?? 0;
  if (!Number.isInteger(wait) || wait < 0 || wait > children.length) {
    throw new RangeError(`drover: spawnChildren: wait must be an integer from 0 to the number of children (${children.length}), not ${wait}`);
  }
  return new SpawnChildren(state as S, [...children], wait, !!opts.collect);
}

/** The body of a child as the spawn route takes it. */
function childBody(c: ChildSpec): Record<string, unknown> {
  return {
    queue: c.queue,
    task_type: c.taskType,
    ...(c.parameters !== undefined ? { parameters: c.parameters } : {}),
    ...(c.key !== undefined ? { key: c.key } : {}),
    ...(c.priority !== undefined ? { priority: c.priority } : {}),
    ...(c.maxRetries !== undefined ? { max_retries: c.maxRetries } : {}),
    ...(c.timeout !== undefined ? { timeout: dur(c.timeout) } : {}),
    ...(c.detached ? { detached: true } : {}),
  };
}

/** The fields of a spawn write. */
export interface SpawnWrite {
  session: Session | string;
  token: number;
  state: Uint8Array;
  name?: string;
  steps?: number;
  children: ChildSpec[];
  wait?: number;
  collect?: boolean;
}

/** PUT /v1/agent-tasks/{id}/steps/{n}/spawn. @internal */
export function putSpawn<T>(t: Transport, id: string, n: number, w: SpawnWrite): Promise<T> {
  return t.put<T>(`/v1/agent-tasks/${seg(id)}/steps/${n}/spawn`, {
    session: typeof w.session === "string" ? w.session : w.session.id,
    token: w.token,
    state: Buffer.from(w.state.buffer, w.state.byteOffset, w.state.byteLength).toString("base64"),
    ...(w.name ? { name: w.name.slice(0, 200) } : {}),
    ...(w.steps ? { steps: w.steps } : {}),
    children: w.children.map(childBody),
    ...(w.wait ? { wait: w.wait } : {}),
    ...(w.collect ? { collect: true } : {}),
  });
}

/** GET /v1/agent-tasks/{id}/children: one page. @internal */
export function childrenPage(t: Transport, id: string, opts: { step?: number; after?: string; limit?: number } = {}): Promise<ChildrenPage> {
  return t.get<ChildrenPage>(`/v1/agent-tasks/${seg(id)}/children`, {
    query: { ...(opts.step ? { step: String(opts.step) } : {}), ...(opts.after ? { after: opts.after } : {}), ...(opts.limit ? { limit: String(opts.limit) } : {}) },
  });
}

/** GET /v1/agent-tasks/{id}/children/{child}. @internal */
export function childOf(t: Transport, id: string, child: string): Promise<ChildOutcome> {
  return t.get<ChildOutcome>(`/v1/agent-tasks/${seg(id)}/children/${seg(child)}`);
}

/**
 * Every outcome of the children step `step` of task `id` spawned, read a
 * page (500) at a time; undefined when that step spawned none.
 * @internal
 */
export async function readChildren(t: Transport, id: string, step: number): Promise<StepChildren | undefined> {
  if (step < 1) return undefined;
  const outcomes: ChildOutcome[] = [];
  let first: ChildrenPage | undefined;
  for (let after: string | undefined, i = 0; i < 100_000; i++) {
    let page: ChildrenPage;
    try {
      page = await childrenPage(t, id, { step, after, limit: 500 });
    } catch (err) {
      if (err instanceof NotFoundError && first === undefined) return undefined; // the step spawned none
      throw err;
    }
    first ??= page;
    outcomes.push(...page.outcomes);
    if (!page.next) break;
    after = page.next;
  }
  return new StepChildren(step, first!.n, first!.ended, first!.failed, outcomes, first!.failed_child, id);
}
