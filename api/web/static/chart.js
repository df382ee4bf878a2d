// A small SVG line chart: several series over a shared x (step), nice ticks, a legend and a
// hover read-out. Points are appended as they arrive; data-points on the element counts them.

import { h, fmtNum } from "./common.js";

const W = 460, H = 210, M = { l: 48, r: 10, t: 8, b: 24 };
export const COLORS = ["#2f6fde", "#d64545", "#1f9d55", "#c98a00", "#8e44ad", "#0f9aa8", "#e67e22", "#5b6474"];

// Round tick values spanning [lo, hi]; `integer` for steps (no tick between two steps).
export function niceTicks(lo, hi, n = 5, integer = false) {
  if (!(hi > lo)) { const pad = integer ? 1 : Math.abs(lo) * 0.1 || 1; lo -= pad; hi += pad; }
  const raw = (hi - lo) / n, mag = 10 ** Math.floor(Math.log10(raw)), f = raw / mag;
  let step = (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
  if (integer) step = Math.max(1, Math.round(step));
  const first = Math.floor(lo / step + 1e-9), last = Math.ceil(hi / step - 1e-9), ticks = [];
  for (let i = first; i <= last; i++) ticks.push(Number((i * step).toPrecision(12)));
  return { lo: first * step, hi: last * step, ticks };
}

export class LineChart {
  // yRange: [lo, hi] always shown (e.g. [0, 1] for rates); the data may widen it.
  constructor(title, { xLabel = "step", format = fmtNum, yRange = null } = {}) {
    this.yRange = yRange;
    this.series = new Map(); // name -> [{x, y}]
    this.xLabel = xLabel;
    this.format = format;
    this.svg = h("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title });
    this.legend = h("div", { class: "legend" });
    this.tip = h("div", { class: "tip" });
    this.el = h("div", { class: "chart", dataset: { chart: title, points: "0" } }, h("h3", {}, title), this.svg, this.legend, this.tip);
    this.svg.addEventListener("mousemove", (e) => this.hover(e));
    this.svg.addEventListener("mouseleave", () => { this.tip.style.display = "none"; this.cursor?.remove(); });
    this.render();
  }

  // points: [{x, y}] in x order, newer than what the series has (older ones are dropped).
  // color: the series' own colour (default: by its order in the chart).
  append(name, points, color) {
    if (color) (this.colors ||= new Map()).set(name, color);
    const s = this.series.get(name) || [];
    const last = s.length ? s[s.length - 1].x : -Infinity;
    for (const p of points) if (p.x > last && Number.isFinite(p.y)) s.push(p);
    this.series.set(name, s);
  }

  count() { let n = 0; for (const s of this.series.values()) n += s.length; return n; }

  render() {
    const all = [...this.series.values()].flat();
    this.el.dataset.points = String(all.length);
    this.svg.replaceChildren();
    this.legend.replaceChildren();
    if (!all.length) {
      this.svg.append(h("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, "no points yet"));
      return;
    }
    const xs = niceTicks(Math.min(...all.map((p) => p.x)), Math.max(...all.map((p) => p.x)), 6, true);
    const yv = all.map((p) => p.y).concat(this.yRange || []);
    const ys = niceTicks(Math.min(...yv), Math.max(...yv), 4);
    this.sx = (x) => M.l + ((x - xs.lo) / (xs.hi - xs.lo)) * (W - M.l - M.r);
    this.sy = (y) => H - M.b - ((y - ys.lo) / (ys.hi - ys.lo)) * (H - M.t - M.b);
    this.xs = xs;
    const grid = h("g", {});
    for (const t of ys.ticks) {
      grid.append(h("line", { x1: M.l, x2: W - M.r, y1: this.sy(t), y2: this.sy(t), stroke: "#eceef2" }),
        h("text", { x: M.l - 4, y: this.sy(t) + 3, "text-anchor": "end" }, this.format(t)));
    }
    for (const t of xs.ticks) {
      grid.append(h("text", { x: this.sx(t), y: H - M.b + 14, "text-anchor": "middle" }, fmtNum(t)));
    }
    grid.append(h("line", { x1: M.l, x2: W - M.r, y1: H - M.b, y2: H - M.b, stroke: "#c8ceda" }),
      h("text", { x: W - M.r, y: H - 2, "text-anchor": "end" }, this.xLabel));
    this.svg.append(grid);
    [...this.series.entries()].forEach(([name, pts], i) => {
      const color = this.colors?.get(name) || COLORS[i % COLORS.length];
      if (pts.length > 1) {
        const d = pts.map((p) => `${this.sx(p.x).toFixed(1)},${this.sy(p.y).toFixed(1)}`).join(" ");
        this.svg.append(h("polyline", { points: d, fill: "none", stroke: color, "stroke-width": 1.6, "stroke-linejoin": "round" }));
      }
      if (pts.length < 40) {
        for (const p of pts) this.svg.append(h("circle", { cx: this.sx(p.x), cy: this.sy(p.y), r: 2.2, fill: color }));
      }
      const last = pts[pts.length - 1];
      this.legend.append(h("span", {}, h("i", { style: `background:${color}` }), `${name} `, last ? this.format(last.y) : ""));
    });
  }

  hover(e) {
    if (!this.sx || !this.count()) return;
    const box = this.svg.getBoundingClientRect();
    const px = ((e.clientX - box.left) / box.width) * W;
    const x = this.xs.lo + ((px - M.l) / (W - M.l - M.r)) * (this.xs.hi - this.xs.lo);
    let best = null;
    for (const pts of this.series.values()) for (const p of pts) if (!best || Math.abs(p.x - x) < Math.abs(best - x)) best = p.x;
    const lines = [`${this.xLabel} ${fmtNum(best)}`];
    for (const [name, pts] of this.series) {
      const p = pts.find((q) => q.x === best);
      if (p) lines.push(`${name}: ${this.format(p.y)}`);
    }
    this.cursor?.remove();
    this.cursor = h("line", { x1: this.sx(best), x2: this.sx(best), y1: M.t, y2: H - M.b, stroke: "#9aa3b2", "stroke-dasharray": "3 3" });
    this.svg.append(this.cursor);
    this.tip.textContent = lines.join("\n");
    this.tip.style.whiteSpace = "pre";
    this.tip.style.display = "block";
    const left = (this.sx(best) / W) * box.width + 14;
    this.tip.style.left = `${Math.min(left, box.width - 140)}px`;
    this.tip.style.top = "30px";
  }
}
