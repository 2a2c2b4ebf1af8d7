// A queue's history on its page: processed, failed, retried and deferred
// per minute, depth over time and the latency from submission to start
// (p50, p99), for the last hour or day, from GET /v1/queues/{q}/history.

import { get, enc } from "./api.js";
import { h, replace, num, errorBox } from "./dom.js";

const SVG = "http://www.w3.org/2000/svg";
const REFRESH_MS = 30000;

function s(tag, attrs, text) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = text;
  return el;
}

function niceMax(m) {
  if (!(m > 0)) return 4;
  const step = m / 4;
  const p = Math.pow(10, Math.floor(Math.log10(step)));
  for (const f of [1, 2, 5, 10]) if (f * p >= step) return 4 * f * p;
  return 40 * p;
}

function label(v, unit) {
  if (unit === "s") return v === 0 ? "0" : v < 1 ? Math.round(v * 1000) + " ms" : v < 120 ? +v.toFixed(1) + " s" : Math.round(v / 60) + " min";
  if (v >= 1000) return (v / 1000).toFixed(v >= 10000 ? 0 : 1) + "k";
  return v >= 10 || v === 0 ? String(Math.round(v)) : v.toFixed(1);
}

function clock(t) {
  return new Date(t).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
}

// lines draws series (each {key, cls}) of buckets as an SVG line chart.
function lines(buckets, series, unit, aria) {
  const width = 800;
  const height = 160;
  const pad = { l: 48, r: 10, t: 8, b: 20 };
  const svg = s("svg", { class: "chart history-chart", viewBox: `0 0 ${width} ${height}`, preserveAspectRatio: "none", role: "img", "aria-label": aria });
  const vals = (b, k) => k(b);
  const top = niceMax(Math.max(0, ...buckets.flatMap((b) => series.map((x) => vals(b, x.key) ?? 0))));
  const n = Math.max(1, buckets.length - 1);
  const X = (i) => pad.l + (i / n) * (width - pad.l - pad.r);
  const Y = (v) => height - pad.b - (v / top) * (height - pad.t - pad.b);
  for (let i = 0; i <= 4; i++) {
    const v = (top * i) / 4;
    svg.append(s("line", { class: "grid-line", x1: pad.l, x2: width - pad.r, y1: Y(v), y2: Y(v) }));
    svg.append(s("text", { class: "axis-label", x: pad.l - 6, y: Y(v) + 4, "text-anchor": "end" }, label(v, unit)));
  }
  for (let i = 0; i <= 4; i++) {
    const j = Math.round((n * i) / 4);
    if (!buckets[j]) continue;
    svg.append(s("text", { class: "axis-label", x: X(j), y: height - 5, "text-anchor": i === 0 ? "start" : i === 4 ? "end" : "middle" }, clock(buckets[j].at)));
  }
  for (const x of series) {
    // A value null (a minute without samples) leaves a gap; a point alone
    // between gaps is drawn as a dot.
    let d = "";
    buckets.forEach((b, i) => {
      const v = vals(b, x.key);
      if (v === null || v === undefined) return;
      const joined = i > 0 && vals(buckets[i - 1], x.key) !== null && vals(buckets[i - 1], x.key) !== undefined;
      d += (joined ? " L" : " M") + X(i).toFixed(1) + " " + Y(v).toFixed(1);
      const next = i + 1 < buckets.length ? vals(buckets[i + 1], x.key) : null;
      if (!joined && (next === null || next === undefined)) svg.append(s("circle", { class: "line dot " + x.cls, cx: X(i).toFixed(1), cy: Y(v).toFixed(1), r: 2.5 }));
    });
    if (d) svg.append(s("path", { class: "line " + x.cls, d: d.trim() }));
  }
  return svg;
}

function legend(series) {
  return h("div", { class: "legend" }, series.map((x) => h("span", { class: "key " + x.cls }, x.label)));
}

const COUNTS = [
  { key: (b) => b.processed, cls: "hl-processed", label: "processed (succeeded)" },
  { key: (b) => b.failed, cls: "hl-failed", label: "failed (to the DLQ)" },
  { key: (b) => b.retried, cls: "hl-retried", label: "retried" },
  { key: (b) => b.deferred, cls: "hl-deferred", label: "deferred (flow control)" },
];
const DEPTH = [
  { key: (b) => b.pending, cls: "hl-pending", label: "pending" },
  { key: (b) => b.running, cls: "hl-running", label: "running" },
  { key: (b) => b.retrying, cls: "hl-retrying", label: "retrying" },
];
// A minute without samples has no latency: null, a gap in the line.
const LATENCY = [
  { key: (b) => (b.latency.samples ? b.latency.p50_seconds : null), cls: "hl-p50", label: "p50" },
  { key: (b) => (b.latency.samples ? b.latency.p99_seconds : null), cls: "hl-p99", label: "p99" },
];

// empty says whether the window counted nothing and saw no depth.
function empty(hist) {
  return hist.buckets.every((b) => [...COUNTS, ...DEPTH].every((x) => !x.key(b)));
}

function seconds(v) {
  return v ? label(v, "s") : "–";
}

// mountHistory returns the history panel of queue q; it refreshes itself
// while ctx.alive().
export function mountHistory(ctx, q) {
  let win = ctx.query.get("window") === "24h" ? "24h" : "1h";
  const body = h("div", { class: "history-body" }, h("p", { class: "muted" }, "Loading…"));
  const switchBox = h("div", { class: "history-switch", role: "group", "aria-label": "history window" });
  const panel = h("section", { class: "panel", id: "history" },
    h("div", { class: "panel-head" }, h("h2", {}, "History", h("small", {}, "per minute")), switchBox), body);

  const drawSwitch = () => replace(switchBox, ["1h", "24h"].map((w) => h("button", {
    type: "button", class: "small " + (w === win ? "" : "secondary"), "aria-pressed": w === win ? "true" : "false", "data-window": w,
    onclick: () => { win = w; drawSwitch(); load(); },
  }, w === "1h" ? "Last hour" : "Last day")));

  const draw = (hist) => {
    const t = hist.totals;
    const closed = hist.closed_through ? "closed through " + clock(hist.closed_through) : "no minute closed yet";
    replace(body,
      h("div", { class: "settings history-totals" },
        h("span", {}, "processed ", h("b", { "data-total": "processed" }, num(t.processed))),
        h("span", {}, "failed ", h("b", { "data-total": "failed" }, num(t.failed))),
        h("span", {}, "retried ", h("b", { "data-total": "retried" }, num(t.retried))),
        h("span", {}, "deferred ", h("b", { "data-total": "deferred" }, num(t.deferred))),
        h("span", {}, "latency to start p50 ", h("b", { "data-total": "p50" }, seconds(hist.latency.p50_seconds)), " · p99 ", h("b", { "data-total": "p99" }, seconds(hist.latency.p99_seconds))),
        h("span", { class: "muted" }, closed)),
      empty(hist)
        ? h("p", { class: "muted", id: "history-empty" }, "Nothing counted in this window yet: each minute is counted once it ends.")
        : [
          h("h3", {}, "Tasks per minute"), legend(COUNTS), lines(hist.buckets, COUNTS, "", "tasks processed, failed, retried and deferred per minute"),
          h("h3", {}, "Depth"), legend(DEPTH), lines(hist.buckets, DEPTH, "", "tasks pending, running and retrying at each minute's end"),
          h("h3", {}, "Latency from submission to start"), legend(LATENCY), lines(hist.buckets, LATENCY, "s", "p50 and p99 of the time from submission to first claim per minute"),
        ]);
  };

  // Each load has a number: an answer that comes after a later load
  // started (the window was switched meanwhile) is dropped.
  let timer;
  let seq = 0;
  const load = async () => {
    clearTimeout(timer);
    const mine = ++seq;
    const current = () => ctx.alive() && mine === seq;
    try {
      const hist = await get("/v1/queues/" + enc(q) + "/history?window=" + win);
      if (!current()) return;
      draw(hist);
    } catch (e) {
      if (!current()) return;
      replace(body, e && e.status === 404 ? h("p", { class: "muted" }, "No history: nothing was submitted to this queue yet.") : errorBox(e));
    }
    timer = setTimeout(() => { if (ctx.alive()) load(); }, REFRESH_MS);
  };
  drawSwitch();
  load();
  return panel;
}
