"""Each job kind's home (kinds/): one per kind of the SDK's `AnySpec`, each implementing every hook,
with the resolved-config model its kind stores; the hooks the API and the worker call give what
each kind needs."""

from __future__ import annotations

from typing import Any

import pytest

from kinds import HOMES, Data, Kind, Needs, home, resolve_config, training_of
from mathrl.specs import JOB_KINDS, KINDS, parse_spec
from mathrl.specs.resolved import RESOLVED, ResolvedConfig

pytestmark = pytest.mark.quick

GRPO = {"kind": "grpo", "model": "/m", "dataset": {"name": "math-train"}}


def test_every_kind_has_one_home_with_every_hook() -> None:
    assert tuple(HOMES) == JOB_KINDS  # the same kinds, in the same order
    for name, kind in HOMES.items():
        assert kind.spec is KINDS[name], name
        assert kind.config is RESOLVED.get(name, ResolvedConfig), name
        assert not getattr(type(kind), "__abstractmethods__", None), name
    with pytest.raises(ValueError, match="unknown job kind 'gpro'. Did you mean 'grpo'"):
        HOMES["gpro"]


def test_a_home_that_misses_a_hook_cannot_be_made() -> None:
    class Toy(Kind[Any, Any]):  # every hook but `needs`
        def resolve(self, spec: Any) -> Any: ...
        def admit(self, spec: Any, config: Any, settings: Any) -> None: ...
        def limits(self, spec: Any, config: Any) -> list[Any]: ...
        def memory(self, config: Any) -> Any: ...
        def run(self, run: Any) -> None: ...

    with pytest.raises(TypeError, match="needs"):
        Toy()  # type: ignore[abstract]


def test_what_each_kind_needs_from_the_worker() -> None:
    def needs(spec: dict[str, Any]) -> Needs:
        parsed = parse_spec(spec)
        return home(parsed).needs(parsed)

    assert needs({**GRPO, "resources": {"gpus": 4}}) == Needs(GRPO["model"], training=True, processes=4, world=4)
    server = needs(
        {**GRPO, "resources": {"gpus": 4}, "generation": {"backend": "vllm", "mode": "server"}, "deepspeed_zero3": True}
    )
    assert (server.processes, server.world, server.vllm_server, server.deepspeed) == (3, 3, True, True)
    assert server.vllm_field == "generation.backend"
    assert needs({"kind": "eval", "model": "org/m"}) == Needs("org/m")
    assert needs({"kind": "eval", "model": "org/m", "backend": "vllm"}) == Needs(
        "org/m", engine_model="org/m", vllm_field="backend"
    )
    assert needs({"kind": "generate", "model": "org/m", "prompt": "2+2=", "backend": "auto"}).engine_model == "org/m"
    sft = needs({"kind": "sft", "model": "/m", "dataset": {"name": "math-train"}, "resources": {"processes": 2}})
    assert sft == Needs("/m", training=True, processes=2, world=2)
    judge = {"type": "score_model", "name": "j", "model": "org/judge", "input": [{"role": "user", "content": "x"}]}
    grade = {"kind": "grade", "grader": judge, "items": [{"completion": "4", "answer": "4"}], "backend": "auto"}
    assert needs(grade) == Needs(None, engine_model="org/judge")
    # a Tinker session samples on a warm engine of its base only where one is idle, its adapters loaded
    # there; not with an lm_head adapter (vLLM refuses it), and not on a GPU (the engine is stopped)
    session = {"kind": "session", "model": "org/m", "session": "s", "lora_rank": 8, "train_unembed": False}
    assert needs(session).engine_model is None  # sessions.warm_engine is off by default
    session["warm_engine"] = True
    assert needs(session) == Needs("org/m", engine_model="org/m", engine_if_warm=True, engine_lora_rank=8)
    assert needs({**session, "train_unembed": True}).engine_model is None
    assert needs({**session, "resources": {"gpus": 1}}).engine_model is None


def test_the_data_each_kind_reads() -> None:
    def data(spec: dict[str, Any]) -> Data:
        parsed = parse_spec(spec)
        return home(parsed).data(parsed)

    heldout = {"benchmark": "gsm8k", "every": 2}
    grpo = data({**GRPO, "eval": heldout})
    assert (grpo.dataset.name if grpo.dataset else None, grpo.heldout is not None, grpo.benchmark) == (
        "math-train",
        True,
        None,
    )
    assert data({"kind": "eval", "model": "org/m", "benchmark": "math500"}) == Data(benchmark="math500")
    user_set = data({"kind": "eval", "model": "org/m", "dataset": {"path": "/d/q.jsonl"}})
    assert user_set.benchmark is None and user_set.dataset is not None and user_set.dataset.path == "/d/q.jsonl"
    assert data({"kind": "generate", "model": "org/m", "prompt": "2+2="}) == Data()


def test_only_kinds_that_train_on_gpus_have_a_memory_plan() -> None:
    grpo = resolve_config(parse_spec({**GRPO, "resources": {"gpus": 1}, "beta": 0.04}))
    plan = training_of(grpo)
    assert plan.reference_model and plan.vllm_fraction == 0.3 and plan.seq_len == 1024
    sft = training_of(resolve_config(parse_spec({"kind": "sft", "model": "/m", "dataset": {"name": "math-train"}})))
    assert sft.seq_len == 1024 and sft.vllm_fraction == 0
    with pytest.raises(ValueError, match="no memory plan for 'eval' jobs"):
        training_of(resolve_config(parse_spec({"kind": "eval", "model": "org/m"})))


def test_limits_name_the_fields_they_hold() -> None:
    grpo = parse_spec({**GRPO, "num_generations": 4, "max_steps": 7})
    limits = {limit.pointer: (limit.value, limit.limit) for limit in home(grpo).limits(grpo, resolve_config(grpo))}
    assert limits["/max_steps"] == (7, "max_steps") and limits["/num_generations"] == (4, "max_generations_per_step")
    assert limits["/max_completion_length"] == (1024, "max_tokens")
