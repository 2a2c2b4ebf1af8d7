// Flow: rate limits with their usage (rate editable with the admin role),
// quotas with the slots in use per subject, breakers with a reset button.

import { api, get, enc } from "./api.js";
import { h, replace, num, rate, ago, badge, bar, table, panel, errorBox, toast, guarded, can, errorText } from "./dom.js";

function quotaRows(qs) {
  const rows = [];
  for (const q of qs) {
    const subjects = new Set([...Object.keys(q.held || {}), ...Object.keys(q.subjects || {})]);
    if (subjects.size === 0) rows.push({ q, subject: null, held: 0, limit: q.limit });
    for (const s of [...subjects].sort()) {
      const own = q.subjects && q.subjects[s];
      rows.push({ q, subject: s, held: (q.held || {})[s] || 0, limit: own || q.limit, own: !!own });
    }
  }
  return rows;
}

export function mount(ctx) {
  const { main, state } = ctx;
  const lbox = h("div", { id: "limits" }, h("p", { class: "muted" }, "Loading…"));
  const qbox = h("div", { id: "quotas" }, h("p", { class: "muted" }, "Loading…"));
  const bbox = h("div", { id: "breakers" }, h("p", { class: "muted" }, "Loading…"));
  main.append(h("h1", {}, "Flow control"), panel("Rate limits", lbox), panel("Quotas", qbox), panel("Circuit breakers", bbox));
  let editing = ""; // the limit whose rate is being edited: live updates wait
  let limits = [];

  const editForm = (l) => {
    const rateIn = h("input", { name: "rate", value: l.rate, "aria-label": "rate", placeholder: "500/m" });
    const burstIn = h("input", { name: "burst", type: "number", min: 1, value: l.burst, "aria-label": "burst" });
    const form = h("form", { class: "edit-rate", "data-edit": l.name },
      rateIn, h("span", { class: "muted" }, "burst"), burstIn,
      h("button", { type: "submit", class: "small" }, "Save"),
      h("button", { type: "button", class: "small secondary", onclick: () => { editing = ""; drawLimits(); } }, "Cancel"));
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      try {
        await api("PUT", "/v1/limits/" + enc(l.name), { rate: rateIn.value.trim(), burst: Number(burstIn.value) || 0 });
        toast("Limit " + l.name + " set to " + rateIn.value.trim());
        editing = "";
        loadLimits();
      } catch (err) {
        toast(errorText(err), true);
      }
    });
    return form;
  };

  const drawLimits = () => {
    replace(lbox, table([
      { label: "Limit", cell: (l) => h("span", { class: "mono" }, l.name) },
      { label: "Rate", cell: (l) => (editing === l.name ? editForm(l) : [l.rate, h("div", { class: "sub" }, rate(l.per_second) + "/s")]) },
      { label: "Burst", num: true, narrow: true, cell: (l) => num(l.burst) },
      { label: "Available", num: true, cell: (l) => [num(Math.floor(l.available)), bar(Math.max(0, l.available), l.burst, true)] },
      { label: "Used", num: true, cell: (l) => num(l.used) },
      { label: "", cell: (l) => (editing === l.name ? "" : guarded(state, "admin", "Edit rate", async () => { editing = l.name; drawLimits(); }, "small secondary")) },
    ], limits, "No rate limit: set one with drover limits set, or PUT /v1/limits/{name}.", (l) => ({ "data-limit": l.name })));
  };

  const loadLimits = async () => {
    try {
      const ls = await get("/v1/limits");
      if (!ctx.alive()) return;
      limits = ls;
      if (!editing) drawLimits();
    } catch (e) {
      if (ctx.alive()) replace(lbox, errorBox(e));
    }
  };

  const loadQuotas = async () => {
    try {
      const qs = await get("/v1/quotas");
      if (!ctx.alive()) return;
      replace(qbox, table([
        { label: "Quota", cell: (r) => h("span", { class: "mono" }, r.q.name) },
        { label: "Subject", cell: (r) => (r.subject === null ? h("span", { class: "muted" }, "none in use") : r.subject === "-" ? "(shared)" : r.subject) },
        { label: "In use", num: true, cell: (r) => [num(r.held) + " / " + (r.limit ? num(r.limit) : "∞"), r.limit ? bar(r.held, r.limit) : null] },
        { label: "Limit", cell: (r) => (r.limit ? num(r.limit) + (r.own ? " (its own)" : " (default)") : "none") },
      ], quotaRows(qs), "No quota: set one with drover quotas set, or PUT /v1/quotas/{name}."));
    } catch (e) {
      if (ctx.alive()) replace(qbox, errorBox(e));
    }
  };

  const loadBreakers = async () => {
    try {
      const bs = await get("/v1/breakers");
      if (!ctx.alive()) return;
      replace(bbox, table([
        { label: "Breaker", cell: (b) => h("span", { class: "mono" }, b.name) },
        { label: "State", cell: (b) => badge(b.state, "b-" + b.state) },
        { label: "Since", narrow: true, cell: (b) => ago(b.since) },
        { label: "Failures", num: true, cell: (b) => num(b.consecutive_failures) + " / " + num(b.config.failures) },
        { label: "Opened", num: true, narrow: true, cell: (b) => num(b.opened) + "×" },
        { label: "Cooldown", narrow: true, cell: (b) => b.config.cooldown },
        { label: "", cell: (b) => {
          const btn = guarded(state, "admin", "Reset", async () => {
            await api("POST", "/v1/breakers/" + enc(b.name) + "/reset");
            toast("Breaker " + b.name + " reset: closed");
            loadBreakers();
          }, "small secondary");
          btn.dataset.act = "reset";
          return btn;
        } },
      ], bs, "No circuit breaker: set one with drover breakers set, or PUT /v1/breakers/{name}.", (b) => ({ "data-breaker": b.name, "data-state": b.state })));
    } catch (e) {
      if (ctx.alive()) replace(bbox, errorBox(e));
    }
  };

  loadLimits();
  loadQuotas();
  loadBreakers();
  if (!can(state, "admin")) main.append(h("p", { class: "muted" }, "Editing a rate and resetting a breaker need the admin role."));
  return {
    event(name, topics) {
      if (name === "changed" && topics.includes("flow")) {
        loadLimits();
        loadQuotas();
        loadBreakers();
      }
    },
  };
}
