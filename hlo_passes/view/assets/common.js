"use strict";
// Shared helpers: DOM and SVG builders, number formatting, colours.
// Script errors are collected in window.__pageErrors and shown in a banner (tests read both).
window.__pageErrors = [];
window.addEventListener("error", (e) => {
  window.__pageErrors.push(String(e.message || e));
  const bar = document.createElement("div");
  bar.className = "error-banner";
  bar.textContent = "Script error: " + (e.message || e);
  document.body.prepend(bar);
});

const SVG_NS = "http://www.w3.org/2000/svg";

function h(tag, attrs, ...children) {
  const e = document.createElement(tag);
  setAttrs(e, attrs);
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function s(tag, attrs, ...children) {
  const e = document.createElementNS(SVG_NS, tag);
  setAttrs(e, attrs);
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function setAttrs(e, attrs) {
  if (!attrs) return;
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "onclick" || k === "ondblclick" || k === "oninput" || k === "onkeydown" || k === "onchange") {
      e.addEventListener(k.slice(2), v);
    } else if (k === "dataset") {
      for (const [dk, dv] of Object.entries(v)) e.dataset[dk] = dv;
    } else if (k === "text") {
      e.textContent = v;
    } else {
      e.setAttribute(k, v === true ? "" : v);
    }
  }
}

function fmtInt(n) {
  return Number(n).toLocaleString("en-US");
}

function fmtBytes(n) {
  n = Number(n);
  if (n < 1024) return n + " B";
  const units = ["KiB", "MiB", "GiB", "TiB"];
  let v = n, u = -1;
  while (v >= 1024 && u < units.length - 1) { v /= 1024; u++; }
  return (v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2)) + " " + units[u];
}

function fmtFlops(n) {
  n = Number(n);
  const units = ["", "K", "M", "G", "T", "P"];
  let v = n, u = 0;
  while (v >= 1000 && u < units.length - 1) { v /= 1000; u++; }
  return (u === 0 ? String(n) : v.toFixed(v >= 100 ? 0 : 1) + " " + units[u]) + "FLOP";
}

function truncate(text, n) {
  text = String(text);
  return text.length > n ? text.slice(0, n - 1) + "…" : text;
}

// Distinct colours for tiles, replica groups and collective kinds.
const PALETTE = ["#4c6ef5", "#f76707", "#37b24d", "#e64980", "#1098ad", "#f59f00", "#7048e8", "#a61e4d",
                 "#0ca678", "#d6336c", "#1c7ed6", "#94d82d", "#ae3ec9", "#fd7e14", "#15aabf", "#82c91e"];
function color(k) {
  if (k < PALETTE.length) return PALETTE[k];
  return `hsl(${(k * 137.508) % 360}, 60%, 55%)`;
}

const KIND_COLORS = {"all-reduce": "#d9480f", "all-gather": "#1971c2", "reduce-scatter": "#2b8a3e",
                     "all-to-all": "#862e9c", "collective-permute": "#e67700", "collective-broadcast": "#5c940d",
                     "ragged-all-to-all": "#a61e4d"};
function kindColor(kind) { return KIND_COLORS[kind] || "#495057"; }

function sourceText(src) {
  if (!src) return "";
  const file = src.file.split("/").slice(-2).join("/");
  return `${file}:${src.line}`;
}
