"use strict";
// The module view: summary and collectives on the left, the graph in the middle, the selected
// instruction (shape, sharding picture, source stack, replica groups) on the right.

function prepareModuleData(data) {
  data.collectivesByComp = new Map();
  for (const rec of data.collectives) {
    if (!data.collectivesByComp.has(rec.comp)) data.collectivesByComp.set(rec.comp, []);
    data.collectivesByComp.get(rec.comp).push(rec);
  }
  data.entryIndex = Math.max(0, data.computations.findIndex((c) => c.entry));
  return data;
}

function findInstruction(data, text, exact) {
  // "comp/name", "name" or "%name"; exact first, then the first name containing the text.
  text = text.trim().replace(/^%/, "");
  if (!text) return null;
  let compName = null, name = text;
  const slash = text.lastIndexOf("/");
  if (slash > 0) { compName = text.slice(0, slash); name = text.slice(slash + 1).replace(/^%/, ""); }
  const comps = data.computations.map((c, ci) => [c, ci]).filter(([c]) => compName === null || c.name === compName);
  comps.sort((a, b) => (b[0].entry ? 1 : 0) - (a[0].entry ? 1 : 0));
  for (const [c, ci] of comps) { const i = c.names.indexOf(name); if (i >= 0) return [ci, i]; }
  if (exact) return null;
  for (const [c, ci] of comps) { const i = c.names.findIndex((x) => x.includes(name)); if (i >= 0) return [ci, i]; }
  return null;
}

function mountModuleView(root, data, opts) {
  opts = opts || {};
  prepareModuleData(data);
  const side = h("aside", {class: "side", id: "side"});
  const details = h("aside", {class: "details", id: "details"},
    h("p", {class: "muted"}, "Click an instruction, or a collective on the left, to see its shape, sharding, " +
      "source line and replica groups. Click a group to open it."));
  const crumb = h("span", {class: "crumb"});
  const status = h("span", {class: "graph-status", id: "graph-status"});
  const scroll = h("div", {class: "graph-scroll", id: "graph"});
  const bar = h("div", {class: "graph-bar"}, crumb,
    h("button", {class: "small", onclick: () => gv.collapseAll(), title: "close every group"}, "collapse all"),
    h("button", {class: "small", onclick: () => gv.fit(), title: "fit the width"}, "fit"),
    h("button", {class: "small", onclick: () => gv.setZoom(gv.zoom * 1.25)}, "+"),
    h("button", {class: "small", onclick: () => gv.setZoom(gv.zoom / 1.25)}, "−"),
    status);
  const pane = h("main", {class: "graph-pane"}, bar, scroll);
  const view = h("div", {class: "view" + (opts.embedded ? " embedded" : "")}, side, pane, details);
  root.append(view);

  const gv = new GraphView(data, scroll, {
    onSelect: (ci, i) => select(ci, i),
    onRender: (st) => {
      const c = data.computations[gv.ci];
      crumb.textContent = `${c.kind === "entry" ? "ENTRY" : c.kind} ${c.name}`;
      status.textContent = `${st.nodes} boxes, ${st.edges} edges · layout ${st.layoutMs.toFixed(0)} ms`;
    },
  });

  function select(ci, i, reveal) {
    if (reveal) gv.reveal(ci, i); else gv.select(ci, i);
    for (const e of side.querySelectorAll(".coll-row.selected")) e.classList.remove("selected");
    const c = data.computations[ci];
    const row = side.querySelector(`.coll-row[data-ci="${ci}"][data-instr="${CSS.escape(c.names[i])}"]`);
    if (row) row.classList.add("selected");
    details.replaceChildren(...instructionDetails(data, ci, i, {select: (a, b) => select(a, b, true),
      openComputation: (cj) => gv.show(cj), toggleBody: () => { if (ci === gv.ci) gv.toggle(`i${i}>`); }}));
  }

  side.append(...moduleSummary(data, (ci) => gv.show(ci)));
  side.append(...collectivesPanel(data, (ci, i) => select(ci, i, true)));
  side.append(...computationsPanel(data, (ci) => gv.show(ci)));

  gv.show(data.entryIndex);
  const api = {
    gv, select,
    selectByName(text, exact) { const f = findInstruction(data, text, exact); if (f) select(f[0], f[1], true); return !!f; },
  };
  return api;
}

function moduleSummary(data) {
  const m = data.module, sm = data.summary;
  const out = [h("h2", null, "Module")];
  out.push(h("table", {class: "kv"},
    h("tr", null, h("td", null, "name"), h("td", {class: "mono"}, m.name)),
    m.source ? h("tr", null, h("td", null, "file"), h("td", {class: "mono"}, m.source)) : null,
    h("tr", {title: m.evidence}, h("td", null, "program"), h("td", {"data-stat": "kind"}, `${m.kind} on ${m.devices} device${m.devices === 1 ? "" : "s"}`)),
    h("tr", null, h("td", null, "drawn as"), h("td", null, `a ${m.mesh[0]}×${m.mesh[1]} grid of devices (device d at row d÷${m.mesh[1]})`))));
  out.push(h("h2", null, "Summary"));
  out.push(h("table", {class: "kv", id: "summary"},
    h("tr", null, h("td", null, "instructions"), h("td", {class: "num", "data-stat": "instructions", "data-value": sm.instructions}, fmtInt(sm.instructions))),
    h("tr", null, h("td", null, "FLOPs"), h("td", {class: "num", "data-stat": "flops", "data-value": sm.flops, title: fmtInt(sm.flops)}, fmtFlops(sm.flops))),
    h("tr", {title: "bytes of the ENTRY parameters held by the device holding the most"}, h("td", null, "peak parameter bytes / device"),
      h("td", {class: "num", "data-stat": "peak-parameter-bytes", "data-value": sm.peak_parameter_bytes, title: fmtInt(sm.peak_parameter_bytes)}, fmtBytes(sm.peak_parameter_bytes))),
    h("tr", null, h("td", null, "collectives"), h("td", {class: "num", "data-stat": "collectives", "data-value": data.collectives.length}, fmtInt(data.collectives.length)))));
  if (sm.collectives.length) {
    const maxB = Math.max(...sm.collectives.map((c) => c.bytes), 1);
    out.push(h("table", {id: "collective-kinds"}, h("tr", null, h("th", null, "collective"), h("th", {class: "num"}, "count"),
      h("th", {class: "num"}, "bytes / device"), h("th", null, "")),
      sm.collectives.map((c) => h("tr", {"data-kind": c.kind, "data-count": c.count, "data-bytes": c.bytes},
        h("td", null, h("span", {class: "coll-kind", style: `background:${kindColor(c.kind)}`}, c.kind)),
        h("td", {class: "num"}, fmtInt(c.count)), h("td", {class: "num", title: fmtInt(c.bytes) + " bytes"}, fmtBytes(c.bytes)),
        h("td", null, h("span", {class: "bar", style: `width:${Math.max(2, 60 * c.bytes / maxB)}px;background:${kindColor(c.kind)}`}))))));
  } else {
    out.push(h("p", {class: "muted", id: "collective-kinds"}, "No collectives."));
  }
  const rows = sm.opcodes.map(([op, n]) => h("tr", {"data-opcode": op, "data-count": n}, h("td", {class: "mono"}, op), h("td", {class: "num"}, fmtInt(n))));
  const opTable = h("table", {id: "opcodes"}, h("tr", null, h("th", null, "opcode"), h("th", {class: "num"}, "instructions")), rows.slice(0, 10));
  out.push(opTable);
  if (rows.length > 10) out.push(h("details", null, h("summary", null, `${rows.length - 10} more opcodes`), h("table", {id: "opcodes-more"}, rows.slice(10))));
  if (data.unreadable && Object.keys(data.unreadable).length) {
    out.push(h("p", {class: "muted", id: "unreadable"}, "Not read (shown as text only): " +
      Object.entries(data.unreadable).map(([k, [n, ex]]) => `${k} of ${n} instructions (${ex})`).join("; ")));
  }
  return out;
}

function collectivesPanel(data, onPick) {
  const out = [h("h2", null, `Collectives (${data.collectives.length})`)];
  if (!data.collectives.length) return out;
  out.push(h("p", {class: "muted"}, "By kind and source line, most bytes first. Click one to find it in the graph."));
  const byKind = new Map();
  for (const rec of data.collectives) {
    if (!byKind.has(rec.kind)) byKind.set(rec.kind, []);
    byKind.get(rec.kind).push(rec);
  }
  const panel = h("div", {id: "collectives"});
  for (const [kind, recs] of byKind) {
    const lines = new Map();
    for (const rec of recs) {
      const c = data.computations[rec.comp];
      const src = c.source[rec.instr] >= 0 ? data.sources[c.source[rec.instr]] : null;
      const key = src ? `${src.file}:${src.line}` : "(no source line)";
      if (!lines.has(key)) lines.set(key, {src, recs: [], bytes: 0});
      const l = lines.get(key);
      l.recs.push(rec); l.bytes += rec.bytes;
    }
    panel.append(h("h3", null, h("span", {class: "coll-kind", style: `background:${kindColor(kind)}`}, kind), ` ${recs.length}`));
    for (const [key, l] of [...lines.entries()].sort((a, b) => b[1].bytes - a[1].bytes)) {
      const fn = l.src && l.src.stack && l.src.stack[0][2] ? ` in ${l.src.stack[0][2].replace(/^.*\./, "")}` : "";
      const det = h("details", {class: "coll-line", "data-source": key, "data-kind": kind},
        h("summary", {title: key}, `${l.src ? sourceText(l.src) : key}${fn} — ×${l.recs.length}, ${fmtBytes(l.bytes)}`));
      for (const rec of l.recs) {
        const c = data.computations[rec.comp];
        const grp = c.groups[c.group[rec.instr]];
        det.append(h("div", {class: "coll-row", "data-ci": rec.comp, "data-instr": c.names[rec.instr], "data-bytes": rec.bytes,
          onclick: () => onPick(rec.comp, rec.instr)},
          h("span", {class: "mono"}, c.names[rec.instr]), h("span", {class: "muted"}, fmtBytes(rec.bytes)),
          h("span", {class: "muted"}, truncate(c.entry ? (grp.label || "") : c.name, 28))));
      }
      panel.append(det);
    }
  }
  out.push(panel);
  return out;
}

function computationsPanel(data, onOpen) {
  const out = [h("h2", null, `Computations (${data.computations.length})`)];
  const main = [], small = [];
  data.computations.forEach((c, ci) => (HELPER_KINDS.has(c.kind) ? small : main).push([c, ci]));
  main.sort((a, b) => (b[0].entry ? 1 : 0) - (a[0].entry ? 1 : 0));
  const row = ([c, ci]) => h("div", {"data-computation": c.name, onclick: () => onOpen(ci)},
    h("span", {class: "mono"}, truncate(c.name, 34)), h("span", {class: "muted"}, ` ${c.kind}, ${c.names.length} ops`));
  out.push(h("div", {class: "comp-list", id: "computations"}, main.map(row)));
  if (small.length) out.push(h("details", null, h("summary", null, `${small.length} reducers and comparators`),
    h("div", {class: "comp-list"}, small.map(row))));
  return out;
}

function instructionDetails(data, ci, i, actions) {
  const c = data.computations[ci];
  const op = data.opcodes[c.opcode[i]];
  const shape = data.shapes[c.shape[i]];
  const rec = (data.collectivesByComp.get(ci) || []).find((r) => r.instr === i);
  const src = c.source[i] >= 0 ? data.sources[c.source[i]] : null;
  const out = [h("h2", null, rec ? `${rec.kind}` : op), h("h1", {class: "mono", id: "selected-name"}, c.names[i])];
  const kv = h("table", {class: "kv"});
  const row = (k, v, attrs) => kv.append(h("tr", attrs, h("td", null, k), h("td", null, v)));
  row("shape", h("span", {class: "mono"}, shape));
  if (c.tile[i] >= 0) row("per device", h("span", {class: "mono", id: "tile-shape"}, data.shapes[c.tile[i]]));
  row("computation", h("a", {onclick: () => actions.openComputation(ci)}, c.name));
  if (c.op_name[i] >= 0) row("op_name", h("span", {class: "mono"}, data.strings[c.op_name[i]]));
  if (src) row("source", h("span", {class: "mono", id: "source-line", "data-file": src.file, "data-line": src.line}, `${src.file}:${src.line}`));
  if (rec) row("bytes / device", h("span", {id: "collective-bytes", "data-bytes": rec.bytes}, `${fmtBytes(rec.bytes)} (${fmtInt(rec.bytes)} B)`));
  out.push(kv);
  if (src && src.stack && src.stack.length > 1) {
    out.push(h("h2", null, "Python stack"), h("ol", {class: "stack mono", id: "stack"},
      src.stack.map(([f, l, fn]) => h("li", null, `${f.split("/").slice(-1)[0]}:${l}` + (fn ? ` ${fn}` : "")))));
  }
  if (rec) {
    out.push(h("h2", null, rec.pairs ? "Source → target pairs" : "Replica groups"), collectivePicture(data, rec));
  }
  if (c.sharding[i] >= 0) {
    out.push(h("h2", null, "Sharding"), h("pre", {id: "sharding-text"}, data.shardings[c.sharding[i]].text),
      shardingPicture(data, c.sharding[i], shape, c.tile[i] >= 0 ? data.shapes[c.tile[i]] : null));
  }
  const calls = c.calls[i];
  if (calls) {
    out.push(h("h2", null, "Calls"), h("div", {class: "chips"},
      calls.map((cj) => h("a", {onclick: () => actions.openComputation(cj)}, data.computations[cj].name)),
      calls.some((cj) => !HELPER_KINDS.has(data.computations[cj].kind))
        ? h("button", {class: "small", onclick: () => actions.toggleBody()}, "show / hide the body in place") : null));
  }
  const link = (j) => h("a", {class: "mono", onclick: () => actions.select(ci, j)}, c.names[j]);
  if (c.operands[i].length) out.push(h("h2", null, "Operands"), h("div", {class: "chips"}, c.operands[i].map(link)));
  const users = [];
  c.operands.forEach((ops, u) => { if (ops.includes(i)) users.push(u); });
  if (users.length) out.push(h("h2", null, `Users (${users.length})`), h("div", {class: "chips"}, users.slice(0, 60).map(link),
    users.length > 60 ? ` … ${users.length - 60} more` : null));
  out.push(h("h2", null, "HLO"), h("pre", {id: "hlo-text"}, c.text[i]));
  return out;
}
