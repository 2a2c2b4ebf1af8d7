/**
 * The TypeScript client of drover's HTTP API: sessions whose loss cancels
 * work, locks with fencing tokens, durable queue workers, agent tasks that
 * resume after a crash, fleet-wide flow control, a service registry and
 * agent checkpoints.
 *
 * ```ts
 * import { Drover } from "@droverhq/client";
 * const drover = new Drover({ url: "http://127.0.0.1:8080" });
 * await using lock = await drover.lock("report-42", { wait: "30s" });
 * await fetch(url, { signal: lock.signal });
 * ```
 *
 * The LangGraph checkpoint saver is in `@droverhq/client/langgraph`.
 * {@link PaxosLocks} is the client of the replicated lock service
 * `drover paxos serve`, which needs no drover server.
 */
import { AgentTasks, type RunStepsOptions, type RunStepsResult, type Step } from "./agent.js";
import { Checkpoints } from "./checkpoints.js";
import { Breakers, Limits, Quotas } from "./flow.js";
import { Budgets } from "./budgets.js";
import { Transport, type ClientOptions } from "./http.js";
import { acquireLock, lockStatus, type Lock, type LockOptions } from "./locks.js";
import { DeadLetters, Queues, type SubmitResult, type SubmittedTask } from "./queue.js";
import { Worker, type TaskHandler, type WorkerOptions } from "./worker.js";
import { Registry } from "./registry.js";
import { Schedules } from "./schedules.js";
import { sendSignal, type SignalOptions, type SignalResult } from "./signals.js";
import { Streams } from "./streams.js";
import { Session, type SessionOptions } from "./session.js";
import type { LockStatus } from "./errors.js";

export * from "./errors.js";
export type { ClientOptions, RequestOptions, ResponseOf } from "./http.js";
export { Transport } from "./http.js";
export { Session, type SessionInfo, type SessionOptions } from "./session.js";
export { Lock, type LockAcquired, type LockOptions } from "./locks.js";
export {
  Queues,
  DeadLetters,
  type BulkResult,
  type Outcome,
  type ReceivedSignalRef,
  type OutcomeResult,
  type PauseResult,
  type QueueHistory,
  type QueueHistoryBucket,
  type QueueHistoryCounts,
  type QueueHistoryLatency,
  type QueueStats,
  type QueueTask,
  type QueueTransition,
  type RunNowResult,
  type SubmitResult,
  type SubmittedTask,
  type SearchPage,
  type SearchQuery,
  type TaskPage,
} from "./queue.js";
export { Worker, type TaskContext, type TaskHandler, type WorkerOptions, type WorkerStats } from "./worker.js";
export { AgentTasks, Sleep, sleepFor, sleepUntil, type AgentTask, type AgentTaskClaim, type ClaimSignal, type RunStepsOptions, type RunStepsResult, type Step, type StepContext, type StepFn, type TaskWait } from "./agent.js";
export { ChildFailedError, SpawnChildren, StepChildren, spawnChildren, type ChildOutcome, type ChildSpec, type ChildrenPage, type SpawnWrite } from "./children.js";
export { WaitSignal, waitSignal, type ReceivedSignal, type SignalOptions, type SignalResult } from "./signals.js";
export { Streams, StreamWriter, DROVER_EVENT_TYPES, type FollowOptions, type StreamEnd, type StreamEvent, type StreamPage } from "./streams.js";
export {
  Budgets,
  TaskBudgetHold,
  BUDGET_HEADERS,
  BUDGET_UNWAITABLE_SECONDS,
  providerHeaders,
  resultUsage,
  type ResultUsage,
  taskBudget,
  type BudgetConfig,
  type BudgetReservation,
  type BudgetSettlement,
  type BudgetTenantUsage,
  type BudgetUsage,
  type ProviderHeaders,
} from "./budgets.js";
export { Limits, Quotas, Breakers, type AllowResult, type BreakerInfo, type LimitInfo, type QuotaInfo, type Slot, type TakeOptions, type TakeResult } from "./flow.js";
export { Registry, Registration, type Endpoint, type RegistryEvent, type WatchOptions } from "./registry.js";
export {
  PaxosLocks,
  PaxosLockHeldError,
  PaxosNotHeldError,
  PaxosTimeoutError,
  PaxosUnreachableError,
  parsePaxosEndpoint,
  PAXOS_LEADER_HEADER,
  PAXOS_LEADER_RETRY_MS,
  IDEMPOTENCY_KEY_HEADER,
  type PaxosAcquireOptions,
  type PaxosCallOptions,
  type PaxosEndpointStatus,
  type PaxosLock,
  type PaxosLocksOptions,
  type PaxosMemberStatus,
  type PaxosNodeStatus,
  type PaxosRenewal,
} from "./paxos.js";
export { Schedules, type Catchup, type Overlap, type ScheduleFields, type ScheduleFire, type ScheduleInfo } from "./schedules.js";
export {
  Checkpoints,
  type ChainLink,
  type CheckpointFence,
  type CheckpointPutResult,
  type CheckpointRecord,
  type ListCheckpoints,
  type PendingWriteRecord,
  type PutChain,
  type PutCheckpoint,
  type TaskWrites,
} from "./checkpoints.js";

/** A live queue worker as the server lists it. */
export interface WorkerInfo {
  id: string;
  address: string;
  queue: string;
  concurrency: number;
  prefetch: number;
  in_flight: number;
  claimed: number;
  succeeded: number;
  failed: number;
  pid: number;
  host: string;
  started_at: string;
  lease: string;
}

/**
 * A client of one drover server (and one namespace). Cheap to create; holds
 * no connection of its own beyond fetch's pool.
 */
export class Drover {
  /** The HTTP layer: base URL, token, namespace, retries. */
  readonly transport: Transport;
  /** Task submission, inspection, claims and outcomes. */
  readonly tasks: Queues;
  /** The dead-letter queues. */
  readonly dlq: DeadLetters;
  /** Agent tasks with steps (the parts of {@link runSteps}). */
  readonly agentTasks: AgentTasks;
  /** Fleet-wide rate limits. */
  readonly limits: Limits;
  /** LLM token budgets: reserve before a model call, settle after it. */
  readonly budgets: Budgets;
  /** Fleet-wide concurrency quotas. */
  readonly quotas: Quotas;
  /** Fleet-wide circuit breakers. */
  readonly breakers: Breakers;
  /** The service registry. */
  readonly registry: Registry;
  /** Agent checkpoints per thread (what the LangGraph saver is built on). */
  readonly checkpoints: Checkpoints;
  /** Schedules: tasks submitted on a cron expression or an interval. */
  readonly schedules: Schedules;
  /** Task streams: follow any task's events; write a claimed task's. */
  readonly streams: Streams;
  /** Lock inspection. */
  readonly locks: { get(name: string): Promise<LockStatus | undefined>; list(): Promise<LockStatus[]> };

  constructor(opts: ClientOptions | string | Transport = {}) {
    this.transport = opts instanceof Transport ? opts : new Transport(typeof opts === "string" ? { url: opts } : opts);
    const t = this.transport;
    this.tasks = new Queues(t);
    this.dlq = new DeadLetters(t);
    this.agentTasks = new AgentTasks(t);
    this.limits = new Limits(t);
    this.budgets = new Budgets(t);
    this.quotas = new Quotas(t);
    this.breakers = new Breakers(t);
    this.registry = new Registry(t);
    this.checkpoints = new Checkpoints(t);
    this.schedules = new Schedules(t);
    this.streams = new Streams(t);
    this.locks = {
      get: (name) => lockStatus(t, name),
      list: async () => (await t.get<LockStatus[] | null>("/v1/locks")) ?? [],
    };
  }

  /** The same server, another namespace (the `Drover-Namespace` header). */
  namespace(ns: string): Drover {
    return new Drover(this.transport.withNamespace(ns));
  }

  /** Creates a session kept alive in the background; see {@link Session}. */
  session(opts: SessionOptions = {}): Promise<Session> {
    return Session.create(this.transport, opts);
  }

  /**
   * Acquires a lock: `{ token, signal, release() }`, disposable with
   * `await using`. Throws {@link LockHeldError} when it is held and `wait`
   * ran out (or was not given).
   */
  lock(name: string, opts: LockOptions = {}): Promise<Lock> {
    return acquireLock(this.transport, name, opts);
  }

  /** Submits tasks to a queue: an array as JSON, an (async) iterable or stream as NDJSON. */
  submit(queue: string, tasks: Parameters<Queues["submit"]>[1], opts?: { signal?: AbortSignal }): Promise<SubmitResult> {
    return this.tasks.submit(queue, tasks as SubmittedTask[], opts);
  }

  /**
   * Starts a queue worker: `handler(task, { signal, token })` returns the
   * result. See {@link Worker}.
   */
  worker(queue: string, opts: WorkerOptions, handler: TaskHandler): Worker;
  worker(queue: string, handler: TaskHandler): Worker;
  worker(queue: string, a: WorkerOptions | TaskHandler, b?: TaskHandler): Worker {
    const [opts, handler] = typeof a === "function" ? [{}, a] : [a, b!];
    return new Worker(this.transport, queue, opts, handler);
  }

  /**
   * Runs an agent task step by step under a claim, resuming after its last
   * checkpointed step; see {@link AgentTasks.runSteps}.
   */
  runSteps<S = unknown>(taskId: string, steps: Step<S>[], opts?: RunStepsOptions<S>): Promise<RunStepsResult<S>> {
    return this.agentTasks.runSteps(taskId, steps, opts);
  }

  /**
   * Sends task `taskId` (a queue task, or an agent task with a checkpoint)
   * the signal `name`, kept in its inbox until a step that waits for it
   * consumes it; see {@link sendSignal} for the errors.
   */
  signal(taskId: string, name: string, opts?: SignalOptions): Promise<SignalResult> {
    return sendSignal(this.transport, taskId, name, opts);
  }

  /** The live queue workers (of one queue). */
  async workers(queue?: string): Promise<WorkerInfo[]> {
    return (await this.transport.get<WorkerInfo[] | null>("/v1/workers", { query: { queue } })) ?? [];
  }

  /** The server's readiness: `{ status, store_full }`; throws {@link UnavailableError} when not ready. */
  ready(): Promise<{ status: string; store_full: boolean; reasons?: string[] }> {
    return this.transport.get("/readyz");
  }
}
