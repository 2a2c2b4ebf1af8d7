// The dashboard's shell: login, the namespace, the live event stream
// (GET /v1/events) and the hash router that mounts one page at a time.

import { api, follow, onUnauthorized, session } from "./api.js";
import { h, replace, errorBox, errorText, toast } from "./dom.js";
import * as overview from "./overview.js";
import * as queuePage from "./queue.js";
import * as taskPage from "./task.js";
import * as locks from "./locks.js";
import * as workers from "./workers.js";
import * as flow from "./flow.js";
import * as budgets from "./budgets.js";
import * as paxos from "./paxos.js";
import * as schedules from "./schedules.js";
import * as login from "./login.js";

// state is what every page may read: the token's role, the namespace (and
// those the token may use), and the latest queue counts from the stream.
const state = { role: "", name: "", auth: false, namespace: "", namespaces: [], defaultNamespace: "", queues: null, ready: false };

const main = document.getElementById("main");
let current = null; // the mounted page's controller
let generation = 0; // bumped at every mount: a page whose number is old is gone
let stream = null; // the AbortController of the event stream

const routes = [
  { re: /^\/?$/, page: overview, nav: "overview" },
  { re: /^\/queue\/([^/]+)$/, page: queuePage, nav: "overview", keys: ["queue"] },
  { re: /^\/queue\/([^/]+)\/task\/([^/]+)$/, page: taskPage, nav: "overview", keys: ["queue", "id"] },
  { re: /^\/locks$/, page: locks, nav: "locks" },
  { re: /^\/workers$/, page: workers, nav: "workers" },
  { re: /^\/flow$/, page: flow, nav: "flow" },
  { re: /^\/budgets$/, page: budgets, nav: "budgets" },
  { re: /^\/schedules$/, page: schedules, nav: "schedules" },
  { re: /^\/paxos$/, page: paxos, nav: "paxos" },
];

function parseHash() {
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, qs] = hash.split("?");
  const query = new URLSearchParams(qs || "");
  for (const r of routes) {
    const m = path.match(r.re);
    if (!m) continue;
    const params = {};
    (r.keys || []).forEach((k, i) => { params[k] = decodeURIComponent(m[i + 1]); });
    return { ...r, params, query };
  }
  return null;
}

function unmount() {
  generation++;
  if (current && current.destroy) current.destroy();
  current = null;
}

// route mounts the page the address names.
function route() {
  if (!state.ready) return;
  unmount();
  const r = parseHash();
  document.querySelectorAll("#nav a").forEach((a) => a.classList.toggle("active", !!r && a.dataset.nav === r.nav));
  document.getElementById("nav").classList.remove("open");
  if (!r) {
    replace(main, h("h1", {}, "Not found"), h("p", {}, "No such page. ", h("a", { href: "#/" }, "Go to the overview.")));
    return;
  }
  const mine = generation;
  const ctx = { main, state, params: r.params, query: r.query, alive: () => mine === generation };
  main.replaceChildren();
  try {
    current = r.page.mount(ctx);
  } catch (e) {
    replace(main, errorBox(e));
  }
}

// pageEvent hands an event of the stream to the mounted page.
function pageEvent(name, data) {
  if (current && current.event) {
    try {
      current.event(name, data);
    } catch (e) {
      replace(main, errorBox(e));
    }
  }
}

function setLive(on, why) {
  const el = document.getElementById("live");
  el.className = "live " + (on ? "on" : "off");
  el.textContent = on ? "live" : "offline";
  el.title = on ? "live updates from GET /v1/events" : why || "reconnecting to GET /v1/events";
}

const sleep = (ms, signal) => new Promise((resolve) => {
  const t = setTimeout(resolve, ms);
  signal.addEventListener("abort", () => { clearTimeout(t); resolve(); }, { once: true });
});

// startEvents follows GET /v1/events until stopped, reconnecting after a
// break with a growing pause (1 s to 15 s).
async function startEvents() {
  stopEvents();
  const ctrl = new AbortController();
  stream = ctrl;
  let pause = 1000;
  while (!ctrl.signal.aborted) {
    try {
      await follow("/v1/events", (name, data) => {
        pause = 1000;
        onServerEvent(name, data);
      }, ctrl.signal);
    } catch (e) {
      if (ctrl.signal.aborted) return;
      if (e.status === 401 || e.status === 403) {
        setLive(false, errorText(e));
        return;
      }
    }
    if (ctrl.signal.aborted) return;
    setLive(false);
    await sleep(pause, ctrl.signal);
    pause = Math.min(pause * 2, 15000);
  }
}

function stopEvents() {
  if (stream) stream.abort();
  stream = null;
}

function onServerEvent(name, data) {
  if (name === "snapshot") {
    setLive(true);
    state.namespace = data.namespace; // the field's placeholder stays the server's (showSession)
    state.queues = data.queues;
    pageEvent("queues", data.queues);
  } else if (name === "queues") {
    state.queues = data.queues;
    pageEvent("queues", data.queues);
  } else if (name === "changed") {
    pageEvent("changed", data.topics);
  } else if (name === "sample") {
    pageEvent("sample", data);
  } else if (name === "end") {
    setLive(false, data.detail);
  }
}

function showLogin(message) {
  state.ready = false;
  stopEvents();
  unmount();
  document.getElementById("session").hidden = true;
  document.getElementById("nav").hidden = true;
  document.getElementById("menu-toggle").hidden = true;
  login.mount({ main, message, onToken: start });
}

// mayUse reports whether the token whoami described may use namespace ns.
function mayUse(me, ns) {
  return !me.auth || me.namespaces.includes("*") || me.namespaces.includes(ns);
}

// pickNamespace is where the dashboard starts: the namespace asked for (the
// tab's, else the server's) if the token may use it, else the server's if
// it may, else the first the token lists.
function pickNamespace(me) {
  if (me.allowed !== false && mayUse(me, me.namespace)) return me.namespace;
  if (mayUse(me, me.default_namespace)) return me.default_namespace;
  return me.namespaces.find((ns) => ns !== "*") || me.default_namespace;
}

// showSession fills the header: the namespace (a free field when the token
// may use any, else a choice among its own), the token, and Log out.
function showSession(me) {
  const any = !me.auth || me.namespaces.includes("*");
  const input = document.getElementById("ns");
  const pick = document.getElementById("ns-pick");
  input.hidden = !any;
  pick.hidden = any;
  document.getElementById("ns-label").htmlFor = any ? "ns" : "ns-pick";
  input.placeholder = state.defaultNamespace;
  input.value = state.namespace === state.defaultNamespace ? "" : state.namespace;
  replace(pick, me.namespaces.map((ns) => h("option", { value: ns, selected: ns === state.namespace }, ns)));
  document.getElementById("ns-form").hidden = false;
  document.getElementById("who").textContent = me.auth ? me.name + " (" + me.role + ")" : "no auth";
  document.getElementById("logout").hidden = !me.auth;
  document.getElementById("session").hidden = false;
  document.getElementById("nav").hidden = false;
  document.getElementById("menu-toggle").hidden = false;
}

// showStartError says why whoami did not answer, with every way on: try
// again, back to the server's namespace, log out.
function showStartError(e) {
  stopEvents();
  unmount();
  const token = session.token() !== "";
  document.getElementById("ns-form").hidden = true;
  document.getElementById("who").textContent = "";
  document.getElementById("logout").hidden = !token;
  document.getElementById("session").hidden = !token;
  setLive(false, errorText(e));
  replace(main, h("section", { class: "panel", id: "start-error" }, h("h1", {}, "drover"), errorBox(e), h("div", { class: "actions" },
    h("button", { type: "button", "data-act": "retry", onclick: start }, "Try again"),
    session.namespace() && h("button", { type: "button", class: "secondary", "data-act": "default-namespace", onclick: () => switchNamespace("") }, "Use the server's namespace"),
    token && h("button", { type: "button", class: "secondary", "data-act": "logout", onclick: logout }, "Log out"))));
}

let starts = 0; // bumped at every start: an answer to an older one is dropped

// start asks the server who the token is, then shows the pages in a
// namespace the token may use; a 401 shows the login instead, and nothing
// else is read.
async function start() {
  const mine = ++starts;
  state.ready = false;
  let me;
  try {
    me = await api("GET", "/v1/whoami");
  } catch (e) {
    if (mine !== starts) return;
    if (e.status === 401) {
      const had = session.token() !== "";
      session.setToken("");
      showLogin(had ? "The server does not accept this token." : "");
      return;
    }
    const asked = session.namespace();
    if (e.status === 400 && asked) { // the tab's namespace is not a namespace name
      session.setNamespace("");
      toast(errorText(e), true);
      start();
      return;
    }
    showStartError(e);
    return;
  }
  if (mine !== starts) return;
  const ns = pickNamespace(me);
  if (ns !== me.namespace) toast("Token \"" + me.name + "\" may not use namespace \"" + me.namespace + "\": showing \"" + ns + "\".", true);
  session.setNamespace(ns === me.default_namespace ? "" : ns);
  Object.assign(state, { role: me.role, name: me.name, auth: me.auth, namespace: ns, namespaces: me.namespaces,
    defaultNamespace: me.default_namespace, ready: true });
  showSession(me);
  setLive(false, "connecting");
  startEvents();
  route();
}

// switchNamespace shows namespace ns ("" or the server's: the server's).
function switchNamespace(ns) {
  session.setNamespace(ns === state.defaultNamespace ? "" : ns);
  state.queues = null;
  start();
}

function logout() {
  session.setToken("");
  session.setNamespace("");
  showLogin("Logged out.");
}

onUnauthorized(() => {
  if (state.ready) {
    session.setToken("");
    showLogin("The server no longer accepts the token: log in again.");
  }
});

window.addEventListener("hashchange", route);

document.getElementById("menu-toggle").addEventListener("click", () => {
  const nav = document.getElementById("nav");
  nav.classList.toggle("open");
  document.getElementById("menu-toggle").setAttribute("aria-expanded", String(nav.classList.contains("open")));
});

document.getElementById("ns-form").addEventListener("submit", (e) => {
  e.preventDefault();
  switchNamespace(document.getElementById("ns").value.trim());
});

document.getElementById("ns-pick").addEventListener("change", (e) => switchNamespace(e.target.value));

document.getElementById("logout").addEventListener("click", logout);

// A page's 403 offers these two ways out (dom.js errorBox).
document.addEventListener("drover:allowed-namespace", () => start());
document.addEventListener("drover:logout", logout);

start();
