// /ui: the job list, newest first, with kind / status / tag filters kept in the URL.
import { KINDS, STATUSES, api, badge, boot, every, fmtDuration, fmtTime, h, shortId } from "./common.js";


const picked = new Set(); // job ids ticked for the compare view

function row(job, onPick) {
  const box = h("input", { type: "checkbox", name: "pick", value: job.id, checked: picked.has(job.id), "aria-label": `compare ${shortId(job.id)}` });
  box.addEventListener("change", () => { if (box.checked) picked.add(job.id); else picked.delete(job.id); onPick(); });
  return h("tr", { dataset: { jobId: job.id, kind: job.kind, status: job.status } },
    h("td", { class: "pick" }, box),
    h("td", { class: "mono" }, h("a", { href: `/ui/jobs/${job.id}`, title: job.id }, shortId(job.id))),
    h("td", {}, job.name || h("span", { class: "muted" }, "—")),
    h("td", {}, job.kind),
    h("td", {}, badge(job.status)),
    h("td", {}, (job.tags || []).map((t) => h("span", { class: "tag" }, t))),
    h("td", {}, job.pipeline_id ? h("a", { href: `/ui/pipelines/${job.pipeline_id}` }, job.pipeline_step || shortId(job.pipeline_id)) : ""),
    h("td", {}, fmtTime(job.created_at)),
    h("td", { class: "num" }, fmtDuration(job.started_at, job.finished_at)));
}

boot(async (main) => {
  const params = new URLSearchParams(location.search);
  const select = (name, options) => h("select", { name },
    h("option", { value: "" }, "any"),
    options.map((o) => h("option", { value: o, selected: params.get(name) === o }, o)));
  const form = h("form", { class: "filters", id: "filters" },
    h("label", {}, "kind", select("kind", KINDS)),
    h("label", {}, "status", select("status", STATUSES)),
    h("label", {}, "tag", h("input", { name: "tag", value: params.get("tag") || "", size: 14 })));
  form.addEventListener("change", () => {
    const q = new URLSearchParams();
    for (const [k, v] of new FormData(form)) if (v) q.set(k, v);
    history.replaceState(null, "", q.toString() ? `?${q}` : location.pathname);
    load(true).catch((e) => main.append(h("p", { class: "notice error" }, e.message)));
  });
  form.addEventListener("submit", (e) => e.preventDefault());
  const body = h("tbody", { id: "jobs" });
  const more = h("button", { type: "button", id: "more", hidden: true }, "Load more");
  const empty = h("p", { class: "muted", id: "empty", hidden: true }, "No jobs match.");
  const compare = h("button", { type: "button", id: "compare", class: "primary", disabled: true }, "Compare");
  const onPick = () => { compare.disabled = picked.size < 2; compare.textContent = picked.size ? `Compare ${picked.size}` : "Compare"; };
  compare.addEventListener("click", () => location.assign(`/ui/compare?jobs=${[...picked].join(",")}`));
  form.append(compare);
  main.replaceChildren(h("h1", {}, "Jobs"), form,
    h("table", {}, h("thead", {}, h("tr", {}, ["", "id", "name", "kind", "status", "tags", "pipeline", "created", "ran"].map((c) => h("th", { class: c === "ran" ? "num" : "" }, c)))), body),
    empty, h("p", {}, more));

  let cursor = null, pages = 0;
  const filters = () => Object.fromEntries([...new FormData(form)].filter(([, v]) => v));
  async function load(reset) {
    const page = await api("/v1/jobs", { ...filters(), limit: 50, cursor: reset ? null : cursor });
    if (reset) { body.replaceChildren(); pages = 0; }
    body.append(...page.data.map((job) => row(job, onPick)));
    pages += 1;
    cursor = page.next_cursor;
    more.hidden = !cursor;
    empty.hidden = body.children.length > 0;
    main.dataset.loaded = "true";
  }
  more.addEventListener("click", () => load(false));
  await load(true);
  every(5000, async () => { if (pages === 1) await load(true); });
});
