"use strict";
// The graph of one computation: op_name scope groups collapsed or expanded in place, fusion /
// call / while bodies expanded in place, laid out by dagre (a layered layout) and drawn as SVG.
//
// What is drawn is the "visible graph": a collapsed group is one node standing for every
// instruction inside it, an expanded group is a cluster around its members, an expanded call
// shows its callees' bodies as clusters wired to the call (operands → the call → the body's
// parameters; the body's root → the call's users).  Edges are lifted to the visible nodes that
// hold their ends and counted.  Only the visible graph is laid out, so a 25k-instruction
// module costs a layout of a few dozen nodes.

const NODE_W = 176, NODE_H = 36, GROUP_W = 196, GROUP_H = 46;
// A box feeding more boxes than this (the parameters, a shared constant) has its edges left out
// of the layout and drawn as a faint fan afterwards: laid out, each such edge spanning the whole
// program would cost the layered layout a dummy node per rank it crosses (seconds, and a tangle).
const MAX_LAID_OUT_FANOUT = 8;
// Callees not worth drawing in place: a reduction's two-parameter adder, a sort's comparator.
const HELPER_KINDS = new Set(["reducer", "comparator", "select", "scatter"]);

class CompInfo {
  // Derived per-computation facts, computed once: group sizes, collectives per group, users.
  constructor(data, ci) {
    const c = data.computations[ci];
    this.c = c;
    const n = c.names.length, G = c.groups.length;
    this.size = new Int32Array(G);
    this.colls = new Int32Array(G);
    this.bytes = new Float64Array(G);
    this.collOf = new Map();
    for (const rec of data.collectivesByComp.get(ci) || []) this.collOf.set(rec.instr, rec);
    for (let i = 0; i < n; i++) {
      let g = c.group[i];
      const rec = this.collOf.get(i);
      while (g >= 0) {
        this.size[g]++;
        if (rec) { this.colls[g]++; this.bytes[g] += rec.bytes; }
        g = c.groups[g].parent;
      }
    }
    this.users = null;
  }

  usersOf(i) {
    if (!this.users) {
      this.users = this.c.names.map(() => []);
      this.c.operands.forEach((ops, u) => { for (const o of ops) this.users[o].push(u); });
    }
    return this.users[i];
  }

  groupPath(i) {
    const path = [];
    for (let g = this.c.group[i]; g > 0; g = this.c.groups[g].parent) path.unshift(g);
    return path;
  }
}

class GraphView {
  constructor(data, scroll, callbacks) {
    this.data = data;
    this.scroll = scroll;
    this.cb = callbacks;
    this.infos = new Map();
    this.expanded = new Set();
    this.ci = -1;
    this.zoom = 1;
    this.selected = null;  // [ci, i]
    this.maxBytes = 1; this.minBytes = 1;
    const all = data.collectives.map((r) => r.bytes).filter((b) => b > 0);
    if (all.length) { this.maxBytes = Math.max(...all); this.minBytes = Math.min(...all); }
  }

  info(ci) {
    if (!this.infos.has(ci)) this.infos.set(ci, new CompInfo(this.data, ci));
    return this.infos.get(ci);
  }

  show(ci) {
    const fresh = ci !== this.ci;
    if (fresh) { this.ci = ci; this.expanded = new Set(); }
    this.render();
    if (fresh) this.scrollToTop();
  }

  // Scroll so that the first boxes of the program (the top rank) are in view.
  scrollToTop() {
    let best = null;
    for (const e of this.svg.querySelectorAll(".node")) {
      const b = e.getBBox();
      if (!best || b.y < best.y - 1 || (Math.abs(b.y - best.y) <= 1 && b.x < best.x)) best = b;
    }
    if (best) this.scroll.scrollTo({left: Math.max(0, best.x * this.zoom - 40), top: 0});
  }

  // Expand or collapse a group ("g12", "i40>/0/g3") or a call's body ("i40>").  What was open
  // inside a collapsed group stays remembered, as in a tree view.
  toggle(key) {
    if (this.expanded.has(key)) this.expanded.delete(key); else this.expanded.add(key);
    this.render();
  }

  collapseAll() { this.expanded = new Set(); this.render(); }

  // Expand the groups around instruction i of computation ci (shown at the top level).
  reveal(ci, i) {
    if (ci !== this.ci) { this.ci = ci; this.expanded = new Set(); }
    for (const g of this.info(ci).groupPath(i)) this.expanded.add("g" + g);
    this.selected = [ci, i];
    this.render();
    const el = this.svg && this.svg.querySelector(`[data-key="i${i}"]`);
    if (el) {
      const box = el.getBBox();
      this.scroll.scrollTo({left: Math.max(0, (box.x + box.width / 2) * this.zoom - this.scroll.clientWidth / 2),
                            top: Math.max(0, (box.y + box.height / 2) * this.zoom - this.scroll.clientHeight / 2)});
      el.classList.add("flash");
    }
  }

  select(ci, i) {
    this.selected = [ci, i];
    if (this.svg) {
      for (const e of this.svg.querySelectorAll(".node.selected")) e.classList.remove("selected");
      for (const e of this.svg.querySelectorAll(`.node[data-ci="${ci}"][data-i="${i}"]`)) e.classList.add("selected");
    }
  }

  setZoom(z) {
    this.zoom = Math.max(0.1, Math.min(3, z));
    if (this.svg) {
      this.svg.setAttribute("width", this.gw * this.zoom);
      this.svg.setAttribute("height", this.gh * this.zoom);
    }
  }

  fit() {
    if (!this.svg) return;
    this.setZoom(Math.min(1, (this.scroll.clientWidth - 10) / this.gw));
  }

  // ---------------------------------------------------------------- visible graph --
  build() {
    const nodes = [], edges = new Map();
    const addEdge = (a, b, kind) => {
      if (!a || !b || a === b) return;
      const key = a + "\u2192" + b;
      const e = edges.get(key);
      if (e) e.count++; else edges.set(key, {v: a, w: b, count: 1, kind});
    };
    const instance = (prefix, ci, parent) => {
      const info = this.info(ci), c = info.c, n = c.names.length;
      const vis = new Array(n);
      const calls = [];
      const assign = (gid, key) => {
        const g = c.groups[gid];
        for (const m of g.members) vis[m] = key;
        for (const ch of g.children) assign(ch, key);
      };
      const emit = (gid, parentKey) => {
        const g = c.groups[gid];
        for (const ch of g.children) {
          const key = prefix + "g" + ch;
          if (this.expanded.has(key)) {
            nodes.push({key, kind: "cluster", parent: parentKey, ci, gid: ch});
            emit(ch, key);
          } else {
            nodes.push({key, kind: "group", parent: parentKey, ci, gid: ch});
            assign(ch, key);
          }
        }
        for (const m of g.members) {
          const key = prefix + "i" + m;
          nodes.push({key, kind: "instr", parent: parentKey, ci, i: m});
          vis[m] = key;
          if (c.calls[m] && this.expanded.has(key + ">")) calls.push([m, parentKey]);
        }
      };
      emit(0, parent);
      const inst = {ci, vis, bodies: new Map()};
      for (const [m, parentKey] of calls) {
        const bkey = prefix + "i" + m + ">";
        nodes.push({key: bkey, kind: "body", parent: parentKey, ci, i: m});
        const subs = c.calls[m].map((cj, k) => {
          const skey = bkey + k;
          nodes.push({key: skey, kind: "callee", parent: bkey, ci: cj});
          return instance(skey + "/", cj, skey);
        });
        inst.bodies.set(m, subs);
      }
      // Edges among this instance's instructions (lifted to visible nodes).
      const outs = (o) => {
        const subs = inst.bodies.get(o);
        if (!subs) return [vis[o]];
        const r = subs.filter((b) => this.data.computations[b.ci].kind !== "while condition")
          .map((b) => b.vis[this.data.computations[b.ci].root]);
        return r.length ? r : [vis[o]];
      };
      for (let u = 0; u < n; u++) {
        for (const o of c.operands[u]) for (const src of outs(o)) addEdge(src, vis[u], "data");
        const subs = inst.bodies.get(u);
        if (subs) {
          for (const b of subs) {
            const bc = this.data.computations[b.ci];
            for (let p = 0; p < bc.names.length; p++) {
              if (this.data.opcodes[bc.opcode[p]] === "parameter") addEdge(vis[u], b.vis[p], "call");
            }
          }
        }
      }
      return inst;
    };
    instance("", this.ci, null);
    return {nodes, edges: [...edges.values()]};
  }

  nodeSize(n) {
    if (n.kind === "group") return [GROUP_W, GROUP_H];
    const rec = this.info(n.ci).collOf.get(n.i);
    if (rec) {
      const t = this.maxBytes > this.minBytes
        ? (Math.log(rec.bytes + 1) - Math.log(this.minBytes + 1)) / (Math.log(this.maxBytes + 1) - Math.log(this.minBytes + 1))
        : 1;
      return [NODE_W + Math.round(110 * t), NODE_H + Math.round(22 * t)];
    }
    return [NODE_W, NODE_H];
  }

  // ---------------------------------------------------------------------- render --
  render() {
    const t0 = performance.now();
    const {nodes, edges} = this.build();
    const g = new dagre.graphlib.Graph({compound: true, multigraph: false});
    const big = nodes.length > 400;
    g.setGraph({rankdir: "TB", nodesep: 14, ranksep: 26, edgesep: 8, marginx: 12, marginy: 12,
                ranker: big ? "longest-path" : "network-simplex"});
    g.setDefaultEdgeLabel(() => ({}));
    const byKey = new Map();
    for (const n of nodes) {
      byKey.set(n.key, n);
      if (n.kind === "cluster" || n.kind === "body" || n.kind === "callee") {
        g.setNode(n.key, {paddingTop: 22});
      } else {
        const [w, hgt] = this.nodeSize(n);
        g.setNode(n.key, {width: w, height: hgt});
      }
      if (n.parent) g.setParent(n.key, n.parent);
    }
    const fanout = new Map();
    for (const e of edges) fanout.set(e.v, (fanout.get(e.v) || 0) + 1);
    const fans = [];
    for (const e of edges) {
      if (fanout.get(e.v) > MAX_LAID_OUT_FANOUT) fans.push(e);
      else g.setEdge(e.v, e.w, {weight: e.kind === "call" ? 1 : Math.min(e.count, 8)});
    }
    dagre.layout(g);
    const t1 = performance.now();
    const gw = g.graph().width || 100, gh = g.graph().height || 100;
    this.gw = gw; this.gh = gh;
    const svg = s("svg", {class: "graph", viewBox: `0 0 ${gw} ${gh}`, width: gw * this.zoom, height: gh * this.zoom,
      "data-nodes": nodes.length, "data-edges": edges.length});
    svg.append(s("defs", null, s("marker", {id: "edge-arrow", viewBox: "0 0 10 10", refX: 10, refY: 5,
      markerWidth: 7, markerHeight: 7, orient: "auto"}, s("path", {d: "M0,0 L10,5 L0,10 z", fill: "#98a2b3"}))));
    const clusters = s("g", {class: "clusters"}), edgeLayer = s("g", {class: "edges"}), nodeLayer = s("g", {class: "nodes"});
    svg.append(clusters, edgeLayer, nodeLayer);
    // Clusters, outermost first.
    const depth = (n) => { let d = 0; for (let p = n.parent; p; p = byKey.get(p).parent) d++; return d; };
    const boxes = nodes.filter((n) => n.kind === "cluster" || n.kind === "body" || n.kind === "callee")
      .sort((a, b) => depth(a) - depth(b));
    for (const n of boxes) {
      const p = g.node(n.key);
      if (!p || p.width === undefined) continue;
      const x = p.x - p.width / 2, y = p.y - p.height / 2;
      const label = this.clusterLabel(n);
      const el = s("g", {class: "cluster" + (n.kind !== "cluster" ? " body" : ""), "data-key": n.key},
        s("rect", {x, y, width: p.width, height: p.height}),
        s("text", {x: x + 6, y: y + 13}, truncate(label, Math.max(10, Math.floor(p.width / 6.5)))),
        s("title", null, label + (n.kind === "callee" ? "" : " (click to collapse)")));
      if (n.kind !== "callee") el.querySelector("text").addEventListener("click", () => this.toggle(n.key));
      clusters.append(el);
    }
    for (const e of edges) {
      const ge = g.edge(e.v, e.w);
      if (!ge || !ge.points) continue;
      const d = "M" + ge.points.map((p) => `${p.x.toFixed(1)},${p.y.toFixed(1)}`).join(" L");
      edgeLayer.append(s("path", {d, class: "edge" + (e.kind === "call" ? " call" : "") + (e.count > 3 ? " heavy" : ""),
        "marker-end": "url(#edge-arrow)"}, s("title", null, e.count > 1 ? `${e.count} values` : "")));
    }
    const fanLayer = s("g", {class: "fans"});
    edgeLayer.before(fanLayer);
    for (const e of fans) {
      const a = g.node(e.v), b = g.node(e.w);
      if (!a || !b) continue;
      const y1 = a.y + a.height / 2, y2 = b.y - b.height / 2;
      fanLayer.append(s("path", {d: `M${a.x.toFixed(1)},${y1.toFixed(1)} L${b.x.toFixed(1)},${(y2 > y1 ? y2 : b.y).toFixed(1)}`,
        class: "edge fan", "data-src": e.v, "marker-end": "url(#edge-arrow)"}));
    }
    for (const n of nodes) {
      let el = null;
      if (n.kind === "group") el = this.drawGroup(n, g.node(n.key));
      else if (n.kind === "instr") el = this.drawInstr(n, g.node(n.key));
      if (!el) continue;
      if (fanout.get(n.key) > MAX_LAID_OUT_FANOUT) {
        el.classList.add("fan-source");
        const mine = () => fanLayer.querySelectorAll(`[data-src="${CSS.escape(n.key)}"]`);
        el.addEventListener("mouseenter", () => { for (const f of mine()) f.classList.add("lit"); });
        el.addEventListener("mouseleave", () => { for (const f of mine()) f.classList.remove("lit"); });
        el.querySelector("title").textContent += `\nfeeds ${fanout.get(n.key)} boxes (hover to see where)`;
      }
      nodeLayer.append(el);
    }
    this.scroll.replaceChildren(svg);
    this.svg = svg;
    if (this.selected) this.select(...this.selected);
    const t2 = performance.now();
    this.lastStats = {nodes: nodes.length, edges: edges.length, fans: fans.length, layoutMs: t1 - t0, drawMs: t2 - t1};
    if (this.cb.onRender) this.cb.onRender(this.lastStats);
  }

  clusterLabel(n) {
    const c = this.data.computations[n.ci];
    if (n.kind === "cluster") return "▾ " + (c.groups[n.gid].label || c.name);
    if (n.kind === "body") return `▾ body of ${c.names[n.i]}`;
    return `${c.kind}: ${c.name}`;
  }

  drawGroup(n, p) {
    const info = this.info(n.ci), grp = info.c.groups[n.gid];
    const x = p.x - p.width / 2, y = p.y - p.height / 2;
    const colls = info.colls[n.gid];
    const el = s("g", {class: "node group" + (colls ? " has-coll" : ""), "data-key": n.key, "data-group": grp.label,
      "data-ci": n.ci, "data-gid": n.gid, "data-collectives": colls});
    el.append(s("rect", {class: "box", x, y, width: p.width, height: p.height}));
    el.append(s("text", {x: x + 8, y: y + 17, "font-weight": 600}, "▸ " + truncate(grp.label, 27)));
    const sub = `${fmtInt(info.size[n.gid])} ops` + (colls ? ` · ${colls} collective${colls > 1 ? "s" : ""}, ${fmtBytes(info.bytes[n.gid])}` : "");
    el.append(s("text", {x: x + 8, y: y + 34, fill: "#667085"}, sub));
    if (colls) {
      el.append(s("circle", {class: "badge", cx: x + p.width - 4, cy: y + 4, r: 9}));
      el.append(s("text", {class: "badge-text", x: x + p.width - 4, y: y + 7.5, "text-anchor": "middle"}, colls > 99 ? "99+" : colls));
    }
    el.append(s("title", null, `${grp.scope || grp.label}\n${info.size[n.gid]} instructions (click to expand)`));
    el.addEventListener("click", () => this.toggle(n.key));
    return el;
  }

  drawInstr(n, p) {
    const data = this.data, c = data.computations[n.ci], i = n.i;
    const op = data.opcodes[c.opcode[i]];
    const rec = this.info(n.ci).collOf.get(i);
    const x = p.x - p.width / 2, y = p.y - p.height / 2;
    let cls = "node instr";
    if (rec) cls += " collective";
    else if (op === "parameter") cls += " param";
    else if (c.calls[i] && c.calls[i].some((cj) => !HELPER_KINDS.has(data.computations[cj].kind))) cls += " calls";
    else if (op === "dot" || op === "convolution") cls += " dot";
    const el = s("g", {class: cls, "data-key": n.key, "data-ci": n.ci, "data-i": i, "data-name": c.names[i],
      "data-opcode": op});
    el.append(s("rect", {class: "box", x, y, width: p.width, height: p.height, rx: 3}));
    const maxc = Math.floor((p.width - 34) / 6.3);
    el.append(s("text", {x: x + 6, y: y + 14, "font-weight": 600}, truncate(c.names[i], maxc)));
    const second = rec ? `${op} · ${fmtBytes(rec.bytes)}/device` : `${op} ${data.shapes[c.shape[i]]}`;
    el.append(s("text", {x: x + 6, y: y + 29, fill: "#475467"}, truncate(second, maxc + 2)));
    if (c.sharding[i] >= 0) {
      const mini = miniSharding(data, c.sharding[i], x + p.width - 28, y + 3);
      if (mini) el.append(mini);
    }
    const src = c.source[i] >= 0 ? data.sources[c.source[i]] : null;
    el.append(s("title", null, `${c.names[i]} = ${op} ${data.shapes[c.shape[i]]}` + (src ? `\n${sourceText(src)}` : "")));
    el.addEventListener("click", () => this.cb.onSelect(n.ci, i));
    if (c.calls[i] && c.calls[i].some((cj) => !HELPER_KINDS.has(data.computations[cj].kind))) {
      const key = n.key + ">";
      const open = this.expanded.has(key);
      const tg = s("g", {class: "toggle", "data-toggle": key},
        s("rect", {x: x + p.width - 18, y: y + p.height - 16, width: 14, height: 13, rx: 2}),
        s("text", {x: x + p.width - 11, y: y + p.height - 6, "text-anchor": "middle"}, open ? "−" : "+"),
        s("title", null, open ? "hide the body" : "show the body in place"));
      tg.addEventListener("click", (ev) => { ev.stopPropagation(); this.toggle(key); });
      el.append(tg);
    }
    return el;
  }
}
