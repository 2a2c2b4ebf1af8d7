// Schedules: every schedule with when it fires, its next fire and its
// state; pause, resume and trigger (write role); the history of one.

import { api, get, enc } from "./api.js";
import { h, replace, time, ago, badge, table, panel, errorBox, guarded, can, toast } from "./dom.js";

function when(s) {
  if (s.every) return "every " + s.every;
  return s.tz ? s.cron + " (" + s.tz + ")" : s.cron;
}

function outcomeBadge(o) {
  const word = (o || "").split(":")[0];
  return badge(o, "s-" + word.toLowerCase());
}

export function mount(ctx) {
  const { main, state } = ctx;
  const box = h("div", { id: "schedules" }, h("p", { class: "muted" }, "Loading…"));
  const hist = h("div", { id: "schedule-history" });
  main.append(h("h1", {}, "Schedules"), panel("Schedules", box), hist);
  let shown = null; // the schedule whose history is open

  const loadHistory = async (name) => {
    shown = name;
    let fires;
    try {
      fires = (await get("/v1/schedules/" + enc(name) + "/history?limit=50")).data;
    } catch (e) {
      if (ctx.alive()) replace(hist, errorBox(e));
      return;
    }
    if (!ctx.alive() || shown !== name) return;
    replace(hist, panel(["History of ", h("span", { class: "mono" }, name)], table([
      { label: "Tick", cell: (f) => [time(f.nominal_time), f.manual ? h("div", { class: "sub" }, "trigger") : ""] },
      { label: "Submitted", cell: (f) => (f.submitted_at ? [ago(f.submitted_at), h("div", { class: "sub" }, time(f.submitted_at))] : "–") },
      { label: "Task", cell: (f) => (f.task_id ? h("span", { class: "mono" }, f.task_id) : "–") },
      { label: "Outcome", cell: (f) => outcomeBadge(f.outcome) },
    ], fires, "No fire yet.", (f) => ({ "data-fire": f.task_id || "", "data-outcome": f.outcome }))));
  };

  const act = (s, verb) => {
    const b = guarded(state, "write", verb[0].toUpperCase() + verb.slice(1), async () => {
      const r = await api("POST", "/v1/schedules/" + enc(s.name) + "/" + verb);
      toast(verb === "trigger" ? "Schedule " + s.name + " fired: task " + r.task_id : "Schedule " + s.name + (verb === "pause" ? " paused" : " resumed"));
      await load();
      if (verb === "trigger" || shown === s.name) loadHistory(s.name);
    }, "small secondary");
    b.dataset.act = verb;
    return b;
  };

  const load = async () => {
    let data;
    try {
      data = (await get("/v1/schedules")).data;
    } catch (e) {
      if (ctx.alive()) replace(box, errorBox(e));
      return;
    }
    if (!ctx.alive()) return;
    replace(box, table([
      { label: "Schedule", cell: (s) => h("button", { type: "button", class: "link mono", title: "show its history", onclick: () => loadHistory(s.name) }, s.name) },
      { label: "When", cell: (s) => when(s) },
      { label: "Task", cell: (s) => [h("a", { href: "#/queue/" + enc(s.queue) }, s.queue), h("div", { class: "sub" }, s.type)] },
      { label: "Policies", narrow: true, cell: (s) => [s.overlap, h("div", { class: "sub" }, "catch-up " + s.catchup + " " + s.catchup_window)] },
      { label: "Next fire", cell: (s) => (s.paused ? badge("paused", "s-paused") : s.next_fire_at ? [time(s.next_fire_at)] : "–") },
      { label: "", cell: (s) => [s.paused ? act(s, "resume") : act(s, "pause"), " ", act(s, "trigger")] },
    ], data, "No schedule: create one with drover schedules create, or POST /v1/schedules.",
    (s) => ({ "data-schedule": s.name, "data-paused": String(s.paused) })));
    if (shown === null && data.length > 0) loadHistory(data[0].name);
  };

  load();
  if (!can(state, "write")) main.append(h("p", { class: "muted" }, "Pausing, resuming and triggering need the write role."));
  const timer = setInterval(() => { if (ctx.alive()) { load(); if (shown) loadHistory(shown); } }, 5000);
  return { destroy() { clearInterval(timer); } };
}
