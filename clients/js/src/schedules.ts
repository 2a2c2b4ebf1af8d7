import { seg, type Transport } from "./http.js";

/** A schedule as the server shows it. Durations are Go duration strings ("30s", "1h0m0s"). */
export interface ScheduleInfo {
  name: string;
  /** Cron expression (5 fields or a descriptor such as `@daily`); or `every`. */
  cron?: string;
  /** IANA time zone the cron expression is read in (default UTC). */
  tz?: string;
  /** Interval: each multiple of it since the Unix epoch, whole seconds, 1s or more. */
  every?: string;
  queue: string;
  type: string;
  params?: unknown;
  overlap: Overlap;
  catchup: Catchup;
  catchup_window: string;
  jitter?: string;
  paused: boolean;
  /** When it fires next (RFC 3339), jitter included; absent while paused. */
  next_fire_at?: string;
}

export type Overlap = "skip" | "allow" | "buffer-one" | "cancel-previous";
export type Catchup = "none" | "latest" | "all";

/** The fields of a schedule that create and update take; durations as strings or seconds. */
export interface ScheduleFields {
  cron?: string;
  tz?: string;
  every?: string | number;
  queue?: string;
  type?: string;
  params?: unknown;
  overlap?: Overlap;
  catchup?: Catchup;
  catchup_window?: string | number;
  jitter?: string | number;
  paused?: boolean;
}

/** One fire of a schedule. */
export interface ScheduleFire {
  /** The tick's time (a trigger's: when it was asked). */
  nominal_time: string;
  /** When its task was submitted; absent when none was. */
  submitted_at?: string;
  /** The task's id: the schedule's name and the tick's time. */
  task_id?: string;
  /** The task's state now (PENDING, RUNNING, SUCCEEDED...), SKIPPED, MISSED, REJECTED or REMOVED. */
  outcome: string;
  /** A trigger's fire. */
  manual?: boolean;
  /** MISSED: how many ticks passed without a fire, from nominal_time to last_time. */
  count?: number;
  /** MISSED: the last of those ticks. */
  last_time?: string;
}

const durations = ["every", "catchup_window", "jitter"] as const;

/** Seconds become Go durations ("30s"); strings pass as they are. */
function body(fields: ScheduleFields): Record<string, unknown> {
  const out: Record<string, unknown> = { ...fields };
  for (const k of durations) {
    const v = fields[k];
    if (typeof v === "number") out[k] = `${v}s`;
  }
  for (const k of Object.keys(out)) if (out[k] === undefined) delete out[k];
  return out;
}

/**
 * Schedules: tasks submitted at each tick of a cron expression or an
 * interval, once per tick across every server.
 *
 * ```ts
 * await drover.schedules.create("poll", { every: "30s", queue: "builds", type: "check" });
 * const fires = await drover.schedules.history("poll");
 * ```
 */
export class Schedules {
  constructor(private readonly t: Transport) {}

  /** Creates a schedule; {@link ConflictError} (409) when the name exists, {@link InvalidInputError} naming the field. */
  create(name: string, fields: ScheduleFields): Promise<ScheduleInfo> {
    return this.t.post<ScheduleInfo>("/v1/schedules", { name, ...body(fields) }, { retry: false });
  }
  async list(): Promise<ScheduleInfo[]> {
    return (await this.t.get<{ data: ScheduleInfo[] }>("/v1/schedules")).data;
  }
  get(name: string): Promise<ScheduleInfo> {
    return this.t.get<ScheduleInfo>(`/v1/schedules/${seg(name)}`);
  }
  /** Changes the fields given; a change of when it fires moves it to its first tick from now. */
  async update(name: string, fields: ScheduleFields): Promise<ScheduleInfo> {
    return (await this.t.request<ScheduleInfo>("PATCH", `/v1/schedules/${seg(name)}`, { body: body(fields) })).data;
  }
  async delete(name: string): Promise<void> {
    await this.t.delete(`/v1/schedules/${seg(name)}`);
  }
  pause(name: string): Promise<ScheduleInfo> {
    return this.t.post<ScheduleInfo>(`/v1/schedules/${seg(name)}/pause`);
  }
  /** Fires again from the next tick to come (the ticks of the pause do not fire). */
  resume(name: string): Promise<ScheduleInfo> {
    return this.t.post<ScheduleInfo>(`/v1/schedules/${seg(name)}/resume`);
  }
  /** Fires once now, with a task id of its own. Never sent twice. */
  trigger(name: string): Promise<ScheduleFire> {
    return this.t.post<ScheduleFire>(`/v1/schedules/${seg(name)}/trigger`, undefined, { retry: false });
  }
  /** The latest fires, newest first (`limit`: 1 to 1000, default 100). */
  async history(name: string, opts: { limit?: number } = {}): Promise<ScheduleFire[]> {
    return (await this.t.get<{ data: ScheduleFire[] }>(`/v1/schedules/${seg(name)}/history`, { query: { limit: opts.limit } })).data;
  }
}
