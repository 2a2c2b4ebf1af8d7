// Queue: the tasks of one queue by state, a page at a time; the dead-letter
// queue with requeue (one, selected, all) and purge; scheduled tasks with
// run now (one, selected, all); the queue's settings; pause and resume.

import { api, get, enc } from "./api.js";
import { h, replace, num, ago, badge, table, errorBox, confirmAction, toast, guarded, can } from "./dom.js";
import { searchPanel } from "./search.js";
import { mountHistory } from "./history.js";

const STATES = ["SCHEDULED", "PENDING", "RUNNING", "RETRYING", "SLEEPING", "WAITING", "SUCCEEDED", "DEAD", "CANCELLED"];
const PAGE = 50;

function taskLink(q, t) {
  return h("a", { href: "#/queue/" + enc(q) + "/task/" + enc(t.task_id), class: "mono" }, t.task_id);
}

function settingsLine(s) {
  if (!s) return h("div", { class: "settings" }, h("span", {}, "No settings: nothing was submitted to this queue yet."));
  return h("div", { class: "settings" },
    h("span", {}, "max depth ", h("b", {}, s.max_depth ? num(s.max_depth) : "none")),
    h("span", {}, "FIFO ", h("b", {}, s.fifo ? "yes: equal priorities in submission order" : "no")),
    h("span", {}, "priorities ", h("b", {}, "0–1000, higher claimed first")));
}

export function mount(ctx) {
  const { main, state } = ctx;
  const q = ctx.params.queue;
  const status = STATES.includes((ctx.query.get("state") || "").toUpperCase()) ? ctx.query.get("state").toUpperCase() : "PENDING";
  const summary = () => (state.queues || []).find((x) => x.name === q);
  const tabs = h("nav", { class: "tabs", "aria-label": "task states" });
  const settings = h("div");
  const pauseBox = h("div", { class: "actions pause", id: "pause" });
  let pausedHere = null; // the state a click here set, until the next summary
  const selectable = status === "DEAD" || status === "SCHEDULED"; // the tabs with actions on selected tasks
  const actions = h("div", { class: "actions " + (status === "DEAD" ? "dlq-actions" : "run-now-actions") });
  const list = h("div", { id: "tasks" }, h("p", { class: "muted" }, "Loading…"));
  const pager = h("div", { class: "pager" });
  main.append(
    h("div", { class: "crumbs" }, h("a", { href: "#/" }, "Overview"), " / queue"),
    h("h1", {}, q),
    pauseBox,
    settings,
    searchPanel(ctx, q),
    mountHistory(ctx, q),
    h("section", { class: "panel" }, tabs, selectable ? actions : null, list, pager),
  );

  const cursors = []; // the after of each page before this one
  let after = "";
  let next = "";
  let tasks = [];
  const selected = new Set();
  let lastCounts = "";

  let drawn = null; // the summary drawn, as JSON
  const drawTabs = (s) => {
    // A summary the same as the one drawn (the stream's snapshot after the
    // page's own fetch, another queue's change) keeps the nodes: redrawing
    // them would drop a click under way on a button. Once a click here set
    // the state, every summary is drawn.
    const key = JSON.stringify(s || null);
    if (key === drawn && pausedHere === null) return;
    drawn = key;
    replace(tabs, ...STATES.map((st) => h("a", {
      href: "#/queue/" + enc(q) + "?state=" + st, class: st === status ? "active" : "", "data-tab": st,
    }, st === "DEAD" ? "Dead (DLQ)" : st[0] + st.slice(1).toLowerCase(), h("span", { class: "count" }, s ? num(s[st.toLowerCase()]) : ""))));
    replace(settings, settingsLine(s));
    pausedHere = null; // a summary: it says the state now, whoever changed it since the click
    drawPause(s);
  };

  const drawPause = (s) => {
    if (!s) return replace(pauseBox);
    const paused = pausedHere ?? !!s.paused;
    const b = guarded(state, "admin", paused ? "Resume" : "Pause", async () => {
      if (!paused && !(await confirmAction("Pause queue " + q + "? No worker claims its tasks until it is resumed; running tasks finish, submissions are accepted.", "Pause"))) return;
      const r = await api("POST", "/v1/queues/" + enc(q) + (paused ? "/resume" : "/pause"));
      pausedHere = r.paused;
      toast((r.paused ? "Paused " : "Resumed ") + q);
      drawPause(s);
    }, paused ? "small" : "small secondary");
    b.dataset.act = paused ? "resume" : "pause";
    replace(pauseBox, paused ? badge("paused", "b-half-open") : null, b,
      h("span", { class: "muted" }, paused ? "workers claim nothing from this queue; submissions are accepted" : ""));
  };

  const reload = async () => {
    const path = status === "DEAD"
      ? "/v1/queues/" + enc(q) + "/dlq?limit=" + PAGE + (after ? "&after=" + enc(after) : "")
      : "/v1/queues/" + enc(q) + "/tasks?status=" + status + "&limit=" + PAGE + (after ? "&after=" + enc(after) : "");
    try {
      const page = await get(path);
      if (!ctx.alive()) return;
      tasks = page.tasks;
      next = page.next || "";
      for (const id of [...selected]) if (!tasks.some((t) => t.task_id === id)) selected.delete(id);
      draw();
    } catch (e) {
      if (ctx.alive()) replace(list, errorBox(e));
    }
  };

  const rowActions = (t) => {
    const out = [];
    if (status === "DEAD") {
      out.push(guarded(state, "write", "Requeue", async () => {
        if (!(await confirmAction("Requeue task " + t.task_id + "? It runs again with a fresh retry budget.", "Requeue"))) return;
        await api("POST", "/v1/queues/" + enc(q) + "/dlq/" + enc(t.task_id) + "/requeue");
        toast("Requeued " + t.task_id);
        reload();
      }));
      out.push(guarded(state, "admin", "Purge", async () => {
        if (!(await confirmAction("Delete dead task " + t.task_id + " for good?", "Purge"))) return;
        await api("DELETE", "/v1/queues/" + enc(q) + "/dlq/" + enc(t.task_id));
        toast("Purged " + t.task_id);
        reload();
      }, "small danger"));
    } else if (status === "SCHEDULED") {
      out.push(guarded(state, "write", "Run now", async () => {
        if (!(await confirmAction("Run task " + t.task_id + " now? It is claimed at once instead of at its time (" + ago(t.scheduled_at).textContent + ").", "Run now"))) return;
        await api("POST", "/v1/queues/" + enc(q) + "/tasks/" + enc(t.task_id) + "/run-now");
        toast("Task " + t.task_id + " runs now");
        reload();
      }, "small"));
    } else if (["PENDING", "RUNNING", "RETRYING"].includes(status)) {
      out.push(guarded(state, "write", "Cancel", async () => {
        if (!(await confirmAction("Cancel task " + t.task_id + "? A running one loses its claim.", "Cancel task"))) return;
        await api("POST", "/v1/queues/" + enc(q) + "/tasks/" + enc(t.task_id) + "/cancel");
        toast("Cancelled " + t.task_id);
        reload();
      }, "small secondary"));
    }
    out.forEach((b) => { b.dataset.act = b.textContent.toLowerCase().replace(/ /g, "-"); });
    return h("div", { class: "actions" }, out);
  };

  const draw = () => {
    const cols = [];
    if (selectable) {
      cols.push({ label: "", cell: (t) => {
        const box = h("input", { type: "checkbox", "aria-label": "select " + t.task_id, checked: selected.has(t.task_id) });
        box.addEventListener("change", () => { if (box.checked) selected.add(t.task_id); else selected.delete(t.task_id); drawActions(); });
        return box;
      } });
    }
    cols.push(
      { label: "Task", cell: (t) => taskLink(q, t) },
      { label: "Type", cell: (t) => t.task_type },
      { label: "Priority", num: true, cell: (t) => num(t.metadata.priority) },
      { label: "Attempt", num: true, narrow: true, cell: (t) => num(t.attempt) + " / " + num(t.max_retries + 1) },
      { label: "Created", narrow: true, cell: (t) => ago(t.metadata.created_at) },
    );
    if (status === "RETRYING") cols.push({ label: "Next attempt", cell: (t) => ago(t.scheduled_at) });
    if (status === "SCHEDULED") cols.push({ label: "Runs", cell: (t) => ago(t.scheduled_at) });
    if (status === "SLEEPING") cols.push({ label: "Wakes", cell: (t) => ago(t.scheduled_at) });
    if (status === "WAITING") {
      cols.push({ label: "Waits for", wrap: true, cell: (t) => (t.waiting_for ? t.waiting_for.signals.join(" or ") : "") });
      cols.push({ label: "Times out", cell: (t) => (t.scheduled_at ? ago(t.scheduled_at) : "never") });
    }
    if (["RETRYING", "DEAD"].includes(status)) cols.push({ label: "Last error", wrap: true, cell: (t) => t.last_error || "" });
    cols.push({ label: "", cell: rowActions });
    replace(list, table(cols, tasks, "No " + status.toLowerCase() + " task" + (cursors.length ? " on this page." : "."), (t) => ({ "data-task": t.task_id })));
    replace(pager,
      h("button", { type: "button", class: "small secondary", disabled: cursors.length === 0, onclick: () => { after = cursors.pop(); reload(); } }, "Previous"),
      h("button", { type: "button", class: "small secondary", disabled: !next, onclick: () => { cursors.push(after); after = next; reload(); } }, "Next"),
      h("span", { class: "muted" }, "page " + (cursors.length + 1) + " · " + PAGE + " a page"));
    drawActions();
  };

  const drawActions = () => {
    if (status === "SCHEDULED") return drawRunNow();
    if (status !== "DEAD") return;
    const base = "/v1/queues/" + enc(q) + "/dlq";
    const sel = [...selected];
    replace(actions,
      guarded(state, "write", "Requeue selected (" + sel.length + ")", async () => {
        if (sel.length === 0) return;
        if (!(await confirmAction("Requeue the " + sel.length + " selected tasks?", "Requeue"))) return;
        let n = 0;
        for (const id of sel) {
          await api("POST", base + "/" + enc(id) + "/requeue");
          selected.delete(id);
          n++;
        }
        toast("Requeued " + n + " tasks");
        reload();
      }, "small"),
      guarded(state, "admin", "Requeue all", async () => {
        if (!(await confirmAction("Requeue every dead task of " + q + "?", "Requeue all"))) return;
        const r = await api("POST", base + "/requeue");
        toast("Requeued " + r.count + " tasks");
        selected.clear();
        reload();
      }, "small"),
      guarded(state, "admin", "Purge all", async () => {
        if (!(await confirmAction("Delete every dead task of " + q + " for good? This cannot be undone.", "Purge all"))) return;
        const r = await api("DELETE", base);
        toast("Purged " + r.count + " tasks");
        selected.clear();
        reload();
      }, "small danger"),
      can(state, "admin") ? null : h("span", { class: "muted" }, "requeue all and purge need the admin role"));
    actions.querySelectorAll("button").forEach((b, i) => { b.dataset.act = ["requeue-selected", "requeue-all", "purge-all"][i]; });
  };

  // drawRunNow draws the SCHEDULED tab's run now of the selected tasks and
  // of every one (write role).
  const drawRunNow = () => {
    const path = "/v1/queues/" + enc(q) + "/tasks/run-now";
    const sel = [...selected];
    replace(actions,
      guarded(state, "write", "Run selected now (" + sel.length + ")", async () => {
        if (sel.length === 0) return;
        if (!(await confirmAction("Run the " + sel.length + " selected tasks now? They are claimed at once instead of at their time.", "Run now"))) return;
        const r = await api("POST", path, { ids: sel });
        toast(r.moved + " tasks run now");
        selected.clear();
        reload();
      }, "small"),
      guarded(state, "write", "Run all now", async () => {
        if (!(await confirmAction("Run every scheduled task of " + q + " now? They are claimed at once instead of at their time.", "Run all now"))) return;
        const r = await api("POST", path, {});
        toast(r.moved + " tasks run now");
        selected.clear();
        reload();
      }, "small secondary"));
    actions.querySelectorAll("button").forEach((b, i) => { b.dataset.act = ["run-selected", "run-all"][i]; });
  };

  const onQueues = (qs) => {
    const s = qs.find((x) => x.name === q);
    drawTabs(s);
    const key = JSON.stringify(s || null);
    if (key !== lastCounts) {
      const first = lastCounts === "";
      lastCounts = key;
      if (!first && cursors.length === 0) reload();
    }
  };

  drawTabs(summary());
  if (state.queues) lastCounts = JSON.stringify(summary() || null);
  else get("/v1/queues").then((qs) => { if (ctx.alive()) { state.queues = state.queues || qs; onQueues(qs); } }).catch(() => {});
  reload();
  return { event(name, data) { if (name === "queues") onQueues(data); } };
}
