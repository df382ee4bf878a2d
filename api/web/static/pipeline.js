// /ui/pipelines/{id}: the pipeline's graph (columns by depth, nodes coloured by job status,
// each a link to its job page) and a table of its jobs; polled until the pipeline ends.
import { $, TERMINAL, api, badge, boot, every, fmtDuration, fmtTime, h, shortId } from "./common.js";

const FILL = { succeeded: "#1f9d55", failed: "#d64545", running: "#2f6fde", cancelled: "#5b6474", queued: "#8a94a6", waiting: "#c3c9d4" };
const NW = 190, NH = 50, GX = 70, GY = 22, PAD = 20;
const pipelineId = decodeURIComponent(location.pathname.split("/").pop());

// depth = 0 without dependencies, else 1 + the deepest dependency (cycles cut at the step itself)
export function layout(jobs) {
  const byStep = new Map(jobs.map((j) => [j.step, j]));
  const depth = new Map();
  const visit = (step, seen) => {
    if (depth.has(step)) return depth.get(step);
    const deps = (byStep.get(step)?.depends_on || []).filter((d) => byStep.has(d) && !seen.has(d));
    const d = deps.length ? 1 + Math.max(...deps.map((x) => visit(x, new Set([...seen, step])))) : 0;
    depth.set(step, d);
    return d;
  };
  jobs.forEach((j) => visit(j.step, new Set([j.step])));
  const cols = [];
  for (const j of jobs) (cols[depth.get(j.step)] ||= []).push(j);
  const pos = new Map();
  cols.forEach((col, c) => col.forEach((j, r) => pos.set(j.step, { x: PAD + c * (NW + GX), y: PAD + r * (NH + GY) })));
  const rows = Math.max(1, ...cols.map((c) => c?.length || 0));
  return { pos, width: PAD * 2 + cols.length * NW + (cols.length - 1) * GX, height: PAD * 2 + rows * NH + (rows - 1) * GY };
}

function dag(jobs) {
  const { pos, width, height } = layout(jobs);
  const svg = h("svg", { viewBox: `0 0 ${width} ${height}`, width, height, id: "dag" },
    h("defs", {}, h("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" },
      h("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#9aa3b2" }))));
  for (const j of jobs) {
    for (const d of j.depends_on || []) {
      const a = pos.get(d), b = pos.get(j.step);
      if (!a || !b) continue;
      const x1 = a.x + NW, y1 = a.y + NH / 2, x2 = b.x, y2 = b.y + NH / 2, mx = (x1 + x2) / 2;
      svg.append(h("path", { d: `M ${x1} ${y1} C ${mx} ${y1}, ${mx} ${y2}, ${x2 - 2} ${y2}`, fill: "none", stroke: "#9aa3b2", "stroke-width": 1.5, "marker-end": "url(#arrow)" }));
    }
  }
  for (const j of jobs) {
    const p = pos.get(j.step);
    const dark = j.status !== "waiting";
    const node = h("g", { class: "node", "data-step": j.step, "data-status": j.status },
      h("rect", { x: p.x, y: p.y, width: NW, height: NH, rx: 8, fill: FILL[j.status] || "#8a94a6" }),
      h("text", { x: p.x + 10, y: p.y + 20, fill: dark ? "#fff" : "#1d2330", "font-weight": 600 }, j.step),
      h("text", { x: p.x + 10, y: p.y + 38, fill: dark ? "#fff" : "#1d2330" }, `${j.kind} · ${j.status}`),
      h("title", {}, j.error ? `${j.step}: ${j.error}` : `${j.step} (${j.kind}): ${j.status}`));
    svg.append(j.job_id ? h("svg:a", { href: `/ui/jobs/${j.job_id}` }, node) : node);
  }
  return svg;
}

boot(async (main) => {
  let p = await api(`/v1/pipelines/${encodeURIComponent(pipelineId)}`);
  const title = h("h1", {}, `Pipeline ${shortId(p.id)}`, p.name ? h("span", { class: "muted" }, p.name) : null, h("span", { id: "status" }, badge(p.status)));
  const meta = h("p", { class: "muted", id: "meta" });
  const graph = h("div", { class: "dag" });
  const body = h("tbody", { id: "steps" });
  main.replaceChildren(title, meta, h("h2", {}, "Graph"), graph, h("h2", {}, "Jobs"),
    h("table", {}, h("thead", {}, h("tr", {}, ["step", "kind", "status", "job", "depends on", "error"].map((c) => h("th", {}, c)))), body));
  function show() {
    $("#status").replaceChildren(badge(p.status));
    meta.textContent = `created ${fmtTime(p.created_at)}${p.finished_at ? ` · finished ${fmtTime(p.finished_at)}` : ""} · ran ${fmtDuration(p.created_at, p.finished_at)}`;
    graph.replaceChildren(dag(p.jobs || []));
    body.replaceChildren(...(p.jobs || []).map((j) => h("tr", { dataset: { step: j.step, status: j.status } },
      h("td", {}, j.step), h("td", {}, j.kind), h("td", {}, badge(j.status)),
      h("td", { class: "mono" }, j.job_id ? h("a", { href: `/ui/jobs/${j.job_id}`, title: j.job_id }, shortId(j.job_id)) : ""),
      h("td", {}, (j.depends_on || []).join(", ")), h("td", {}, j.error || ""))));
    main.dataset.loaded = "true";
  }
  show();
  if (TERMINAL.has(p.status)) return;
  every(3000, async () => {
    p = await api(`/v1/pipelines/${pipelineId}`);
    show();
    return !TERMINAL.has(p.status);
  });
});
