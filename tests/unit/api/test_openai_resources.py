"""The OpenAI resources that are views over jobs (api/openai/resource.py): each says what every job
status is in its own words, so a status added to mathrl/status.py cannot leave one answering a
KeyError (a 500) or a made-up word."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.quick


def test_every_job_backed_resource_names_every_job_status() -> None:
    import importlib
    import pkgutil

    import api.routers
    from api.openai.resource import JobResource
    from api.routers.openai_evals import STATUS as EVAL_RUN_STATUS
    from mathrl.status import STATUSES

    found = {}
    for info in pkgutil.iter_modules(api.routers.__path__):
        module = importlib.import_module(f"api.routers.{info.name}")
        found |= {f"{info.name}.{k}": v for k, v in vars(module).items() if isinstance(v, JobResource)}
    assert {name.split(".")[0] for name in found} >= {"openai_batches", "openai_fine_tuning", "openai_responses"}
    for name, resource in found.items():
        assert set(resource.statuses) == set(STATUSES), (name, set(STATUSES) ^ set(resource.statuses))
    assert set(EVAL_RUN_STATUS) == set(STATUSES)
