"use strict";
// Entry point: read the page's data, mount the page named by <body data-page>, and mark the
// page ready (body[data-ready], window.__readyMs) once the first graph is drawn.

(function main() {
  const t0 = performance.now();
  const data = JSON.parse(document.getElementById("page-data").textContent);
  const root = document.getElementById("root");
  const kind = document.body.dataset.page;
  let api = null;
  if (kind === "view") {
    const m = data.module;
    const search = h("input", {type: "search", id: "search", placeholder: "find an instruction by name",
      onkeydown: (ev) => { if (ev.key === "Enter") { if (!api.selectByName(ev.target.value)) ev.target.style.background = "#ffe3e3"; else ev.target.style.background = ""; } }});
    root.append(h("div", {class: "topbar"}, h("h1", null, m.name),
      h("span", {class: "muted"}, `${m.kind} program on ${m.devices} device${m.devices === 1 ? "" : "s"}`),
      h("span", {class: "grow"}), search));
    const holder = h("div", {class: "view-holder"});
    root.append(holder);
    api = mountModuleView(holder, data);
  } else if (kind === "report") {
    api = mountReport(root, data);
  } else if (kind === "diff") {
    mountDiffPage(root, data);
  }
  window.__page = api;
  const hash = decodeURIComponent(location.hash || "");
  if (hash.startsWith("#instr=") && api) {
    const target = hash.slice(7);
    if (kind === "report") api.openInView(null, target); else api.selectByName(target);
  }
  window.__readyMs = performance.now();
  window.__mountMs = performance.now() - t0;
  document.body.dataset.ready = "1";
})();
