"""/ui: the status pages (job list, job, compare, pipelines, scores) and their static files.

The HTML routes need no key: each page is the same shell naming its script, and every
datum comes from the authorized JSON API. Static files are read once at import, served
from memory with an ETag (`no-cache`: the browser revalidates, a 304 costs nothing)."""

from __future__ import annotations

import hashlib
import json
from html import escape
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from api.problems import problem_response
from mathrl.specs import JOB_KINDS
from mathrl.status import as_json as status_as_json

router = APIRouter(include_in_schema=False)

STATIC_DIR = Path(__file__).parent / "static"
_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8", ".txt": "text/plain"}
STATIC: dict[str, tuple[bytes, str, str]] = {
    p.name: (p.read_bytes(), _TYPES[p.suffix], '"' + hashlib.sha256(p.read_bytes()).hexdigest()[:16] + '"')
    for p in sorted(STATIC_DIR.iterdir())
    if p.suffix in _TYPES
}
VERSION = hashlib.sha256(b"".join(etag.encode() for _, _, etag in STATIC.values())).hexdigest()[:10]
SECURITY_HEADERS = {
    # the key lives in sessionStorage: no script but ours, no framing
    "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

SHELL = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · mathrl</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/ui/static/style.css?v={version}">
</head>
<body data-page="{page}">
<header class="top">
  <a class="brand" href="/ui">mathrl</a>
  <nav><a href="/ui" data-nav="jobs">Jobs</a><a href="/ui/pipelines" data-nav="pipelines">Pipelines</a>\
<a href="/ui/scores" data-nav="scores">Scores</a></nav>
  <span id="who"></span>
</header>
<main id="main"><noscript>These pages need JavaScript.</noscript><p class="muted" id="loading">Loading…</p></main>
<script type="application/json" id="mathrl-status">{status}</script>
<script type="module" src="/ui/static/{page}.js?v={version}"></script>
</body>
</html>
"""


# the job statuses and their moves, as mathrl.status defines them, and the job kinds
# (mathrl.specs.JOB_KINDS), which common.js reads: the
# pages keep no copy of their own; "<" escaped so that the JSON cannot close the script element
STATUS_JSON = json.dumps({**status_as_json(), "kinds": list(JOB_KINDS)}).replace("<", "\\u003c")


def _page(page: str, title: str) -> HTMLResponse:
    html = SHELL.format(title=escape(title), page=page, version=VERSION, status=STATUS_JSON)
    return HTMLResponse(html, headers={**SECURITY_HEADERS, "Cache-Control": "no-cache"})


@router.get("/")
def root() -> RedirectResponse:
    return RedirectResponse("/ui", status_code=307)


@router.get("/ui")
def jobs_page() -> HTMLResponse:
    return _page("jobs", "Jobs")


@router.get("/ui/jobs/{job_id}")
def job_page(job_id: str) -> HTMLResponse:
    return _page("job", f"Job {job_id[-8:]}")


@router.get("/ui/pipelines")
def pipelines_page() -> HTMLResponse:
    return _page("pipelines", "Pipelines")


@router.get("/ui/pipelines/{pipeline_id}")
def pipeline_page(pipeline_id: str) -> HTMLResponse:
    return _page("pipeline", f"Pipeline {pipeline_id[-8:]}")


@router.get("/ui/scores")
def scores_page() -> HTMLResponse:
    return _page("scores", "Scores")


@router.get("/ui/compare")
def compare_page() -> HTMLResponse:
    return _page("compare", "Compare runs")


@router.get("/ui/static/{name}")
def static_file(name: str, request: Request) -> Response:
    hit = STATIC.get(name)
    if hit is None:
        return problem_response(404, "Not found", f"No static file '{name}' in the status pages.", request.url.path)
    body, media_type, etag = hit
    headers = {"ETag": etag, "Cache-Control": "no-cache", **SECURITY_HEADERS}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    return Response(body, media_type=media_type, headers=headers)
