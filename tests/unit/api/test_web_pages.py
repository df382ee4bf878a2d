"""The status pages served, with no browser: pages and files without a key, the job statuses and
kinds from the server (the pages in Chromium: tests/system/test_web.py)."""

from __future__ import annotations

import re
from typing import Any

import pytest


@pytest.mark.quick
def test_pages_and_their_files_are_served_without_a_key(app_client: Any) -> None:
    """The HTML holds no data, so it needs no key; static files revalidate by ETag; every
    module a page imports is one the server has."""
    from api.web.router import STATIC

    for path, script in [
        ("/ui", "jobs"),
        ("/ui/jobs/x", "job"),
        ("/ui/pipelines", "pipelines"),
        ("/ui/pipelines/x", "pipeline"),
        ("/ui/scores", "scores"),
        ("/ui/compare", "compare"),
    ]:
        r = app_client.get(path)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert (
            f'src="/ui/static/{script}.js?v=' in r.text
            and "frame-ancestors 'none'" in r.headers["content-security-policy"]
        )
    r = app_client.get("/ui/static/chart.js")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/javascript")
    assert app_client.get("/ui/static/chart.js", headers={"If-None-Match": r.headers["etag"]}).status_code == 304
    missing = app_client.get("/ui/static/nope.js")
    assert missing.status_code == 404 and missing.headers["content-type"] == "application/problem+json"
    for name, (body, _, _) in STATIC.items():
        for imported in re.findall(r'from "\./([\w.]+)"', body.decode()):
            assert imported in STATIC, f"{name} imports {imported}, which is not served"


@pytest.mark.quick
def test_pages_get_the_job_statuses_and_kinds_from_the_server(app_client: Any) -> None:
    """The shell carries mathrl.status's definition and mathrl.specs' job kinds, and no page
    script spells them out (their own copies had drifted: the kind filter lacked 'grade')."""
    import html as html_lib
    import json

    from api.web.router import STATIC
    from mathrl.specs import JOB_KINDS
    from mathrl.status import as_json

    r = app_client.get("/ui")
    found = re.search(r'<script type="application/json" id="mathrl-status">(.*?)</script>', r.text)
    assert found and json.loads(html_lib.unescape(found.group(1))) == {**as_json(), "kinds": list(JOB_KINDS)}
    assert "grade" in JOB_KINDS
    for name, (body, _, _) in STATIC.items():
        text = body.decode()
        assert not re.search(r'"succeeded",\s*"failed"|"failed",\s*"cancelled"', text), f"{name} lists statuses itself"
        assert not re.search(r'"eval",\s*"sft"|"grpo",\s*"reward_model"', text), f"{name} lists job kinds itself"
