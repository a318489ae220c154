"use strict";
// Pictures of shardings (the tile grid, and the device mesh coloured by tile) and of the
// replica groups / source-target pairs of collectives, drawn on the device mesh.

// The data tile dims as a 2D grid: rows = the first split dim, columns = the other split dims.
function tileGrid(tiles) {
  const split = tiles.map((t, d) => [t, d]).filter(([t]) => t > 1);
  if (split.length === 0) return {rows: 1, cols: 1, rowDims: [], colDims: [], split};
  const rowDims = [split[0][1]];
  const colDims = split.slice(1).map(([, d]) => d);
  const rows = split[0][0];
  const cols = colDims.reduce((a, d) => a * tiles[d], 1);
  return {rows, cols, rowDims, colDims, split};
}

// Position (row, col) of flat tile index k (row-major over `tiles`).
function tileCell(tiles, grid, k) {
  const idx = new Array(tiles.length);
  for (let d = tiles.length - 1; d >= 0; d--) { idx[d] = k % tiles[d]; k = Math.floor(k / tiles[d]); }
  const row = grid.rowDims.length ? idx[grid.rowDims[0]] : 0;
  let col = 0;
  for (const d of grid.colDims) col = col * tiles[d] + idx[d];
  return [row, col];
}

function meshCell(d, mesh) { return [Math.floor(d / mesh[1]), d % mesh[1]]; }

function meshSvg(mesh, devices, fillOf, labelOf, opts) {
  opts = opts || {};
  const cw = Math.max(26, Math.min(44, 300 / mesh[1])), ch = Math.max(20, Math.min(30, 160 / mesh[0]));
  const w = mesh[1] * cw + 2, hgt = mesh[0] * ch + 2;
  const svg = s("svg", {width: w, height: hgt, class: "mesh", "data-devices": devices});
  svg.append(s("defs", null, s("pattern", {id: "hatch", width: 6, height: 6, patternUnits: "userSpaceOnUse",
    patternTransform: "rotate(45)"}, s("rect", {width: 3, height: 6, fill: "rgba(0,0,0,.18)"}))));
  for (let d = 0; d < devices; d++) {
    const [r, c] = meshCell(d, mesh);
    const x = 1 + c * cw, y = 1 + r * ch;
    const fill = fillOf(d);
    const g = s("g", {class: "device", "data-device": d});
    g.append(s("rect", {x, y, width: cw - 2, height: ch - 2, fill: fill || "#e9ecef", stroke: "#495057",
      "stroke-width": 0.6, rx: 3}));
    if (opts.hatched && opts.hatched(d)) g.append(s("rect", {x, y, width: cw - 2, height: ch - 2, fill: "url(#hatch)"}));
    g.append(s("text", {x: x + (cw - 2) / 2, y: y + ch / 2 + 2, "text-anchor": "middle",
      fill: fill ? "white" : "#495057"}, labelOf(d)));
    svg.append(g);
  }
  if (opts.arrows) {
    svg.append(s("defs", null, s("marker", {id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 6,
      markerHeight: 6, orient: "auto-start-reverse"}, s("path", {d: "M0,0 L10,5 L0,10 z", fill: "#212529"}))));
    for (const [a, b] of opts.arrows) {
      const [ra, ca] = meshCell(a, mesh), [rb, cb] = meshCell(b, mesh);
      const x1 = 1 + ca * cw + cw / 2, y1 = 1 + ra * ch + ch / 2, x2 = 1 + cb * cw + cw / 2, y2 = 1 + rb * ch + ch / 2;
      const dx = x2 - x1, dy = y2 - y1, len = Math.hypot(dx, dy) || 1;
      const bend = 8;  // a slight curve so that a->b and b->a do not overlap
      const mx = (x1 + x2) / 2 - dy / len * bend, my = (y1 + y2) / 2 + dx / len * bend;
      const sx = x1 + dx / len * 7, sy = y1 + dy / len * 7, ex = x2 - dx / len * 9, ey = y2 - dy / len * 9;
      svg.append(s("path", {d: `M${sx},${sy} Q${mx},${my} ${ex},${ey}`, fill: "none", stroke: "#212529",
        "stroke-width": 1.2, "marker-end": "url(#arrow)", class: "pair"}));
    }
  }
  return svg;
}

// A sharding's picture: the tile grid (devices written in each tile) and the mesh coloured by tile.
function shardingPicture(data, sid, shapeText, tileShape) {
  const sh = data.shardings[sid];
  const mesh = data.module.mesh, devices = data.module.devices;
  const box = h("div", {class: "picture sharding-picture", "data-sharding-kind": sh.kind});
  if (sh.kind === "tuple") {
    sh.elements.slice(0, 8).forEach((e, k) => {
      box.append(h("div", {class: "legend"}, `element ${k}`), shardingPicture(data, e, null, null));
    });
    if (sh.elements.length > 8) box.append(h("div", {class: "legend"}, `… ${sh.elements.length - 8} more elements`));
    return box;
  }
  if (sh.kind === "replicated") {
    box.append(meshSvg(mesh, devices, () => color(0), (d) => d),
      h("div", {class: "legend"}, `replicated: each of the ${devices} devices holds the whole array`));
    return box;
  }
  if (sh.kind === "manual") {
    box.append(meshSvg(mesh, devices, () => "#868e96", (d) => d, {hatched: () => true}),
      h("div", {class: "legend"}, "manual: each device holds its own piece (inside shard_map); shapes are per device"));
    return box;
  }
  if (sh.kind === "maximal") {
    box.append(meshSvg(mesh, devices, (d) => d === sh.device ? color(0) : null, (d) => d),
      h("div", {class: "legend"}, `maximal: only device ${sh.device} holds it`));
    return box;
  }
  if (sh.kind !== "tiled") {
    box.append(h("div", {class: "legend"}, `${sh.kind} sharding`));
    return box;
  }
  const tiles = sh.tiles, grid = tileGrid(tiles);
  const tileOf = new Map();
  sh.grid.forEach((devs, k) => devs.forEach((d) => tileOf.set(d, k)));
  // Tile grid.
  const cw = Math.max(30, Math.min(56, 260 / grid.cols)), ch = Math.max(22, Math.min(34, 150 / grid.rows));
  const tsvg = s("svg", {width: grid.cols * cw + 2, height: grid.rows * ch + 2, class: "tiles",
    "data-rows": grid.rows, "data-cols": grid.cols});
  sh.grid.forEach((devs, k) => {
    const [r, c] = tileCell(tiles, grid, k);
    const x = 1 + c * cw, y = 1 + r * ch;
    const label = devs.length <= 3 ? devs.join(",") : devs.slice(0, 2).join(",") + ",…";
    const g = s("g", {class: "tile", "data-tile": k, "data-devices": devs.join(",")},
      s("rect", {x, y, width: cw - 2, height: ch - 2, fill: color(k), rx: 2}),
      s("text", {x: x + (cw - 2) / 2, y: y + ch / 2 + 3, "text-anchor": "middle", fill: "white"}, label),
      s("title", null, `tile ${k}: devices ${devs.join(", ")}`));
    tsvg.append(g);
  });
  const dimsText = grid.split.length ? grid.split.map(([t, d]) => `dim ${d} in ${t}`).join(", ") : "not split";
  const repl = sh.replicas > 1 ? `; each tile on ${sh.replicas} devices (partial replication)` : "";
  const manual = sh.manual > 1 ? `; manual over ${sh.manual} devices` : "";
  box.append(h("div", {class: "legend"}, `tiles: ${dimsText}${repl}${manual}` +
    (grid.split.length > 1 ? ` (rows: dim ${grid.rowDims[0]}, columns: dims ${grid.colDims.join(",")})` : "")));
  box.append(tsvg);
  box.append(h("div", {class: "legend"}, "devices, coloured by the tile they hold:"));
  box.append(meshSvg(mesh, devices, (d) => tileOf.has(d) ? color(tileOf.get(d)) : null,
    (d) => d, {hatched: (d) => sh.manual > 1 && tileOf.has(d)}));
  if (tileShape) box.append(h("div", {class: "legend"}, `per device: ${tileShape}` + (shapeText ? ` of ${shapeText}` : "")));
  return box;
}

// Replica groups (or source→target pairs) of a collective on the device mesh.
function collectivePicture(data, coll) {
  const mesh = data.module.mesh, devices = data.module.devices;
  const box = h("div", {class: "picture groups-picture"});
  if (coll.pairs) {
    const involved = new Set(coll.pairs.flat());
    box.append(meshSvg(mesh, devices, (d) => involved.has(d) ? color(0) : null, (d) => d, {arrows: coll.pairs}));
    box.append(h("div", {class: "legend"}, `${coll.pairs.length} source→target pairs: ` +
      truncate(coll.pairs.map(([a, b]) => `${a}→${b}`).join(" "), 200)));
    return box;
  }
  const groupOf = new Map();
  coll.groups.forEach((g, k) => g.forEach((d) => groupOf.set(d, k)));
  box.append(meshSvg(mesh, devices, (d) => groupOf.has(d) ? color(groupOf.get(d)) : null,
    (d) => groupOf.has(d) ? `${d}·g${groupOf.get(d)}` : d));
  const size = coll.groups.length ? coll.groups[0].length : 0;
  box.append(h("div", {class: "legend"}, `${coll.groups.length} group${coll.groups.length === 1 ? "" : "s"} of ` +
    `${size}: ` + truncate(coll.groups.map((g) => "{" + g.join(",") + "}").join(" "), 200)));
  return box;
}

// A few pixels' worth of tile grid, drawn inside a graph node.
function miniSharding(data, sid, x, y) {
  let sh = data.shardings[sid];
  if (!sh) return null;
  const g = s("g", {class: "mini-sharding"});
  if (sh.kind === "tuple") sh = data.shardings[sh.elements[0]] || sh;
  if (sh.kind === "replicated") {
    g.append(s("rect", {x, y, width: 12, height: 12, fill: color(0), rx: 2}), s("title", null, "replicated"));
    return g;
  }
  if (sh.kind === "manual") {
    g.append(s("rect", {x, y, width: 12, height: 12, fill: "#868e96", rx: 2}), s("title", null, "manual"));
    return g;
  }
  if (sh.kind !== "tiled") return null;
  const grid = tileGrid(sh.tiles);
  const rows = Math.min(grid.rows, 8), cols = Math.min(grid.cols, 8);
  const cw = Math.max(2, Math.floor(24 / cols)), ch = Math.max(2, Math.floor(12 / rows));
  sh.grid.forEach((devs, k) => {
    const [r, c] = tileCell(sh.tiles, grid, k);
    if (r >= rows || c >= cols) return;
    g.append(s("rect", {x: x + c * cw, y: y + r * ch, width: cw - 0.5, height: ch - 0.5, fill: color(k)}));
  });
  g.append(s("title", null, sh.text));
  return g;
}
