// /ui/pipelines: pipelines newest first.
import { api, badge, boot, every, fmtDuration, fmtTime, h, shortId } from "./common.js";

boot(async (main) => {
  const body = h("tbody", { id: "pipelines" });
  const empty = h("p", { class: "muted", id: "empty", hidden: true }, "No pipelines in this project.");
  const more = h("button", { type: "button", id: "more", hidden: true }, "Load more");
  main.replaceChildren(h("h1", {}, "Pipelines"),
    h("table", {}, h("thead", {}, h("tr", {}, ["id", "name", "status", "jobs", "tags", "created", "ran"].map((c) => h("th", {}, c)))), body),
    empty, h("p", {}, more));
  let cursor = null, pages = 0;
  async function load(reset) {
    const page = await api("/v1/pipelines", { limit: 50, cursor: reset ? null : cursor });
    if (reset) { body.replaceChildren(); pages = 0; }
    pages += 1;
    body.append(...page.data.map((p) => {
      const jobs = p.jobs || [];
      const done = jobs.filter((j) => j.status === "succeeded").length;
      return h("tr", { dataset: { pipelineId: p.id } },
        h("td", { class: "mono" }, h("a", { href: `/ui/pipelines/${p.id}`, title: p.id }, shortId(p.id))),
        h("td", {}, p.name || ""), h("td", {}, badge(p.status)),
        h("td", {}, jobs.length ? `${done}/${jobs.length} done` : ""),
        h("td", {}, (p.tags || []).map((t) => h("span", { class: "tag" }, t))),
        h("td", {}, fmtTime(p.created_at)), h("td", {}, fmtDuration(p.created_at, p.finished_at)));
    }));
    cursor = page.next_cursor;
    more.hidden = !cursor;
    empty.hidden = body.children.length > 0;
    main.dataset.loaded = "true";
  }
  more.addEventListener("click", () => load(false));
  await load(true);
  every(5000, async () => { if (pages === 1) await load(true); });
});
