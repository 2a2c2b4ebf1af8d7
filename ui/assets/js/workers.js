// Workers and registry: the live queue workers with their load, and every
// registered component with its endpoints and what they publish.

import { get, enc } from "./api.js";
import { h, replace, num, ago, bar, table, panel, errorBox } from "./dom.js";

// published shows an endpoint's data: its top-level fields, numbers first.
function published(data) {
  if (!data || typeof data !== "object") return h("span", { class: "muted" }, "–");
  const entries = Object.entries(data).sort(([, a], [, b]) => (typeof b === "number") - (typeof a === "number"));
  if (entries.length === 0) return h("span", { class: "muted" }, "–");
  return h("div", { class: "kv" }, entries.map(([k, v]) => h("span", {}, h("b", {}, k), typeof v === "object" ? JSON.stringify(v) : String(v))));
}

function workersTable(ws) {
  return table([
    { label: "Worker", cell: (w) => [h("span", { class: "mono" }, w.id), h("div", { class: "sub" }, w.host + " · pid " + w.pid)] },
    { label: "Queue", cell: (w) => h("a", { href: "#/queue/" + enc(w.queue) }, w.queue) },
    { label: "In flight", num: true, cell: (w) => [num(w.in_flight) + " / " + num(w.concurrency), bar(w.in_flight, w.concurrency, true)] },
    { label: "Prefetch", num: true, narrow: true, cell: (w) => num(w.prefetch) },
    { label: "Claimed", num: true, narrow: true, cell: (w) => num(w.claimed) },
    { label: "Succeeded", num: true, cell: (w) => num(w.succeeded) },
    { label: "Failed", num: true, cell: (w) => num(w.failed) },
    { label: "Started", narrow: true, cell: (w) => ago(w.started_at) },
  ], ws, "No live worker: start one with drover worker --queue NAME.", (w) => ({ "data-worker": w.id }));
}

function componentPanel(c) {
  return panel([h("span", { class: "mono" }, c.component), h("small", {}, num(c.endpoints.length) + " endpoint" + (c.endpoints.length === 1 ? "" : "s"))],
    table([
      { label: "Endpoint", cell: (e) => h("span", { class: "mono" }, e.id) },
      { label: "Address", wrap: true, cell: (e) => h("span", { class: "mono" }, e.address) },
      { label: "Published data", wrap: true, cell: (e) => published(e.data) },
      { label: "Revision", num: true, narrow: true, cell: (e) => num(e.mod_revision) },
    ], c.endpoints, "No endpoint.", (e) => ({ "data-endpoint": c.component + "/" + e.id })));
}

export function mount(ctx) {
  const { main } = ctx;
  const wbox = h("div", { id: "workers" }, h("p", { class: "muted" }, "Loading…"));
  const rbox = h("div", { id: "registry" }, h("p", { class: "muted" }, "Loading…"));
  main.append(h("h1", {}, "Workers and registry"), panel("Live queue workers", wbox), h("h2", {}, "Registered components"), rbox);

  const load = async () => {
    try {
      const [ws, cs] = await Promise.all([get("/v1/workers"), get("/v1/registry")]);
      if (!ctx.alive()) return;
      replace(wbox, workersTable(ws));
      replace(rbox, cs.length ? cs.map(componentPanel) : h("p", { class: "empty" }, "No component is registered."));
    } catch (e) {
      if (ctx.alive()) replace(wbox, errorBox(e));
    }
  };

  load();
  return { event(name, topics) { if (name === "changed" && topics.includes("registry")) load(); } };
}
