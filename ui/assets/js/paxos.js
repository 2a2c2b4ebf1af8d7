// Paxos: the lock service group the server knows of (its leader, ballot
// and each node's lag), or a plain statement that it knows none.

import { get } from "./api.js";
import { h, replace, num, table, panel, errorBox, badge } from "./dom.js";

const REFRESH_MS = 5000;

function summary(g) {
  const item = (label, value) => h("div", {}, h("span", { class: "muted" }, label), h("b", {}, value));
  return h("div", { class: "paxos-summary" },
    item("Leader", g.has_leader ? "node " + g.leader + (g.leader_addr ? " at " + g.leader_addr : "") : "none"),
    item("Ballot", g.ballot || "–"),
    item("Commit index", num(g.commit)),
    item("Nodes answering", num(g.nodes.filter((n) => !n.error).length) + " of " + num(g.nodes.length)));
}

function nodes(g) {
  return table([
    { label: "Endpoint", cell: (n) => h("span", { class: "mono" }, n.endpoint) },
    { label: "Node", num: true, cell: (n) => (n.id !== undefined ? num(n.id) : "–") },
    { label: "Role", cell: (n) => (n.error ? badge("down", "b-open") : badge(n.role, n.role === "leader" ? "b-closed" : "")) },
    { label: "Ballot", narrow: true, cell: (n) => n.ballot || "–" },
    { label: "Commit", num: true, cell: (n) => num(n.commit) },
    { label: "Applied", num: true, narrow: true, cell: (n) => num(n.applied) },
    { label: "Lag", num: true, cell: (n) => (n.lag !== undefined ? num(n.lag) : "–") },
    { label: "Error", wrap: true, cell: (n) => (n.error ? h("span", { class: "error" }, n.error) : "") },
  ], g.nodes, "No node.");
}

export function mount(ctx) {
  const { main } = ctx;
  const box = h("div", { id: "paxos" }, h("p", { class: "muted" }, "Loading…"));
  main.append(h("h1", {}, "Paxos lock service"), box);
  let timer = 0;

  const load = async () => {
    try {
      const g = await get("/v1/paxos");
      if (!ctx.alive()) return;
      if (!g.configured) {
        replace(box, panel("No Paxos group configured",
          h("p", { id: "paxos-none" }, "This server knows no Paxos group, so there is no leader, ballot or lag to show."),
          h("p", { class: "muted" }, "The Paxos lock service runs apart from drover's server (drover paxos serve). Start the server with " +
            "PAXOS_ENDPOINTS=HOST:PORT,HOST:PORT,HOST:PORT (the nodes' API addresses) to show its group here.")));
        return;
      }
      replace(box, panel("Group", summary(g), g.detail ? h("p", { class: "muted" }, g.detail) : null), panel("Nodes", nodes(g)));
      timer = setTimeout(load, REFRESH_MS);
    } catch (e) {
      if (ctx.alive()) replace(box, errorBox(e));
    }
  };

  load();
  return { destroy() { clearTimeout(timer); } };
}
