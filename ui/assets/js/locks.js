// Locks: every held lock with its holder, fencing token, since when, time
// left, and the contenders waiting in line.

import { get, enc } from "./api.js";
import { h, replace, num, time, ago, table, panel, errorBox } from "./dom.js";

const MAX_LINES = 10;

function who(holder) {
  return [holder.id, h("div", { class: "sub" }, [holder.host, holder.pid ? "pid " + holder.pid : ""].filter(Boolean).join(" · "))];
}

async function waitersOf(name) {
  try {
    const line = await get("/v1/locks/" + enc(name) + "/waiters");
    return table([
      { label: "#", num: true, cell: (c) => num(c.position) },
      { label: "Waiter", cell: (c) => who(c.holder) },
      { label: "Waiting since", cell: (c) => ago(c.holder.acquired_at) },
      { label: "Token when served", num: true, cell: (c) => h("span", { class: "mono" }, c.token) },
      { label: "Lease left", num: true, cell: (c) => (c.ttl_left ? num(c.ttl_left) + " s" : "–") },
    ], line.waiters, "Nobody waits.");
  } catch (e) {
    return errorBox(e);
  }
}

export function mount(ctx) {
  const { main } = ctx;
  const box = h("div", { id: "locks" }, h("p", { class: "muted" }, "Loading…"));
  const lines = h("div", { id: "lines" });
  main.append(h("h1", {}, "Locks"), panel("Held locks", box), lines);
  const hidden = new Set(); // the locks whose line the user closed
  let waited = []; // the locks with waiters, by name

  // drawLines shows the line of each lock with waiters (the first ten).
  const drawLines = async () => {
    const parts = [];
    for (const name of waited.filter((n) => !hidden.has(n)).slice(0, MAX_LINES)) {
      parts.push(panel(["Waiting for ", h("span", { class: "mono" }, name)], await waitersOf(name)));
    }
    if (ctx.alive()) replace(lines, parts);
  };

  const load = async () => {
    let ls;
    try {
      ls = await get("/v1/locks");
    } catch (e) {
      if (ctx.alive()) replace(box, errorBox(e));
      return;
    }
    if (!ctx.alive()) return;
    waited = ls.filter((l) => l.waiters > 0).map((l) => l.name).sort();
    replace(box, table([
      { label: "Lock", cell: (l) => h("span", { class: "mono" }, l.name) },
      { label: "Holder", cell: (l) => who(l.holder) },
      { label: "Token", num: true, cell: (l) => h("span", { class: "mono" }, l.token) },
      { label: "Since", cell: (l) => [ago(l.holder.acquired_at), h("div", { class: "sub" }, time(l.holder.acquired_at))] },
      { label: "Left", num: true, narrow: true, cell: (l) => (l.ttl_left ? num(l.ttl_left) + " s" : "–") },
      { label: "Waiters", num: true, cell: (l) => (l.waiters > 0
        ? h("button", { type: "button", class: "small secondary", title: "show or hide the line", onclick: () => { if (hidden.has(l.name)) hidden.delete(l.name); else hidden.add(l.name); drawLines(); } }, num(l.waiters))
        : "0") },
    ], ls, "No lock is held.", (l) => ({ "data-lock": l.name })));
    drawLines();
  };

  load();
  return { event(name, topics) { if (name === "changed" && topics.includes("locks")) load(); } };
}
