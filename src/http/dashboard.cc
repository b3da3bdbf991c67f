// The dashboard document (see dashboard.h). Three raw string literals: markup, style and
// script, concatenated by the compiler. Everything the page needs is in here; it talks
// only to kvd's own endpoints, with relative URLs (so it also works behind a proxy).
#include "http/dashboard.h"

namespace kvd::http {
namespace {

constexpr char kHtml[] =
    R"KVDHTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>kvd dashboard</title>
<link rel="icon" href="data:,">
<style>
:root {
  --bg: #0d1117; --panel: #151b23; --panel2: #1a212b; --line: #262f3b; --grid: #202833;
  --text: #e6edf3; --muted: #8b96a5; --faint: #5c6675;
  --teal: #2dd4bf; --blue: #60a5fa; --violet: #a78bfa; --amber: #fbbf24;
  --green: #34d399; --red: #f87171; --pink: #f472b6;
}
* { box-sizing: border-box; }
html, body { margin: 0; background: var(--bg); color: var(--text);
  font: 14px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
.num { font-variant-numeric: tabular-nums; }
header { display: flex; align-items: center; gap: 18px; padding: 14px 24px;
  border-bottom: 1px solid var(--line); background: linear-gradient(180deg, #111822, #0d1117); }
.brand { display: flex; align-items: center; gap: 10px; }
.brand .name { font-weight: 700; font-size: 20px; letter-spacing: .5px; }
.brand .sub { color: var(--muted); font-size: 13px; }
.meta { display: flex; gap: 14px; align-items: center; color: var(--muted); font-size: 13px; flex: 1; }
.pill { padding: 3px 10px; border-radius: 999px; font-weight: 600; font-size: 12px;
  background: #22303c; color: var(--muted); display: inline-flex; align-items: center; gap: 6px; }
.pill::before { content: ""; width: 7px; height: 7px; border-radius: 50%; background: currentColor; }
.pill.ok { background: rgba(52, 211, 153, .12); color: var(--green); }
.pill.bad { background: rgba(248, 113, 113, .14); color: var(--red); }
.window { display: flex; border: 1px solid var(--line); border-radius: 8px; overflow: hidden; }
.window button { background: transparent; color: var(--muted); border: 0; padding: 5px 12px;
  font: inherit; font-size: 12px; cursor: pointer; }
.window button + button { border-left: 1px solid var(--line); }
.window button.on { background: var(--panel2); color: var(--text); }
main { padding: 20px 24px 28px; display: grid; gap: 16px; max-width: 1600px; margin: 0 auto; }
#banner { display: none; padding: 10px 14px; border-radius: 8px; background: rgba(248, 113, 113, .12);
  border: 1px solid rgba(248, 113, 113, .35); color: var(--red); }
.kpis { display: grid; grid-template-columns: repeat(6, minmax(0, 1fr)); gap: 14px; }
.kpi { background: var(--panel); border: 1px solid var(--line); border-radius: 12px; padding: 14px 16px;
  position: relative; overflow: hidden; min-height: 112px; }
.kpi::after { content: ""; position: absolute; left: 0; top: 0; bottom: 0; width: 3px; background: var(--accent, var(--teal)); }
.kpi .label { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .08em; }
.kpi .value { font-size: 28px; font-weight: 650; margin-top: 6px; white-space: nowrap; }
.kpi .value small { font-size: 14px; color: var(--muted); font-weight: 500; margin-left: 3px; }
.kpi .detail { color: var(--muted); font-size: 12px; margin-top: 6px; white-space: nowrap;
  overflow: hidden; text-overflow: ellipsis; }
.bar { height: 6px; background: #232c38; border-radius: 3px; margin-top: 10px; overflow: hidden; position: relative; }
.bar > div { height: 100%; width: 0; background: linear-gradient(90deg, var(--teal), var(--blue)); transition: width .4s; }
.bar > i { position: absolute; top: -2px; bottom: -2px; width: 2px; background: var(--amber); opacity: .8; display: none; }
.strip { display: flex; flex-wrap: wrap; gap: 8px 22px; color: var(--muted); font-size: 12.5px;
  background: var(--panel); border: 1px solid var(--line); border-radius: 10px; padding: 9px 16px; }
.strip b { color: var(--text); font-weight: 600; }
.charts { display: grid; grid-template-columns: repeat(2, minmax(0, 1fr)); gap: 14px; }
.card { background: var(--panel); border: 1px solid var(--line); border-radius: 12px; padding: 14px 16px 10px; position: relative; min-width: 0; }
.card-h { display: flex; align-items: baseline; justify-content: space-between; gap: 12px; margin-bottom: 6px; }
h2 { font-size: 13px; font-weight: 600; margin: 0; color: var(--text); letter-spacing: .02em; }
.legend { display: flex; gap: 14px; font-size: 12px; color: var(--muted); flex-wrap: wrap; justify-content: flex-end; }
.legend span::before { content: ""; display: inline-block; width: 10px; height: 3px; border-radius: 2px;
  background: var(--c); margin-right: 6px; vertical-align: middle; }
.legend b { color: var(--text); font-weight: 600; margin-left: 4px; }
canvas { width: 100%; height: 190px; display: block; }
.tip { position: absolute; pointer-events: none; background: #0b0f14f0; border: 1px solid var(--line);
  border-radius: 8px; padding: 6px 9px; font-size: 12px; display: none; white-space: nowrap; z-index: 2; }
.tip .t { color: var(--muted); margin-bottom: 2px; }
.tables { display: grid; grid-template-columns: minmax(0, 3fr) minmax(0, 2fr); gap: 14px; }
table { width: 100%; border-collapse: collapse; font-size: 13px; margin-top: 8px; }
th { text-align: left; color: var(--muted); font-weight: 500; font-size: 11.5px; text-transform: uppercase;
  letter-spacing: .06em; padding: 6px 8px; border-bottom: 1px solid var(--line); }
td { padding: 7px 8px; border-bottom: 1px solid var(--grid); vertical-align: top; white-space: nowrap; }
th { white-space: nowrap; }
td.id { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 12px; color: var(--muted); }
tr:last-child td { border-bottom: 0; }
td.r, th.r { text-align: right; }
td.layout { color: var(--muted); max-width: 1px; width: 100%; overflow: hidden; text-overflow: ellipsis; }
td.empty { color: var(--faint); text-align: center; padding: 18px; }
.tag { font-size: 11px; padding: 1px 7px; border-radius: 6px; background: #1f2a37; color: var(--blue); }
.tag.ed { color: var(--pink); background: #2a1f2c; }
.dot { display: inline-block; width: 7px; height: 7px; border-radius: 50%; background: var(--green); margin-right: 6px; }
.dot.idle { background: var(--amber); }
footer { color: var(--faint); font-size: 12px; text-align: center; padding-bottom: 8px; }
footer a { color: var(--muted); }
@media (max-width: 1280px) { .kpis { grid-template-columns: repeat(3, minmax(0, 1fr)); } }
@media (max-width: 900px) { .charts, .tables { grid-template-columns: 1fr; } .kpis { grid-template-columns: repeat(2, minmax(0, 1fr)); } }
</style>
</head>
<body data-live="0">
<header>
  <div class="brand">
    <svg width="26" height="26" viewBox="0 0 26 26" aria-hidden="true">
      <rect x="2" y="3" width="22" height="5" rx="2" fill="#2dd4bf"/>
      <rect x="2" y="10.5" width="22" height="5" rx="2" fill="#60a5fa"/>
      <rect x="2" y="18" width="14" height="5" rx="2" fill="#a78bfa"/>
    </svg>
    <span class="name">kvd</span><span class="sub">KV-cache server</span>
  </div>
  <div class="meta">
    <span id="health" class="pill">connecting</span>
    <span id="version"></span>
    <span id="uptime"></span>
    <span id="endpoint"></span>
    <span id="updated"></span>
  </div>
  <div class="window" id="window">
    <button data-s="60">1 min</button><button data-s="300" class="on">5 min</button><button data-s="900">15 min</button>
  </div>
</header>
<main>
  <div id="banner"></div>
  <section class="kpis">
    <div class="kpi" style="--accent: var(--teal)">
      <div class="label">L1 usage</div>
      <div class="value num" id="l1-pct">–</div>
      <div class="bar"><div id="l1-bar"></div><i id="l1-mark" title="eviction watermark"></i></div>
      <div class="detail num" id="l1-detail">&nbsp;</div>
    </div>
    <div class="kpi" style="--accent: var(--green)">
      <div class="label">Hit rate</div>
      <div class="value num" id="hit-rate">–</div>
      <div class="detail num" id="hit-detail">&nbsp;</div>
    </div>
    <div class="kpi" style="--accent: var(--teal)">
      <div class="label">Store throughput</div>
      <div class="value num" id="store-rate">–</div>
      <div class="detail num" id="store-detail">&nbsp;</div>
    </div>
    <div class="kpi" style="--accent: var(--blue)">
      <div class="label">Retrieve throughput</div>
      <div class="value num" id="retrieve-rate">–</div>
      <div class="detail num" id="retrieve-detail">&nbsp;</div>
    </div>
    <div class="kpi" style="--accent: var(--violet)">
      <div class="label">Requests</div>
      <div class="value num" id="request-rate">–</div>
      <div class="detail num">total <span id="total-requests">0</span></div>
    </div>
    <div class="kpi" style="--accent: var(--amber)">
      <div class="label">Instances</div>
      <div class="value num" id="instance-count">–</div>
      <div class="detail" id="instance-detail">&nbsp;</div>
    </div>
  </section>
  <div class="strip num" id="strip">&nbsp;</div>
  <section class="charts">
    <div class="card"><div class="card-h"><h2>L1 usage</h2><div class="legend" id="lg-l1"></div></div><canvas id="ch-l1"></canvas><div class="tip"></div></div>
    <div class="card"><div class="card-h"><h2>Hit rate</h2><div class="legend" id="lg-hit"></div></div><canvas id="ch-hit"></canvas><div class="tip"></div></div>
    <div class="card"><div class="card-h"><h2>Throughput</h2><div class="legend" id="lg-tp"></div></div><canvas id="ch-tp"></canvas><div class="tip"></div></div>
    <div class="card"><div class="card-h"><h2>Request rate</h2><div class="legend" id="lg-rq"></div></div><canvas id="ch-rq"></canvas><div class="tip"></div></div>
  </section>
  <section class="tables">
    <div class="card">
      <div class="card-h"><h2>Registered instances</h2><div class="legend" id="inst-note"></div></div>
      <table id="instances">
        <thead><tr><th>ID</th><th>Model</th><th>Mode</th><th class="r">World</th><th>Layout</th><th class="r">Object / chunk</th><th class="r">Last seen</th></tr></thead>
        <tbody><tr><td colspan="7" class="empty">waiting for data…</td></tr></tbody>
      </table>
    </div>
    <div class="card" id="tiers-card" style="display:none">
      <div class="card-h"><h2>Tiers behind L1</h2><div class="legend" id="tiers-note"></div></div>
      <table id="tiers">
        <thead><tr><th>Tier</th><th>Back-end</th><th>State</th><th class="r">Usage</th><th class="r">Stored</th><th class="r">Loaded</th><th class="r">Skipped / failed</th><th class="r">Evicted</th></tr></thead>
        <tbody></tbody>
      </table>
    </div>
    <div class="card">
      <div class="card-h"><h2>Operations</h2><div class="legend">latency from receipt to reply</div></div>
      <table id="ops">
        <thead><tr><th>Op</th><th class="r">Requests</th><th class="r">In flight</th><th class="r">Mean</th><th class="r">p50</th><th class="r">p99</th></tr></thead>
        <tbody><tr><td colspan="6" class="empty">waiting for data…</td></tr></tbody>
      </table>
    </div>
    <div class="card" id="families-card" style="display:none">
      <div class="card-h"><h2>Registered metrics</h2><div class="legend">every family of the metrics registry, as /metrics has it</div></div>
      <table id="families">
        <thead><tr><th>Metric</th><th>Labels</th><th class="r">Value</th></tr></thead>
        <tbody></tbody>
      </table>
    </div>
  </section>
  <footer>
    <a href="status">/status</a> · <a href="metrics">/metrics</a> · <a href="conf">/conf</a> ·
    <a href="api/timeseries">/api/timeseries</a> · <a href="healthcheck">/healthcheck</a>
  </footer>
</main>
)KVDHTML"
    R"KVDHTML(<script>
"use strict";
const $ = (id) => document.getElementById(id);
const C = { teal: "#2dd4bf", blue: "#60a5fa", violet: "#a78bfa", amber: "#fbbf24", green: "#34d399", red: "#f87171", pink: "#f472b6" };
let windowSeconds = 300, watermark = null, lastOk = 0, lastTs = null, charts = {};

function fmtBytes(b, digits) {
  if (b == null || !isFinite(b)) return "–";
  const u = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let i = 0, v = Math.abs(b);
  while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
  const d = digits != null ? digits : (v >= 100 || i === 0 ? 0 : v >= 10 ? 1 : 2);
  return (b < 0 ? "-" : "") + v.toFixed(d) + " " + u[i];
}
function fmtRate(b) { return fmtBytes(b) + "/s"; }
// "7.50 MiB" -> "7.5 MiB", "2.00 GiB" -> "2 GiB" (axis labels)
function trimZeros(s) { return s.replace(/\.(\d*?)0+(?=\D|$)/, (m, d) => (d ? "." + d : "")); }
function fmtNum(n) {
  if (n == null || !isFinite(n)) return "–";
  const a = Math.abs(n);
  if (a >= 1e9) return (n / 1e9).toFixed(a >= 1e10 ? 0 : 1) + "G";
  if (a >= 1e6) return (n / 1e6).toFixed(a >= 1e7 ? 0 : 1) + "M";
  if (a >= 1e4) return (n / 1e3).toFixed(a >= 1e5 ? 0 : 1) + "k";
  if (Number.isInteger(n)) return n.toLocaleString("en-US");
  return n.toFixed(a >= 100 ? 0 : a >= 10 ? 1 : 2);
}
function fmtPct(x, d) { return x == null || !isFinite(x) ? "–" : (100 * x).toFixed(d == null ? 1 : d) + "%"; }
function fmtMs(ms) {
  if (ms == null || !isFinite(ms)) return "–";
  if (ms < 1) return (ms * 1000).toFixed(0) + " µs";
  if (ms < 100) return ms.toFixed(ms < 10 ? 2 : 1) + " ms";
  if (ms < 10000) return ms.toFixed(0) + " ms";
  return (ms / 1000).toFixed(1) + " s";
}
function fmtDur(s) {
  if (s == null) return "–";
  s = Math.floor(s);
  const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60);
  if (d) return d + "d " + h + "h";
  if (h) return h + "h " + m + "m";
  if (m) return m + "m " + (s % 60) + "s";
  return s + "s";
}
function esc(s) { return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c])); }
function setText(id, v) { const e = $(id); if (e && e.textContent !== v) e.textContent = v; }
function valueWithUnit(id, s) {
  // "12.3 GiB/s" -> big number, small unit
  const m = /^(-?[\d.,]+[kMG]?)\s*(.*)$/.exec(s);
  const e = $(id);
  if (!m) { e.textContent = s; return; }
  e.innerHTML = esc(m[1]) + (m[2] ? "<small>" + esc(m[2]) + "</small>" : "");
}

// Mean of the last n finite values of an array.
function tailMean(a, n) {
  let s = 0, k = 0;
  for (let i = a.length - 1; i >= 0 && k < n; i--) { if (a[i] != null && isFinite(a[i])) { s += a[i]; k++; } }
  return k ? s / k : null;
}
function tailSum(a, n) { let s = 0; for (let i = Math.max(0, a.length - n); i < a.length; i++) s += a[i] || 0; return s; }

// Axis maximum with four round steps (step = 1, 1.5, 2, 2.5, 3, 4, 5, 6, 8 x 10^k; for
// bytes in units of a power of 1024).
function niceMax(v, bytes) {
  if (!(v > 0)) return 4;
  let unit = 1;
  if (bytes) { while (v / unit >= 1024) unit *= 1024; }
  const x = v / unit / 4, p = Math.pow(10, Math.floor(Math.log10(x))), f = x / p;
  const n = [1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10].find((c) => f <= c + 1e-9);
  return 4 * n * p * unit;
}
function ago(s) { return s === 0 ? "now" : s < 60 ? "-" + s + "s" : "-" + Math.floor(s / 60) + "m" + (s % 60 ? (s % 60) + "s" : ""); }

class Chart {
  constructor(canvas, opt) {
    this.cv = canvas; this.opt = opt; this.tip = canvas.parentElement.querySelector(".tip");
    this.data = null; this.hover = null;
    canvas.addEventListener("mousemove", (e) => { const r = canvas.getBoundingClientRect(); this.hover = e.clientX - r.left; this.draw(); });
    canvas.addEventListener("mouseleave", () => { this.hover = null; this.draw(); });
  }
  set(t, series, tEnd) { this.data = { t, series, tEnd }; this.draw(); }
  draw() {
    const cv = this.cv, dpr = window.devicePixelRatio || 1, w = cv.clientWidth, h = cv.clientHeight;
    if (!w || !h) return;
    if (cv.width !== Math.round(w * dpr) || cv.height !== Math.round(h * dpr)) { cv.width = Math.round(w * dpr); cv.height = Math.round(h * dpr); }
    const g = cv.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, w, h);
    const o = this.opt, R = 10, T = 8, B = 22, ph = h - T - B;
    g.font = "11px system-ui, 'DejaVu Sans', sans-serif";
    const d = this.data;
    // The window shrinks to the data while the history is short (at least a minute).
    const tEnd = d ? d.tEnd : Date.now();
    const span = d && d.t.length ? Math.max(60, Math.ceil((tEnd - d.t[0]) / 1000)) : windowSeconds;
    const win = Math.min(windowSeconds, span), tStart = tEnd - win * 1000;
    let ymax = o.ymax || 0;
    if (!o.ymax && d) for (const s of d.series) for (let i = 0; i < s.v.length; i++) if (d.t[i] >= tStart && s.v[i] > ymax) ymax = s.v[i];
    if (!o.ymax) ymax = niceMax(ymax * 1.08, o.bytes);
    const axis = o.axis || o.fmt;
    let L = 0;
    for (let i = 0; i <= 4; i++) L = Math.max(L, g.measureText(axis(ymax * i / 4)).width);
    L = Math.ceil(L) + 14;
    const pw = w - L - R;
    const X = (t) => L + (t - tStart) / (tEnd - tStart) * pw, Y = (v) => T + ph - Math.min(v / ymax, 1.04) * ph;
    // grid + y labels
    g.textAlign = "right"; g.textBaseline = "middle";
    for (let i = 0; i <= 4; i++) {
      const v = ymax * i / 4, y = Math.round(Y(v)) + 0.5;
      g.strokeStyle = i ? "#202833" : "#2b3542"; g.lineWidth = 1;
      g.beginPath(); g.moveTo(L, y); g.lineTo(L + pw, y); g.stroke();
      g.fillStyle = "#6b7684"; g.fillText(axis(v), L - 8, y);
    }
    // x labels: relative time
    g.textAlign = "center"; g.textBaseline = "top";
    const steps = win <= 60 ? 15 : win <= 120 ? 30 : win <= 300 ? 60 : 180;
    for (let s = 0; s <= win; s += steps) {
      const x = X(tEnd - s * 1000);
      g.fillStyle = "#6b7684";
      g.fillText(ago(s), Math.min(Math.max(x, L + 12), L + pw - 12), T + ph + 6);
    }
    if (o.mark != null && o.mark() != null) {
      const y = Math.round(Y(o.mark())) + 0.5;
      g.save(); g.setLineDash([4, 4]); g.strokeStyle = "rgba(251,191,36,.7)"; g.beginPath(); g.moveTo(L, y); g.lineTo(L + pw, y); g.stroke(); g.restore();
      g.fillStyle = "rgba(251,191,36,.85)"; g.textAlign = "right"; g.textBaseline = "bottom"; g.fillText("eviction watermark", L + pw - 4, y - 3);
    }
    if (!d || d.t.length < 2) {
      g.fillStyle = "#5c6675"; g.textAlign = "center"; g.textBaseline = "middle"; g.font = "13px system-ui, 'DejaVu Sans', sans-serif";
      g.fillText("collecting samples…", L + pw / 2, T + ph / 2);
      return;
    }
    g.save(); g.beginPath(); g.rect(L, T - 2, pw, ph + 4); g.clip();
    for (const s of d.series) {
      // area under the first-class series
      if (s.fill) {
        const grad = g.createLinearGradient(0, T, 0, T + ph);
        grad.addColorStop(0, s.c + "55"); grad.addColorStop(1, s.c + "05");
        g.fillStyle = grad;
        let open = false, x0 = 0, lastX = 0;
        g.beginPath();
        for (let i = 0; i < d.t.length; i++) {
          const v = s.v[i];
          if (v == null) { if (open) { g.lineTo(lastX, T + ph); g.lineTo(x0, T + ph); g.closePath(); open = false; } continue; }
          const x = X(d.t[i]), y = Y(v);
          if (!open) { g.moveTo(x, y); x0 = x; open = true; } else g.lineTo(x, y);
          lastX = x;
        }
        if (open) { g.lineTo(lastX, T + ph); g.lineTo(x0, T + ph); g.closePath(); }
        g.fill();
      }
      g.strokeStyle = s.c; g.lineWidth = 1.8; g.lineJoin = "round";
      g.beginPath();
      let pen = false;
      for (let i = 0; i < d.t.length; i++) {
        const v = s.v[i];
        if (v == null) { pen = false; continue; }
        const x = X(d.t[i]), y = Y(v);
        if (!pen) { g.moveTo(x, y); pen = true; } else g.lineTo(x, y);
      }
      g.stroke();
    }
    g.restore();
    // hover
    if (this.hover != null && this.hover >= L && this.hover <= L + pw) {
      const tt = tStart + (this.hover - L) / pw * (tEnd - tStart);
      let bi = 0, bd = Infinity;
      for (let i = 0; i < d.t.length; i++) { const dd = Math.abs(d.t[i] - tt); if (dd < bd) { bd = dd; bi = i; } }
      const x = X(d.t[bi]);
      g.strokeStyle = "#3a4656"; g.beginPath(); g.moveTo(x, T); g.lineTo(x, T + ph); g.stroke();
      let html = '<div class="t">' + new Date(d.t[bi]).toLocaleTimeString() + "</div>";
      for (const s of d.series) {
        const v = s.v[bi];
        if (v != null) { g.fillStyle = s.c; g.beginPath(); g.arc(x, Y(v), 3, 0, 7); g.fill(); }
        html += '<div><span style="color:' + s.c + '">●</span> ' + esc(s.n) + ": <b>" + esc(v == null ? "–" : o.fmt(v)) + "</b></div>";
      }
      this.tip.innerHTML = html; this.tip.style.display = "block";
      const left = x + 14 + this.tip.offsetWidth > w ? x - this.tip.offsetWidth - 10 : x + 14;
      this.tip.style.left = left + "px"; this.tip.style.top = "40px";
    } else if (this.tip) this.tip.style.display = "none";
  }
}

function legend(id, items) {
  $(id).innerHTML = items.map((i) => '<span style="--c:' + i.c + '">' + esc(i.n) + (i.v != null ? "<b>" + esc(i.v) + "</b>" : "") + "</span>").join("");
}

function renderSeries(ts) {
  const t = ts.t;
  if (!t.length) return;
  const tEnd = t[t.length - 1];
  const lastN = (a) => tailMean(a, 10);
  charts.l1.set(t, [{ n: "used", c: C.teal, v: ts.l1_usage_ratio, fill: true }], tEnd);
  legend("lg-l1", [{ n: "used", c: C.teal, v: fmtPct(ts.l1_usage_ratio[ts.l1_usage_ratio.length - 1]) }]);
  charts.hit.set(t, [{ n: "hit ratio", c: C.green, v: ts.hit_ratio, fill: true }], tEnd);
  legend("lg-hit", [{ n: "per-second hit ratio", c: C.green, v: fmtPct(tailMean(ts.hit_ratio, 60)) }]);
  charts.tp.set(t, [
    { n: "store", c: C.teal, v: ts.store_bytes_per_second, fill: true },
    { n: "retrieve", c: C.blue, v: ts.retrieve_bytes_per_second, fill: true }], tEnd);
  legend("lg-tp", [{ n: "store", c: C.teal, v: fmtRate(lastN(ts.store_bytes_per_second)) },
                   { n: "retrieve", c: C.blue, v: fmtRate(lastN(ts.retrieve_bytes_per_second)) }]);
  charts.rq.set(t, [
    { n: "all", c: C.violet, v: ts.requests_per_second, fill: true },
    { n: "lookup", c: C.amber, v: ts.lookups_per_second },
    { n: "store", c: C.teal, v: ts.stores_per_second },
    { n: "retrieve", c: C.blue, v: ts.retrieves_per_second }], tEnd);
  legend("lg-rq", [{ n: "all", c: C.violet, v: fmtNum(lastN(ts.requests_per_second)) + "/s" },
                   { n: "lookup", c: C.amber }, { n: "store", c: C.teal }, { n: "retrieve", c: C.blue }]);

  const store = lastN(ts.store_bytes_per_second), retr = lastN(ts.retrieve_bytes_per_second);
  valueWithUnit("store-rate", fmtRate(store));
  valueWithUnit("retrieve-rate", fmtRate(retr));
  valueWithUnit("request-rate", fmtNum(lastN(ts.requests_per_second)) + " /s");
  // hit ratio over the last minute, from token rates
  const lt = tailSum(ts.lookup_tokens_per_second, 60), ht = tailSum(ts.hit_tokens_per_second, 60);
  setText("hit-detail", "last minute " + (lt > 0 ? fmtPct(ht / lt) : "–") + " · " + fmtNum(Math.round(lt)) + " tokens looked up");
}

function renderStatus(s) {
  const l1 = s.l1, c = s.counters;
  setText("version", "v" + s.version);
  setText("uptime", "up " + fmtDur(s.uptime_seconds));
  const h = $("health");
  h.className = "pill " + (s.is_healthy ? "ok" : "bad");
  h.textContent = s.is_healthy ? "healthy" : "unhealthy";
  h.title = s.unhealthy_reason || "";
  valueWithUnit("l1-pct", fmtPct(l1.usage_ratio));
  $("l1-bar").style.width = Math.min(100, 100 * l1.usage_ratio).toFixed(2) + "%";
  setText("l1-detail", fmtBytes(l1.used_bytes) + " of " + fmtBytes(l1.total_bytes) + " · " + fmtNum(l1.entries) + " chunks");
  valueWithUnit("hit-rate", c.lookup_tokens ? fmtPct(c.hit_ratio) : "–");
  setText("store-detail", "total " + fmtBytes(c.stored_bytes) + " · " + fmtNum(c.stored_chunks) + " chunks" + (c.store_failures ? " · " + fmtNum(c.store_failures) + " failed" : ""));
  setText("retrieve-detail", "total " + fmtBytes(c.retrieved_bytes) + " · " + fmtNum(c.retrieved_chunks) + " chunks" + (c.retrieve_failures ? " · " + fmtNum(c.retrieve_failures) + " failed" : ""));
  setText("total-requests", fmtNum(c.requests));
  setText("instance-count", String(s.instances.length));
  const models = [...new Set(s.instances.map((i) => i.model_name))];
  setText("instance-detail", models.length ? models.join(", ") : "no workers registered");
  const inflight = s.in_flight ? Object.entries(s.in_flight).map(([k, v]) => k + " " + v).join(", ") : "none";
  $("strip").innerHTML = [
    ["entries", fmtNum(l1.entries)], ["locked", fmtNum(l1.locked_entries)], ["pinned objects", fmtNum(l1.pinned_objects)],
    ["evicted", fmtNum(l1.evictions) + " (" + fmtBytes(l1.evicted_bytes) + ")"], ["sessions", fmtNum(s.sessions)],
    ["in flight", inflight], ["lookups", fmtNum(c.lookups)], ["chunk", s.chunk_size + " tokens"]]
    .map(([k, v]) => k + " <b>" + esc(v) + "</b>").join("");

  const rows = s.instances.map((i) => {
    const idle = i.idle_seconds;
    const layout = i.layout.includes("; ") ? i.layout.slice(i.layout.indexOf("; ") + 2) : i.layout;
    return "<tr><td class=\"id\">" + esc(i.instance_id_str || i.instance_id) + "</td><td>" + esc(i.model_name) + "</td><td><span class=\"tag" +
      (i.mode === "engine_driven" ? " ed" : "") + "\">" + esc(i.mode.replace("_", "-")) + "</span></td><td class=\"r num\">" +
      esc(i.world_size) + "</td><td class=\"layout\" title=\"" + esc(i.layout) + "\">" + esc(layout) + "</td><td class=\"r num\">" +
      esc(fmtBytes(i.object_bytes_per_chunk)) + "</td><td class=\"r num\"><span class=\"dot" + (idle > 30 ? " idle" : "") + "\"></span>" +
      esc(idle < 1 ? "just now" : fmtDur(idle) + " ago") + "</td></tr>";
  });
  $("instances").tBodies[0].innerHTML = rows.length ? rows.join("") : '<tr><td colspan="7" class="empty">No workers registered yet</td></tr>';
  const tiers = s.tiers || [];
  $("tiers-card").style.display = tiers.length ? "" : "none";
  if (tiers.length) {
    const p = s.l2_policies || {};
    setText("tiers-note", "store " + (p.store_policy || "") + " · prefetch " + (p.prefetch_policy || "") + " · " +
      fmtNum(p.prefetch_hit_chunks || 0) + " chunks prefetched · " + fmtNum(p.active_prefetch_jobs || 0) + " running");
    $("tiers").tBodies[0].innerHTML = tiers.map((t) =>
      "<tr><td>" + esc(t.name) + "</td><td class=\"layout\" title=\"" + esc(t.describe) + "\">" + esc(t.describe) + "</td><td><span class=\"dot" +
      (t.healthy ? "" : " idle") + "\"></span>" + esc(t.healthy ? "ok" : "down") + "</td><td class=\"r num\">" +
      esc(t.capacity_bytes ? fmtBytes(t.usage_bytes) + " / " + fmtBytes(t.capacity_bytes) : "–") + "</td><td class=\"r num\">" +
      esc(fmtBytes(t.store.stored_bytes)) + "</td><td class=\"r num\">" + esc(fmtBytes(t.prefetch.loaded_bytes)) + "</td><td class=\"r num\">" +
      esc(fmtNum(t.store.skipped_over_budget) + " / " + fmtNum(t.store.failed + t.store.no_space + t.prefetch.corrupted + t.prefetch.unavailable)) +
      "</td><td class=\"r num\">" + esc(fmtNum(t.evicted_objects)) + "</td></tr>").join("");
  }
  const ops = Object.entries(s.ops || {}).sort((a, b) => b[1].requests - a[1].requests);
  $("ops").tBodies[0].innerHTML = ops.length ? ops.map(([n, o]) =>
    "<tr><td>" + esc(n) + "</td><td class=\"r num\">" + esc(fmtNum(o.requests)) + "</td><td class=\"r num\">" + esc(fmtNum(o.in_flight)) +
    "</td><td class=\"r num\">" + esc(fmtMs(o.mean_ms)) + "</td><td class=\"r num\">" + esc(fmtMs(o.p50_ms)) + "</td><td class=\"r num\">" +
    esc(fmtMs(o.p99_ms)) + "</td></tr>").join("") : '<tr><td colspan="6" class="empty">No requests yet</td></tr>';
  const fams = Object.entries(s.metrics || {});
  $("families-card").style.display = fams.length ? "" : "none";
  $("families").tBodies[0].innerHTML = fams.flatMap(([n, f]) => f.series.map((x) => {
    const labels = Object.entries(x.labels).map(([k, v]) => k + "=" + v).join(", ");
    const v = f.type === "histogram" ? fmtNum(x.count) + " obs · mean " + (x.count ? trimZeros((x.sum / x.count).toPrecision(3)) : "–") : fmtNum(x.value);
    return "<tr><td title=\"" + esc(f.help) + "\">" + esc(n) + "</td><td class=\"layout\">" + esc(labels) + "</td><td class=\"r num\">" + esc(v) + "</td></tr>";
  })).join("");
}

async function getJson(url) {
  const r = await fetch(url, { cache: "no-store" });
  if (!r.ok && r.status !== 503) throw new Error(url + ": HTTP " + r.status);
  return r.json();
}

async function tick() {
  try {
    const [s, ts] = await Promise.all([getJson("status"), getJson("api/timeseries?points=" + (windowSeconds + 2))]);
    lastTs = ts;
    renderStatus(s);
    renderSeries(ts);
    lastOk = Date.now();
    $("banner").style.display = "none";
    document.body.dataset.live = "1";
  } catch (e) {
    const b = $("banner");
    b.style.display = "block";
    b.textContent = "kvd is not answering" + (lastOk ? " (last update " + fmtDur((Date.now() - lastOk) / 1000) + " ago)" : "") + ": " + e.message;
    const h = $("health"); h.className = "pill bad"; h.textContent = "unreachable";
  }
  setText("updated", lastOk ? "updated " + new Date(lastOk).toLocaleTimeString() : "");
  setTimeout(tick, 1000);
}

async function loadConf() {
  try {
    const c = await getJson("conf");
    if (c && c.zmq && c.zmq.endpoint) setText("endpoint", c.zmq.endpoint);
    const w = c && c.l1 && c.l1.eviction_trigger_watermark;
    if (typeof w === "number") {
      watermark = w;
      const m = $("l1-mark"); m.style.display = "block"; m.style.left = "calc(" + (100 * w).toFixed(1) + "% - 1px)";
    }
  } catch (e) { /* optional */ }
}

function init() {
  const pct = (v) => (100 * v).toFixed(0) + "%";
  charts.l1 = new Chart($("ch-l1"), { ymax: 1, fmt: pct, mark: () => watermark });
  charts.hit = new Chart($("ch-hit"), { ymax: 1, fmt: pct });
  charts.tp = new Chart($("ch-tp"), { bytes: true, fmt: (v) => fmtRate(v), axis: (v) => trimZeros(fmtBytes(v)) + "/s" });
  charts.rq = new Chart($("ch-rq"), { fmt: (v) => fmtNum(v) + "/s", axis: (v) => fmtNum(v) });
  for (const b of $("window").querySelectorAll("button")) {
    b.addEventListener("click", () => {
      windowSeconds = +b.dataset.s;
      for (const x of $("window").querySelectorAll("button")) x.classList.toggle("on", x === b);
      if (lastTs) renderSeries(lastTs);
    });
  }
  window.addEventListener("resize", () => { for (const k in charts) charts[k].draw(); });
  loadConf();
  tick();
}
init();
</script>
</body>
</html>
)KVDHTML";

}  // namespace

std::string_view DashboardHtml() { return std::string_view(kHtml, sizeof(kHtml) - 1); }

}  // namespace kvd::http
