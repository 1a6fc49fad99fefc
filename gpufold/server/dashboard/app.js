// The gpufold dashboard: plain JavaScript, no build step, no external resources.
// Every REFRESH ms it reads the live replica's API (same origin) and redraws.
"use strict";

const params = new URLSearchParams(location.search);
const REFRESH = Math.max(250, Number(params.get("refresh") || 2000));
const MAX_NODES = 4000; // nodes drawn per cluster (pages of 1000)
const $ = (id) => document.getElementById(id);
let refreshes = 0;
let timer = null;
let wantedCluster = params.get("cluster") || "";

async function getJson(path) {
  const response = await fetch(path, { headers: { Accept: "application/json" } });
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
  return response.json();
}

function setValue(id, value, text) {
  const el = $(id);
  el.dataset.value = String(value);
  el.textContent = text === undefined ? String(value) : text;
}

function el(tag, attrs, children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "text") node.textContent = value;
    else if (key === "style") node.setAttribute("style", value);
    else node.setAttribute(key, value);
  }
  for (const child of children || []) node.appendChild(child);
  return node;
}

async function allNodes(cluster) {
  const nodes = [];
  let total = Infinity;
  while (nodes.length < Math.min(total, MAX_NODES)) {
    const page = await getJson(`/v1/nodes?cluster=${encodeURIComponent(cluster)}&limit=1000&offset=${nodes.length}`);
    total = page.total;
    nodes.push(...page.nodes);
    if (!page.nodes.length) break;
  }
  return { nodes, total };
}

function drawClusters(clusters) {
  const select = $("cluster");
  const names = clusters.map((c) => c.cluster);
  if (!wantedCluster || !names.includes(wantedCluster)) wantedCluster = names[0] || "";
  if ([...select.options].map((o) => o.value).join() !== names.join()) {
    select.replaceChildren(...names.map((n) => el("option", { value: n, text: n })));
  }
  select.value = wantedCluster;
  return clusters.find((c) => c.cluster === wantedCluster);
}

function drawSummary(c) {
  setValue("nodes-count", c.nodes);
  setValue("gpus-count", c.gpus);
  const pct = c.gpu_milli_capacity ? (100 * c.gpu_milli_allocated) / c.gpu_milli_capacity : 0;
  setValue("allocated-pct", pct.toFixed(1), `${pct.toFixed(1)}%`);
  setValue("running-count", c.running);
  setValue("pending-count", c.pending);
  setValue("frag-pct", c.fragmentation_pct, `${c.fragmentation_pct.toFixed(1)}%`);
}

function labelKeys(nodes) {
  const keys = new Set();
  for (const n of nodes) for (const k of Object.keys(n.labels)) keys.add(k);
  return [...keys].sort();
}

function drawGrid(nodes, total) {
  const select = $("group-label");
  const keys = labelKeys(nodes);
  const current = select.value || params.get("group") || keys.find((k) => /topolog|zone|rack/.test(k)) || "";
  if ([...select.options].slice(1).map((o) => o.value).join() !== keys.join()) {
    select.replaceChildren(el("option", { value: "", text: "(none)" }), ...keys.map((k) => el("option", { value: k, text: k })));
  }
  select.value = keys.includes(current) ? current : "";
  const label = select.value;
  const groups = new Map();
  for (const n of nodes) {
    const key = `${n.gpu_model || "CPU only"}${label ? " · " + label + "=" + (n.labels[label] ?? "–") : ""}`;
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(n);
  }
  const parts = [];
  for (const key of [...groups.keys()].sort()) {
    const members = groups.get(key);
    const boxes = members.map((n) => {
      const gpus = n.gpus.map((g) => {
        const state = g.allocated_milli === 0 ? "free" : g.allocated_milli >= 1000 && g.pods.length <= 1 ? "full" : "shared";
        const who = g.pods.map((p) => `${p.pod_id} (${p.tenant}) ${p.milli}m`).join("\n");
        const inner = state === "shared" ? [el("b", { style: `height:${g.allocated_milli / 10}%` })] : [];
        return el("i", { class: `gpu ${state}`, "data-state": state, title: `${n.node_id} GPU ${g.index}: ${g.allocated_milli}/1000 milli\n${who}` }, inner);
      });
      return el("span", { class: `node ${n.status}`, "data-node": n.node_id, title: `${n.node_id} (${n.status}) ${n.pods} pods` }, gpus);
    });
    const gpuCount = members.reduce((s, n) => s + n.gpu_count, 0);
    parts.push(el("div", { class: "group" }, [el("h3", { text: `${key} — ${members.length} nodes, ${gpuCount} GPUs` }), el("div", { class: "nodes" }, boxes)]));
  }
  if (total > nodes.length) parts.push(el("div", { class: "muted", text: `showing ${nodes.length} of ${total} nodes` }));
  $("grid").replaceChildren(...parts);
}

function drawChart(points) {
  const svg = $("chart");
  const W = 600, H = 220, P = 24;
  const items = [];
  for (const y of [0, 50, 100]) {
    const yy = H - P - ((H - 2 * P) * y) / 100;
    items.push(`<line x1="${P}" x2="${W - 4}" y1="${yy}" y2="${yy}" stroke="#e4e8ee"/><text x="2" y="${yy + 4}" font-size="10" fill="#8a93a3">${y}%</text>`);
  }
  if (points.length) {
    const t0 = points[0].t, t1 = points[points.length - 1].t || t0 + 1;
    const x = (t) => P + ((W - P - 4) * (t - t0)) / Math.max(1, t1 - t0);
    const y = (v) => H - P - ((H - 2 * P) * Math.min(100, Math.max(0, v))) / 100;
    const util = points.map((p) => `${x(p.t).toFixed(1)},${y(p.gpu_milli_capacity ? (100 * p.gpu_milli_allocated) / p.gpu_milli_capacity : 0).toFixed(1)}`).join(" ");
    const frag = points.map((p) => `${x(p.t).toFixed(1)},${y(p.fragmentation_pct).toFixed(1)}`).join(" ");
    items.push(`<polyline class="line util" points="${util}"/><polyline class="line frag" points="${frag}"/>`);
    const fmt = (t) => new Date(t).toISOString().replace("T", " ").slice(0, 16);
    items.push(`<text x="${P}" y="${H - 6}" font-size="10" fill="#8a93a3">${fmt(t0)}</text><text x="${W - 110}" y="${H - 6}" font-size="10" fill="#8a93a3">${fmt(t1)}</text>`);
  }
  svg.innerHTML = items.join("");
  svg.dataset.points = String(points.length);
}

function drawTenants(rows) {
  const max = Math.max(1, ...rows.map((r) => r.gpu_milli));
  $("tenants").replaceChildren(
    ...rows.map((r) =>
      el("div", { class: "tenant", "data-tenant": r.tenant }, [
        el("span", { text: r.tenant }),
        el("div", {}, [el("div", { class: "bar", style: `width:${(100 * r.gpu_milli) / max}%` })]),
        el("span", { class: "muted", text: `${(r.gpu_milli / 1000).toFixed(2)} GPUs · ${r.running} running · ${r.pending} pending` }),
      ])
    )
  );
}

function asks(p) {
  if (!p.num_gpu) return "no GPU";
  const gpus = p.gpu_milli < 1000 ? `${p.gpu_milli}m of 1 GPU` : `${p.num_gpu} GPU`;
  return `${gpus}${p.gpu_models.length ? " (" + p.gpu_models.join("/") + ")" : ""}, ${p.cpu_milli}m CPU`;
}

function drawQueue(page) {
  const rows = page.pods.map((p) =>
    el("tr", { class: "pod", "data-pod": p.pod_id }, [
      el("td", { text: p.pod_id }),
      el("td", { text: p.tenant }),
      el("td", { text: String(p.priority) }),
      el("td", { text: asks(p) }),
      el("td", { class: "reasons" }, (p.reasons || []).map((r) => el("div", {}, [el("span", { class: "code", text: r.code + " " }), el("span", { text: r.message })]))),
    ])
  );
  if (page.total > page.pods.length) rows.push(el("tr", {}, [el("td", { colspan: "5", class: "muted", text: `… ${page.total - page.pods.length} more` })]));
  $("queue").tBodies[0].replaceChildren(...rows);
}

async function refresh() {
  try {
    const overview = await getJson("/v1/clusters");
    const cluster = drawClusters(overview.clusters);
    const r = overview.replica;
    const lag = r.lag ? `, ${r.lag} behind the head` : ", at the head";
    $("status").textContent = `replica at ${Object.entries(r.offsets).map(([p, o]) => `p${p}:${o}`).join(" ")}${lag}${r.error ? " — " + r.error : ""} · ${new Date().toLocaleTimeString()}`;
    if (cluster) {
      const c = encodeURIComponent(cluster.cluster);
      const [grid, history, tenants, queue] = await Promise.all([
        allNodes(cluster.cluster),
        getJson(`/v1/clusters/${c}/history`),
        getJson(`/v1/tenants?cluster=${c}`),
        getJson(`/v1/pods?state=pending&cluster=${c}&limit=50`),
      ]);
      drawSummary(cluster);
      drawGrid(grid.nodes, grid.total);
      drawChart(history.points);
      drawTenants(tenants.tenants);
      drawQueue(queue);
    }
    document.body.dataset.cluster = wantedCluster;
  } catch (error) {
    $("status").textContent = `error: ${error.message}`;
  } finally {
    refreshes += 1;
    document.body.dataset.refreshes = String(refreshes);
    timer = setTimeout(refresh, REFRESH);
  }
}

function now() { clearTimeout(timer); refresh(); }
$("cluster").addEventListener("change", (e) => { wantedCluster = e.target.value; now(); });
$("group-label").addEventListener("change", now);
refresh();
