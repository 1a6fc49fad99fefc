// The gpufold dashboard: plain JavaScript, no build step, no external resources.
// Every REFRESH ms it asks the server for what the page shows, each answer revalidated by its ETag
// (an unchanged answer is a 304 with no body), and redraws. The page's state lives in the URL.
"use strict";

const GF = window.GF || (window.GF = {});
const $ = (id) => document.getElementById(id);
const KEYS = ["cluster", "tab", "tenant", "search", "node", "offset", "explain", "nodepanel", "group", "refresh", "fold"];
const STALE_SECONDS = 10;

function readState() {
  const params = new URLSearchParams(location.search);
  const state = {};
  for (const key of KEYS) if (params.get(key)) state[key] = params.get(key);
  state.tab = state.tab || "queue";
  state.offset = Number(state.offset || 0);
  return state;
}

const state = readState();
const REFRESH = Math.max(250, Number(state.refresh || 2000));
const cache = new Map(); // url -> {etag, body}
let timer = null;
let refreshes = 0;
let lastGood = null;
let busy = false;

function writeState() {
  const params = new URLSearchParams();
  for (const key of KEYS) {
    const value = state[key];
    if (value === undefined || value === null || value === "" || (key === "offset" && !value) || (key === "tab" && value === "queue")) continue;
    params.set(key, String(value));
  }
  const query = params.toString();
  history.replaceState(null, "", query ? `?${query}` : location.pathname);
}

function count(name, by) {
  const data = document.body.dataset;
  data[name] = String(Number(data[name] || 0) + by);
}

async function get(path) {
  const known = cache.get(path);
  const headers = { Accept: "application/json" };
  if (known) headers["If-None-Match"] = known.etag;
  const response = await fetch(path, { headers, cache: "no-store" });
  if (response.status === 304 && known) {
    count("notModified", 1);
    return known.body;
  }
  const text = await response.text();
  count("bytes", text.length);
  if (!response.ok) {
    const error = new Error(`${path}: HTTP ${response.status}`);
    error.status = response.status;
    try { error.detail = JSON.parse(text).detail; } catch (_) { error.detail = text.slice(0, 200); }
    throw error;
  }
  const body = JSON.parse(text);
  const etag = response.headers.get("ETag");
  if (etag) cache.set(path, { etag, body });
  return body;
}

function el(tag, attrs, children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null) continue;
    if (key === "text") node.textContent = value;
    else if (key === "onclick") node.addEventListener("click", value);
    else node.setAttribute(key, value);
  }
  for (const child of children || []) if (child) node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
  return node;
}

function setValue(id, value, text) {
  const node = $(id);
  node.dataset.value = String(value);
  node.textContent = text === undefined ? String(value) : text;
}

function set(changes) {
  Object.assign(state, changes);
  writeState();
  now();
}

GF.el = el;
GF.state = state;
GF.set = set;
GF.get = get;
GF.enc = encodeURIComponent;

// ------------------------------------------------------------------ summary, chart, health

function pickCluster(clusters) {
  const select = $("cluster");
  const names = clusters.map((c) => c.cluster);
  if (!state.cluster || !names.includes(state.cluster)) {
    // The largest cluster by default (a typo'd empty one never becomes the default).
    const largest = [...clusters].sort((a, b) => b.nodes - a.nodes || (a.cluster < b.cluster ? -1 : 1))[0];
    state.cluster = largest ? largest.cluster : "";
    writeState();
  }
  if ([...select.options].map((o) => o.value).join() !== names.join()) {
    select.replaceChildren(...names.map((n) => el("option", { value: n, text: n })));
  }
  select.value = state.cluster;
  return clusters.find((c) => c.cluster === state.cluster);
}

function drawSummary(c) {
  const pct = c.gpu_milli_capacity ? (100 * c.gpu_milli_allocated) / c.gpu_milli_capacity : 0;
  setValue("allocated-pct", pct.toFixed(1), `${pct.toFixed(1)}%`);
  $("allocated-gpus").textContent = `${(c.gpu_milli_allocated / 1000).toFixed(1)} of ${(c.gpu_milli_capacity / 1000).toFixed(0)} GPUs`;
  setValue("running-count", c.running);
  setValue("pending-count", c.pending);
  const extra = [];
  if (c.gangs_pending) extra.push(`${c.gangs_pending} gang(s)`);
  if (c.waiting) extra.push(`${c.waiting} waiting for dependencies`);
  if (c.reservation) extra.push(`nodes reserved for ${c.reservation.holder_id}`);
  $("pending-sub").textContent = extra.join(" · ");
  setValue("frag-pct", c.fragmentation_pct, `${c.fragmentation_pct.toFixed(1)}%`);
  setValue("nodes-count", c.nodes);
  $("nodes-sub").textContent = c.nodes_unschedulable ? `${c.nodes_unschedulable} cordoned or failed` : c.policy;
  setValue("gpus-count", c.gpus);
}

function fmtTime(t) {
  return new Date(t).toISOString().replace("T", " ").slice(0, 16);
}

function drawChart(points) {
  const svg = $("chart");
  const W = 600, H = 160, P = 22;
  const items = [];
  for (const y of [0, 50, 100]) {
    const yy = H - P - ((H - 2 * P) * y) / 100;
    items.push(`<line x1="${P}" x2="${W - 4}" y1="${yy}" y2="${yy}" stroke="#e4e8ee"/><text x="2" y="${yy + 4}" font-size="10" fill="#8a93a3">${y}%</text>`);
  }
  if (points.length) {
    const t0 = points[0].t, t1 = Math.max(points[points.length - 1].t, t0 + 1);
    const x = (t) => P + ((W - P - 4) * (t - t0)) / (t1 - t0);
    const y = (v) => H - P - ((H - 2 * P) * Math.min(100, Math.max(0, v))) / 100;
    const line = (items, values) => items.map((p) => `${x(p.t).toFixed(1)},${y(values(p)).toFixed(1)}`).join(" ");
    const util = line(points, (p) => (p.gpu_milli_capacity ? (100 * p.gpu_milli_allocated) / p.gpu_milli_capacity : 0));
    // Fragmentation is measured at most twice a second while the replica folds: drawn through its measures.
    const measured = points.filter((p) => p.fragmentation_pct !== null);
    const frag = line(measured, (p) => p.fragmentation_pct);
    items.push(`<polyline class="line util" points="${util}"/><polyline class="line frag" points="${frag}"/>`);
    if (measured.length < 24) {
      for (const p of measured) items.push(`<circle class="dot frag" cx="${x(p.t).toFixed(1)}" cy="${y(p.fragmentation_pct).toFixed(1)}" r="2.5"/>`);
    }
    $("chart-range").textContent = `· event time ${fmtTime(t0)} → ${fmtTime(t1)}`;
    svg.dataset.t0 = String(t0);
  }
  svg.innerHTML = items.join("");
  svg.dataset.points = String(points.length);
}

function banner(kind, text) {
  const node = $("banner");
  if (!kind) {
    node.hidden = true;
    node.dataset.kind = "";
    $("main").classList.remove("stale");
    return;
  }
  node.hidden = false;
  node.dataset.kind = kind;
  node.className = `banner ${kind}`;
  node.textContent = text;
  $("main").classList.toggle("stale", kind !== "warn");
}

function drawHealth(status) {
  const problems = status.problems || [];
  setValue("health", status.ok ? "ok" : "problem", status.ok ? "ok" : `${problems.length} problem(s)`);
  const worst = Math.max(0, ...((status.fold && status.fold.partitions) || []).map((p) => p.lag_seconds));
  $("health-sub").textContent = status.ok ? `fold lag ${worst.toFixed(1)} s` : problems[0];
  if (status.ok) return (status.warnings || []).length ? ["warn", status.warnings.join(" · ")] : null;
  const down = problems.some((p) => /stopped|not running|halted|unreachable|restoring/.test(p));
  return [down ? "down" : "stale", (down ? "Not live: " : "Behind: ") + problems.join(" · ")];
}

// ------------------------------------------------------------------ the loop

async function refresh() {
  if (busy) return;
  busy = true;
  try {
    const [status, overview] = await Promise.all([get("/v1/status").catch((e) => ({ ok: false, problems: [e.detail || e.message] })), get("/v1/clusters")]);
    const cluster = pickCluster(overview.clusters);
    const r = overview.replica;
    lastGood = new Date();
    $("status").textContent = `replica ${Object.entries(r.offsets).map(([p, o]) => `p${p}:${o}`).join(" ")}${r.lag ? `, ${r.lag} behind` : ""} · ${lastGood.toLocaleTimeString()}`;
    const alarm = drawHealth(status);
    if (cluster) {
      drawSummary(cluster);
      if (cluster.halted) banner("down", `Cluster ${cluster.cluster} is halted: ${cluster.halted.error || "its fold raised"}`);
      else banner(...(alarm || [null]));
      const c = GF.enc(cluster.cluster);
      const history = await get(`/v1/clusters/${c}/history`);
      drawChart(history.points);
      await GF.views.draw(state.tab, cluster);
      await GF.panels.draw(cluster);
    } else {
      banner(...(alarm || ["warn", "No cluster yet: add a node (POST /v1/clusters/{cluster}/nodes?create_cluster=true)."]));
      $("content").replaceChildren(el("p", { class: "muted", text: "no cluster yet" }));
    }
    document.body.dataset.cluster = state.cluster || "";
  } catch (error) {
    if (error.status === undefined) {
      const since = lastGood ? ` since ${lastGood.toLocaleTimeString()}` : "";
      banner("unreachable", `The server is unreachable${since}: the numbers below are not live.`);
    } else {
      banner("stale", `${error.message}: ${error.detail || ""}`);
    }
  } finally {
    busy = false;
    refreshes += 1;
    document.body.dataset.refreshes = String(refreshes);
    clearTimeout(timer);
    timer = setTimeout(refresh, REFRESH);
  }
}

function now() {
  clearTimeout(timer);
  if (busy) { timer = setTimeout(now, 50); return; }
  refresh();
}

GF.now = now;
$("cluster").addEventListener("change", (e) => set({ cluster: e.target.value, offset: 0, explain: "", nodepanel: "", node: "", tenant: "" }));
for (const button of document.querySelectorAll("#tabs button")) {
  button.addEventListener("click", () => set({ tab: button.dataset.tab, offset: 0 }));
}
$("panel-close").addEventListener("click", () => set({ explain: "", nodepanel: "" }));
writeState();
refresh();
