// courtly's charts: SVG drawn with DOM calls only (every label is set as text, never as markup).
"use strict";
(function () {
  const NS = "http://www.w3.org/2000/svg";

  function el(name, attrs, parent) {
    const node = document.createElementNS(NS, name);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
    if (parent) parent.appendChild(node);
    return node;
  }

  function text(parent, x, y, value, attrs) {
    const node = el("text", Object.assign({ x: x, y: y }, attrs || {}), parent);
    node.textContent = String(value);
    return node;
  }

  function niceMax(value) {
    if (!(value > 0)) return 1;
    const power = Math.pow(10, Math.floor(Math.log10(value)));
    for (const step of [1, 2, 2.5, 5, 10]) if (step * power >= value) return step * power;
    return 10 * power;
  }

  function clock(seconds) {
    const d = new Date(seconds * 1000);
    return d.toTimeString().slice(0, 8);
  }

  function format(value) {
    if (Number.isInteger(value)) return value.toLocaleString("en");
    if (value >= 100) return Math.round(value).toLocaleString("en");
    if (value >= 10) return value.toFixed(1);
    return value.toFixed(2).replace(/\.?0+$/, "") || "0";
  }

  // lines: [{name, color, points: [[x, y], ...]}]; x is wall time in seconds
  function line(container, lines, options) {
    const opts = Object.assign({ width: 900, height: 260, unit: "/s" }, options || {});
    const pad = { left: 56, right: 40, top: 14, bottom: 40 };
    const svg = el("svg", { viewBox: `0 0 ${opts.width} ${opts.height}`, role: "img",
      class: "chart-svg", width: "100%" });
    const title = el("title", {}, svg);
    title.textContent = opts.title || "chart";
    const all = lines.flatMap((l) => l.points);
    const xs = all.map((p) => p[0]);
    const x0 = xs.length ? Math.min(...xs) : 0;
    const x1 = xs.length ? Math.max(...xs) : 1;
    const yMax = niceMax(Math.max(0, ...all.map((p) => p[1])));
    const w = opts.width - pad.left - pad.right;
    const h = opts.height - pad.top - pad.bottom;
    const sx = (x) => pad.left + (x1 > x0 ? ((x - x0) / (x1 - x0)) * w : w / 2);
    const sy = (y) => pad.top + h - (y / yMax) * h;
    const grid = el("g", { class: "grid" }, svg);
    for (let i = 0; i <= 4; i++) {
      const y = (yMax * i) / 4;
      el("line", { x1: pad.left, x2: pad.left + w, y1: sy(y), y2: sy(y) }, grid);
      text(grid, pad.left - 6, sy(y) + 4, format(y), { "text-anchor": "end" });
    }
    for (let i = 0; i <= 4 && xs.length; i++) {
      const x = x0 + ((x1 - x0) * i) / 4;
      text(grid, sx(x), opts.height - pad.bottom + 16, clock(x), { "text-anchor": "middle" });
    }
    lines.forEach((l, k) => {
      if (l.points.length) {
        const points = l.points.map((p) => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`);
        el("polyline", { points: points.join(" "), fill: "none", stroke: l.color,
          "stroke-width": 2, class: "series", "data-name": l.name }, svg);
      }
      const lx = pad.left + k * 190;
      el("rect", { x: lx, y: opts.height - 14, width: 12, height: 4, fill: l.color }, svg);
      text(svg, lx + 18, opts.height - 9, `${l.name}${opts.unit}`, { class: "legend" });
    });
    container.replaceChildren(svg);
    return svg;
  }

  // items: [{label, value, color?}]: horizontal bars, the largest first as given
  function bars(container, items, options) {
    const opts = Object.assign({ width: 520, bar: 20, labelWidth: 220, valueWidth: 70 },
      options || {});
    const height = Math.max(1, items.length) * (opts.bar + 6) + 6;
    const svg = el("svg", { viewBox: `0 0 ${opts.width} ${height}`, role: "img",
      class: "chart-svg bars", width: "100%" });
    const title = el("title", {}, svg);
    title.textContent = opts.title || "bars";
    const max = Math.max(1, ...items.map((i) => i.value));
    const w = opts.width - opts.labelWidth - opts.valueWidth;
    items.forEach((item, k) => {
      const y = 6 + k * (opts.bar + 6);
      const room = Math.floor(opts.labelWidth / 6.5);  // characters that fit beside the bar
      const label = item.label.length > room ? `…${item.label.slice(1 - room)}` : item.label;
      text(svg, opts.labelWidth - 8, y + opts.bar - 6, label,
        { "text-anchor": "end", class: "bar-label" });
      el("rect", { x: opts.labelWidth, y: y, height: opts.bar, class: "bar",
        width: Math.max(1, (item.value / max) * w), fill: item.color || "#4c78a8" }, svg);
      text(svg, opts.labelWidth + Math.max(1, (item.value / max) * w) + 6, y + opts.bar - 6,
        item.text !== undefined ? item.text : format(item.value), { class: "bar-value" });
    });
    container.replaceChildren(svg);
    return svg;
  }

  // a series of bins {start, step, actions, requests} as per-second points
  function ratePoints(series, key) {
    const counts = series[key] || [];
    return counts.map((n, i) => [series.start + (i + 0.5) * series.step, n / series.step]);
  }

  // errors: the exit codes that are errors (the summary's error_codes)
  function codeColor(code, errors) {
    if (code === "OK") return "#2f8f4e";
    return errors.includes(code) ? "#c2413b" : "#7a869a";
  }

  window.courtlyChart = { line, bars, ratePoints, codeColor, format, clock };
})();
