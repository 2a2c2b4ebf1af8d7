// What the Agent Server chaos tests share: graph runtimes as child
// processes (`agentserver-cli.js serve -c` the fixture's langgraph.json),
// an SDK client that follows a run's stream and joins it again with its
// last event id, and the counts of a run's outcome: its status, its nodes'
// executions (from the file the fixture's nodes append to), the writes its
// checkpoints committed, and the stream events the client received.
import { spawn } from "node:child_process";
import { readFileSync, existsSync } from "node:fs";
import { join } from "node:path";
import { jsRoot } from "./helpers/server.mjs";

export const fixtureDir = join(jsRoot, "test", "fixtures", "agentserver-chaos");
export const NODES = ["n1", "n2", "n3", "n4", "n5"];
const cli = join(jsRoot, "dist", "agentserver-cli.js");

/** A seeded pseudo-random source (mulberry32): the same seed, the same chaos. */
export function rng(seed) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return { next, int: (lo, hi) => lo + Math.floor(next() * (hi - lo + 1)), pick: (xs) => xs[Math.floor(next() * xs.length)] };
}

/**
 * Starts one graph runtime process serving the fixture's graphs to url's
 * namespace ns; resolves once it says it serves them. Returns { pid,
 * proc, alive(), kill(signal), log() }.
 */
export async function startRuntime({ url, ns, nodeLog, ttl = 3, concurrency = 4 }) {
  const env = {
    ...process.env,
    DROVER_URL: url,
    DROVER_NAMESPACE: ns,
    DROVER_LANGGRAPH_TTL: String(ttl),
    DROVER_LANGGRAPH_CONCURRENCY: String(concurrency),
    CHAOS_NODE_LOG: nodeLog,
  };
  const proc = spawn(process.execPath, [cli, "serve", "-c", join(fixtureDir, "langgraph.json")], { cwd: fixtureDir, env, stdio: ["ignore", "ignore", "pipe"] });
  let log = "";
  let exited = false;
  proc.on("exit", () => (exited = true));
  const serving = new Promise((res, rej) => {
    proc.stderr.on("data", (d) => {
      log += d;
      if (log.length > 100_000) log = log.slice(-50_000);
      if (log.includes("drover-langgraph: serving")) res();
    });
    proc.on("exit", (code, sig) => rej(new Error(`runtime exited (${code ?? sig}) before it served:\n${log.slice(-3000)}`)));
  });
  const t = setTimeout(() => proc.kill("SIGKILL"), 60_000);
  try {
    await serving;
  } finally {
    clearTimeout(t);
  }
  return {
    pid: proc.pid,
    proc,
    alive: () => !exited,
    kill: (signal = "SIGKILL") => proc.kill(signal),
    exited: () => new Promise((res) => (exited ? res() : proc.once("exit", () => res()))),
    log: () => log,
  };
}

/** The node log's records (one JSON object a line). */
export function nodeRecords(nodeLog) {
  if (!existsSync(nodeLog)) return [];
  return readFileSync(nodeLog, "utf8")
    .split("\n")
    .filter(Boolean)
    .map((l) => JSON.parse(l));
}

/**
 * Follows run's stream as an SDK client does: joinStream, joined again
 * with the id of the last event it had whenever the stream breaks or the
 * client leaves (`leave()`: a client that goes away and comes back). Ends
 * when a stream ends with the run ended. Returns { leave(), done }, done
 * resolving to { events: [{id, event, data}], joins, status }.
 */
export function follow(client, thread, run, { maxJoins = 40, onEvent = () => {} } = {}) {
  let current;
  const done = (async () => {
    const events = [];
    let joins = 0;
    let last;
    for (;;) {
      if (++joins > maxJoins) throw new Error(`run ${run}: stream not ended after ${maxJoins} joins`);
      const ac = new AbortController();
      current = ac;
      let broken = false;
      try {
        for await (const part of client.runs.joinStream(thread, run, { lastEventId: last, signal: ac.signal })) {
          events.push({ id: part.id, event: part.event, data: part.data });
          if (part.id !== undefined) last = part.id;
          onEvent(part, events);
          if (ac.signal.aborted) break;
        }
      } catch (e) {
        if (!ac.signal.aborted) {
          events.push({ broken: String(e?.message ?? e) });
          broken = true;
        }
      }
      if (ac.signal.aborted) continue; // left: join again after the last event had
      // A broken stream is joined again after its last event whatever the run's status: a run
      // that ended meanwhile still has its events after the break to give.
      if (broken) {
        await new Promise((r) => setTimeout(r, 200));
        continue;
      }
      const r = await retrying(() => client.runs.get(thread, run));
      if (!["pending", "running"].includes(r.status)) return { events, joins, status: r.status };
    }
  })();
  return { leave: () => current?.abort(), done };
}

/** f(), again (up to 30 times, 200 ms apart) while it fails: a member may be down. */
export async function retrying(f, tries = 30) {
  for (let i = 1; ; i++) {
    try {
      return await f();
    } catch (e) {
      if (i >= tries) throw e;
      await new Promise((r) => setTimeout(r, 200));
    }
  }
}

/**
 * The counts of one run: what the client received, what its nodes
 * executed, and what its checkpoints committed. `tuples` are the
 * thread's checkpoints with their pending writes (DroverSaver.list);
 * `records` the node log's records of this run.
 */
export function judge({ status, events, finalTrail, tuples, records }) {
  const out = { status, problems: [], reexecuted: 0, duplicates: 0, superseded: 0, boundaries: 0, events: 0, missing: 0 };
  const problem = (s) => out.problems.push(s);
  if (status !== "success") problem(`status ${status}`);
  // The final trail: each node once, in order.
  const names = (finalTrail ?? []).map((t) => t.node);
  if (JSON.stringify(names) !== JSON.stringify(NODES)) problem(`final trail ${JSON.stringify(names)}`);
  const committed = Object.fromEntries((finalTrail ?? []).map((t) => [t.node, t.attempt]));
  // Every write any checkpoint or pending write holds is the one the final state kept: a node whose
  // write was committed was not executed again (its second write would differ by its attempt).
  const seen = new Set();
  for (const tp of tuples) {
    for (const t of tp.checkpoint?.channel_values?.trail ?? []) seen.add(JSON.stringify(t));
    for (const [, channel, value] of tp.pendingWrites ?? []) if (channel === "trail") for (const t of value ?? []) seen.add(JSON.stringify(t));
  }
  for (const s of seen) {
    const t = JSON.parse(s);
    if (committed[t.node] !== t.attempt) problem(`node ${t.node}: attempt ${t.attempt} committed, but the state kept attempt ${committed[t.node]} (executed twice past its checkpoint)`);
  }
  // The node log: no execution after the committed one, one in its attempt.
  for (const n of NODES) {
    const starts = records.filter((r) => r.node === n && r.phase === "start");
    out.reexecuted += Math.max(0, starts.length - 1);
    if (starts.some((r) => r.attempt > committed[n])) problem(`node ${n} executed in an attempt after its committed one`);
    if (starts.filter((r) => r.attempt === committed[n]).length > 1) problem(`node ${n} executed twice in attempt ${committed[n]}`);
  }
  // The stream: ids 0, 1, 2 … each once; no event twice; the last values the final state.
  const got = events.filter((e) => !e.broken);
  out.events = got.length;
  got.forEach((e, i) => {
    if (Number(e.id) !== i) problem(`event ${i} has id ${e.id}`);
  });
  const keys = new Map();
  const updated = new Map();
  for (const e of got) {
    if (e.event === "metadata" && e.data?.attempt > 1) out.boundaries++;
    if (e.event !== "updates" && e.event !== "values") continue;
    const k = `${e.event} ${JSON.stringify(e.data)}`;
    keys.set(k, (keys.get(k) ?? 0) + 1);
    if (e.event === "updates") for (const [n, v] of Object.entries(e.data ?? {})) updated.set(n, (updated.get(n) ?? new Set()).add(JSON.stringify(v)));
  }
  for (const [k, c] of keys) {
    if (c > 1) {
      out.duplicates += c - 1;
      problem(`event received ${c} times: ${k}`);
    }
  }
  // A node executed again because its first write was never committed: its update comes again,
  // with the new attempt's write, after the boundary (not a duplicate: another write).
  for (const vs of updated.values()) out.superseded += vs.size - 1;
  // Every committed write came as an update. Counted, not a failure: a runtime killed after a
  // checkpoint was stored but before its step's events were can lose them (docs/agent-server.md,
  // "Chaos", Open); the next values event carries the state.
  for (const t of finalTrail ?? []) {
    const streamed = got.some((e) => e.event === "updates" && (e.data?.[t.node]?.trail ?? []).some((x) => canonical(x) === canonical(t)));
    if (!streamed) out.missing++;
  }
  const lastValues = got.filter((e) => e.event === "values").at(-1);
  if (status === "success" && canonical(lastValues?.data?.trail) !== canonical(finalTrail)) problem(`last values event ${JSON.stringify(lastValues?.data)} is not the final state`);
  return out;
}

/** v as JSON with its objects' keys sorted (the server stores a state's objects with sorted keys). */
export function canonical(v) {
  return JSON.stringify(v, (_k, x) => (x && typeof x === "object" && !Array.isArray(x) ? Object.fromEntries(Object.entries(x).sort(([a], [b]) => (a < b ? -1 : 1))) : x));
}
