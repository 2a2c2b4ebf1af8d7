// Small DOM helpers shared by the pages: element building, tables,
// formatting, the confirmation dialog and the toast.

// h builds an element: h("a", {href: "#/", class: "x", onclick: f}, "text", child).
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (v === true) el.setAttribute(k, "");
    else el.setAttribute(k, String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

// replace empties el and fills it with children.
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

const numberFormat = new Intl.NumberFormat();

export function num(n) {
  if (n === undefined || n === null) return "–";
  return numberFormat.format(n);
}

export function rate(n) {
  if (!n) return "0";
  return n >= 100 ? Math.round(n).toString() : n >= 10 ? n.toFixed(1) : n.toFixed(2);
}

// ago says how long ago t was ("12 s ago"), with the exact time as a title.
export function ago(t) {
  if (!t) return h("span", { class: "muted" }, "–");
  const d = new Date(t);
  if (isNaN(d.getTime()) || d.getFullYear() < 1971) return h("span", { class: "muted" }, "–");
  const s = Math.round((Date.now() - d.getTime()) / 1000);
  let text;
  if (s < -1) text = "in " + span(-s);
  else if (s < 2) text = "just now";
  else text = span(s) + " ago";
  return h("time", { datetime: d.toISOString(), title: d.toLocaleString() }, text);
}

function span(s) {
  if (s < 60) return s + " s";
  if (s < 3600) return Math.round(s / 60) + " min";
  if (s < 86400) return (s / 3600).toFixed(1) + " h";
  return Math.round(s / 86400) + " d";
}

export function time(t) {
  if (!t) return "–";
  const d = new Date(t);
  return isNaN(d.getTime()) ? "–" : d.toLocaleString();
}

export function badge(text, cls) {
  return h("span", { class: "badge " + (cls || "s-" + text) }, text);
}

// bar draws used out of total as a small bar, red when full unless
// fullIsGood (a bucket of tokens).
export function bar(used, total, fullIsGood) {
  const pct = total > 0 ? Math.max(0, Math.min(100, (used / total) * 100)) : 0;
  const fill = h("span");
  fill.style.width = pct.toFixed(1) + "%";
  return h("span", { class: "bar" + (pct >= 100 && !fullIsGood ? " full" : ""), title: num(used) + " of " + num(total) }, fill);
}

// table renders rows as a table: columns are {label, cell(row), num, narrow,
// short} (narrow: hidden at phone width; short: the label there).
export function table(columns, rows, emptyText, rowAttrs) {
  if (!rows || rows.length === 0) return h("p", { class: "empty" }, emptyText || "Nothing here.");
  const cls = (c) => [c.num ? "num" : "", c.narrow ? "hide-narrow" : "", c.wrap ? "wrap" : ""].filter(Boolean).join(" ") || undefined;
  const label = (c) => (c.short ? [h("span", { class: "long" }, c.label), h("span", { class: "short" }, c.short)] : c.label);
  const head = h("tr", {}, columns.map((c) => h("th", { class: cls(c) }, label(c))));
  const body = rows.map((r) => h("tr", rowAttrs ? rowAttrs(r) : {}, columns.map((c) => h("td", { class: cls(c) }, c.cell(r)))));
  return h("div", { class: "table-wrap" }, h("table", {}, h("thead", {}, head), h("tbody", {}, body)));
}

export function panel(title, ...children) {
  return h("section", { class: "panel" }, h("div", { class: "panel-head" }, h("h2", {}, title)), children);
}

// pretty shows a JSON value, or text, in a pre block.
export function pretty(v) {
  if (v === undefined || v === null) return h("p", { class: "muted" }, "none");
  const text = typeof v === "string" ? v : JSON.stringify(v, null, 2);
  return h("pre", {}, text);
}

// base64Text decodes base64 bytes to text when they are UTF-8, else null.
export function base64Text(b64) {
  if (!b64) return null;
  try {
    const bin = atob(b64);
    const bytes = Uint8Array.from(bin, (c) => c.charCodeAt(0));
    return new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch (e) {
    return null;
  }
}

// confirmAction asks the user to confirm text; resolves true on Confirm.
export function confirmAction(text, okLabel) {
  const dlg = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  document.getElementById("confirm-ok").textContent = okLabel || "Confirm";
  dlg.returnValue = "";
  return new Promise((resolve) => {
    dlg.addEventListener("close", () => resolve(dlg.returnValue === "ok"), { once: true });
    dlg.showModal();
  });
}

let toastTimer = 0;

// toast shows a short message at the bottom of the page.
export function toast(text, bad) {
  const el = document.getElementById("toast");
  el.textContent = text;
  el.className = "toast show" + (bad ? " bad" : "");
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { el.className = "toast"; }, bad ? 6000 : 3000);
}

// errorText says what an API error means to the user.
export function errorText(err) {
  if (!err) return "";
  if (err.status === 403) return "Not allowed: " + err.message;
  return err.message || String(err);
}

// errorBox shows an API error where a page's data would be. A 403 comes
// with a way out: log out, and, when the token may not use the namespace,
// back to one it may use (the shell, app.js, listens for these two
// events); a 403 for the token's role has no other namespace to offer.
export function errorBox(err) {
  const p = h("p", { class: "error", role: "alert" }, errorText(err));
  if (!err || err.status !== 403) return p;
  const ask = (name) => () => document.dispatchEvent(new CustomEvent(name));
  return h("div", { class: "way-out" }, p, h("div", { class: "actions" },
    namespaceForbidden(err) && h("button", { type: "button", class: "secondary", "data-act": "allowed-namespace", onclick: ask("drover:allowed-namespace") }, "Go to a namespace this token may use"),
    h("button", { type: "button", class: "secondary", "data-act": "logout", onclick: ask("drover:logout") }, "Log out")));
}

// namespaceForbidden reports a 403 for the request's namespace, which the
// server's detail names ("token … may not use namespace …", see
// httpapi/auth.go), rather than for the token's role.
function namespaceForbidden(err) {
  const detail = (err.problem && err.problem.detail) || err.message || "";
  return detail.includes("may not use namespace");
}

// can reports whether the logged-in token has at least role need.
export function can(state, need) {
  const order = { read: 1, write: 2, admin: 3 };
  return (order[state.role] || 0) >= order[need];
}

// guarded makes a button that runs act (an async function), disabled
// while it runs, and says why when the role is too low.
export function guarded(state, need, label, act, cls) {
  const allowed = can(state, need);
  const b = h("button", { type: "button", class: cls === undefined ? "small" : cls, disabled: !allowed, title: allowed ? undefined : "needs the " + need + " role" }, label);
  b.addEventListener("click", async () => {
    b.disabled = true;
    try {
      await act();
    } catch (e) {
      toast(errorText(e), true);
    } finally {
      b.disabled = !allowed;
    }
  });
  return b;
}
