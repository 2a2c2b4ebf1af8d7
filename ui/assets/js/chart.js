// The overview's chart: tasks processed and failed per second over the last
// hour, as inline SVG drawn from GET /v1/stats/history's samples.

const SVG = "http://www.w3.org/2000/svg";

function s(tag, attrs, text) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = text;
  return el;
}

// niceMax is the top of the y axis for values up to m: four steps of 1, 2
// or 5 times a power of ten.
function niceMax(m) {
  if (!(m > 0)) return 4;
  const step = m / 4;
  const p = Math.pow(10, Math.floor(Math.log10(step)));
  for (const f of [1, 2, 5, 10]) if (f * p >= step) return 4 * f * p;
  return 40 * p;
}

function label(v) {
  if (v >= 1000) return (v / 1000).toFixed(v >= 10000 ? 0 : 1) + "k";
  return v >= 10 || v === 0 ? String(Math.round(v)) : v.toFixed(1);
}

// drawChart draws samples (oldest first) over the windowSeconds that end
// now (or since the oldest sample, when younger) into an SVG as wide as el.
export function drawChart(el, samples, windowSeconds) {
  const width = Math.max(280, Math.floor(el.clientWidth || 800));
  const height = 200;
  const pad = { l: 40, r: 10, t: 10, b: 22 };
  const svg = s("svg", { class: "chart", width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": "tasks processed and failed per second over the last hour" });
  const now = Date.now();
  const all = samples.map((x) => ({ t: new Date(x.at).getTime(), p: x.processed_per_second || 0, f: x.failed_per_second || 0 }));
  // The window, or less while the server has not kept that much yet (at
  // least a minute), so that a young history fills the chart.
  const oldest = all.length ? all[0].t : now;
  const spanMs = Math.min(windowSeconds * 1000, Math.max(60000, now - oldest));
  const from = now - spanMs;
  const pts = all.filter((x) => x.t >= from);
  const top = niceMax(Math.max(0, ...pts.map((x) => Math.max(x.p, x.f))));
  const X = (t) => pad.l + ((t - from) / (now - from)) * (width - pad.l - pad.r);
  const Y = (v) => height - pad.b - (v / top) * (height - pad.t - pad.b);
  for (let i = 0; i <= 4; i++) {
    const v = (top * i) / 4;
    svg.append(s("line", { class: "grid-line", x1: pad.l, x2: width - pad.r, y1: Y(v), y2: Y(v) }));
    svg.append(s("text", { class: "axis-label", x: pad.l - 6, y: Y(v) + 4, "text-anchor": "end" }, label(v)));
  }
  for (let i = 4; i >= 0; i--) {
    const ago = (spanMs * i) / 4 / 1000;
    const text = i === 0 ? "now" : ago >= 60 ? "-" + Math.round(ago / 60) + " min" : "-" + Math.round(ago) + " s";
    svg.append(s("text", { class: "axis-label", x: X(now - ago * 1000), y: height - 6, "text-anchor": i === 4 ? "start" : i === 0 ? "end" : "middle" }, text));
  }
  if (pts.length > 1) {
    const line = (k) => pts.map((x, i) => (i ? "L" : "M") + X(x.t).toFixed(1) + " " + Y(x[k]).toFixed(1)).join(" ");
    const area = line("p") + ` L${X(pts[pts.length - 1].t).toFixed(1)} ${Y(0)} L${X(pts[0].t).toFixed(1)} ${Y(0)} Z`;
    svg.append(s("path", { class: "area processed", d: area }));
    svg.append(s("path", { class: "line processed", d: line("p") }));
    svg.append(s("path", { class: "line failed", d: line("f") }));
  } else {
    svg.append(s("text", { class: "axis-label", x: width / 2, y: height / 2, "text-anchor": "middle" }, "collecting samples…"));
  }
  el.replaceChildren(svg);
}
