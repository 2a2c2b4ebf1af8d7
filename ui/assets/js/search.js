// Search: a box on the queue page that finds the queue's tasks by id
// prefix, status, type, parameters and creation time (GET
// /v1/queues/{queue}/search), a page at a time. A page that read its budget
// of tasks and found nothing is followed by the next for up to 3 s; then
// the user chooses to keep going. The filters live in the page's address
// (f_id, f_status, f_type, f_param, f_since, f_until), so a search can be
// shared and reloaded.
//
// The parameter box takes one key=value a line, so that a value may hold
// spaces and commas ("subject=weekly report"); a line's ends are trimmed.
// The key is a top-level key of the tasks' parameters (letters, digits,
// '.', '_', '-', ':'); the value is compared as JSON when it parses, else
// as a string. Enter searches, Shift+Enter starts another line.

import { get, enc } from "./api.js";
import { h, replace, num, ago, badge, table, errorBox } from "./dom.js";

const STATUSES = ["SCHEDULED", "PENDING", "RUNNING", "RETRYING", "SUCCEEDED", "DEAD", "CANCELLED"];
const PAGE = 50;
const FOLLOW_MS = 3000;
const FIELDS = [
  ["f_id", "id_prefix"], ["f_status", "status"], ["f_type", "type"], ["f_since", "since"], ["f_until", "until"],
];

// searchPath is the route of one page of the search filters asks for.
function searchPath(q, filters, cursor) {
  const p = new URLSearchParams();
  for (const [, api] of FIELDS) if (filters[api]) p.append(api, filters[api]);
  for (const kv of paramLines(filters.param)) p.append("param", kv);
  p.set("limit", String(PAGE));
  if (cursor) p.set("cursor", cursor);
  return "/v1/queues/" + enc(q) + "/search?" + p.toString();
}

// paramLines returns the key=value filters of the parameter box: one a
// line, blank lines left out.
export function paramLines(text) {
  return (text || "").split(/\r?\n/).map((l) => l.trim()).filter(Boolean);
}

// readFilters reads the filters of the page's address.
function readFilters(query) {
  const f = {};
  for (const [key, api] of FIELDS) f[api] = query.get(key) || "";
  f.param = query.get("f_param") || "";
  return f;
}

// keepInAddress writes the filters into the address without reloading
// the page.
function keepInAddress(filters) {
  const [path, qs] = location.hash.split("?");
  const p = new URLSearchParams(qs || "");
  for (const [key, api] of FIELDS) if (filters[api]) p.set(key, filters[api]); else p.delete(key);
  if (filters.param) p.set("f_param", filters.param); else p.delete("f_param");
  const s = p.toString();
  history.replaceState(null, "", path + (s ? "?" + s : ""));
}

// paramBox is the parameter box: one key=value a line.
function paramBox(value) {
  const title = "One key=value a line; the value may hold spaces. Keys are the top-level keys of the tasks' parameters.";
  return h("label", { class: "muted" }, "param ",
    h("textarea", { name: "param", rows: fit(value), cols: 16, placeholder: "key=value, one a line", title, "aria-label": "param",
      oninput: (e) => { e.target.rows = fit(e.target.value); } }, value));
}

// fit is how many rows the parameter box shows for text: its lines, 1 to 4.
function fit(text) {
  return Math.min(4, Math.max(1, (text || "").split("\n").length));
}

// searchPanel returns the search box of queue q, with its results below.
export function searchPanel(ctx, q) {
  const filters = readFilters(ctx.query);
  const input = (name, label, placeholder, size) => h("label", { class: "muted" }, label + " ",
    h("input", { name, value: filters[name], placeholder, size, "aria-label": label }));
  const status = h("select", { name: "status", "aria-label": "status" }, h("option", { value: "" }, "any status"),
    STATUSES.map((s) => h("option", { value: s, selected: filters.status === s }, s[0] + s.slice(1).toLowerCase())));
  const form = h("form", { class: "actions", id: "search-form", role: "search" },
    input("id_prefix", "id", "starts with", 10), status, input("type", "type", "task type", 9),
    paramBox(filters.param), input("since", "since", "1h or 2026-11-28T09:00:00Z", 14),
    input("until", "until", "time or duration", 10),
    h("button", { type: "submit", class: "small", "data-act": "search" }, "Search"),
    h("button", { type: "button", class: "small secondary", "data-act": "clear", onclick: () => { form.reset(); for (const el of form.elements) if (el.name) el.value = ""; run(); } }, "Clear"));
  form.param.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); form.requestSubmit(); }
  });
  const note = h("p", { class: "muted", id: "search-note" });
  const results = h("div", { id: "search-results" });
  const pager = h("div", { class: "pager" });
  const section = h("section", { class: "panel", id: "search" }, h("div", { class: "panel-head" }, h("h2", {}, "Find a task")), form, note, results, pager);

  let generation = 0;
  let cursors = []; // the cursor of each page before this one
  let cursor = "";

  const collect = () => {
    const f = {};
    for (const el of form.elements) if (el.name) f[el.name] = el.value.trim();
    return f;
  };

  // load fetches the page at cursor c, following empty pages for a while.
  const load = async (f, c) => {
    const mine = ++generation;
    const t0 = Date.now();
    let scanned = 0;
    replace(note, "Searching…");
    try {
      for (;;) {
        const page = await get(searchPath(q, f, c));
        if (!ctx.alive() || mine !== generation) return;
        scanned += page.scanned || 0;
        const tasks = page.data || [];
        if (tasks.length > 0 || !page.next_cursor || Date.now() - t0 > FOLLOW_MS) {
          draw(f, c, tasks, page.next_cursor || "", scanned);
          return;
        }
        c = page.next_cursor;
      }
    } catch (e) {
      if (ctx.alive() && mine === generation) {
        replace(note);
        replace(results, errorBox(e));
        replace(pager);
      }
    }
  };

  const draw = (f, c, tasks, next, scanned) => {
    cursor = c;
    const empty = next ? "Nothing found yet: " + num(scanned) + " tasks read so far." : "No task matches.";
    replace(note, num(tasks.length) + " found · " + num(scanned) + " read" + (next ? " · more to search" : ""));
    replace(results, table([
      { label: "Task", cell: (t) => h("a", { href: "#/queue/" + enc(q) + "/task/" + enc(t.task_id), class: "mono" }, t.task_id) },
      { label: "Type", cell: (t) => t.task_type },
      { label: "Status", cell: (t) => badge(t.current_status) },
      { label: "Attempt", num: true, narrow: true, cell: (t) => num(t.attempt) },
      { label: "Created", narrow: true, cell: (t) => ago(t.metadata.created_at) },
    ], tasks, empty, (t) => ({ "data-found": t.task_id })));
    replace(pager,
      h("button", { type: "button", class: "small secondary", "data-act": "search-previous", disabled: cursors.length === 0, onclick: () => load(f, cursors.pop()) }, "Previous"),
      h("button", { type: "button", class: "small secondary", "data-act": "search-next", disabled: !next, onclick: () => { cursors.push(cursor); load(f, next); } }, tasks.length ? "Next" : "Keep searching"));
  };

  const run = () => {
    const f = collect();
    keepInAddress(f);
    cursors = [];
    const any = Object.values(f).some(Boolean);
    if (!any) {
      replace(note, "Filters narrow the queue's tasks; an id prefix and a status are quickest.");
      replace(results);
      replace(pager);
      return;
    }
    load(f, "");
  };

  form.addEventListener("submit", (e) => { e.preventDefault(); run(); });
  run();
  return section;
}
