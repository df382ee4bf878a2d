"""The status pages (/ui) in headless Chromium: Debian's `chromium` driven by Playwright,
against the real API and worker processes. The job list loads and filters; a running GRPO
job's charts gain points while the test watches; the scores page shows the scores of real
eval jobs (leaderboard, before/after, score over training steps); a key of another project
sees nothing; a pipeline's graph shows each job's state. A screenshot of every page is saved
under $MATHRL_SCREENSHOTS (default: a pytest temporary directory) and the path printed."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.env import EMBEDDED, free_port
from tests.helpers.processes import wait_for
from tests.helpers.service import Service

CHROMIUM = os.environ.get("MATHRL_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PARKED = {"resources": {"gpus": 1}}  # a queue no worker serves in these tests: the job stays queued
TINY = "tiny:2x64"
GRPO_STEPS = 48
LIVE_STEPS = 100_000  # the watched job: never ends on its own; the test cancels it
SAVE_STEPS = 24
SAMPLE_EVERY = 12


@pytest.fixture(scope="module")
def shots(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    d = Path(os.environ.get("MATHRL_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    d.mkdir(parents=True, exist_ok=True)
    yield d
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"status-page screenshots: {d} ({len(list(d.glob('*.png')))} files)")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if shutil.which(CHROMIUM) is None:
        missing = f"{CHROMIUM} is missing: scripts/services installs Debian's chromium (apt-get install chromium)"
        if EMBEDDED:  # scripts/test -m quick installs nothing system-wide
            pytest.skip(missing)
        pytest.fail(missing)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser context per test: its own sessionStorage, so the key form comes first."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.set_default_timeout(20_000)
    yield pg
    ctx.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


@pytest.fixture(scope="module")
def project(service: Service) -> tuple[str, Any]:
    key = service.key()
    return key, service.client(key)


def sign_in(page: Any, url: str, key: str) -> None:
    """Open a page, enter the key in its form once; the page reloads and renders its data."""
    page.goto(url)
    page.fill("#keyform input[name=key]", key)
    page.click("#keyform button[type=submit]")
    page.wait_for_selector("main[data-loaded=true], #notfound")


def shoot(page: Any, shots: Path, name: str) -> None:
    page.screenshot(path=str(shots / f"{name}.png"), full_page=True)


def job_rows(page: Any) -> list[dict[str, str]]:
    return page.eval_on_selector_all("#jobs tr", "rows => rows.map(r => ({...r.dataset}))")


@pytest.mark.slow
def test_job_list_loads_and_filters(service: Service, project: tuple[str, Any], page: Any, shots: Path) -> None:
    key, c = project
    ev = c.jobs.create(
        {"kind": "eval", "model": "org/model", "limit": 5, "name": "parked eval", "tags": ["web"], **PARKED}
    )
    sft = c.jobs.create({"kind": "sft", "model": TINY, "dataset": {"name": "arith", "split": "train"}, **PARKED})
    gone = c.jobs.create({"kind": "eval", "model": "org/other", "limit": 5, **PARKED})
    c.jobs.cancel(gone.id)

    sign_in(page, f"{service.url}/ui", key)
    wait_for(lambda: len(job_rows(page)) == 3, 10, what="three job rows")
    rows = job_rows(page)
    assert [r["jobId"] for r in rows] == [gone.id, sft.id, ev.id]  # newest first
    assert page.inner_text(f"tr[data-job-id='{ev.id}']").count("parked eval") == 1
    shoot(page, shots, "jobs")

    page.select_option("select[name=kind]", "sft")
    wait_for(lambda: [r["jobId"] for r in job_rows(page)] == [sft.id], 10, what="the kind filter")
    page.select_option("select[name=kind]", "")
    page.select_option("select[name=status]", "cancelled")
    wait_for(lambda: [r["jobId"] for r in job_rows(page)] == [gone.id], 10, what="the status filter")
    assert "status=cancelled" in page.url
    page.select_option("select[name=status]", "")
    page.fill("input[name=tag]", "web")
    page.dispatch_event("input[name=tag]", "change")
    wait_for(lambda: [r["jobId"] for r in job_rows(page)] == [ev.id], 10, what="the tag filter")
    shoot(page, shots, "jobs-filtered")

    page.reload()  # the key was entered once: a reload keeps it, and the filter is in the URL
    page.wait_for_selector("main[data-loaded=true]")
    assert [r["jobId"] for r in job_rows(page)] == [ev.id]
    page.click(f"tr[data-job-id='{ev.id}'] a")
    page.wait_for_selector("main[data-loaded=true]")
    assert page.get_attribute("#status .badge", "data-status") == "queued"
    assert '"model": "org/model"' in page.inner_text("#config")


def chart_points(page: Any, title: str) -> int:
    el = page.query_selector(f".chart[data-chart='{title}']")
    return int(el.get_attribute("data-points")) if el else 0


@pytest.fixture(scope="module")
def grpo_job(service: Service, project: tuple[str, Any], browser: Any, shots: Path) -> dict[str, Any]:
    """Two real GRPO jobs on a tiny model (module-scoped so the scores test can evaluate the
    finished one's checkpoints). A long one is watched in its job page while it runs, then
    cancelled: it cannot end before the page has polled twice, however fast the machine. A
    short one runs to the end and its page is read. Returns what the pages showed."""
    key, c = project
    spec = {
        "kind": "grpo",
        "model": TINY,
        "dataset": {"name": "arith", "split": "train", "limit": 2000},
        "max_steps": GRPO_STEPS,
        "learning_rate": 1e-4,
        "beta": 0.04,
        "num_generations": 4,
        "per_device_train_batch_size": 16,
        "max_completion_length": 4,
        "rewards": [{"name": "accuracy"}, {"name": "overlong", "buffer": 2, "weight": 0.5}],
        "logging_steps": 1,
        "save_steps": SAVE_STEPS,
        "sample_every": SAMPLE_EVERY,
        "seed": 3,
    }
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = ctx.new_page()
    pg.set_default_timeout(20_000)
    seen: dict[str, Any] = {}
    requests: list[tuple[str, str | None]] = []  # what the page asked the API for, with its Authorization
    pg.on("request", lambda r: requests.append((r.url, r.headers.get("authorization"))))
    try:
        live = c.jobs.create({**spec, "name": "web grpo live", "max_steps": LIVE_STEPS, "save_steps": LIVE_STEPS})
        seen["live_id"] = live.id
        sign_in(pg, f"{service.url}/ui/jobs/{live.id}", key)
        # first points (the job process needs some seconds to start), then more while running
        first = wait_for(lambda: chart_points(pg, "Reward"), 180, 0.25, "the first reward points")
        seen["running_when_first"] = pg.get_attribute("#status .badge", "data-status")
        seen["first"] = first
        shoot(pg, shots, "job-running")
        watched_from = len(requests)
        seen["later"] = wait_for(lambda: (n := chart_points(pg, "Reward")) > first and n, 60, 0.25, "more points")
        seen["running_when_later"] = pg.get_attribute("#status .badge", "data-status")
        seen["requests_while_watched"] = [u for u, _ in requests[watched_from:] if "/v1/" in u]
        seen["streams"] = [(u, a) for u, a in requests if "/events/stream" in u]
        seen["key"] = key
        c.jobs.cancel(live.id)
        assert c.jobs.wait(live.id, timeout=120).status == "cancelled"
        pg.wait_for_selector("#status .badge[data-status=cancelled]", timeout=15_000)

        # the finished run also scores held-out problems every SAMPLE_EVERY steps (trainer/heldout_eval.py)
        heldout = {"benchmark": "arith", "limit": 20, "every": SAMPLE_EVERY, "max_new_tokens": 6}
        job = c.jobs.create({**spec, "name": "web grpo", "eval": heldout})
        seen["id"] = job.id
        done = c.jobs.wait(job.id, timeout=300)
        assert done.status == "succeeded", done.error
        pg.goto(f"{service.url}/ui/jobs/{job.id}")  # the key is remembered for the session
        pg.wait_for_selector("#status .badge[data-status=succeeded]", timeout=15_000)
        wait_for(lambda: chart_points(pg, "Loss") >= GRPO_STEPS, 15, what="every loss point")
        pg.wait_for_selector("#samples tr[data-step]")
        seen["charts"] = pg.eval_on_selector_all(".chart", "els => els.map(e => [e.dataset.chart, +e.dataset.points])")
        seen["samples"] = pg.eval_on_selector_all("#samples tr", "rows => rows.map(r => r.dataset.step)")
        seen["sample_steps"] = pg.eval_on_selector_all("#samplestep option", "os => os.map(o => o.value)")
        seen["checkpoints"] = pg.inner_text("#checkpoints")
        seen["events"] = pg.inner_text("#events")
        seen["config"] = pg.inner_text("#config")
        shoot(pg, shots, "job-finished")
    finally:
        ctx.close()
    return seen


@pytest.mark.slow
def test_running_job_chart_gains_points_while_watched(grpo_job: dict[str, Any]) -> None:
    assert grpo_job["running_when_first"] == "running"
    assert grpo_job["running_when_later"] == "running", "the points must arrive while the job runs"
    assert grpo_job["later"] > grpo_job["first"]
    charts = dict(grpo_job["charts"])
    # one series per reward function plus the weighted total, each with a point per step
    assert charts["Reward"] == 3 * GRPO_STEPS, charts
    for title in ("KL", "Loss", "Accuracy", "Completion length", "Step time (s)"):
        assert charts.get(title, 0) >= GRPO_STEPS, (title, charts)
    # the held-out series: accuracy and its CI bounds at steps 12, 24, 36 and 48
    assert charts["Held-out accuracy (95% CI)"] == 3 * (GRPO_STEPS // SAMPLE_EVERY), charts
    # sampled completions every SAMPLE_EVERY steps; the newest step's shown, the others one click away
    assert grpo_job["sample_steps"] == [str(s) for s in range(GRPO_STEPS, 0, -SAMPLE_EVERY)]
    assert len(grpo_job["samples"]) >= 4 and set(grpo_job["samples"]) == {str(GRPO_STEPS)}
    assert "checkpoint" in grpo_job["checkpoints"] and "final" in grpo_job["checkpoints"]
    assert "started" in grpo_job["events"] and "succeeded" in grpo_job["events"]
    assert '"num_generations": 4' in grpo_job["config"] and '"beta"' in grpo_job["config"]


@pytest.mark.slow
def test_the_job_page_follows_the_stream_instead_of_polling(grpo_job: dict[str, Any]) -> None:
    """Issue 20.7: the page polled five endpoints every 2 s. Now, after reading the history once,
    it follows the job's event stream, which carries the metric points too: while the charts
    gained points, the page asked the API for nothing (a status event may re-read the job)."""
    assert grpo_job["later"] > grpo_job["first"]
    asked = [u.split("?")[0] for u in grpo_job["requests_while_watched"]]
    polled = [u for u in asked if not re.search(r"/v1/jobs/[\w-]+(/samples)?$", u)]
    assert polled == [], polled
    # completions only when the steps reach a sampled one (every SAMPLE_EVERY steps)
    steps = (grpo_job["later"] - grpo_job["first"]) // 3  # three reward series: a point each per step
    assert sum(u.endswith("/samples") for u in asked) <= steps // SAMPLE_EVERY + 1, asked
    # the stream is read with fetch and the key in the Authorization header, never in the URL
    url, authorization = grpo_job["streams"][0]
    assert "metrics=true" in url and authorization == f"Bearer {grpo_job['key']}"
    assert grpo_job["key"] not in url


@pytest.mark.slow
def test_compare_view_overlays_runs_and_diffs_their_hyperparameters(
    service: Service, project: tuple[str, Any], grpo_job: dict[str, Any], page: Any, shots: Path
) -> None:
    key, _ = project
    done, live = grpo_job["id"], grpo_job["live_id"]
    sign_in(page, f"{service.url}/ui", key)
    wait_for(lambda: {done, live} <= {r["jobId"] for r in job_rows(page)}, 10, what="both GRPO jobs listed")
    assert page.is_disabled("#compare")
    page.check(f"tr[data-job-id='{done}'] input[name=pick]")
    page.check(f"tr[data-job-id='{live}'] input[name=pick]")
    page.click("#compare")
    page.wait_for_url("**/ui/compare?jobs=*")
    page.wait_for_selector("main[data-loaded=true]")
    assert set(page.url.split("jobs=")[1].split(",")) == {done, live}
    charts = dict(page.eval_on_selector_all(".chart", "els => els.map(e => [e.dataset.chart, +e.dataset.points])"))
    assert set(charts) == {"Reward", "Loss", "KL", "Accuracy", "Held-out accuracy"}, charts
    held = charts.pop("Held-out accuracy")  # only the finished run scored a held-out set
    assert held == GRPO_STEPS // SAMPLE_EVERY and done[-8:] in page.inner_text(
        ".chart[data-chart='Held-out accuracy'] .legend"
    )
    for title in charts:  # both runs' curves in every panel: the finished run's 48 steps and the live run's
        legend = page.inner_text(f".chart[data-chart='{title}'] .legend")
        assert done[-8:] in legend and live[-8:] in legend, (title, legend)
        assert charts[title] > GRPO_STEPS, (title, charts)
    rows = "rows => rows.map(r => [r.dataset.param, r.dataset.diff])"
    diff = dict(page.eval_on_selector_all("#params tbody tr", rows))
    assert diff["max_steps"] == "true" and diff["save_steps"] == "true" and diff["name"] == "true"
    assert diff["learning_rate"] == "false" and diff["num_generations"] == "false"
    assert page.inner_text("#params tr[data-param='max_steps']").split("\t")[1:] in (
        [str(GRPO_STEPS), str(LIVE_STEPS)],
        [str(LIVE_STEPS), str(GRPO_STEPS)],
    )
    shoot(page, shots, "compare")
    page.check("#onlydiff")
    shown = page.eval_on_selector_all("#params tbody tr", "rows => rows.map(r => r.dataset.diff)")
    assert shown and set(shown) == {"true"}


@pytest.mark.slow
def test_cancel_and_resubmit_from_the_job_page(
    service: Service, project: tuple[str, Any], page: Any, shots: Path
) -> None:
    key, c = project
    job = c.jobs.create({"kind": "eval", "model": "org/model", "limit": 5, "name": "to cancel", **PARKED})
    sign_in(page, f"{service.url}/ui/jobs/{job.id}", key)
    assert page.get_attribute("#status .badge", "data-status") == "queued"
    page.wait_for_selector("main[data-streaming=true]")  # following the stream of a queued job
    page.click("#cancel")
    assert "again" in page.inner_text("#cancel")  # one click only arms it
    page.click("#cancel")
    page.wait_for_selector("#status .badge[data-status=cancelled]")
    assert c.jobs.retrieve(job.id).status == "cancelled" and page.is_hidden("#cancel")
    shoot(page, shots, "job-cancelled")
    page.click("#resubmit")
    page.wait_for_url(re.compile(r".*/ui/jobs/(?!" + job.id + r")[\w-]+$"))
    page.wait_for_selector("main[data-loaded=true]")
    copy_id = page.url.rsplit("/", 1)[1]
    copy = c.jobs.retrieve(copy_id)
    assert copy.status == "queued" and copy.name == "to cancel (copy)"
    assert {k: v for k, v in copy.spec.items() if k != "name"} == {k: v for k, v in job.spec.items() if k != "name"}
    c.jobs.cancel(copy_id)


@pytest.mark.slow
def test_a_read_only_key_cannot_cancel_from_the_page(service: Service, project: tuple[str, Any], page: Any) -> None:
    key, c = project
    job = c.jobs.create({"kind": "eval", "model": "org/model", "limit": 5, **PARKED})
    read_only = c.request("POST", "/v1/keys", json={"scopes": ["read"]})["key"]  # the project's own key makes it
    sign_in(page, f"{service.url}/ui/jobs/{job.id}", read_only)
    page.click("#cancel")
    page.click("#cancel")
    page.wait_for_selector("#actionnotice .notice")
    assert "Cancel refused" in page.inner_text("#actionnotice") and "submit" in page.inner_text("#actionnotice")
    assert c.jobs.retrieve(job.id).status == "queued"
    c.jobs.cancel(job.id)


@pytest.mark.slow
def test_the_pages_streams_count_under_the_per_key_limit(service: Service, browser: Any, tmp_path: Path) -> None:
    """limits.max_streams_per_key (2 on this API process): a page following a job holds one."""
    api = Service(env={**service.env, "MATHRL_LIMITS__MAX_STREAMS_PER_KEY": "2"}, logs=tmp_path, port=free_port())
    api.start_api()
    try:
        key = api.key()
        c = api.client(key)
        job = c.jobs.create({"kind": "eval", "model": "org/model", "limit": 5, **PARKED})  # stays queued
        ctx = browser.new_context()
        pg = ctx.new_page()
        sign_in(pg, f"{api.url}/ui/jobs/{job.id}", key)
        pg.wait_for_selector("main[data-streaming=true]")
        h = {"Authorization": f"Bearer {key}"}
        url = f"{api.url}/v1/jobs/{job.id}/events/stream"
        with httpx.stream("GET", url, headers=h, timeout=httpx.Timeout(10, read=None)) as second:
            assert second.status_code == 200
            third = httpx.get(url, headers=h, timeout=10)
            assert third.status_code == 429 and third.headers["retry-after"], third.text
            assert "2 open event streams" in third.json()["detail"] and "status page" in third.json()["detail"]
        ctx.close()  # the page's stream and the second one end: their count is given back
        wait_for(lambda: _opens(url, h), 15, 0.5, "a stream admitted once the others closed")
        c.jobs.cancel(job.id)
    finally:
        api.stop_api()


def _opens(url: str, headers: dict[str, str]) -> bool:
    with httpx.stream("GET", url, headers=headers, timeout=httpx.Timeout(10, read=None)) as r:
        return r.status_code == 200


@pytest.mark.slow
def test_scores_page_shows_stored_scores(
    service: Service, project: tuple[str, Any], grpo_job: dict[str, Any], page: Any, shots: Path
) -> None:
    key, c = project
    gid = grpo_job["id"]
    models = [TINY, f"job:{gid}@step-{SAVE_STEPS}", f"job:{gid}"]  # before, a checkpoint, the final model
    for m in models:  # one after the other: the scores' order is the models' order
        job = c.jobs.create(
            {
                "kind": "eval",
                "model": m,
                "benchmark": "arith",
                "limit": 40,
                "batch_size": 40,
                "sampling": {"max_new_tokens": 5},
            }
        )
        done = c.jobs.wait(job.id, timeout=300)
        assert done.status == "succeeded", done.error
    scores = c.scores.list()
    acc = {s.model_ref: s for s in scores if s.metric == "accuracy"}
    assert set(models) <= set(acc)

    # the step charts wait on their job's checkpoints: the page is loaded only once they are drawn,
    # however slow that answer (here the browser holds it back two seconds)
    page.add_init_script(
        "const f = window.fetch; window.fetch = (u, o) => /checkpoints/.test(String(u))"
        " ? new Promise((ok) => setTimeout(ok, 2000)).then(() => f(u, o)) : f(u, o);"
    )
    sign_in(page, f"{service.url}/ui/scores", key)
    board = page.eval_on_selector_all(
        "#leaderboard tbody tr", "rows => rows.map(r => [r.dataset.model, r.cells[2].innerText])"
    )
    assert {m: v for m, v in board} == {m: f"{100 * acc[m].value:.1f}%" for m in models}
    # before/after: the first and the newest model scored by default, any two on request
    assert page.input_value("#before") == TINY and page.input_value("#after") == f"job:{gid}"
    row = page.inner_text("#compare tbody tr")
    assert "arith" in row and f"{100 * acc[TINY].value:.1f}%" in row and " pt" in row
    page.select_option("#after", f"job:{gid}@step-{SAVE_STEPS}")
    assert f"{100 * acc[f'job:{gid}@step-{SAVE_STEPS}'].value:.1f}%" in page.inner_text("#compare tbody tr")
    # score over training steps: the starting model (step 0), the checkpoint and the final model
    steps = page.eval_on_selector_all("#steps .chart", "els => els.map(e => +e.dataset.points)")
    assert steps == [3], steps
    shoot(page, shots, "scores")
    # another metric: the leaderboard follows the select, best first
    tokens = {s.model_ref: s.value for s in scores if s.metric == "mean_completion_tokens"}
    page.select_option("#metric", "mean_completion_tokens")
    board = page.eval_on_selector_all(
        "#leaderboard tbody tr", "rows => rows.map(r => [r.dataset.model, r.cells[2].innerText])"
    )
    assert [m for m, _ in board] == sorted(tokens, key=lambda m: -tokens[m])
    for m, text in board:
        assert float(text) == pytest.approx(tokens[m], rel=1e-3)


@pytest.mark.slow
def test_another_projects_key_sees_nothing(service: Service, grpo_job: dict[str, Any], page: Any, shots: Path) -> None:
    other = service.key()
    sign_in(page, f"{service.url}/ui", other)
    assert job_rows(page) == [] and page.is_visible("#empty")
    shoot(page, shots, "other-project-jobs")
    page.goto(f"{service.url}/ui/jobs/{grpo_job['id']}")  # the key is remembered for the session
    page.wait_for_selector("#notfound")
    assert "not found" in page.inner_text("#notfound").lower()
    assert page.query_selector(".chart") is None
    shoot(page, shots, "other-project-job")
    page.goto(f"{service.url}/ui/scores")
    page.wait_for_selector("#noscores")
    assert page.query_selector("#leaderboard") is None


@pytest.mark.slow
def test_a_refused_key_brings_back_the_form(service: Service, page: Any) -> None:
    page.goto(f"{service.url}/ui/scores")
    page.fill("#keyform input[name=key]", "mrl_not-a-key")
    page.click("#keyform button[type=submit]")
    page.wait_for_selector("#keyform .notice")
    assert "refused" in page.inner_text("#keyform")
    assert page.evaluate("sessionStorage.getItem('mathrl.key')") is None


@pytest.mark.slow
def test_pipeline_page_draws_the_graph(service: Service, project: tuple[str, Any], page: Any, shots: Path) -> None:
    key, c = project
    r = c.request(
        "POST",
        "/v1/pipelines",
        json={
            "name": "web dag",
            "jobs": {
                "sft": {"kind": "sft", "model": TINY, "dataset": {"name": "arith", "split": "train"}, **PARKED},
                "grpo": {"kind": "grpo", "model": "job:sft", "dataset": {"name": "arith", "split": "train"}, **PARKED},
                "eval-sft": {"kind": "eval", "model": "job:sft", "benchmark": "arith", **PARKED},
                "eval-grpo": {"kind": "eval", "model": "job:grpo", "benchmark": "arith", **PARKED},
            },
        },
    )
    pid = r["id"]
    job_of = {j["step"]: j["job_id"] for j in r["jobs"]}
    sign_in(page, f"{service.url}/ui/pipelines/{pid}", key)
    shoot(page, shots, "pipeline")
    nodes = page.eval_on_selector_all("#dag g.node", "gs => gs.map(g => [g.dataset.step, g.dataset.status])")
    assert dict(nodes) == {"sft": "queued", "grpo": "waiting", "eval-sft": "waiting", "eval-grpo": "waiting"}
    # columns by depth: sft, then grpo and eval-sft, then eval-grpo
    x = {s: float(page.get_attribute(f"#dag g.node[data-step='{s}'] rect", "x")) for s in job_of}
    assert x["sft"] < x["grpo"] == x["eval-sft"] < x["eval-grpo"]
    assert len(page.query_selector_all("#dag path[marker-end]")) == 3  # sft->grpo, sft->eval-sft, grpo->eval-grpo
    page.click("#dag g.node[data-step='grpo']")
    page.wait_for_url(f"**/ui/jobs/{job_of['grpo']}")
    page.wait_for_selector("main[data-loaded=true]")
    assert page.get_attribute("#status .badge", "data-status") == "waiting"
    page.goto(f"{service.url}/ui/pipelines")
    page.wait_for_selector(f"tr[data-pipeline-id='{pid}']")
    shoot(page, shots, "pipelines")


@pytest.mark.slow
def test_the_job_page_picks_its_stream_up_again_after_an_api_restart(
    service: Service, browser: Any, tmp_path: Path
) -> None:
    api = Service(env=dict(service.env), logs=tmp_path, port=free_port())
    api.start_api()
    try:
        key = api.key()
        c = api.client(key)
        job = c.jobs.create({"kind": "eval", "model": "org/model", "limit": 5, **PARKED})
        ctx = browser.new_context()
        pg = ctx.new_page()
        sign_in(pg, f"{api.url}/ui/jobs/{job.id}", key)
        pg.wait_for_selector("main[data-streaming=true]")
        api.stop_api()
        pg.wait_for_selector("#livenotice .notice")  # the page says so, and keeps trying
        assert "interrupted" in pg.inner_text("#livenotice")
        api.start_api()
        pg.wait_for_selector("main[data-streaming=true]", timeout=30_000)
        wait_for(lambda: pg.inner_text("#livenotice") == "", 10, what="the notice gone once the stream is back")
        c.jobs.cancel(job.id)  # seen through the new stream
        pg.wait_for_selector("#status .badge[data-status=cancelled]")
        ctx.close()
    finally:
        api.stop_api()
