// The workflow parts of the task page: the task's parent and children,
// what it waits for (with Approve and Reject for a wait on a signal), the
// signals it received, and the live view of its stream.

import { api, get, enc, follow } from "./api.js";
import { h, replace, num, time, ago, badge, table, panel, errorBox, errorText, guarded, confirmAction } from "./dom.js";

const taskHref = (q, id) => "#/queue/" + enc(q) + "/task/" + enc(id);

// family shows the task's parent (a link) and its children: the counts of
// every step and a page of children with their states, Next for more.
export function family(t) {
  const parts = [];
  if (t.parent) {
    const link = t.parent_queue ? h("a", { href: taskHref(t.parent_queue, t.parent), class: "mono", "data-parent": t.parent }, t.parent)
      : h("span", { class: "mono", "data-parent": t.parent }, t.parent + " (gone)");
    parts.push(h("p", { id: "parent" }, "Spawned by ", link, " at its step " + num(t.parent_step) + "."));
  }
  const ch = t.children;
  if (ch) parts.push(children(t, ch));
  if (parts.length === 0) return null;
  return panel("Parent and children", h("div", { class: "stack" }, parts));
}

function counts(c) {
  return [num(c.spawned), " spawned: ", badge(num(c.succeeded) + " succeeded", "s-SUCCEEDED"), " ",
    badge(num(c.failed) + " failed", "s-DEAD"), " ", badge(num(c.live) + " not ended", "s-PENDING")];
}

function children(t, first) {
  const rows = h("div");
  const more = h("div", { class: "pager" });
  const show = (page) => {
    replace(rows, table([
      { label: "Child", cell: (c) => h("a", { href: taskHref(c.queue, c.task_id), class: "mono" }, c.task_id) },
      { label: "Status", cell: (c) => badge(c.status) },
      { label: "Queue", cell: (c) => c.queue },
      { label: "Type", narrow: true, cell: (c) => c.task_type },
      { label: "Step", num: true, narrow: true, cell: (c) => num(c.step) },
      { label: "Error", wrap: true, cell: (c) => c.error || "" },
    ], page.children, "No child listed.", (c) => ({ "data-child": c.task_id, "data-status": c.status })));
    replace(more, page.next_cursor ? h("button", {
      type: "button", class: "secondary small", "data-act": "children-next",
      onclick: async () => {
        try {
          show(await get("/v1/queues/" + enc(t.queue) + "/tasks/" + enc(t.task_id) + "/children?limit=50&cursor=" + enc(page.next_cursor)));
        } catch (e) {
          replace(more, errorBox(e));
        }
      },
    }, "Next children") : null);
  };
  show(first);
  const steps = (first.steps || []).length > 1
    ? first.steps.map((s) => h("p", { class: "muted" }, "Step " + num(s.step) + ": ", counts(s))) : null;
  return h("div", { id: "children" }, h("p", { class: "child-counts" }, "Children: ", counts(first)), steps, rows, more);
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
    const keys = { true: randomKey(), false: randomKey() };
    const send = (approved) => async () => {
      const name = pick ? pick.value : names[0];
      const verb = approved ? "Approve" : "Reject";
      if (!(await confirmAction(verb + ": send task " + t.task_id + " the signal " + name + " with {\"approved\": " + approved + "}?", verb))) return;
      replace(note, h("span", { class: "muted" }, "Sending " + name + "…"));
      try {
        const r = await api("POST", "/v1/tasks/" + enc(t.task_id) + "/signals/" + enc(name),
          { data: { approved }, idempotency_key: keys[approved] });
        replace(note, h("span", { class: "ok", "data-woke": String(r.woke), "data-stored": String(r.stored) },
          (approved ? "Approved" : "Rejected") + " (signal " + name + ", key " + r.idempotency_key + "): " + outcome(r)));
        reload();
      } catch (e) {
        replace(note, h("span", { class: "error", role: "alert" }, "The signal was not sent: " + errorText(e)));
      }
    };
    rows.push(h("div", { class: "actions decide" }, pick,
      withAct(guarded(state, "write", "Approve", send(true), ""), "approve"),
      withAct(guarded(state, "write", "Reject", send(false), "danger"), "reject")));
  }
  return panel("Waiting", h("div", { class: "stack", id: "waiting" }, rows));
}

// randomKey is an idempotency key for one decision shown: a second click
// of the same button sends the same signal once (crypto.randomUUID needs a
// secure context; a dashboard on a LAN address has none).
function randomKey() {
  const b = crypto.getRandomValues(new Uint8Array(12));
  return "ui-" + Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
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

// live follows the task's stream (GET /v1/tasks/{id}/stream) while the page
// is open: tokens joined as text, other events listed, each attempt's
// boundary shown, until the stream's end. It reconnects from the next
// event after a break.
export function live(ctx, id) {
  const status = h("p", { class: "muted", id: "stream-status" }, "Connecting…");
  const text = h("pre", { id: "stream-text", class: "stream-text" });
  const list = h("ol", { id: "stream-events", class: "stream-events" });
  const box = panel("Live stream", h("div", { class: "stack" }, status, text, list));
  const abort = new AbortController();
  let next = 1;
  let ended = false;
  const onEvent = (name, d) => {
    if (name === "end") {
      ended = true;
      replace(status, h("span", { "data-ended": d.reason }, "Ended: " + d.reason + (d.detail ? " (" + d.detail + ")" : "") + "."));
      return;
    }
    if (typeof d.seq !== "number" || d.seq < next) return;
    next = d.seq + 1;
    replace(status, "Following: event " + num(d.seq) + ".");
    show(d, text, list);
  };
  const run = async () => {
    let wait = 1000;
    while (!ended && ctx.alive()) {
      try {
        await follow("/v1/tasks/" + enc(id) + "/stream?from=" + next, onEvent, abort.signal, () => {
          if (next === 1) replace(status, h("span", { "data-open": "true" }, "Waiting for events…"));
        });
        wait = 1000;
      } catch (e) {
        if (!ctx.alive()) return;
        replace(status, e.status === 404 ? "No stream yet: the task has emitted nothing." : h("span", { class: "error" }, errorText(e)));
        wait = Math.min(wait * 2, 15000);
      }
      if (!ended && ctx.alive()) await new Promise((r) => setTimeout(r, wait));
    }
  };
  run();
  return { box, stop: () => abort.abort() };
}

// show adds one event: a token's text to the text, a boundary or another
// event to the list.
function show(ev, text, list) {
  const d = ev.data || {};
  if (ev.type === "token") {
    text.append(document.createTextNode(typeof d.text === "string" ? d.text : ""));
    return;
  }
  let line;
  switch (ev.type) {
    case "attempt_started":
      line = h("li", { class: "boundary", "data-type": ev.type }, "Attempt " + num(d.attempt) + " started" + (d.worker ? " on " + d.worker : "") + (d.token ? " (token " + d.token + ")" : ""));
      if (text.textContent) text.append(document.createTextNode("\n— attempt " + num(d.attempt) + " —\n"));
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
}

