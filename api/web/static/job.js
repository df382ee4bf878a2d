// /ui/jobs/{id}: status, live training curves, the event log, sampled completions with their
// rewards, checkpoints, scores and the resolved config; cancel, and resubmit a copy. History is
// read once; after that the page follows the job's event stream (events and metric points as
// they are written) until the job ends, instead of polling.
import { LineChart } from "./chart.js";
import {
  $, AuthError, TERMINAL, api, badge, boot, fmtDuration, fmtNum, fmtTime, follow, h, pct, post, shortId, showKeyForm,
} from "./common.js";

// Panels in display order: a metric goes to every panel whose test it passes; the rest get
// one small chart each under "Other metrics".
const PANELS = [
  ["Reward", (n) => n === "reward" || /^rewards\/.+\/mean$/.test(n)],
  ["KL", (n) => n === "kl"],
  ["Loss", (n) => n === "loss"],
  ["Accuracy", (n) => n.includes("accuracy") && !n.endsWith("/std") && !n.startsWith("heldout/")],
  // a training job's held-out evaluation every N steps (trainer/heldout_eval.py), with its 95% CI
  ["Held-out accuracy (95% CI)", (n) => /^heldout\/(accuracy|ci_low|ci_high)$/.test(n)],
  // mathrl's GRPO loop (trainer/grpo_loop.py): groups kept and dropped, completions trained on
  ["Dynamic sampling", (n) => /^dynamic_sampling\/(kept_fraction|zero_variance_fraction)$/.test(n) || n === "skip/trained_fraction"],
  ["Completion length", (n) => /^completions\/(mean|min|max)_length$/.test(n)],
  ["Step time (s)", (n) => n === "step_time"],
  // where a GRPO step's time goes (trainer/callbacks.py): generation, weight sync, the rest
  ["Step breakdown (s)", (n) => /^(generation|weight_sync|training|tool)_seconds$/.test(n)],
  ["Generation share", (n) => n === "generation_share" || n === "tool_share"],
  // a job with the python tool (docs/tools.md): calls per rollout, and the shares of calls and rollouts
  ["Tool calls", (n) => n === "tool/calls_per_rollout"],
  ["Tool outcomes", (n) => /^tool\/(call_errors|timeouts|answered|void_turns)$/.test(n)],
  ["Generated tokens/s", (n) => n === "generation_tokens_per_second"],
];

const jobId = decodeURIComponent(location.pathname.split("/").pop());

function facts(job) {
  const spec = job.spec || {};
  const items = [
    ["kind", job.kind], ["model", spec.model], ["benchmark / dataset", spec.benchmark || spec.dataset?.name || spec.dataset?.path || spec.dataset?.hub],
    ["queue", job.queue], ["attempts", `${job.attempts} / ${job.max_attempts}` + (job.drains ? ` (${job.drains} drained, not counted)` : "")], ["created", fmtTime(job.created_at)],
    ["started", fmtTime(job.started_at)], ["finished", fmtTime(job.finished_at)], ["ran", fmtDuration(job.started_at, job.finished_at)],
  ];
  const out = h("div", { class: "facts card" }, items.map(([k, v]) => h("div", {}, h("span", {}, k), v || "—")));
  if (job.pipeline_id) out.append(h("div", {}, h("span", {}, "pipeline"), h("a", { href: `/ui/pipelines/${job.pipeline_id}` }, job.pipeline_step || shortId(job.pipeline_id))));
  if (job.tags?.length) out.append(h("div", {}, h("span", {}, "tags"), job.tags.map((t) => h("span", { class: "tag" }, t))));
  return out;
}

function sampleRow(s) {
  const rewards = s.data?.rewards || {};
  const graded = s.data && "correct" in s.data ? (s.data.correct ? "correct" : "wrong") : "";
  return h("tr", { dataset: { step: s.step ?? "" } },
    h("td", { class: "num" }, s.step ?? ""),
    h("td", {}, h("pre", {}, s.prompt)),
    h("td", {}, h("pre", {}, s.completion)),
    h("td", { class: "mono" }, Object.entries(rewards).map(([k, v]) => h("div", {}, `${k} ${fmtNum(v, 3)}`)), graded),
    h("td", { class: "num" }, fmtNum(s.data?.advantage, 3)));
}

// Cancel (a second click within 5 s confirms) and resubmit a copy of the spec, with the page's key.
function actions(getJob, showJob, say) {
  const cancel = h("button", { type: "button", id: "cancel" }, "Cancel job");
  let armed = null;
  cancel.addEventListener("click", async () => {
    if (!armed) {
      cancel.textContent = "Click again to cancel";
      cancel.classList.add("danger");
      armed = setTimeout(() => { armed = null; cancel.textContent = "Cancel job"; cancel.classList.remove("danger"); }, 5000);
      return;
    }
    clearTimeout(armed);
    armed = null;
    cancel.disabled = true;
    try {
      showJob(await post(`/v1/jobs/${encodeURIComponent(jobId)}/cancel`));
      say("");
    } catch (e) {
      if (e instanceof AuthError) { showKeyForm(e.message); return; }
      say(`Cancel refused: ${e.message}`);
    } finally {
      cancel.disabled = false;
      cancel.textContent = "Cancel job";
      cancel.classList.remove("danger");
    }
  });
  const again = h("button", { type: "button", id: "resubmit" }, "Resubmit a copy");
  const idem = crypto.randomUUID(); // a double click submits once
  again.addEventListener("click", async () => {
    const job = getJob();
    again.disabled = true;
    try {
      const spec = { ...job.spec, name: `${job.spec.name || `job ${shortId(job.id)}`} (copy)` };
      const made = await post("/v1/jobs", spec, { "Idempotency-Key": `resubmit-${job.id}-${idem}` });
      location.assign(`/ui/jobs/${made.id}`);
    } catch (e) {
      if (e instanceof AuthError) { showKeyForm(e.message); return; }
      say(`Resubmit refused: ${e.message}`);
      again.disabled = false;
    }
  });
  return { cancel, again };
}

boot(async (main) => {
  let job = await api(`/v1/jobs/${encodeURIComponent(jobId)}`);
  const notice = h("div", { id: "actionnotice" }), liveNotice = h("div", { id: "livenotice" });
  const say = (text) => notice.replaceChildren(text ? h("p", { class: "notice error" }, text) : "");
  const sayLive = (text) => liveNotice.replaceChildren(text ? h("p", { class: "notice" }, text) : "");
  const { cancel, again } = actions(() => job, (j) => { job = j; showJob(); }, say);
  const title = h("h1", {}, `Job ${shortId(job.id)}`, job.name ? h("span", { class: "muted" }, job.name) : null, h("span", { id: "status" }, badge(job.status)),
    h("span", { class: "actions" }, cancel, again));
  const factsBox = h("div", { id: "facts" }, facts(job));
  const errorBox = h("div", { id: "error" });
  const bar = h("div", {}), progress = h("div", { class: "progress", hidden: true }, bar);
  const progressText = h("span", { class: "muted", id: "progress" });
  const grid = h("div", { class: "grid", id: "charts" });
  const others = h("div", { class: "grid" });
  const otherBox = h("details", { hidden: true }, h("summary", {}, "Other metrics"), others);
  const noMetrics = h("p", { class: "muted", id: "nometrics" }, "No metrics yet.");
  const samples = h("tbody", { id: "samples" });
  const stepSel = h("select", { id: "samplestep" });
  const sampleBox = h("label", { hidden: true }, "step", stepSel);
  const checkpoints = h("tbody", { id: "checkpoints" });
  const scores = h("tbody", { id: "scores" });
  const log = h("div", { class: "log mono", id: "events" });
  main.replaceChildren(title, notice, liveNotice, factsBox, errorBox, progress, progressText,
    h("h2", {}, "Metrics"), noMetrics, grid, otherBox,
    h("h2", {}, "Events"), log,
    h("h2", {}, "Sample completions"), h("div", { class: "controls" }, sampleBox),
    h("table", {}, h("thead", {}, h("tr", {}, ["step", "prompt", "completion", "rewards", "advantage"].map((c) => h("th", {}, c)))), samples),
    h("h2", {}, "Checkpoints"),
    h("table", {}, h("thead", {}, h("tr", {}, ["step", "kind", "uri", "saved"].map((c) => h("th", {}, c)))), checkpoints),
    h("div", { id: "scorebox", hidden: true }, h("h2", {}, "Scores"),
      h("table", {}, h("thead", {}, h("tr", {}, ["benchmark", "metric", "value", "95% CI", "n", "model"].map((c) => h("th", {}, c)))), scores)),
    h("h2", {}, "Resolved config"),
    h("pre", { class: "config", id: "config" }, JSON.stringify(job.resolved_config ?? job.spec, null, 2)),
    h("details", {}, h("summary", {}, "Spec as submitted"), h("pre", { class: "config" }, JSON.stringify(job.spec, null, 2))));

  const charts = new Map(); // title -> LineChart
  const chartFor = (titleText, other) => {
    let c = charts.get(titleText);
    if (!c) {
      c = new LineChart(titleText);
      charts.set(titleText, c);
      if (other) { others.append(c.el); otherBox.hidden = false; } else {
        // keep PANELS order
        const order = PANELS.map(([t]) => t);
        const after = [...grid.children].find((el) => order.indexOf(el.dataset.chart) > order.indexOf(titleText));
        grid.insertBefore(c.el, after || null);
      }
    }
    return c;
  };

  let lastStep = null, lastSeq = null, lastSample = null;
  // series: [{name, points: [{step, value}]}], as GET .../metrics pages and the stream give them
  function addPoints(series) {
    const touched = new Set();
    for (const s of series) {
      const pts = s.points.map((p) => ({ x: p.step, y: p.value }));
      if (pts.length) lastStep = Math.max(lastStep ?? -1, pts[pts.length - 1].x);
      const panels = PANELS.filter(([, test]) => test(s.name));
      const targets = panels.length ? panels.map(([t]) => chartFor(t, false)) : [chartFor(s.name, true)];
      for (const c of targets) { c.append(s.name, pts); touched.add(c); }
    }
    for (const c of touched) c.render();
    noMetrics.hidden = charts.size > 0;
  }
  async function metrics() {
    for (;;) {  // pages of whole steps: next_cursor is the last step of a page
      const page = await api(`/v1/jobs/${jobId}/metrics`, { after_step: lastStep });
      addPoints(page.data);
      if (!page.next_cursor) break;
    }
  }
  function addEvent(e) {
    if (lastSeq !== null && e.seq <= lastSeq) return;
    lastSeq = e.seq;
    if (e.type === "progress" && e.data?.total) {
      progress.hidden = false;
      bar.style.width = `${(100 * e.data.done) / e.data.total}%`;
      progressText.textContent = e.message;
      return;
    }
    // the job's run on the operator's MLflow server (worker/tracking.py): a link to it
    const run = e.type === "tracking" && /^https?:\/\//.test(e.data?.url || "")
      ? [" ", h("a", { href: e.data.url, target: "_blank", rel: "noopener" }, "open in MLflow")] : null;
    log.append(h("div", { class: e.level }, h("span", { class: "t" }, `${fmtTime(e.time)} `), `${e.type}: ${e.message}`, run));
    log.scrollTop = log.scrollHeight;
  }
  async function events() {
    for (;;) {
      const page = await api(`/v1/jobs/${jobId}/events`, { after: lastSeq, limit: 500 });
      page.data.forEach(addEvent);
      if (!page.next_cursor) break;
    }
  }
  // Samples of one step at a time (the newest unless the user picks another), eval items all.
  const allSamples = [];
  let followLatest = true;
  stepSel.addEventListener("change", () => { followLatest = stepSel.selectedIndex === 0; showSamples(); });
  function showSamples() {
    const steps = [...new Set(allSamples.map((x) => x.step))].filter((x) => x !== null).sort((a, b) => b - a);
    sampleBox.hidden = steps.length < 2;
    const want = followLatest ? String(steps[0]) : stepSel.value;
    stepSel.replaceChildren(...steps.map((x) => h("option", { value: x, selected: String(x) === want }, x)));
    const shown = steps.length ? allSamples.filter((x) => String(x.step) === want) : allSamples;
    samples.replaceChildren(...shown.slice(0, 500).map(sampleRow));
    if (!allSamples.length) samples.append(h("tr", {}, h("td", { colspan: 5, class: "muted" }, "none yet")));
  }
  async function moreSamples() {
    const page = await api(`/v1/jobs/${jobId}/samples`, { cursor: lastSample, limit: 500 });
    if (!page.data.length && lastSample !== null) return;
    if (page.data.length) lastSample = page.data[page.data.length - 1].id;
    allSamples.push(...page.data);
    showSamples();
  }
  async function ckpts() {
    const page = await api(`/v1/jobs/${jobId}/checkpoints`);
    checkpoints.replaceChildren(...page.data.map((c) => h("tr", {},
      h("td", { class: "num" }, c.step), h("td", {}, c.kind), h("td", { class: "mono" }, c.uri), h("td", {}, fmtTime(c.created_at)))));
    if (!page.data.length) checkpoints.append(h("tr", {}, h("td", { colspan: 4, class: "muted" }, "none yet")));
  }
  async function jobScores() {
    const page = await api("/v1/scores", { job_id: jobId });
    $("#scorebox").hidden = !page.data.length;
    scores.replaceChildren(...page.data.map((s) => h("tr", {},
      h("td", {}, s.benchmark), h("td", {}, s.metric), h("td", { class: "num" }, fmtNum(s.value)),
      h("td", { class: "num" }, s.ci_low != null ? `${pct(s.ci_low)} – ${pct(s.ci_high)}` : ""),
      h("td", { class: "num" }, s.n), h("td", { class: "mono" }, s.model_ref))));
  }
  function showJob() {
    $("#status").replaceChildren(badge(job.status));
    cancel.hidden = TERMINAL.has(job.status);
    factsBox.replaceChildren(facts(job));
    errorBox.replaceChildren(job.error ? h("p", { class: "notice error" }, job.error) : "");
  }

  async function refresh() {
    await Promise.all([metrics(), events(), moreSamples(), ckpts()]);
    main.dataset.loaded = "true";
  }
  showJob();
  await refresh();
  if (TERMINAL.has(job.status)) { await jobScores(); return; }

  // Live: the event stream carries events and metric points; a status event re-reads the job,
  // a checkpoint event the checkpoints, new steps the samples (at most every 2 s).
  const later = (fn, ms) => { let t = null; return () => { if (!t) t = setTimeout(() => { t = null; fn().catch(console.error); }, ms); }; };
  const samplesSoon = later(moreSamples, 2000), ckptsSoon = later(ckpts, 500);
  const jobSoon = later(async () => { job = await api(`/v1/jobs/${jobId}`); showJob(); }, 200);
  const onMessage = (type, data) => {
    if (type === "metrics") {
      const byName = new Map();
      for (const p of data.data) (byName.get(p.name) || byName.set(p.name, []).get(p.name)).push(p);
      const before = lastStep ?? 0;
      addPoints([...byName].map(([name, points]) => ({ name, points })));
      // completions are sampled every `sample_every` steps: read them when a step reaches one
      const every = job.resolved_config?.sample_every;
      if (every && Math.floor((lastStep ?? 0) / every) > Math.floor(before / every)) samplesSoon();
      return;
    }
    addEvent(data);
    if (type !== "progress") jobSoon(); // events are few (claimed, started, checkpoint, retry, a status...)
    if (type === "checkpoint") ckptsSoon();
  };
  for (;;) {  // the server ends the stream when the job ends; a dropped one is picked up again
    try {
      await follow(`/v1/jobs/${jobId}/events/stream`, { after: lastSeq, metrics: true, metrics_after_step: lastStep }, onMessage,
        { onOpen: () => { main.dataset.streaming = "true"; sayLive(""); } });
    } catch (e) {
      if (e instanceof AuthError) { showKeyForm(`The server refused this key: ${e.message}`); return; }
      sayLive(`Live updates interrupted (${e.message}); retrying.`);
      await new Promise((r) => setTimeout(r, 3000));
    }
    main.dataset.streaming = "false";
    try {
      job = await api(`/v1/jobs/${jobId}`);
    } catch (e) {
      if (e instanceof AuthError) { showKeyForm(`The server refused this key: ${e.message}`); return; }
      sayLive(`Live updates interrupted (${e.message}); retrying.`); // the server is away: try again
      await new Promise((r) => setTimeout(r, 3000));
      continue;
    }
    showJob();
    if (TERMINAL.has(job.status)) break;
  }
  sayLive("");
  await Promise.all([refresh(), jobScores()]); // the last rows may land just after the status
});
