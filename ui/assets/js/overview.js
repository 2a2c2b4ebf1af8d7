// Overview: every queue with its counts by state (scheduled and sleeping
// ones included), the processed and failed rates of the last hour, live
// workers, held locks and open breakers.

import { get, enc } from "./api.js";
import { h, replace, num, rate, ago, badge, bar, table, panel, errorBox } from "./dom.js";
import { drawChart } from "./chart.js";

const STATES = ["scheduled", "pending", "running", "retrying", "sleeping", "waiting", "succeeded", "dead", "cancelled"];
const SHORT = { scheduled: "sched.", pending: "pend.", running: "run.", retrying: "retry", sleeping: "sleep", waiting: "wait", succeeded: "done", dead: "dead", cancelled: "canc." };
const NARROW = new Set(["scheduled", "sleeping", "waiting", "cancelled"]); // hidden at phone width

export function queuesTable(queues) {
  const cols = [
    { label: "Queue", cell: (q) => [h("a", { href: "#/queue/" + enc(q.name) }, q.name), q.paused ? [" ", badge("paused", "b-half-open")] : null] },
    ...STATES.map((s) => ({ label: s, short: SHORT[s], num: true, narrow: NARROW.has(s), cell: (q) => h("span", { "data-state": s }, num(q[s])) })),
    { label: "Max depth", num: true, narrow: true, cell: (q) => (q.max_depth ? num(q.max_depth) : "none") },
    { label: "FIFO", narrow: true, cell: (q) => (q.fifo ? "yes" : "no") },
  ];
  return table(cols, queues, "No queue yet: submit tasks (drover submit, or POST /v1/queues/{queue}/tasks).", (q) => ({ "data-queue": q.name }));
}

function cards(queues) {
  const sum = (k) => queues.reduce((a, q) => a + (q[k] || 0), 0);
  const card = (label, value, cls) => h("div", { class: "card" }, h("div", { class: "label" }, label), h("div", { class: "value " + (cls || "") }, value));
  return [
    card("Queues", num(queues.length)),
    card("Pending", num(sum("pending")), "s-PENDING"),
    card("Running", num(sum("running")), "s-RUNNING"),
    card("Retrying", num(sum("retrying")), "s-RETRYING"),
    card("Waiting", num(sum("waiting")), "s-WAITING"),
    card("Dead", num(sum("dead")), "s-DEAD"),
  ];
}

function workersTable(ws) {
  return table([
    { label: "Worker", cell: (w) => [w.id, h("div", { class: "sub" }, w.host + " · pid " + w.pid)] },
    { label: "Queue", cell: (w) => h("a", { href: "#/queue/" + enc(w.queue) }, w.queue) },
    { label: "In flight", num: true, cell: (w) => [num(w.in_flight) + " / " + num(w.concurrency), bar(w.in_flight, w.concurrency, true)] },
    { label: "Succeeded", num: true, narrow: true, cell: (w) => num(w.succeeded) },
    { label: "Failed", num: true, narrow: true, cell: (w) => num(w.failed) },
  ], ws, "No live worker.");
}

function locksTable(ls) {
  return table([
    { label: "Lock", cell: (l) => l.name },
    { label: "Holder", cell: (l) => l.holder.id },
    { label: "Token", num: true, cell: (l) => h("span", { class: "mono" }, l.token) },
    { label: "Since", cell: (l) => ago(l.holder.acquired_at) },
  ], ls, "No lock is held.");
}

function breakersTable(bs) {
  return table([
    { label: "Breaker", cell: (b) => b.name },
    { label: "State", cell: (b) => badge(b.state, "b-" + b.state) },
    { label: "Since", cell: (b) => ago(b.since) },
    { label: "Failures", num: true, cell: (b) => num(b.consecutive_failures) },
  ], bs, "No breaker is open.");
}

export function mount(ctx) {
  const { main, state } = ctx;
  const cardsBox = h("div", { class: "cards" });
  const chartBox = h("div", { id: "chart" });
  const queuesBox = h("div", { id: "queues" }, h("p", { class: "muted" }, "Loading…"));
  const workersBox = h("div", { id: "workers" }, h("p", { class: "muted" }, "Loading…"));
  const locksBox = h("div", { id: "locks" }, h("p", { class: "muted" }, "Loading…"));
  const breakersBox = h("div", { id: "breakers" }, h("p", { class: "muted" }, "Loading…"));
  const legend = h("div", { class: "legend" }, h("span", { class: "key processed" }, "processed/s (succeeded)"), h("span", { class: "key failed" }, "failed/s (to the dead-letter queue)"));
  main.append(
    h("h1", {}, "Overview", h("small", {}, "namespace " + state.namespace)),
    cardsBox,
    panel("Processed and failed per second, last hour", legend, chartBox),
    panel("Queues", queuesBox),
    h("div", { class: "grid" }, panel("Live workers", workersBox), panel("Held locks", locksBox)),
    h("div", { class: "stack" }, panel("Open breakers", breakersBox)),
  );

  let samples = [];
  let windowSeconds = 3600;
  const redraw = () => drawChart(chartBox, samples, windowSeconds);
  const showQueues = (qs) => {
    replace(queuesBox, queuesTable(qs));
    replace(cardsBox, ...cards(qs));
  };
  const load = async (box, path, draw) => {
    try {
      const data = await get(path);
      if (ctx.alive()) replace(box, draw(data));
    } catch (e) {
      if (ctx.alive()) replace(box, errorBox(e));
    }
  };
  const loadWorkers = () => load(workersBox, "/v1/workers", workersTable);
  const loadLocks = () => load(locksBox, "/v1/locks", locksTable);
  const loadBreakers = () => load(breakersBox, "/v1/breakers", (bs) => breakersTable(bs.filter((b) => b.state !== "closed")));

  if (state.queues) showQueues(state.queues);
  else load(queuesBox, "/v1/queues", (qs) => { replace(cardsBox, ...cards(qs)); return queuesTable(qs); });
  redraw();
  get("/v1/stats/history").then((hist) => {
    if (!ctx.alive()) return;
    samples = hist.samples;
    windowSeconds = hist.window_seconds;
    redraw();
  }).catch((e) => { if (ctx.alive()) chartBox.append(errorBox(e)); });
  loadWorkers();
  loadLocks();
  loadBreakers();
  window.addEventListener("resize", redraw);

  return {
    event(name, data) {
      if (name === "queues") showQueues(data);
      else if (name === "sample") {
        samples.push(data);
        const from = Date.now() - windowSeconds * 1000;
        samples = samples.filter((x) => new Date(x.at).getTime() >= from);
        redraw();
      } else if (name === "changed") {
        if (data.includes("registry")) loadWorkers();
        if (data.includes("locks")) loadLocks();
        if (data.includes("flow")) loadBreakers();
      }
    },
    destroy() { window.removeEventListener("resize", redraw); },
  };
}
