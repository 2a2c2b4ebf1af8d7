// The workflow parts of the task page: the task's parent and children,
// what it waits for (with Approve and Reject for a wait on a signal), the
// signals it received, and the live view of its stream.

import { api, get, enc, follow } from "./api.js";
import { h, replace, num, time, ago, badge, table, panel, errorBox, errorText, guarded, confirmAction } from "./dom.js";

const taskHref = (q, id) => "#/queue/" + enc(q) + "/task/" + enc(id);

// newPager is where the children's table stands, kept by the task page
// across its reloads: the cursor of the page shown ("" for the first), the
// cursors of the pages before it, and the queues of the children listed.
export function newPager() {
  return { cursor: "", back: [], queues: new Set() };
}

// family shows the task's parent (a link) and its children: the counts of
// every step and a page of children with their states, with Next,
// Previous and First. pager keeps the page shown across reloads.
export function family(ctx, t, pager) {
  const parts = [];
  if (t.parent) {
    const link = t.parent_queue ? h("a", { href: taskHref(t.parent_queue, t.parent), class: "mono", "data-parent": t.parent }, t.parent)
      : h("span", { class: "mono", "data-parent": t.parent }, t.parent + " (gone)");
    parts.push(h("p", { id: "parent" }, "Spawned by ", link, " at its step " + num(t.parent_step) + "."));
  }
  const ch = t.children;
  if (ch) parts.push(children(ctx, t, ch, pager));
  else pager.queues = new Set();
  if (parts.length === 0) return null;
  return panel("Parent and children", h("div", { class: "stack" }, parts));
}

function counts(c) {
  return [num(c.spawned), " spawned: ", badge(num(c.succeeded) + " succeeded", "s-SUCCEEDED"), " ",
    badge(num(c.failed) + " failed", "s-DEAD"), " ", badge(num(c.live) + " not ended", "s-PENDING")];
}

function children(ctx, t, first, pager) {
  const rows = h("div");
  const more = h("div", { class: "pager" });
  const path = "/v1/queues/" + enc(t.queue) + "/tasks/" + enc(t.task_id) + "/children?limit=50&cursor=";
  let shown = 0; // the generation of the page asked last: an older answer is dropped
  const button = (label, act, onclick) => h("button", { type: "button", class: "secondary small", "data-act": act, onclick }, label);
  const go = async (cursor, back) => {
    const gen = ++shown;
    // The page asked for is where the pager stands from now on, before its
    // answer: a reload of the task page while it is read (a listed queue
    // changed) asks for it again rather than showing the first page.
    pager.cursor = cursor;
    pager.back = back;
    if (cursor === "") {
      render(first);
      return;
    }
    let page;
    try {
      page = await get(path + enc(cursor));
    } catch (e) {
      if (ctx.alive() && gen === shown) replace(more, errorBox(e));
      return;
    }
    if (!ctx.alive() || gen !== shown) return;
    render(page);
  };
  const render = (page) => {
    const list = page.children || [];
    pager.queues = new Set(list.map((c) => c.queue));
    replace(rows, table([
      { label: "Child", cell: (c) => h("a", { href: taskHref(c.queue, c.task_id), class: "mono" }, c.task_id) },
      { label: "Status", cell: (c) => badge(c.status) },
      { label: "Queue", cell: (c) => c.queue },
      { label: "Type", narrow: true, cell: (c) => c.task_type },
      { label: "Step", num: true, narrow: true, cell: (c) => num(c.step) },
      { label: "Error", wrap: true, cell: (c) => c.error || "" },
    ], list, "No child listed.", (c) => ({ "data-child": c.task_id, "data-status": c.status })));
    const cur = pager.cursor;
    const back = pager.back;
    replace(more,
      back.length > 0 || cur !== "" ? button("First", "children-first", () => go("", [])) : null,
      cur !== "" ? button("Previous children", "children-prev", () => go(back[back.length - 1] || "", back.slice(0, -1))) : null,
      page.next_cursor ? button("Next children", "children-next", () => go(page.next_cursor, [...back, cur])) : null);
  };
  if (pager.cursor === "") render(first);
  else {
    replace(rows, h("p", { class: "muted" }, "Loading…"));
    go(pager.cursor, pager.back);
  }
  const steps = (first.steps || []).length > 1
    ? first.steps.map((s) => h("p", { class: "muted" }, "Step " + num(s.step) + ": ", counts(s))) : null;
  return h("div", { id: "children" }, h("p", { class: "child-counts" }, "Children: ", counts(first)), steps, rows, more);
}

// decisionKey is the idempotency key of a decision on wait w for signal
// name: the same for Approve and Reject and for every render of the same
// wait, so that two clicks (of either button, before or after a reload)
// send one signal. A key holds letters, digits and '-' only.
export function decisionKey(since, name) {
  const key = "ui-" + Date.parse(since) + "-" + name.replace(/[^A-Za-z0-9-]/g, "-");
  return key.slice(0, 128);
}

// waiting shows what a WAITING task waits for and since when; a wait on a
// signal gets Approve and Reject, which send it with {"approved": ...}.
// note is the element, outside the panel, that says what the last decision
// did: it outlives the page's reloads and the wait.
export function waiting(state, t, note, reload) {
  const w = t.waiting_for;
  if (t.current_status !== "WAITING" || !w) return null;
  let what;
  if (w.children) {
    what = "its children: " + num(w.children.wait) + " of the " + num(w.children.n) + " that step " + num(w.children.step) + " spawned must end" +
      (w.children.collect ? " (every outcome collected)" : " (the first failed child fails it)");
  } else {
    what = "the signal " + (w.signals || []).join(" or ");
  }
  const rows = [
    h("p", { id: "waits-for" }, "Waits for ", h("b", {}, what), ", since ", time(w.since), " (", ago(w.since), ")",
      w.until ? [", until ", time(w.until), " (", ago(w.until), ")"] : ", with no timeout", "."),
  ];
  const names = w.signals || [];
  if (names.length > 0) {
    const pick = names.length > 1 ? h("select", { "aria-label": "signal", id: "signal-name" }, names.map((n) => h("option", { value: n }, n))) : null;
    let busy = false;
    const buttons = [];
    const hold = (on) => {
      busy = on;
      for (const b of buttons) b.disabled = on || b.dataset.denied === "true";
    };
    const send = (approved) => async () => {
      if (busy) return;
      hold(true);
      try {
        const name = pick ? pick.value : names[0];
        const verb = approved ? "Approve" : "Reject";
        if (!(await confirmAction(verb + ": send task " + t.task_id + " the signal " + name + " with {\"approved\": " + approved + "}?", verb))) return;
        replace(note, h("span", { class: "muted" }, "Sending " + name + "…"));
        try {
          const r = await api("POST", "/v1/tasks/" + enc(t.task_id) + "/signals/" + enc(name),
            { data: { approved }, idempotency_key: decisionKey(w.since, name) });
          replace(note, h("span", { class: "ok", "data-woke": String(r.woke), "data-stored": String(r.stored) },
            (approved ? "Approved" : "Rejected") + " (signal " + name + ", key " + r.idempotency_key + "): " + outcome(r)));
          reload();
        } catch (e) {
          replace(note, h("span", { class: "error", role: "alert" }, "The signal was not sent: " + errorText(e)));
        }
      } finally {
        hold(false);
      }
    };
    buttons.push(withAct(guarded(state, "write", "Approve", send(true), ""), "approve"),
      withAct(guarded(state, "write", "Reject", send(false), "danger"), "reject"));
    for (const b of buttons) b.dataset.denied = String(b.disabled);
    rows.push(h("div", { class: "actions decide" }, pick, buttons));
  }
  return panel("Waiting", h("div", { class: "stack", id: "waiting" }, rows));
}

function withAct(b, act) {
  b.dataset.act = act;
  return b;
}

// outcome says what a signal did, as the API answered it.
function outcome(r) {
  if (r.woke) return "the task was waiting for it and resumes now.";
  if (r.stored) return "stored in the task's inbox; the step that waits for it gets it.";
  return "a signal with this key was sent before; nothing new was stored.";
}

// signals lists the signals the task received.
export function signals(t) {
  if (!t.signals || t.signals.length === 0) return null;
  return panel("Signals received", table([
    { label: "Name", cell: (s) => h("span", { class: "mono" }, s.name) },
    { label: "Key", wrap: true, narrow: true, cell: (s) => h("span", { class: "mono" }, s.idempotency_key) },
    { label: "Sent", cell: (s) => time(s.sent_at) },
    { label: "State", cell: (s) => (s.consumed ? "consumed " + time(s.consumed_at) : "waiting to be consumed") },
    { label: "Data", wrap: true, cell: (s) => (s.data !== undefined ? h("span", { class: "mono" }, JSON.stringify(s.data)) : "") },
  ], t.signals, "", (s) => ({ "data-signal": s.name })));
}

// Bounds of the live view: the text keeps its last maxText characters
// (trimmed once it passes them by a slack, so that a token costs no copy
// of the whole text), the list its last maxEvents events.
const maxText = 256 * 1024;
const textSlack = 32 * 1024;
const maxEvents = 500;

// A task in one of these states may emit: its page follows its stream by
// itself; for another, the page offers Follow.
const streaming = ["RUNNING", "RETRYING", "WAITING", "SLEEPING"];

// live follows the task's stream (GET /v1/tasks/{id}/stream) while the page
// is open and the task may emit (update says its state): tokens joined as
// text, other events listed, each attempt's boundary shown, until the
// stream's final end (done, or the task ended). An end that is not final
// (the server closing, a read error) and a break reconnect from the next
// event, after a backoff with jitter that resets once an event came or a
// connection lasted a few seconds.
export function live(ctx, id) {
  const status = h("p", { class: "muted", id: "stream-status" }, "Not followed: the task is not running.");
  const controls = h("div", { class: "actions" });
  const trimmed = h("p", { class: "muted", id: "stream-trimmed" }, "Earlier events trimmed.");
  trimmed.hidden = true;
  const text = h("pre", { id: "stream-text", class: "stream-text" });
  const list = h("ol", { id: "stream-events", class: "stream-events" });
  const box = panel("Live stream", h("div", { class: "stack" }, status, controls, trimmed, text, list));
  const abort = new AbortController();
  let next = 1;
  let started = false;
  let final = false;
  const start = () => {
    if (started) return;
    started = true;
    replace(controls);
    replace(status, "Connecting…");
    run();
  };
  replace(controls, h("button", { type: "button", class: "secondary small", "data-act": "follow", onclick: start }, "Follow"));
  // onEvent shows one event; it reports whether the event was new.
  const onEvent = (name, d) => {
    if (name === "end") {
      if (d.reason === "done" || d.reason === "ended") {
        final = true;
        replace(status, h("span", { "data-ended": d.reason }, "Ended: " + d.reason + (d.detail ? " (" + d.detail + ")" : "") + "."));
      } else {
        replace(status, h("span", { "data-reconnecting": d.reason || "" }, "Reconnecting… (the stream broke off: " + (d.reason || "no reason") + ")"));
      }
      return false;
    }
    if (typeof d.seq !== "number" || d.seq < next) return false;
    next = d.seq + 1;
    replace(status, "Following: event " + num(d.seq) + ".");
    show(d, text, list, trimmed);
    return true;
  };
  const onOpen = () => {
    replace(status, next === 1 ? h("span", { "data-open": "true" }, "Waiting for events…") : "Following: event " + num(next - 1) + ".");
  };
  const run = async () => {
    let wait = 1000;
    while (!final && ctx.alive()) {
      const opened = Date.now();
      let fresh = false;
      try {
        await follow("/v1/tasks/" + enc(id) + "/stream?from=" + next, (name, d) => {
          if (onEvent(name, d)) fresh = true;
        }, abort.signal, onOpen);
      } catch (e) {
        if (!ctx.alive() || abort.signal.aborted) return;
        if (e.status === 404) {
          replace(status, h("span", { "data-gone": "true" }, "No such task, or its stream passed retention."));
          return;
        }
        replace(status, h("span", { class: "error" }, errorText(e) + " Reconnecting…"));
      }
      if (fresh || Date.now() - opened >= 5000) wait = 1000;
      if (final || !ctx.alive()) return;
      await new Promise((r) => setTimeout(r, wait / 2 + Math.random() * wait / 2));
      wait = Math.min(wait * 2, 15000);
    }
  };
  return {
    box,
    stop: () => abort.abort(),
    // update starts following once the task may emit.
    update(t) {
      if (streaming.includes(t.current_status)) start();
    },
  };
}

// show adds one event: a token's text to the text, a boundary or another
// event to the list; both keep their last part only.
function show(ev, text, list, trimmed) {
  const d = ev.data || {};
  if (ev.type === "token") {
    append(text, typeof d.text === "string" ? d.text : "", trimmed);
    return;
  }
  let line;
  switch (ev.type) {
    case "attempt_started":
      line = h("li", { class: "boundary", "data-type": ev.type }, "Attempt " + num(d.attempt) + " started" + (d.worker ? " on " + d.worker : "") + (d.token ? " (token " + d.token + ")" : ""));
      if (text.textContent) append(text, "\n— attempt " + num(d.attempt) + " —\n", trimmed);
      break;
    case "attempt_lost":
      line = h("li", { class: "boundary lost", "data-type": ev.type }, "Attempt " + num(d.attempt) + " was lost (its worker died or lost its claim)");
      break;
    case "attempt_ended":
      line = h("li", { class: "boundary", "data-type": ev.type }, "Attempt " + num(d.attempt) + " ended: " + (d.outcome || "") + (d.error ? " (" + d.error + ")" : ""));
      break;
    case "done":
      line = h("li", { class: "boundary", "data-type": ev.type }, "Done: " + (d.outcome || "") + (d.error ? " (" + d.error + ")" : ""));
      break;
    default:
      line = h("li", { "data-type": ev.type }, h("span", { class: "mono" }, "#" + ev.seq + " " + ev.type + " "), JSON.stringify(ev.data));
  }
  list.append(line);
  while (list.children.length > maxEvents) {
    list.firstElementChild.remove();
    trimmed.hidden = false;
  }
}

// append adds s to the live text, keeping its last maxText characters.
function append(text, s, trimmed) {
  text.append(document.createTextNode(s));
  const len = text.textContent.length;
  if (len > maxText + textSlack) {
    text.textContent = text.textContent.slice(len - maxText);
    trimmed.hidden = false;
  }
}
