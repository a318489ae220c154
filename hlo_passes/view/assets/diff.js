"use strict";
// A structural diff (hlo_passes.diff.ModuleDiff) side by side: A on the left, B on the right.

function statsTable(a, b, labels) {
  const kinds = [...new Set([...Object.keys(a.collectives), ...Object.keys(b.collectives)])].sort();
  const rows = [["instructions", a.instructions, b.instructions, fmtInt], ["FLOPs", a.flops, b.flops, fmtInt]];
  for (const k of kinds) {
    const ca = a.collectives[k] || [0, 0], cb = b.collectives[k] || [0, 0];
    rows.push([`${k} count`, ca[0], cb[0], fmtInt], [`${k} bytes / device`, ca[1], cb[1], fmtBytes]);
  }
  return h("table", {class: "stats-table", style: "width:auto"},
    h("tr", null, h("th", null, ""), h("th", {class: "num"}, labels[0]), h("th", {class: "num"}, labels[1]), h("th", {class: "num"}, "change")),
    rows.map(([name, va, vb, f]) => h("tr", {"data-metric": name, "data-a": va, "data-b": vb},
      h("td", null, name), h("td", {class: "num"}, f(va)), h("td", {class: "num"}, f(vb)),
      h("td", {class: "num"}, vb === va ? "" : (vb > va ? "+" : "−") + f(Math.abs(vb - va))))));
}

function renderDiff(d) {
  const out = [];
  if (d.equal) {
    out.push(h("p", {class: "diff-equal", "data-diff": "equal"}, "No structural change (renumbering ignored)."));
    return out;
  }
  const table = h("table", {class: "diff", "data-diff": "different"},
    h("colgroup", null, h("col", {style: "width:50%"}), h("col", {style: "width:50%"})),
    h("tr", null, h("th", null, d.a), h("th", null, d.b)));
  for (const c of d.removed) {
    table.append(h("tr", {class: "comp comp-removed"}, h("td", {colspan: 2}, `computation ${c.name} (only in ${d.a})`)));
    for (const line of c.lines) table.append(h("tr", {class: "removed", "data-whole": "removed"}, h("td", {class: "a"}, line), h("td", {class: "b"}, "")));
  }
  for (const c of d.added) {
    table.append(h("tr", {class: "comp comp-added"}, h("td", {colspan: 2}, `computation ${c.name} (only in ${d.b})`)));
    for (const line of c.lines) table.append(h("tr", {class: "added", "data-whole": "added"}, h("td", {class: "a"}, ""), h("td", {class: "b"}, line)));
  }
  for (const comp of d.computations) {
    table.append(h("tr", {class: "comp"}, h("td", {colspan: 2}, `computation ${comp.name}`)));
    for (const ch of comp.changes) {
      if (ch.kind === "changed") {
        table.append(h("tr", {class: "what"}, h("td", {colspan: 2}, "changed: " + ch.what)));
      }
      table.append(h("tr", {class: ch.kind, "data-change": ch.kind},
        h("td", {class: "a"}, ch.before || ""), h("td", {class: "b"}, ch.after || "")));
    }
  }
  out.push(table);
  if (d.omitted) out.push(h("p", {class: "muted", "data-omitted": d.omitted}, `${fmtInt(d.omitted)} more changes not shown.`));
  return out;
}

function mountDiffPage(root, data) {
  const counts = {removed: 0, added: 0, changed: 0};
  for (const c of data.diff.computations) for (const ch of c.changes) counts[ch.kind]++;
  root.append(h("div", {class: "topbar"}, h("h1", null, "Structural diff"), h("span", {class: "muted"},
    `${data.diff.a}  →  ${data.diff.b}`)));
  const page = h("div", {class: "page"});
  page.append(h("p", {id: "diff-counts", "data-removed": counts.removed, "data-added": counts.added, "data-changed": counts.changed},
    `${counts.removed} removed, ${counts.added} added, ${counts.changed} changed instructions; ` +
    `${data.diff.removed.length} computations removed, ${data.diff.added.length} added.`));
  page.append(h("h2", null, "Numbers"), statsTable(data.stats_a, data.stats_b, ["A", "B"]));
  page.append(h("h2", null, "Changes"), ...renderDiff(data.diff));
  root.append(page);
}
