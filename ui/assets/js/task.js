// Task: one task's fields, parameters, every transition, result and step
// checkpoints, with cancel (and requeue or purge once it is dead); its
// parent, children, wait and signals, with Approve and Reject for a wait
// on a signal (workflow.js); and the live view of its stream.

import { api, get, enc } from "./api.js";
import { h, replace, num, time, ago, badge, table, panel, pretty, errorBox, confirmAction, toast, guarded, base64Text } from "./dom.js";
import { family, waiting, signals, live, newPager } from "./workflow.js";

function fields(t) {
  const m = t.metadata || {};
  const rows = [
    ["Task", h("span", { class: "mono" }, t.task_id)],
    ["Status", badge(t.current_status)],
    ["Type", t.task_type],
    ["Queue", h("a", { href: "#/queue/" + enc(t.queue) }, t.queue)],
    ["Attempt", num(t.attempt) + " (retries attempted " + num(t.retries_attempted) + " of " + num(t.max_retries) + ")"],
    ["Priority", num(m.priority)],
    ["Created", [time(m.created_at), " (", ago(m.created_at), ")"]],
    ["Source system", m.source_system],
    ["Tenant", m.tenant],
    ["Token", t.token ? h("span", { class: "mono" }, t.token) : null],
    ["Timeout", t.timeout],
    ["Backoff", t.backoff_base ? t.backoff_base + " to " + (t.backoff_max || "?") : null],
    [t.current_status === "WAITING" ? "Wait times out" : "Next attempt", t.scheduled_at ? [time(t.scheduled_at), " (", ago(t.scheduled_at), ")"] : null],
    ["Input", t.input_data_uri ? h("span", { class: "mono" }, t.input_data_uri) : null],
    ["Output", t.output_data_uri ? h("span", { class: "mono" }, t.output_data_uri) : null],
    ["Last error", t.last_error ? h("span", { class: "error" }, t.last_error) : null],
  ].filter(([, v]) => v !== undefined && v !== null && v !== "");
  return h("dl", { class: "fields" }, rows.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
}

function transitions(t) {
  return table([
    { label: "Time", cell: (x) => time(x.at) },
    { label: "Status", cell: (x) => badge(x.status) },
    { label: "Worker", wrap: true, cell: (x) => x.worker || "" },
    { label: "Attempt", num: true, cell: (x) => (x.attempt ? num(x.attempt) : "") },
    { label: "Error", wrap: true, cell: (x) => x.error || "" },
  ], t.transitions || [], "No transition recorded.");
}

function result(t) {
  if (t.result !== undefined && t.result !== null) return pretty(t.result);
  if (t.result_base64) {
    const text = base64Text(t.result_base64);
    return pretty(text !== null ? text : "(" + t.result_base64.length + " bytes of base64) " + t.result_base64);
  }
  return h("p", { class: "muted" }, t.current_status === "SUCCEEDED" ? "The task succeeded without a result." : "No result: the task has not succeeded.");
}

async function steps(id) {
  let at;
  try {
    at = await get("/v1/agent-tasks/" + enc(id));
  } catch (e) {
    if (e.status === 404) return h("p", { class: "muted" }, "No step checkpoint: the task's handler does not run steps, or none finished yet.");
    return errorBox(e);
  }
  const hist = at.history || [];
  if (hist.length === 0 && !at.step) return h("p", { class: "muted" }, "No step checkpoint yet.");
  const state = base64Text(at.state);
  return h("div", { class: "stack" },
    h("p", {}, "Last step " + num(at.step) + (at.steps ? " of " + num(at.steps) : "") + (at.completed ? ", completed." : ".")),
    table([
      { label: "Step", num: true, cell: (s) => num(s.step) },
      { label: "Name", cell: (s) => s.name },
      { label: "Worker", wrap: true, cell: (s) => s.worker },
      { label: "Token", num: true, narrow: true, cell: (s) => h("span", { class: "mono" }, s.token) },
      { label: "Finished", cell: (s) => time(s.finished_at) },
    ], hist, "No step recorded."),
    at.state ? [h("h2", {}, "State of the last step"), pretty(state !== null ? state : at.state)] : null);
}

export function mount(ctx) {
  const { main, state } = ctx;
  const { queue: q, id } = ctx.params;
  const head = h("div");
  const body = h("div", { id: "task" }, h("p", { class: "muted" }, "Loading…"));
  const note = h("p", { id: "decision", "aria-live": "polite" });
  const stream = live(ctx, id);
  main.append(h("div", { class: "crumbs" }, h("a", { href: "#/" }, "Overview"), " / ", h("a", { href: "#/queue/" + enc(q) }, q), " / task"), head, note, body, stream.box);
  const base = "/v1/queues/" + enc(q);
  const pager = newPager(); // the children's page shown, kept across reloads
  let parentQueue = "";
  let lastKey = "";
  let loading = false; // a load is under way
  let again = false; // another load was asked for meanwhile
  let gen = 0; // the generation of the last load: an older answer is dropped

  const act = (label, need, question, method, path, cls) => guarded(state, need, label, async () => {
    if (!(await confirmAction(question, label))) return;
    await api(method, path);
    toast(label + ": done");
    load();
  }, cls);

  // load reads the task and shows it, one load at a time: one asked for
  // while another runs runs after it.
  const load = async () => {
    if (loading) {
      again = true;
      return;
    }
    loading = true;
    try {
      do {
        again = false;
        await loadOnce(++gen);
      } while (again && ctx.alive());
    } finally {
      loading = false;
    }
  };

  const loadOnce = async (my) => {
    let t;
    try {
      t = await get(base + "/tasks/" + enc(id));
    } catch (e) {
      if (ctx.alive() && my === gen) replace(body, errorBox(e));
      return;
    }
    if (!ctx.alive() || my !== gen) return;
    const stepsBox = h("div", {}, h("p", { class: "muted" }, "Loading…"));
    const buttons = [];
    parentQueue = t.parent_queue || "";
    stream.update(t);
    if (["PENDING", "RUNNING", "RETRYING", "WAITING"].includes(t.current_status)) {
      buttons.push(act("Cancel task", "write", "Cancel task " + id + "? A running one loses its claim.", "POST", base + "/tasks/" + enc(id) + "/cancel", "danger"));
    }
    if (t.current_status === "DEAD") {
      buttons.push(act("Requeue", "write", "Requeue task " + id + "? It runs again with a fresh retry budget.", "POST", base + "/dlq/" + enc(id) + "/requeue", ""));
      buttons.push(act("Purge", "admin", "Delete dead task " + id + " for good?", "DELETE", base + "/dlq/" + enc(id), "danger"));
    }
    replace(head, h("div", { class: "panel-head" }, h("h1", {}, h("span", { class: "mono" }, id)), h("div", { class: "actions" }, buttons)));
    replace(body,
      h("div", { class: "grid" }, panel("Fields", fields(t)), panel("Parameters", pretty(t.parameters))),
      h("div", { class: "stack" },
        waiting(state, t, note, load),
        family(ctx, t, pager),
        signals(t),
        panel("Transitions", transitions(t)),
        panel("Result", result(t)),
        panel("Step checkpoints", stepsBox)));
    const s = await steps(id);
    if (ctx.alive() && my === gen) replace(stepsBox, s);
  };

  load();
  return {
    destroy() { stream.stop(); },
    event(name, data) {
      if (name !== "queues") return;
      // Only the queues that hold what the page shows: the task's, its
      // parent's and those of the children listed.
      const watched = new Set([q, parentQueue, ...pager.queues]);
      const key = JSON.stringify(data.filter((x) => watched.has(x.name)));
      if (lastKey && key !== lastKey) load();
      lastKey = key;
    },
  };
}
