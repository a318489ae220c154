"use strict";
// The pass report of `hlo-passes run --report`: per pass its time, whether it changed the module,
// its remarks, its structural diff and before/after charts; the final module's view in a tab.

function barChart(title, categories, series, fmt, attrs) {
  // Grouped bars: one group per category, one bar per series.
  const bw = 16, gap = 14, left = 8, top = 22, hgt = 110;
  const w = left + categories.length * (series.length * bw + gap) + 8;
  const max = Math.max(1, ...series.flatMap((sr) => sr.values));
  const svg = s("svg", {width: Math.max(w, 160), height: top + hgt + 34});
  categories.forEach((cat, k) => {
    const gx = left + k * (series.length * bw + gap);
    series.forEach((sr, j) => {
      const v = sr.values[k], bh = Math.round(hgt * v / max);
      svg.append(s("rect", {x: gx + j * bw, y: top + hgt - bh, width: bw - 2, height: Math.max(bh, v ? 1 : 0),
        fill: sr.color, "data-series": sr.label, "data-category": cat, "data-value": v}, s("title", null, `${sr.label}: ${fmt(v)}`)));
    });
    svg.append(s("text", {x: gx, y: top + hgt + 13, "font-size": 10}, truncate(cat, 14)));
  });
  series.forEach((sr, j) => {
    svg.append(s("rect", {x: left + j * 60, y: top + hgt + 20, width: 9, height: 9, fill: sr.color}),
      s("text", {x: left + j * 60 + 12, y: top + hgt + 28, "font-size": 10}, sr.label));
  });
  return h("div", Object.assign({class: "chart"}, attrs || {}), h("div", {class: "title"}, title), svg);
}

function beforeAfterCharts(before, after) {
  const kinds = [...new Set([...Object.keys(before.collectives), ...Object.keys(after.collectives)])].sort();
  const get = (st, k, j) => (st.collectives[k] || [0, 0])[j];
  const ser = (j) => [{label: "before", color: "#adb5bd", values: kinds.map((k) => get(before, k, j))},
                      {label: "after", color: "#d9480f", values: kinds.map((k) => get(after, k, j))}];
  const charts = [];
  if (kinds.length) {
    charts.push(barChart("collectives (count)", kinds, ser(0), fmtInt, {"data-chart": "collective-count"}));
    charts.push(barChart("collectives (bytes / device)", kinds, ser(1), fmtBytes, {"data-chart": "collective-bytes"}));
  }
  charts.push(barChart("FLOPs", ["flops"], [{label: "before", color: "#adb5bd", values: [before.flops]},
    {label: "after", color: "#1971c2", values: [after.flops]}], fmtInt, {"data-chart": "flops"}));
  charts.push(barChart("instructions", ["instructions"], [{label: "before", color: "#adb5bd", values: [before.instructions]},
    {label: "after", color: "#2b8a3e", values: [after.instructions]}], fmtInt, {"data-chart": "instructions"}));
  return h("div", {class: "charts"}, charts);
}

function mountReport(root, data) {
  const tabs = h("div", {class: "tabs"});
  const passesPage = h("div", {class: "page", id: "passes-page"});
  const viewPage = h("div", {id: "final-view", style: "display:none"});
  let view = null;
  const showTab = (name) => {
    for (const b of tabs.children) b.classList.toggle("active", b.dataset.tab === name);
    passesPage.style.display = name === "passes" ? "" : "none";
    viewPage.style.display = name === "view" ? "" : "none";
    if (name === "view" && !view) view = mountModuleView(viewPage, data.final, {embedded: true});
  };
  const openInView = (comp, instr) => {
    showTab("view");
    const ok = view.selectByName(comp ? `${comp}/${instr}` : instr, true) || view.selectByName(instr, true);
    if (!ok) {
      viewPage.querySelector(".details").replaceChildren(h("p", {class: "muted", id: "not-in-final"},
        `${instr} is not in the final module: a later pass removed or renamed it.`));
    }
  };
  tabs.append(h("button", {"data-tab": "passes", onclick: () => showTab("passes")}, "Passes"),
    h("button", {"data-tab": "view", onclick: () => showTab("view"), id: "final-tab"}, "Final module"));
  root.append(h("div", {class: "topbar"}, h("h1", null, "Pass report"), h("span", {class: "mono"}, data.input),
    h("span", {class: "grow"}), tabs));
  root.append(passesPage, viewPage);

  passesPage.append(h("p", null, "Pipeline ", h("code", {id: "pipeline"}, data.pipeline), ` — ${data.passes.length} passes, ` +
    `${(data.total_seconds * 1000).toFixed(1)} ms in passes.`));
  if (data.error) passesPage.append(h("p", {class: "error-banner", id: "run-error"}, data.error));
  // Overview: one row per pass.
  const table = h("table", {class: "report-passes", id: "passes"},
    h("tr", null, h("th", null, "#"), h("th", null, "pass"), h("th", {class: "num"}, "time"), h("th", null, "changed"),
      h("th", {class: "num"}, "remarks"), h("th", {class: "num"}, "instructions"), h("th", {class: "num"}, "collectives"),
      h("th", {class: "num"}, "collective bytes"), h("th", {class: "num"}, "FLOPs")));
  const total = (st, j) => Object.values(st.collectives).reduce((a, v) => a + v[j], 0);
  data.passes.forEach((p, k) => {
    table.append(h("tr", {"data-pass": p.name, "data-changed": p.changed ? "yes" : "no", "data-seconds": p.seconds,
      onclick: () => document.getElementById(`pass-${k}`).scrollIntoView()},
      h("td", null, k + 1), h("td", {class: "mono"}, p.name), h("td", {class: "num"}, `${(p.seconds * 1000).toFixed(1)} ms`),
      h("td", {class: p.changed ? "changed-yes" : "changed-no"}, p.changed ? "changed" : "no change"),
      h("td", {class: "num"}, p.remarks.length),
      h("td", {class: "num"}, `${fmtInt(p.before.instructions)} → ${fmtInt(p.after.instructions)}`),
      h("td", {class: "num"}, `${total(p.before, 0)} → ${total(p.after, 0)}`),
      h("td", {class: "num"}, `${fmtBytes(total(p.before, 1))} → ${fmtBytes(total(p.after, 1))}`),
      h("td", {class: "num"}, `${fmtFlops(p.before.flops)} → ${fmtFlops(p.after.flops)}`)));
  });
  passesPage.append(table);
  if (data.passes.length) {
    passesPage.append(h("h2", null, "Whole pipeline"),
      beforeAfterCharts(data.passes[0].before, data.passes[data.passes.length - 1].after));
  }
  data.passes.forEach((p, k) => {
    const sec = h("section", {class: "pass", id: `pass-${k}`, "data-pass": p.name});
    sec.append(h("h3", null, `${k + 1}. `, h("code", null, p.name), ` — ${(p.seconds * 1000).toFixed(1)} ms, `,
      h("span", {class: p.changed ? "changed-yes" : "changed-no"}, p.changed ? "changed the module" : "no change")));
    sec.append(beforeAfterCharts(p.before, p.after));
    if (p.remarks.length) {
      sec.append(h("h2", null, `Remarks (${p.remarks.length})`));
      sec.append(h("table", {class: "remarks"}, p.remarks.map((r) => h("tr", {class: "remark", "data-kind": r.kind},
        h("td", {class: `remark-${r.kind}`}, r.kind),
        h("td", {class: "mono"}, r.instruction ? h("a", {onclick: () => openInView(r.computation, r.instruction),
          title: "show it in the final module"}, r.instruction) : ""),
        h("td", {class: "mono source"}, r.source || ""),
        h("td", null, r.message)))));
    }
    sec.append(h("h2", null, "Structural diff"), ...renderDiff(p.diff));
    passesPage.append(sec);
  });
  showTab(location.hash.startsWith("#instr=") ? "view" : "passes");
  return {showTab, openInView, get view() { return view; }};
}
