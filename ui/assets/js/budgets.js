// Budgets: each LLM token budget's current window (used, reserved,
// remaining, requests, live reservations) and each tenant's part of it,
// read again every 2 s (a reserve or a settle sends no event).

import { get, enc } from "./api.js";
import { h, replace, num, ago, bar, table, panel, errorBox } from "./dom.js";

// limits says what a budget allows per window ("30,000 tokens and 500
// requests per 1 min").
function limits(b) {
  const parts = [];
  if (b.tokens) parts.push(num(b.tokens) + " tokens");
  if (b.requests) parts.push(num(b.requests) + " requests");
  const w = b.window_seconds;
  const win = w % 3600 === 0 ? w / 3600 + " h" : w % 60 === 0 ? w / 60 + " min" : w + " s";
  return parts.join(" and ") + " per " + win;
}

function tenantsTable(b) {
  const rows = [...(b.tenant_usage || [])].sort((x, y) => y.used + y.reserved - (x.used + x.reserved) || x.tenant.localeCompare(y.tenant));
  const weights = b.weights || {};
  const caps = b.caps || {};
  return table([
    { label: "Tenant", cell: (t) => (t.tenant ? h("span", { class: "mono" }, t.tenant) : h("span", { class: "muted" }, "(none)")) },
    { label: "Weight", num: true, narrow: true, cell: (t) => num(weights[t.tenant] ?? 1) },
    { label: "Cap", num: true, narrow: true, cell: (t) => (caps[t.tenant] ? num(caps[t.tenant]) : h("span", { class: "muted" }, "–")) },
    { label: "Requests", num: true, cell: (t) => num(t.requests) },
    { label: "Used", num: true, cell: (t) => num(t.used) },
    { label: "Reserved", num: true, cell: (t) => num(t.reserved) },
    { label: "Of the budget", cell: (t) => (b.tokens ? bar(t.used + t.reserved, caps[t.tenant] || b.tokens) : h("span", { class: "muted" }, "no token limit")) },
  ], rows, "No tenant used this window yet.", (t) => ({ "data-tenant": t.tenant }));
}

function budgetPanel(b) {
  const taken = b.used + b.reserved;
  const summary = table([
    { label: "Window", cell: () => [limits(b), h("div", { class: "sub" }, "since ", ago(b.window_start))] },
    { label: "Used", num: true, cell: () => num(b.used) },
    { label: "Reserved", num: true, cell: () => [num(b.reserved), h("div", { class: "sub" }, num(b.live) + " live")] },
    { label: "Remaining", num: true, cell: () => (b.remaining < 0 ? "no limit" : [num(b.remaining), bar(taken, b.tokens)]) },
    { label: "Requests", num: true, cell: () => num(b.requests_used) + (b.requests ? " / " + num(b.requests) : "") },
  ], [b], "", () => ({ class: "budget-summary" }));
  return h("div", { "data-budget": b.key }, panel(h("span", { class: "mono" }, b.key), summary, h("h3", {}, "Per tenant"), tenantsTable(b)));
}

export function mount(ctx) {
  const { main } = ctx;
  const box = h("div", { id: "budgets" }, h("p", { class: "muted" }, "Loading…"));
  main.append(h("h1", {}, "LLM budgets"), box);

  const load = async () => {
    try {
      // The list has no reservations (it reads no reservation keys): each
      // budget's own route counts its live ones.
      const bs = await get("/v1/budgets");
      const list = await Promise.all(((bs && bs.data) || []).map((b) => get("/v1/budgets/" + enc(b.key)).catch(() => b)));
      if (!ctx.alive()) return;
      replace(box, list.length ? list.map(budgetPanel) : h("p", { class: "empty" }, "No budget: set one with drover budgets set, or PUT /v1/budgets/{key}."));
    } catch (e) {
      if (ctx.alive()) replace(box, errorBox(e));
    }
  };

  load();
  const timer = setInterval(() => { if (ctx.alive()) load(); }, 2000);
  return { destroy() { clearInterval(timer); } };
}
