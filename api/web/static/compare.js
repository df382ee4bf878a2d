// /ui/compare?jobs=<id>,<id>,...: chosen runs' curves overlaid (reward, loss, KL, accuracy, held-out
// accuracy), and
// their resolved hyperparameters side by side, the ones that differ highlighted.
import { COLORS, LineChart } from "./chart.js";
import { api, boot, fmtTime, h, shortId } from "./common.js";

// A panel overlays one metric per run: the first of its names that the run has.
const PANELS = [
  ["Reward", ["reward", "eval/accuracy"]],
  ["Loss", ["loss"]],
  ["KL", ["kl"]],
  ["Accuracy", ["rewards/accuracy/mean", "eval/accuracy", "accuracy"]],
  ["Held-out accuracy", ["heldout/accuracy"]], // training jobs' held-out eval series (trainer/heldout_eval.py)
];

async function allMetrics(id) {
  const out = new Map(); // name -> [{x, y}]
  let after;
  for (let i = 0; i < 50; i++) {
    const page = await api(`/v1/jobs/${encodeURIComponent(id)}/metrics`, { after_step: after });
    for (const s of page.data) {
      const pts = out.get(s.name) || [];
      pts.push(...s.points.map((p) => ({ x: p.step, y: p.value })));
      out.set(s.name, pts);
    }
    if (!page.next_cursor) break;
    after = page.next_cursor;
  }
  return out;
}

// {"a": {"b": 1}, "c": [1, 2]} -> {"a.b": "1", "c": "[1,2]"}: dotted paths to printed values
function flatten(obj, prefix = "", out = {}) {
  for (const [k, v] of Object.entries(obj || {})) {
    const key = prefix ? `${prefix}.${k}` : k;
    if (v && typeof v === "object" && !Array.isArray(v)) flatten(v, key, out);
    else out[key] = JSON.stringify(v);
  }
  return out;
}

boot(async (main) => {
  const ids = [...new Set((new URLSearchParams(location.search).get("jobs") || "").split(",").map((s) => s.trim()).filter(Boolean))];
  if (ids.length < 2) {
    main.replaceChildren(h("h1", {}, "Compare runs"),
      h("p", { class: "muted", id: "pickmore" }, "Pick two or more jobs on the ", h("a", { href: "/ui" }, "job list"), " and press Compare."));
    main.dataset.loaded = "true";
    return;
  }
  const jobs = await Promise.all(ids.map((id) => api(`/v1/jobs/${encodeURIComponent(id)}`)));
  const metrics = await Promise.all(ids.map(allMetrics));
  const label = (job) => `${shortId(job.id)}${job.name ? ` ${job.name}` : ""}`;

  const runs = h("table", { id: "runs" }, h("thead", {}, h("tr", {}, ["", "run", "kind", "status", "created"].map((c) => h("th", {}, c)))),
    h("tbody", {}, jobs.map((job, i) => h("tr", { dataset: { jobId: job.id } },
      h("td", {}, h("span", { class: "swatch", style: `display:inline-block;width:12px;height:12px;border-radius:2px;background:${COLORS[i % COLORS.length]}` })),
      h("td", {}, h("a", { href: `/ui/jobs/${job.id}` }, label(job))),
      h("td", {}, job.kind), h("td", {}, job.status), h("td", {}, fmtTime(job.created_at))))));

  const grid = h("div", { class: "grid", id: "charts" });
  for (const [title, names] of PANELS) {
    const chart = new LineChart(title);
    let any = false;
    jobs.forEach((job, i) => {
      const name = names.find((n) => metrics[i].has(n));
      if (!name) return;
      chart.append(`${label(job)} · ${name}`, metrics[i].get(name), COLORS[i % COLORS.length]); // the run's colour
      any = true;
    });
    if (any) { chart.render(); grid.append(chart.el); }
  }

  const flat = jobs.map((job) => flatten(job.resolved_config || job.spec));
  const keys = [...new Set(flat.flatMap((f) => Object.keys(f)))].sort();
  const differs = (k) => new Set(flat.map((f) => f[k] ?? "—")).size > 1;
  const onlyDiff = h("input", { type: "checkbox", id: "onlydiff" });
  const body = h("tbody", {});
  const show = () => body.replaceChildren(...keys.filter((k) => !onlyDiff.checked || differs(k)).map((k) =>
    h("tr", { class: differs(k) ? "diff" : "", dataset: { param: k, diff: differs(k) ? "true" : "false" } },
      h("td", {}, k), flat.map((f) => h("td", {}, f[k] ?? "—")))));
  onlyDiff.addEventListener("change", show);
  show();

  main.replaceChildren(h("h1", {}, `Compare ${jobs.length} runs`), runs,
    h("h2", {}, "Curves"), grid.children.length ? grid : h("p", { class: "muted", id: "nocurves" }, "None of these runs has metrics yet."),
    h("h2", {}, "Resolved hyperparameters"),
    h("p", { class: "muted" }, `${keys.filter(differs).length} of ${keys.length} differ (highlighted). `,
      h("label", { style: "display:inline-flex;flex-direction:row;gap:4px" }, onlyDiff, "only differences")),
    h("table", { class: "params", id: "params" }, h("thead", {}, h("tr", {}, h("th", {}, "parameter"), jobs.map((j) => h("th", {}, label(j))))), body));
  main.dataset.loaded = "true";
});
