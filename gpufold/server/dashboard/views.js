// The dashboard's views: the queue, running pods, gangs, quotas, disruptions, the GPU grid, and the
// explain and node panels. Each reads the replica's API (through GF.get: ETag-revalidated) and draws.
"use strict";

(function () {
  const GF = window.GF || (window.GF = {});
  const $ = (id) => document.getElementById(id);
  const PAGE = 50;
  const el = (...args) => GF.el(...args);

  function age(ms) {
    if (ms === null || ms === undefined) return "–";
    const s = Math.round(ms / 1000);
    if (s < 90) return `${s} s`;
    if (s < 5400) return `${Math.round(s / 60)} min`;
    if (s < 172800) return `${(s / 3600).toFixed(1)} h`;
    return `${(s / 86400).toFixed(1)} d`;
  }

  function plural(n, word) {
    return `${n} ${word}${n === 1 ? "" : "s"}`;
  }

  function when(t, now) {
    if (t === null || t === undefined) return "–";
    if (!now) return new Date(t).toISOString().slice(0, 16).replace("T", " ");
    return t >= now ? `in ${age(t - now)}` : `${age(now - t)} ago`;
  }

  function table(headers, rows, cls) {
    const head = el("tr", {}, headers.map(([label, hcls]) => el("th", { text: label, class: hcls })));
    return el("table", { class: cls || "" }, [el("thead", {}, [head]), el("tbody", {}, rows)]);
  }

  function td(text, cls) {
    return el("td", { text: text === undefined || text === null ? "–" : String(text), class: cls });
  }

  function reasonsCell(reasons, limit) {
    const shown = (reasons || []).slice(0, limit || 2);
    const more = (reasons || []).length - shown.length;
    return el("td", { class: "reasons" }, [
      ...shown.map((r) => el("div", {}, [el("span", { class: "code", text: `${r.code} ` }), el("span", { text: r.message })])),
      more > 0 ? el("div", { class: "muted small", text: `+${more} more` }) : null,
    ]);
  }

  async function tenantSelect(cluster, key) {
    const tenants = await GF.get(`/v1/tenants?cluster=${GF.enc(cluster)}`);
    const names = [...new Set(tenants.tenants.map((t) => t.tenant))].sort();
    const select = el("select", { id: "tenant-filter", "aria-label": "tenant" }, [
      el("option", { value: "", text: "all tenants" }),
      ...names.map((n) => el("option", { value: n, text: n })),
    ]);
    select.value = GF.state[key] || "";
    select.addEventListener("change", () => GF.set({ [key]: select.value, offset: 0 }));
    return select;
  }

  function searchBox(placeholder, key) {
    const input = el("input", { id: `${key}-filter`, type: "search", placeholder, "aria-label": placeholder });
    input.value = GF.state[key] || "";
    input.addEventListener("change", () => GF.set({ [key]: input.value.trim(), offset: 0 }));
    return input;
  }

  function pager(total, offset) {
    const node = $("pager");
    if (total <= PAGE && !offset) { node.replaceChildren(); return; }
    const last = Math.min(total, offset + PAGE);
    const prev = el("button", { id: "page-prev", text: "‹ previous", onclick: () => GF.set({ offset: Math.max(0, offset - PAGE) }) });
    const next = el("button", { id: "page-next", text: "next ›", onclick: () => GF.set({ offset: offset + PAGE }) });
    if (!offset) prev.disabled = true;
    if (last >= total) next.disabled = true;
    node.replaceChildren(prev, el("span", { class: "muted", text: ` ${total ? offset + 1 : 0}–${last} of ${total} ` }), next);
  }

  function filters(...children) {
    $("filters").replaceChildren(...children.filter(Boolean));
  }

  // -------------------------------------------------------------- tabs

  const views = {
    async queue(c) {
      const s = GF.state;
      const query = new URLSearchParams({ limit: PAGE, offset: s.offset || 0 });
      if (s.tenant) query.set("tenant", s.tenant);
      if (s.search) query.set("search", s.search);
      const [page, tenants] = await Promise.all([
        GF.get(`/v1/clusters/${GF.enc(c.cluster)}/queue?${query}`),
        tenantSelect(c.cluster, "tenant"),
      ]);
      filters(tenants, searchBox("pod or gang id", "search"),
        el("span", { class: "muted small", text: `${page.queued} in the queue, in scheduling order: priority, then fair share (with quotas), then arrival` }));
      const rows = page.jobs.map((j) =>
        el("tr", { class: `job ${j.kind}${s.explain === j.id ? " selected" : ""}`, "data-job": j.id, "data-position": j.position ?? "", tabindex: "0",
          onclick: () => GF.set({ explain: j.id, nodepanel: "" }) }, [
          td(j.position ?? "wait", "num"),
          el("td", {}, [el("span", { class: "id", text: j.id }), j.kind === "gang" ? el("span", { class: "badge", text: "gang" }) : null]),
          td(age(j.age_ms), "age wide"),
          td(j.priority, "prio num wide"),
          td(j.tenant, "tenant"),
          td(j.request.text, "wide"),
          reasonsCell(j.reasons),
          td(j.expected_start === null ? (j.holds_reservation ? "unknown" : "–") : when(j.expected_start, c.event_time), "expected wide"),
        ])
      );
      if (!rows.length) rows.push(el("tr", {}, [el("td", { colspan: "8", class: "muted", text: "nothing waits" })]));
      $("content").replaceChildren(table([["#", "num"], ["job"], ["age", "wide"], ["prio", "wide"], ["tenant"], ["asks", "wide"], ["why it waits now"], ["expected start", "wide"]], rows, "queue"));
      pager(page.total, s.offset || 0);
    },

    async running(c) {
      const s = GF.state;
      const query = new URLSearchParams({ state: "running", cluster: c.cluster, limit: PAGE, offset: s.offset || 0 });
      if (s.tenant) query.set("tenant", s.tenant);
      if (s.node) query.set("node", s.node);
      const [page, tenants] = await Promise.all([GF.get(`/v1/pods?${query}`), tenantSelect(c.cluster, "tenant")]);
      filters(tenants, searchBox("node id", "node"));
      const rows = page.pods.map((p) =>
        el("tr", { class: "pod", "data-pod": p.pod_id }, [
          el("td", {}, [el("span", { class: "id", text: p.pod_id })]),
          td(p.tenant),
          td(p.priority, "num wide"),
          el("td", {}, [el("a", { href: "#", class: "node-link", text: p.node_id, onclick: (e) => { e.preventDefault(); GF.set({ nodepanel: p.node_id, explain: "" }); } })]),
          td(p.gpus.map((g) => `${g.index}:${g.milli}`).join(" ") || "no GPU", "wide"),
          td(when(p.started_at, c.event_time), "wide"),
        ])
      );
      if (!rows.length) rows.push(el("tr", {}, [el("td", { colspan: "6", class: "muted", text: "no running pod matches" })]));
      $("content").replaceChildren(table([["pod"], ["tenant"], ["prio", "wide"], ["node"], ["GPU:milli", "wide"], ["since", "wide"]], rows, "running"));
      pager(page.total, s.offset || 0);
    },

    async gangs(c) {
      const page = await GF.get(`/v1/clusters/${GF.enc(c.cluster)}/gangs`);
      filters(el("span", { class: "muted small", text: `${page.gangs.length} gang(s): queued first, in queue order` }));
      const rows = page.gangs.map((g) =>
        el("tr", { class: "gang", "data-gang": g.gang_id, tabindex: "0", onclick: () => GF.set({ explain: g.gang_id, nodepanel: "" }) }, [
          el("td", {}, [el("span", { class: "id", text: g.gang_id })]),
          td(g.state),
          td(g.tenant),
          td(g.priority, "num wide"),
          td(`${g.placed}/${g.min_members} of ${g.members.length}`, "num"),
          td(g.domain || g.topology_required || g.topology_preferred || "–", "wide"),
          td(g.waiting_for.join(", ") || "–", "wide"),
        ])
      );
      if (!rows.length) rows.push(el("tr", {}, [el("td", { colspan: "7", class: "muted", text: "no gangs" })]));
      $("content").replaceChildren(table([["gang"], ["state"], ["tenant"], ["prio", "wide"], ["placed/min of all", "num"], ["domain", "wide"], ["waits for", "wide"]], rows, "gangs"));
      pager(0, 0);
    },

    async quotas(c) {
      const [quotas, tenants] = await Promise.all([
        GF.get(`/v1/quotas?cluster=${GF.enc(c.cluster)}`),
        GF.get(`/v1/tenants?cluster=${GF.enc(c.cluster)}`),
      ]);
      filters(el("span", { class: "muted small", text: "nominal, used, may hold now, borrowed beyond nominal, lent to the cohort" }));
      const unit = (key, v) => (key === "cpu" ? `${(v / 1000).toFixed(1)} cores` : key === "memory" ? `${(v / 1024).toFixed(0)} GiB` : `${(v / 1000).toFixed(2)}`);
      const rows = quotas.quotas.map((q) =>
        el("tr", { class: "quota", "data-tenant": q.tenant, "data-key": q.key }, [
          td(q.tenant + (q.default ? " (default)" : "")), td(q.cohort || "–", "wide"), td(q.key),
          td(unit(q.key, q.nominal), "nominal num"), td(unit(q.key, q.used), "used num"), td(unit(q.key, q.may_hold), "may-hold num wide"),
          td(unit(q.key, q.borrowed), "borrowed num wide"), td(unit(q.key, q.lent), "lent num wide"),
        ])
      );
      if (!rows.length) rows.push(el("tr", {}, [el("td", { colspan: "8", class: "muted", text: "no quotas: tenants are not limited" })]));
      const max = Math.max(1, ...tenants.tenants.map((t) => t.gpu_milli));
      const bars = tenants.tenants.map((t) =>
        el("div", { class: "tenant", "data-tenant": t.tenant }, [
          el("span", { text: t.tenant }),
          el("div", {}, [el("div", { class: "bar", style: `width:${(100 * t.gpu_milli) / max}%` })]),
          el("span", { class: "muted", text: `${(t.gpu_milli / 1000).toFixed(2)} GPUs · ${t.running} running · ${t.pending} pending` }),
        ])
      );
      $("content").replaceChildren(
        table([["tenant"], ["cohort", "wide"], ["key"], ["nominal", "num"], ["used", "num"], ["may hold", "num wide"], ["borrowed", "num wide"], ["lent", "num wide"]], rows, "quotas"),
        el("h3", { text: "GPUs per tenant now" }), el("div", { id: "tenants" }, bars)
      );
      pager(0, 0);
    },

    async budgets(c) {
      const page = await GF.get(`/v1/clusters/${GF.enc(c.cluster)}/disruption-budgets`);
      filters(el("span", { class: "muted small", text: "disruption budgets: what each counts unavailable now, what it still allows, the drain evictions it blocks" }));
      const selector = (b) => [b.tenant && `tenant=${b.tenant}`, b.gang_id && `gang=${b.gang_id}`, ...Object.entries(b.label_selector).map(([k, v]) => `${k}=${v}`)].filter(Boolean).join(", ") || "every pod";
      const rows = page.budgets.map((b) =>
        el("tr", { class: "budget", "data-budget": b.budget_id }, [
          el("td", {}, [el("span", { class: "id", text: b.budget_id })]),
          td(selector(b), "selector"),
          td(b.max_unavailable, "max-unavailable num wide"),
          td(b.unavailable, "unavailable num wide"),
          td(b.allowed_disruptions, "allowed num"),
          td(b.blocked_evictions.map((e) => `${e.pod_id} on ${e.node_id || "–"}`).join(", ") || "–", "blocked"),
        ])
      );
      if (!rows.length) rows.push(el("tr", {}, [el("td", { colspan: "6", class: "muted", text: "no disruption budgets: drains evict at once" })]));
      $("content").replaceChildren(table([["budget"], ["selector"], ["max_unavailable", "num wide"], ["unavailable", "num wide"], ["allowed", "num"], ["blocked evictions"]], rows, "budgets"));
      pager(0, 0);
    },

    async disruptions(c) {
      const page = await GF.get(`/v1/clusters/${GF.enc(c.cluster)}/disruptions?limit=100`);
      filters(el("span", { class: "muted small", text: "recent preemptions, evictions, migrations and time limits, newest first" }));
      const rows = page.events.map((e) => {
        const [type, p] = Object.entries(e.payload)[0];
        let cause = p.reason || p.message || "";
        if (type === "PodPreempted") cause = `by ${p.by} (${p.reason})${p.message ? ": " + p.message : ""}`;
        if (type === "PodMigrated") cause = `${p.from_node} → ${p.to_node} (${p.reason})${p.message ? ": " + p.message : ""}`;
        if (type === "PodTimeLimitReached") cause = `time limit of ${age(p.time_limit_ms)} reached`;
        return el("tr", { class: "disruption", "data-type": type }, [
          td(when(e.occurred_at, c.event_time), "wide"), td(type), td(p.pod_id || p.gang_id || "–", "pod"), td(p.node_id || p.from_node || "–", "wide"), td(cause, "cause"),
        ]);
      });
      if (!rows.length) rows.push(el("tr", {}, [el("td", { colspan: "5", class: "muted", text: "nothing was preempted, evicted or moved" })]));
      $("content").replaceChildren(table([["when", "wide"], ["what"], ["pod"], ["node", "wide"], ["cause"]], rows, "disruptions"));
      pager(0, 0);
    },

    async nodes(c) {
      const grid = await GF.get(`/v1/clusters/${GF.enc(c.cluster)}/grid`);
      const keys = grid.label_keys;
      const select = el("select", { id: "group-label", "aria-label": "group by label" }, [el("option", { value: "", text: "group by: GPU model" }), ...keys.map((k) => el("option", { value: k, text: `… and ${k}` }))]);
      const wanted = GF.state.group !== undefined ? GF.state.group : keys.find((k) => /topolog|zone|rack/.test(k)) || "";
      select.value = keys.includes(wanted) ? wanted : "";
      select.addEventListener("change", () => GF.set({ group: select.value }));
      const legend = el("span", { class: "legend small" }, [el("i", { class: "gpu free" }), "free", el("i", { class: "gpu shared" }, [el("b", { style: "height:50%" })]), "shared", el("i", { class: "gpu full" }), "whole", el("i", { class: "node cordoned key" }), "cordoned", el("i", { class: "node failed key" }), "failed"]);
      filters(select, legend);
      const labelIndex = keys.indexOf(select.value);
      const foldAbove = Number(GF.state.fold || 200);
      const total = grid.models.reduce((n, m) => n + m.nodes, 0);
      const groups = grid.models.map((m) => {
        const open = total <= foldAbove;
        const head = el("summary", {}, [
          el("b", { text: m.gpu_model || "CPU only" }),
          el("span", { class: "muted", text: ` ${plural(m.nodes, "node")}, ${plural(m.gpus, "GPU")}: ${m.free} free, ${m.shared} shared, ${m.full} whole${m.cordoned ? `, ${m.cordoned} cordoned` : ""}${m.failed ? `, ${m.failed} failed` : ""}` }),
          m.gpus ? el("span", { class: "stack" }, [
            el("i", { class: "full", style: `width:${(100 * m.full) / m.gpus}%` }),
            el("i", { class: "shared", style: `width:${(100 * m.shared) / m.gpus}%` }),
          ]) : null,
        ]);
        const details = el("details", { class: "group", "data-model": m.gpu_model }, [head]);
        if (open) details.open = true;
        const fill = () => {
          if (details.dataset.filled) return;
          details.dataset.filled = "1";
          const byLabel = new Map();
          for (const row of m.rows) {
            const key = labelIndex >= 0 ? row[4][labelIndex] || "–" : "";
            if (!byLabel.has(key)) byLabel.set(key, []);
            byLabel.get(key).push(row);
          }
          for (const key of [...byLabel.keys()].sort()) {
            const boxes = byLabel.get(key).map(([id, status, allocated, pods, , shared]) => {
              const sharedSet = new Set(shared);
              const gpus = allocated.map((milli, i) => {
                const st = milli === 0 ? "free" : milli >= 1000 && !sharedSet.has(i) ? "full" : "shared";
                return el("i", { class: `gpu ${st}`, "data-state": st }, st === "shared" ? [el("b", { style: `height:${milli / 10}%` })] : []);
              });
              return el("span", { class: `node ${status}`, "data-node": id, title: `${id} (${status}) ${pods} pods`, tabindex: "0", onclick: () => GF.set({ nodepanel: id, explain: "" }) }, gpus);
            });
            if (labelIndex >= 0) details.appendChild(el("h4", { text: `${keys[labelIndex]}=${key} — ${plural(boxes.length, "node")}` }));
            details.appendChild(el("div", { class: "nodes" }, boxes));
          }
        };
        details.addEventListener("toggle", fill);
        if (open) fill();
        return details;
      });
      $("content").replaceChildren(el("div", { id: "grid", "data-folded": String(total > foldAbove) }, groups));
      pager(0, 0);
    },
  };

  GF.views = {
    async draw(tab, cluster) {
      for (const button of document.querySelectorAll("#tabs button")) button.classList.toggle("active", button.dataset.tab === tab);
      document.body.dataset.tab = tab;
      const view = views[tab] || views.queue;
      const s = GF.state;
      const key = JSON.stringify([tab, s.cluster, s.tenant, s.search, s.node, s.offset, s.group, s.fold].map((v) => v || ""));
      const content = $("content");
      // Keep the open grid groups (and scroll) when nothing about the view changed: redraw only the data.
      if (tab === "nodes" && content.dataset.key === key) {
        const open = [...content.querySelectorAll("details[open]")].map((d) => d.dataset.model);
        await view(cluster);
        for (const d of content.querySelectorAll("details")) if (open.includes(d.dataset.model) && !d.open) d.open = true;
      } else {
        await view(cluster);
      }
      content.dataset.key = key;
    },
  };

  // -------------------------------------------------------------- panels

  async function explainPanel(c, id) {
    const data = await GF.get(`/v1/clusters/${GF.enc(c.cluster)}/pods/${GF.enc(id)}/explain`);
    const parts = [el("p", { class: "message", text: data.message })];
    parts.push(el("p", { class: "muted small", text: `${data.kind} · ${data.state} · asks ${data.request}` }));
    if (data.reasons.length) parts.push(el("h3", { text: "why, now" }), el("ul", { class: "reasons" }, data.reasons.map((r) => el("li", {}, [el("span", { class: "code", text: `${r.code} ` }), r.message]))));
    if (data.reservation) parts.push(el("h3", { text: "reservation" }), el("p", { text: data.reservation.message }));
    if (data.gang) {
      const g = data.gang;
      parts.push(el("h3", { text: `gang ${g.gang_id}: ${g.state}, ${g.placed}/${g.min_members} of ${g.members.length}` }),
        table([["member"], ["asks"], ["node"]], g.members.map((m) => el("tr", {}, [td(m.pod_id), td(m.request), td(m.node_id || "–")]))));
    }
    if (data.nearest_miss) parts.push(el("h3", { text: "nearest miss" }), el("p", { text: `${data.nearest_miss.message} (${data.nearest_miss.similar_nodes} similar node(s))` }));
    if (data.would_fit_if.length) parts.push(el("h3", { text: "would start if" }), el("ul", { class: "remedies" }, data.would_fit_if.map((r) => el("li", { "data-change": r.change, text: r.message }))));
    return [`why ${id} ${data.state === "running" ? "runs where it runs" : "waits"}`, parts];
  }

  async function nodePanel(c, id) {
    const n = await GF.get(`/v1/clusters/${GF.enc(c.cluster)}/nodes/${GF.enc(id)}`);
    const parts = [
      el("p", { class: "message", text: `${n.gpu_model || "CPU only"}, ${n.gpu_count} GPU(s), ${n.status}${n.reserved_for ? `, reserved for ${n.reserved_for}` : ""}` }),
      el("p", { class: "muted small", text: `CPU ${n.cpu_milli_allocated}/${n.cpu_milli} milli · memory ${n.memory_mib_allocated}/${n.memory_mib} MiB` }),
      el("h3", { text: "labels" }),
      el("ul", { class: "labels" }, Object.entries(n.labels).map(([k, v]) => el("li", { class: "code", text: `${k}=${v}` }))),
      el("h3", { text: "taints" }),
      el("ul", { class: "taints" }, n.taints.map((t) => el("li", { class: "code", text: `${t.key}${t.value ? "=" + t.value : ""}:${t.effect}` }))),
      el("h3", { text: `pods (${n.pod_list.length})` }),
      table([["pod"], ["tenant"], ["asks"], ["GPU:milli"]], n.pod_list.map((p) => el("tr", { class: "pod", "data-pod": p.pod_id }, [td(p.pod_id), td(p.tenant), td(p.request), td(p.gpus.map((g) => `${g.index}:${g.milli}`).join(" ") || "–")]))),
    ];
    if (!n.labels || !Object.keys(n.labels).length) parts[3].replaceChildren(el("li", { class: "muted", text: "none" }));
    if (!n.taints.length) parts[5].replaceChildren(el("li", { class: "muted", text: "none" }));
    return [`node ${id}`, parts];
  }

  GF.panels = {
    async draw(c) {
      const panel = $("panel");
      const s = GF.state;
      if (!s.explain && !s.nodepanel) { panel.hidden = true; panel.dataset.kind = ""; return; }
      try {
        const [title, parts] = s.explain ? await explainPanel(c, s.explain) : await nodePanel(c, s.nodepanel);
        $("panel-title").textContent = title;
        $("panel-body").replaceChildren(...parts);
        panel.dataset.kind = s.explain ? "explain" : "node";
        panel.dataset.id = s.explain || s.nodepanel;
      } catch (error) {
        $("panel-title").textContent = s.explain || s.nodepanel;
        $("panel-body").replaceChildren(el("p", { class: "muted", text: error.status === 404 ? "gone: it no longer waits or runs here" : error.message }));
      }
      panel.hidden = false;
    },
  };
})();
