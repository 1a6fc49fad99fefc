// The API reference, drawn from /openapi.json by this page alone (no CDN, no third-party code).
"use strict";

const $ = (id) => document.getElementById(id);

function el(tag, attrs, children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "text") node.textContent = value;
    else node.setAttribute(key, value);
  }
  for (const child of children || []) node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
  return node;
}

function resolve(spec, schema) {
  let seen = 0;
  while (schema && schema.$ref && seen++ < 10) schema = spec.components.schemas[schema.$ref.split("/").pop()] || {};
  return schema || {};
}

function typeOf(spec, schema) {
  schema = resolve(spec, schema);
  if (schema.anyOf) return schema.anyOf.map((s) => typeOf(spec, s)).join(" | ");
  if (schema.type === "array") return `${typeOf(spec, schema.items || {})}[]`;
  if (schema.enum) return schema.enum.map((v) => JSON.stringify(v)).join(" | ");
  return schema.type || (schema.properties ? "object" : "any");
}

function fields(spec, schema) {
  schema = resolve(spec, schema);
  const props = schema.properties || {};
  const required = new Set(schema.required || []);
  const rows = Object.entries(props).map(([name, prop]) =>
    el("tr", {}, [
      el("td", { class: "code", text: name + (required.has(name) ? " *" : "") }),
      el("td", { text: typeOf(spec, prop) }),
      el("td", { text: (resolve(spec, prop).description || prop.description || "") }),
    ])
  );
  if (!rows.length) return el("p", { class: "muted", text: `body: ${typeOf(spec, schema)}` });
  return el("table", {}, [el("thead", {}, [el("tr", {}, [el("th", { text: "field" }), el("th", { text: "type" }), el("th", { text: "" })])]), el("tbody", {}, rows)]);
}

function operation(spec, path, method, op) {
  const params = (op.parameters || []).map((p) =>
    el("tr", {}, [
      el("td", { class: "code", text: p.name + (p.required ? " *" : "") }),
      el("td", { text: `${p.in}, ${typeOf(spec, p.schema || {})}` }),
      el("td", { text: p.description || (p.schema && p.schema.description) || "" }),
    ])
  );
  const responses = Object.entries(op.responses || {}).map(([code, r]) =>
    el("li", {}, [el("span", { class: "code", text: code + " " }), r.description || ""])
  );
  const parts = [
    el("summary", {}, [el("span", { class: `method ${method}`, text: method.toUpperCase() }), el("span", { class: "code", text: " " + path + " " }), el("span", { class: "muted", text: op.summary || "" })]),
  ];
  if (op.security && op.security.length) parts.push(el("p", { class: "secured", text: "needs Authorization: Bearer <GPUFOLD_API_TOKEN>" }));
  if (op.description) parts.push(el("p", { text: op.description }));
  if (params.length) parts.push(el("h4", { text: "parameters" }), el("table", {}, [el("tbody", {}, params)]));
  const body = op.requestBody && op.requestBody.content && op.requestBody.content["application/json"];
  if (body) parts.push(el("h4", { text: "body (application/json)" }), fields(spec, body.schema || {}));
  parts.push(el("h4", { text: "responses" }), el("ul", {}, responses));
  return el("details", { class: "op", "data-path": path, "data-method": method }, parts);
}

async function main() {
  const spec = await (await fetch("/openapi.json")).json();
  $("about").textContent = `${spec.info.title} ${spec.info.version}: ${spec.info.description || ""}`;
  const scheme = spec.components && spec.components.securitySchemes && spec.components.securitySchemes.bearer;
  if (scheme) $("auth").textContent = `Auth: HTTP bearer — ${scheme.description || ""}`;
  const ops = [];
  for (const [path, item] of Object.entries(spec.paths)) {
    for (const [method, op] of Object.entries(item)) ops.push(operation(spec, path, method, op));
  }
  $("routes").replaceChildren(...ops);
  document.body.dataset.routes = String(ops.length);
  $("filter").addEventListener("input", (e) => {
    const words = e.target.value.toLowerCase().split(/\s+/).filter(Boolean);
    for (const op of ops) {
      const text = `${op.dataset.method} ${op.dataset.path} ${op.textContent}`.toLowerCase();
      op.hidden = !words.every((w) => text.includes(w));
    }
  });
}

main().catch((error) => { $("about").textContent = `cannot read /openapi.json: ${error.message}`; });
