// /ui/scores: a leaderboard (model x benchmark for one metric), a before/after comparison of
// two models, and score over training steps for models that are checkpoints of a job.
import { LineChart } from "./chart.js";
import { NotFound, api, boot, fmtNum, fmtTime, h, pct, shortId } from "./common.js";

const STEP_REF = /^job:([^@]+)@step-(\d+)$/;
const FINAL_REF = /^job:([^@]+)(@final)?$/;
const isRate = (metric) => /accuracy|pass@|maj@/.test(metric);

boot(async (main) => {
  const params = new URLSearchParams(location.search);
  const all = (await api("/v1/scores", { limit: 2000 })).data; // newest first
  if (!all.length) {
    main.replaceChildren(h("h1", {}, "Scores"), h("p", { class: "muted", id: "noscores" }, "No scores stored in this project yet: run an eval job."));
    main.dataset.loaded = "true";
    return;
  }
  const metrics = [...new Set(all.map((s) => s.metric))].sort();
  const metricSel = h("select", { name: "metric", id: "metric" },
    metrics.map((m) => h("option", { value: m, selected: m === (params.get("metric") || (metrics.includes("accuracy") ? "accuracy" : metrics[0])) }, m)));
  const models = [...new Set([...all].reverse().map((s) => s.model_ref))]; // oldest first
  const pick = (name, def) => h("select", { name, id: name }, models.map((m) => h("option", { value: m, selected: m === (params.get(name) || def) }, m)));
  const selA = pick("before", models[0]), selB = pick("after", models[models.length - 1]);
  const board = h("div", { id: "leaderboard" }), compare = h("div", { id: "compare" }), steps = h("div", { class: "grid", id: "steps" });
  main.replaceChildren(h("h1", {}, "Scores"),
    h("div", { class: "controls" }, h("label", {}, "metric", metricSel)),
    h("h2", {}, "Leaderboard"), board,
    h("h2", {}, "Before / after"), h("div", { class: "controls" }, h("label", {}, "before", selA), h("label", {}, "after", selB)), compare,
    h("h2", {}, "Score over training steps"), steps,
    h("details", {}, h("summary", {}, `All scores (${all.length})`), rawTable(all)));

  const fmt = (metric, v) => (isRate(metric) ? pct(v) : fmtNum(v));
  // newest score per (model, benchmark) for a metric
  const latest = (metric) => {
    const m = new Map();
    for (const s of all) if (s.metric === metric && !m.has(`${s.model_ref}\u0000${s.benchmark}`)) m.set(`${s.model_ref}\u0000${s.benchmark}`, s);
    return m;
  };

  function renderBoard() {
    const metric = metricSel.value, got = latest(metric);
    const benches = [...new Set([...got.values()].map((s) => s.benchmark))].sort();
    const rows = [...new Set([...got.values()].map((s) => s.model_ref))].map((model) => {
      const cells = benches.map((b) => got.get(`${model}\u0000${b}`));
      const vals = cells.filter(Boolean).map((s) => s.value);
      return { model, cells, mean: vals.reduce((a, b) => a + b, 0) / vals.length };
    }).sort((a, b) => b.mean - a.mean);
    const best = benches.map((_, i) => Math.max(...rows.map((r) => r.cells[i]?.value ?? -Infinity)));
    board.replaceChildren(h("table", {},
      h("thead", {}, h("tr", {}, h("th", {}, "#"), h("th", {}, "model"), benches.map((b) => h("th", { class: "num" }, b)), benches.length > 1 ? h("th", { class: "num" }, "mean") : null)),
      h("tbody", {}, rows.map((r, i) => h("tr", { dataset: { model: r.model } },
        h("td", {}, i + 1), h("td", { class: "mono" }, modelLink(r.model)),
        r.cells.map((s, j) => h("td", { class: `num${s && s.value === best[j] && rows.length > 1 ? " best" : ""}`, title: s ? ciText(s) : "" },
          s ? fmt(metric, s.value) : "—")),
        benches.length > 1 ? h("td", { class: "num" }, fmt(metric, r.mean)) : null)))));
  }

  function renderCompare() {
    const metric = metricSel.value, got = latest(metric);
    const benches = [...new Set([...got.values()].map((s) => s.benchmark))].sort();
    const rows = benches.map((b) => [b, got.get(`${selA.value}\u0000${b}`), got.get(`${selB.value}\u0000${b}`)]).filter(([, a, c]) => a || c);
    compare.replaceChildren(h("table", {},
      h("thead", {}, h("tr", {}, ["benchmark", "before", "after", "change"].map((c) => h("th", { class: c === "benchmark" ? "" : "num" }, c)))),
      h("tbody", {}, rows.map(([b, a, c]) => {
        const d = a && c ? c.value - a.value : null;
        const sig = a && c && a.ci_low != null && c.ci_low != null && (c.ci_low > a.ci_high || c.ci_high < a.ci_low);
        return h("tr", {}, h("td", {}, b),
          h("td", { class: "num", title: a ? ciText(a) : "" }, a ? fmt(metric, a.value) : "—"),
          h("td", { class: "num", title: c ? ciText(c) : "" }, c ? fmt(metric, c.value) : "—"),
          h("td", { class: `num ${d > 0 ? "up" : d < 0 ? "down" : ""}` }, d === null ? "" : `${d > 0 ? "+" : ""}${isRate(metric) ? `${(100 * d).toFixed(1)} pt` : fmtNum(d)}${sig ? " (CIs apart)" : ""}`));
      }))));
  }

  // job id -> {step -> score} for refs 'job:<id>@step-N'; the final model sits at the final
  // checkpoint's step and the job's starting model at step 0 when they were scored too.
  const jobInfo = new Map();
  async function info(id) {
    if (!jobInfo.has(id)) {
      try {
        const [job, ck] = await Promise.all([api(`/v1/jobs/${id}`), api(`/v1/jobs/${id}/checkpoints`)]);
        const final = ck.data.find((c) => c.kind === "final");
        jobInfo.set(id, { job, finalStep: final ? final.step : null });
      } catch (e) { if (!(e instanceof NotFound)) throw e; jobInfo.set(id, null); }
    }
    return jobInfo.get(id);
  }
  // a later render (a metric change) supersedes one still awaiting its jobs: that one ends when the latest does
  let stepsRender = 0, latestSteps = Promise.resolve();
  function renderSteps() {
    latestSteps = drawSteps(++stepsRender);
    return latestSteps;
  }
  async function drawSteps(mine) {
    const metric = metricSel.value;
    const ids = [...new Set(all.map((s) => s.model_ref.match(STEP_REF)?.[1]).filter(Boolean))];
    const charts = [];
    if (!ids.length) charts.push(h("p", { class: "muted" }, "No checkpoint of a training job has been scored yet (eval a model 'job:<id>@step-N')."));
    for (const id of ids) {
      const meta = await info(id);
      if (mine !== stepsRender) return latestSteps;
      const series = new Map(); // benchmark -> Map(step -> value)
      for (const s of [...all].reverse()) {
        if (s.metric !== metric) continue;
        let step = null;
        const m = s.model_ref.match(STEP_REF);
        if (m && m[1] === id) step = Number(m[2]);
        else if (s.model_ref.match(FINAL_REF)?.[1] === id && meta?.finalStep != null) step = meta.finalStep;
        else if (meta && s.model_ref === meta.job.spec?.model) step = 0;
        if (step === null) continue;
        if (!series.has(s.benchmark)) series.set(s.benchmark, new Map());
        series.get(s.benchmark).set(step, s.value);
      }
      const name = meta?.job ? `${meta.job.kind} ${shortId(id)}${meta.job.name ? ` (${meta.job.name})` : ""}` : shortId(id);
      const chart = new LineChart(`${metric}: ${name}`, { format: (v) => fmt(metric, v), yRange: isRate(metric) ? [0, 1] : null });
      for (const [bench, pts] of series) chart.append(bench, [...pts].sort((a, b) => a[0] - b[0]).map(([x, y]) => ({ x, y })));
      chart.render();
      charts.push(chart.el);
    }
    steps.replaceChildren(...charts);
  }

  const all3 = () => { renderBoard(); renderCompare(); return renderSteps(); };
  metricSel.addEventListener("change", all3);
  selA.addEventListener("change", renderCompare);
  selB.addEventListener("change", renderCompare);
  await all3();
  main.dataset.loaded = "true"; // after the step charts, which wait on their jobs
});

function ciText(s) {
  return `${s.ci_low != null ? `95% CI ${fmtNum(s.ci_low)}–${fmtNum(s.ci_high)}, ` : ""}n=${s.n}, ${s.backend} ${s.backend_version}, ${fmtTime(s.created_at)}`;
}

function modelLink(ref) {
  const m = ref.match(/^job:([^@]+)/);
  return m ? h("a", { href: `/ui/jobs/${m[1]}` }, ref) : ref;
}

function rawTable(all) {
  return h("table", { id: "rawscores" },
    h("thead", {}, h("tr", {}, ["model", "benchmark", "metric", "value", "95% CI", "n", "backend", "job", "when"].map((c) => h("th", {}, c)))),
    h("tbody", {}, all.map((s) => h("tr", {},
      h("td", { class: "mono" }, s.model_ref), h("td", {}, `${s.benchmark} ${s.benchmark_version}`), h("td", {}, s.metric),
      h("td", { class: "num" }, fmtNum(s.value)), h("td", { class: "num" }, s.ci_low != null ? `${fmtNum(s.ci_low)}–${fmtNum(s.ci_high)}` : ""),
      h("td", { class: "num" }, s.n), h("td", {}, s.backend), h("td", { class: "mono" }, h("a", { href: `/ui/jobs/${s.job_id}`, title: s.job_id }, shortId(s.job_id))),
      h("td", {}, fmtTime(s.created_at))))));
}
