"""Job specs and GRPO preset resolution (no service needed)."""

from __future__ import annotations

from typing import Any, get_args

import pytest
from pydantic import ValidationError

from kinds import resolve_config
from mathrl.specs import GRPOSpec, parse_spec
from mathrl.specs.grpo import TRL_DEFAULTS
from mathrl.specs.presets import PRESETS, resolve_grpo

pytestmark = pytest.mark.quick

DATASET = {"name": "gsm8k-train"}


def test_deepseekmath_preset_resolves_to_the_paper_values() -> None:
    spec = GRPOSpec(model="org/m", preset="deepseekmath", dataset=DATASET, resources={"gpus": 8})
    r = resolve_grpo(spec)
    assert (r["learning_rate"], r["beta"], r["num_generations"]) == (1e-6, 0.04, 64)
    assert (r["max_completion_length"], r["global_batch_size"], r["num_iterations"]) == (1024, 1024, 1)
    assert r["loss_type"] == "grpo"
    # 1024 completions = 16 per device x 8 GPUs x 8 accumulation steps; 16 questions of 64 each
    assert r["gradient_accumulation_steps"] == 8 and r["questions_per_step"] == 16


def test_explicit_fields_override_the_preset_and_config_stores_values() -> None:
    spec = GRPOSpec(
        model="org/m",
        preset="deepseekmath",
        dataset=DATASET,
        beta=0.0,
        num_generations=8,
        global_batch_size=64,
        per_device_train_batch_size=8,
    )
    cfg = resolve_config(spec)
    assert cfg.beta == 0.0 and cfg.num_generations == 8 and cfg.learning_rate == 1e-6
    assert cfg.preset == "deepseekmath" and cfg.gradient_accumulation_steps == 8


def test_trl_default_preset_is_trls_defaults() -> None:
    r = resolve_grpo(GRPOSpec(model="org/m", dataset=DATASET))
    assert r["beta"] == 0.0 and r["num_generations"] == 8 and r["loss_type"] == "dapo"
    assert PRESETS["trl-default"] == {}


def test_every_knob_is_declared_once() -> None:
    """A GRPO knob is one declaration on the spec (help, bounds, TRL's default); the preset is values
    over it, and the resolved config reuses its help and types it as the run uses it."""
    from typing import get_args

    from mathrl.specs.base import knob_help
    from mathrl.specs.resolved import ResolvedGRPO

    for knob in TRL_DEFAULTS:
        spec_field, resolved_field = GRPOSpec.model_fields[knob], ResolvedGRPO.model_fields[knob]
        assert spec_field.default is None and "TRL's default (" in (spec_field.description or ""), knob
        assert resolved_field.description is not None
        assert resolved_field.description.startswith(knob_help(GRPOSpec, knob)), knob
        given = {a for a in get_args(spec_field.annotation) if a is not type(None)}
        assert given <= {resolved_field.annotation, *get_args(resolved_field.annotation)}, knob
    for preset in PRESETS.values():
        assert set(preset) <= set(TRL_DEFAULTS)  # values over declared knobs only


def test_trl_defaults_match_installed_trl() -> None:
    trl = pytest.importorskip("trl")
    cfg = trl.GRPOConfig(output_dir="/tmp/mathrl-trl-check", use_cpu=True, bf16=False, report_to=[])
    for knob, value in TRL_DEFAULTS.items():
        if knob in ("global_batch_size", "max_prompt_length", "warmup_ratio"):
            continue  # ours: TRL has no such field
        assert getattr(cfg, knob) == value, knob


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({"num_generations": 1}, "num_generations", "at least 2"),
        ({"beta": -0.1}, "beta", "must be >= 0"),
        ({"num_generations": 6}, "num_generations", "multiple of 6"),
        ({"global_batch_size": 12, "per_device_train_batch_size": 8}, "global_batch_size", "multiple"),
        ({"lora": {"enabled": False, "r": 8}}, "r", "enabled=true"),
        ({"vllm_mode": "server"}, "vllm_mode", "generation.backend='vllm'"),
        (
            {"generation": {"gpu_memory_utilization": 0.5}},
            "generation/gpu_memory_utilization",
            "MATHRL_VLLM__CPU_KV_GIB",
        ),
        ({"generation": {"backend": "vllm", "tensor_parallel_size": 2}}, "generation/tensor_parallel_size", "divide"),
        (
            {"generation": {"backend": "hf", "tensor_parallel_size": 2}, "resources": {"processes": 2}},
            "generation/tensor_parallel_size",
            "backend='vllm'",
        ),
        ({"use_vllm": True, "generation": {"backend": "vllm"}}, "use_vllm", "only generation.backend"),
        ({"generation": {"backend": "vllm", "mode": "server"}}, "generation/mode", "add a 'lora' block"),
        ({"generation": {"backend": "hf", "mode": "server"}, "lora": {}}, "generation/mode", "backend='vllm'"),
        (
            {"generation": {"backend": "vllm", "mode": "server"}, "lora": {"r": 1024}, "resources": {"gpus": 2}},
            "lora/r",
            "takes ranks up to 512",
        ),
        (
            {"generation": {"mode": "server", "server_gpus": 2}, "resources": {"gpus": 2}},
            "generation/server_gpus",
            "leaves no GPU",
        ),
        ({"generation": {"server_gpus": 1}, "resources": {"gpus": 2}}, "generation/server_gpus", "mode 'server'"),
        ({"epsilon": 0.2, "delta": 1.1}, "delta", "exceed"),
        (
            {"algorithm": "async", "beta": 0.04, "lora": {}, "generation": {"backend": "vllm", "mode": "server"}},
            "beta",
            "not a setting of async GRPO",
        ),
        (
            {
                "algorithm": "async",
                "preset": "deepseekmath",
                "lora": {},
                "generation": {"backend": "vllm", "mode": "server"},
            },
            "preset",
            "algorithm='sync'",
        ),
        ({"max_staleness": 2}, "max_staleness", "algorithm='async'"),
        ({"algorithm": "async"}, "algorithm", "mode='server'"),
        ({"deepspeed_zero3": True}, "deepspeed_zero3", "gpus >= 2"),
        (
            {"rewards": [{"name": "format"}], "dynamic_sampling": {"metric": "correct"}},
            "dynamic_sampling/metric",
            "use metric 'reward'",
        ),
        ({"rewards": [{"name": "format"}], "curriculum": True}, "curriculum", "needs an accuracy or binary reward"),
        (
            {"curriculum": {}, "num_generations": 8, "per_device_train_batch_size": 4, "resources": {"processes": 2}},
            "curriculum",
            "whole groups",
        ),
        (
            {
                "algorithm": "async",
                "dynamic_sampling": True,
                "lora": {},
                "generation": {"backend": "vllm", "mode": "server"},
            },
            "dynamic_sampling",
            "own rollout worker",
        ),
        ({"generation": {"backend": "vllm", "overlap": True}}, "generation/overlap", "set generation.backend='hf'"),
        ({"generation": {"overlap": True}, "resources": {"gpus": 1}}, "generation/overlap", "generates with vllm"),
        ({"generation": {"hf_mode": "continuous", "overlap": True}}, "generation/overlap", "paged cache"),
        (
            {"generation": {"backend": "hf", "overlap": True}, "deepspeed_zero3": True, "resources": {"gpus": 2}},
            "generation/overlap",
            "ZeRO-3",
        ),
        ({"generation": {"overlap": True}, "dynamic_sampling": True}, "generation/overlap", "set dynamic_sampling"),
        ({"generation": {"overlap": True}, "curriculum": {}}, "generation/overlap", "set curriculum: false"),
        ({"generation": {"overlap": True}, "num_iterations": 2}, "generation/overlap", "set num_iterations: 1"),
    ],
)
def test_impossible_grpo_settings_say_how_to_fix(spec: dict, field: str, words: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_spec({"kind": "grpo", "model": "org/m", "dataset": DATASET, **spec})
    err = info.value.errors()[0]
    assert getattr(err["ctx"]["error"], "field", None) == field or field in err["loc"]
    assert words in err["msg"]


def test_grpo_refuses_a_backend_its_trainer_cannot_generate_with(monkeypatch: pytest.MonkeyPatch) -> None:
    """A backend declared without TRL's way of generating (mathrl/backends.py `BackendInfo.trl`) is
    refused by GRPO, naming the field and the backends it runs, where it once ran on hf quietly;
    the trainer's own reading of the registry refuses it too."""
    from mathrl.backends import GENERATION_BACKENDS, BackendInfo, trl_uses_vllm

    assert trl_uses_vllm("vllm") and not trl_uses_vllm("hf")
    toy = BackendInfo("hf", vllm=False, description="an engine for eval and generate only", trl=None)
    monkeypatch.setitem(GENERATION_BACKENDS._entries, "hf", toy)  # the same name, so the specs' choices accept it
    with pytest.raises(ValidationError) as info:
        parse_spec({"kind": "grpo", "model": "org/m", "dataset": DATASET, "generation": {"backend": "hf"}})
    err = info.value.errors()[0]
    assert err["ctx"]["error"].field == "generation/backend"
    assert "cannot generate with the 'hf' backend" in err["msg"] and "('vllm', or 'auto')" in err["msg"]
    # a CPU job's 'auto' resolves to it as well, and is refused the same way
    with pytest.raises(ValidationError, match="cannot generate with the 'hf' backend"):
        parse_spec({"kind": "grpo", "model": "org/m", "dataset": DATASET})
    with pytest.raises(ValueError, match="cannot generate with the 'hf' backend"):
        trl_uses_vllm("hf")
    # eval jobs still take it: only GRPO's trainer needs TRL to run it
    assert parse_spec({"kind": "eval", "model": "org/m", "benchmark": "gsm8k", "backend": "hf"}).backend == "hf"


def test_a_generate_job_refuses_a_backend_that_answers_no_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """A backend declared without a way to answer a generate job's calls (`BackendInfo.chats`) is
    refused by the generate spec, naming the field, where evaluator/chat.py would have answered on
    transformers quietly; eval jobs still take it."""
    from mathrl.backends import GENERATION_BACKENDS, BackendInfo

    chat = {"kind": "generate", "model": "org/m", "messages": [{"role": "user", "content": "2+2?"}]}
    assert parse_spec({**chat, "backend": "hf"}).backend == "hf"
    toy = BackendInfo("hf", vllm=False, description="an engine for eval jobs only", trl="transformers", chats=None)
    monkeypatch.setitem(GENERATION_BACKENDS._entries, "hf", toy)  # the same name, so the specs' choices accept it
    with pytest.raises(ValidationError) as info:
        parse_spec({**chat, "backend": "hf"})
    err = info.value.errors()[0]
    assert err["ctx"]["error"].field == "backend"
    assert "cannot be answered with the 'hf' backend" in err["msg"] and "('vllm', or 'auto')" in err["msg"]
    assert parse_spec({"kind": "eval", "model": "org/m", "benchmark": "gsm8k", "backend": "hf"}).backend == "hf"


def test_generation_backend_resolves_and_old_specs_translate() -> None:
    base = {"kind": "grpo", "model": "org/m", "dataset": DATASET}
    assert resolve_grpo(parse_spec(base))["generation_backend"] == "hf"  # auto on a CPU job
    gpu = parse_spec({**base, "resources": {"gpus": 1}})
    assert resolve_grpo(gpu)["generation_backend"] == "vllm"  # auto on a GPU job: vLLM colocated
    assert resolve_grpo(parse_spec({**base, "generation": {"backend": "vllm"}}))["generation_backend"] == "vllm"
    # stored specs from before the generation block still parse, meaning what they meant
    old = parse_spec({**base, "use_vllm": True, "vllm_mode": "colocate", "resources": {"gpus": 1}})
    assert old.generation.backend == "vllm" and old.generation.mode == "colocate"
    assert parse_spec({**base, "use_vllm": False, "vllm_mode": None}).generation.backend == "hf"
    server = parse_spec({**base, "use_vllm": True, "vllm_mode": "server", "resources": {"gpus": 8}})
    assert server.generation.mode == "server" and server.training_processes == 6  # 6 train, 2 generate
    resolved = resolve_grpo(server)
    assert resolved["vllm_server_gpus"] == 2 and resolved["world_size"] == 6 and resolved["generation_mode"] == "server"
    # async: the knobs AsyncGRPOTrainer has no setting for are stored as not applicable
    asynchronous = resolve_grpo(
        parse_spec(
            {
                **base,
                "algorithm": "async",
                "lora": {},
                "max_staleness": 0,
                "generation": {"backend": "vllm", "mode": "server"},
            }
        )
    )
    assert asynchronous["algorithm"] == "async" and asynchronous["beta"] is None and asynchronous["loss_type"] is None
    with pytest.raises(ValidationError) as info:
        parse_spec({**base, "generation": {"gpu_memory_utilization": 1.5}, "resources": {"gpus": 1}})
    assert info.value.errors()[0]["loc"][-2:] == ("generation", "gpu_memory_utilization")


def test_model_refs() -> None:
    for good in ("org/name", "gpt2", "/abs/path", "./rel", "job:abc-123", "job:abc@step-200", "job:abc@final"):
        parse_spec({"kind": "eval", "model": good})
    for bad in ("https://evil.example/model", "job:", "job:x@step-", "a b"):
        with pytest.raises(ValidationError):
            parse_spec({"kind": "eval", "model": bad})
    for tiny in ("tiny:2x64", "tiny:8x1024", "tiny:1x16"):
        parse_spec({"kind": "sft", "model": tiny, "dataset": DATASET})
    # tiny:99x9999 was ~100 billion weights, built on the worker until it ran out of memory; an odd
    # width made attention heads of odd size, which the rotary embedding cannot take
    for tiny in ("tiny:99x9999", "tiny:9x64", "tiny:0x64", "tiny:2x2048", "tiny:2x11", "tiny:2x12"):
        with pytest.raises(ValidationError, match="a tiny model has 1 to 8 layers"):
            parse_spec({"kind": "sft", "model": tiny, "dataset": DATASET})


def test_model_references_are_found_by_their_type_at_any_depth() -> None:
    """model_refs (what admission, the project check, pipeline ordering and the worker's re-check
    read) once looked up 'model', 'policy' and 'load' by name: a kind with `teacher: ModelRef` went
    past every check (issue 68). Now every ModelRef field is found, nested and in unions too."""
    from pydantic import BaseModel

    from mathrl.modelref import ModelRef
    from mathrl.specs import model_refs
    from mathrl.specs.base import JobBase

    class Inner(BaseModel):
        judge: ModelRef | None = None
        note: str = "not a model"

    class Distill(JobBase):
        student: ModelRef
        teacher: ModelRef
        helpers: list[Inner] = []
        by_name: dict[str, Inner] = {}

    spec = Distill(
        student="org/student",
        teacher="/abs/other-project/model",
        helpers=[Inner(), Inner(judge="job:abc")],
        by_name={"x": Inner(judge="org/judge")},
    )
    assert model_refs(spec) == {
        "student": "org/student",
        "teacher": "/abs/other-project/model",
        "helpers/1/judge": "job:abc",
        "by_name/x/judge": "org/judge",
    }
    grpo = parse_spec(
        {
            "kind": "grpo",
            "model": "org/m",
            "dataset": DATASET,
            "rewards": [
                {"name": "reward_model", "model": "job:rm"},
                {
                    "name": "grader",
                    "grader": {
                        "type": "score_model",
                        "model": "org/judge",
                        "input": [{"role": "user", "content": "{{sample.output_text}}"}],
                    },
                },
            ],
        }
    )
    assert model_refs(grpo) == {"model": "org/m", "rewards/0/model": "job:rm", "rewards/1/grader/model": "org/judge"}


def test_a_reward_model_jobs_sampling_is_declared_once() -> None:
    """sampling.n and sampling.seed sat beside samples_per_question and seed and were not read (n 16 sampled
    8), and a temperature under 0.3 was raised to 0.3 without a word. Each is declared once now; an n
    equal to the count is taken, and stored specs' old defaults (n 8, seed 0) still parse."""
    rm = {"kind": "reward_model", "model": "org/m", "dataset": DATASET}
    assert parse_spec({**rm, "sampling": {"n": 16}}).samples_per_question == 16  # (it was still 8)
    stored = {"temperature": 0.7, "top_p": 1.0, "max_new_tokens": 512, "n": 8, "seed": 0}
    spec = parse_spec({**rm, "samples_per_question": 4, "sampling": stored})
    assert spec.samples_per_question == 4 and "n" not in spec.model_dump()["sampling"]
    partial = parse_spec({**rm, "sampling": {"max_new_tokens": 64}}).sampling
    assert (partial.temperature, partial.max_new_tokens) == (0.7, 64)  # (a partial block sampled greedy, then 0.3)
    for bad, field in (
        ({"samples_per_question": 4, "sampling": {"n": 16}}, "give the count once"),
        ({"sampling": {"temperature": 0}}, "greater than or equal to 0.3"),
        ({"sampling": {"seed": 5}}, "its own `seed`"),
    ):
        with pytest.raises(ValidationError, match=field):
            parse_spec({**rm, **bad})


@pytest.mark.parametrize(
    "spec",
    [
        {"kind": "eval", "model": "org/m"},
        {"kind": "grpo", "model": "org/m", "dataset": DATASET, "lora": {"enabled": False}},
        {
            "kind": "grpo",
            "model": "org/m",
            "dataset": DATASET,
            "lora": {"r": 8},
            "preset": "deepseekmath",
            "num_generations": 8,
        },
        {"kind": "reward_model", "model": "org/m", "dataset": DATASET},
        {"kind": "reward_model", "model": "org/m", "dataset": DATASET, "type": "process", "completions_per_step": 2},
    ],
)
def test_stored_specs_round_trip(spec: dict) -> None:
    """The API stores model_dump(mode='json'); the worker must be able to parse it back."""
    parsed = parse_spec(spec)
    assert parse_spec(parsed.model_dump(mode="json")) == parsed


@pytest.mark.quick
def test_every_spec_field_is_described() -> None:
    """Issue 20.5: 13 GRPOSpec fields (and more of the other specs) had no description, so the
    OpenAPI page and the SDK's help said nothing about them."""
    import inspect

    from pydantic import BaseModel

    from mathrl import specs

    missing = [
        f"{name}.{field}"
        for name, model in vars(specs).items()
        if inspect.isclass(model) and issubclass(model, BaseModel) and model.__module__ == "mathrl.specs"
        for field, info in model.model_fields.items()
        if not info.description
    ]
    assert not missing, missing


def test_the_loop_resolves_per_preset_and_is_stored() -> None:
    base = {"kind": "grpo", "model": "org/m", "dataset": DATASET}
    cfg = resolve_config(parse_spec(base))  # trl-default: what was measured to help, the update TRL's
    assert cfg.dynamic_sampling is None and cfg.curriculum is None and cfg.skip_zero_advantage is True
    on = resolve_config(parse_spec({**base, "dynamic_sampling": True}))
    assert on.record()["dynamic_sampling"] == {"metric": "correct", "max_rounds": 3}
    paper = resolve_config(parse_spec({**base, "preset": "deepseekmath", "resources": {"gpus": 8}}))
    assert paper.dynamic_sampling is None and paper.curriculum is None
    assert paper.skip_zero_advantage is False
    # no correctness verdict to read: the default filters on the weighted reward
    shaped = resolve_config(
        parse_spec({**base, "rewards": [{"name": "reward_model", "model": "org/rm"}], "dynamic_sampling": {}})
    )
    assert shaped.dynamic_sampling is not None and shaped.dynamic_sampling.metric == "reward"
    # the worker parses the stored spec (every field dumped) again: the unset metric stays unset there; a
    # default of 'correct' read as asked for and failed the job after its 201
    for rewards in ([{"name": "format"}], [{"name": "accuracy"}]):
        spec = parse_spec({**base, "rewards": rewards, "dynamic_sampling": True})
        stored = parse_spec(spec.model_dump(mode="json"))
        assert resolve_config(stored).record()["dynamic_sampling"] == resolve_config(spec).record()["dynamic_sampling"]
    asked = resolve_config(
        parse_spec({**base, "curriculum": {"floor": 0.1}, "dynamic_sampling": False, "skip_zero_advantage": False})
    )
    assert asked.record()["curriculum"] == {"decay": 0.5, "floor": 0.1} and asked.dynamic_sampling is None
    assert asked.skip_zero_advantage is False
    # skipping is stored as what the run does: exact only without a KL term
    assert resolve_config(parse_spec({**base, "beta": 0.04})).skip_zero_advantage is False
    with pytest.raises(ValidationError, match="drop skip_zero_advantage, or set beta: 0"):
        parse_spec({**base, "beta": 0.04, "skip_zero_advantage": True})
    # a preset's default that cannot run is off, not refused (checked with a preset defaulting it on)
    from mathrl.specs import presets

    saved = presets.LOOP_DEFAULTS["trl-default"]
    presets.LOOP_DEFAULTS["trl-default"] = {**saved, "dynamic_sampling": True}
    try:
        split = resolve_config(
            parse_spec({**base, "num_generations": 8, "per_device_train_batch_size": 4, "resources": {"processes": 2}})
        )
    finally:
        presets.LOOP_DEFAULTS["trl-default"] = saved
    assert split.dynamic_sampling is None


def test_every_kind_and_grader_type_is_registered_in_one_place() -> None:
    """A job kind is its spec class in AnySpec (its home on the server: tests/unit/kinds); a grader
    type is its class in the Grader union and its scorer: each registry is read off them, and
    names what it lacks."""
    from evaluator.graders import SCORERS
    from mathrl.graders import GRADER_TYPES
    from mathrl.specs import JOB_KINDS, KINDS

    assert JOB_KINDS == ("eval", "grpo", "reward_model", "sft", "grade", "generate", "session")
    assert sorted(SCORERS) == sorted(GRADER_TYPES)
    with pytest.raises(ValueError, match="unknown job kind 'gpro'. Did you mean 'grpo'"):
        KINDS["gpro"]
    assert "gpro" not in KINDS and KINDS.get("gpro") is None


def test_a_gpu_type_routes_a_gpu_job_to_that_cards_queue() -> None:
    base = {"kind": "eval", "model": "org/m", "benchmark": "gsm8k"}
    assert parse_spec({**base, "resources": {"gpus": 8, "gpu_type": "h100"}}).resources.queue == "gpu-8-h100"
    assert parse_spec({**base, "resources": {"gpus": 8}}).resources.queue == "gpu-8"
    for resources in ({"gpu_type": "h100"}, {"gpus": 1, "gpu_type": "h100", "pool": "a100s"}):
        with pytest.raises(ValidationError, match="gpu_type 'h100' routes a one-node GPU job"):
            parse_spec({**base, "resources": resources})
    with pytest.raises(ValidationError, match="gpu_type"):
        parse_spec({**base, "resources": {"gpus": 1, "gpu_type": "H100!"}})


def test_every_queue_a_spec_can_name_fits_the_queue_column() -> None:
    """A 32-character gpu_type made 'gpu-64-<type>' 39 characters, which PostgreSQL refused at the
    commit (a 422 that blamed a NUL byte); a pool could be 64."""
    base = {"kind": "eval", "model": "org/m", "benchmark": "gsm8k"}
    longest = parse_spec({**base, "resources": {"gpus": 64, "gpu_type": "a" * 25}}).resources.queue
    assert len(longest) == 32
    for resources in ({"gpus": 64, "gpu_type": "a" * 26}, {"pool": "p" * 33}):
        with pytest.raises(ValidationError, match="at most"):
            parse_spec({**base, "resources": resources})


def _spec_classes(annotation: Any, out: list[type]) -> list[type]:
    """Every model class a field's type reaches (in unions, lists and dicts), each once."""
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if annotation not in out:
            out.append(annotation)
            for field in annotation.model_fields.values():
                _spec_classes(field.annotation, out)
    else:
        for arg in get_args(annotation):
            _spec_classes(arg, out)
    return out


def _untyped_references(spec_classes: list[type]) -> list[str]:
    """The text fields that name a model or an uploaded file by what they are called or say (a
    'model', 'policy', 'load' or 'teacher' field, one whose text is a hub id or 'job:<id>', a '*file'
    field, a 'file-<hex>' pattern, 'POST /v1/files'), and are not typed ModelRef or FileRef: the
    references mathrl.specs.model_refs and file_refs would miss."""
    from mathrl.fileref import FILE_ID_PATTERN, names_a_file
    from mathrl.modelref import names_a_model

    def has_text(annotation: Any) -> bool:
        return annotation is str or any(has_text(a) for a in get_args(annotation))

    missed = []
    for cls in spec_classes:
        for name, field in cls.model_fields.items():  # type: ignore[attr-defined]
            if not has_text(field.annotation) or names_a_model(field) or names_a_file(field):
                continue
            text = (field.description or "").lower()
            patterns = [getattr(m, "pattern", None) for m in field.metadata]
            named = name in ("model", "policy", "load", "teacher", "student", "judge", "base_model")
            says = "'job:" in text or "hub id ('org" in text or "/v1/files" in text or "'file-" in text
            if named or says or name.endswith("file") or FILE_ID_PATTERN in patterns:
                missed.append(f"{cls.__name__}.{name}")
    return missed


def test_every_reference_field_of_every_kind_is_typed_as_one() -> None:
    """model_refs and file_refs find references by their type, so a field that names a model or a
    file as a plain `str` would pass every check they feed (admission, the project check, pipeline
    ordering, the worker's re-check and file lookup). No spec of any kind has one; a toy kind's
    `teacher: str` and `notes_file: str` are caught. (DatasetRef.path, a file under an operator's
    data root or a URL, is each kind's `data()` to declare: the raw-path rules read it there.)"""
    from pydantic import Field

    from mathrl.fileref import FILE_ID_PATTERN
    from mathrl.specs.base import JobBase
    from mathrl.specs.job import KINDS

    classes: list[type] = []
    for kind in KINDS:
        _spec_classes(KINDS[kind], classes)
    assert len(classes) > 20  # the kinds and every model their fields reach (datasets, rewards, graders, ...)
    assert _untyped_references(classes) == []

    class Toy(JobBase):
        teacher: str = Field("org/t", description="the teacher: a hub id ('org/name') or 'job:<id>'")
        notes_file: str | None = Field(None, pattern=FILE_ID_PATTERN)

    assert _untyped_references([Toy]) == ["Toy.teacher", "Toy.notes_file"]


def test_uploaded_files_are_found_by_their_type_and_told_where_they_are() -> None:
    """`batch` was read by `getattr(spec, "batch")` at submit and on the worker (issue 68): a kind
    with a file elsewhere went unchecked. file_refs finds every FileRef with the purpose it asks for,
    and with_file_paths gives each holder its local path, leaving the spec as it was."""
    from pydantic import Field

    from mathrl.specs import FileRef, HoldsAFile, file_refs, with_file_paths
    from mathrl.specs.base import JobBase

    a, b, c = ("file-" + ch * 32 for ch in "abc")
    generate = parse_spec({"kind": "generate", "model": "org/m", "batch": {"file": a, "endpoint": "/v1/completions"}})
    assert {k: (u.file_id, u.purpose) for k, u in file_refs(generate).items()} == {"batch/file": (a, "batch")}
    grpo = parse_spec(
        {"kind": "grpo", "model": "org/m", "dataset": {"file": a, "format": "messages"}, "eval": {"file": b}}
    )
    assert {k: (u.file_id, u.purpose) for k, u in file_refs(grpo).items()} == {
        "dataset/file": (a, None),
        "eval/file": (b, None),
    }
    seen: list[tuple[str, str]] = []
    local = with_file_paths(grpo, lambda where, file_id: seen.append((where, file_id)) or f"/store/{file_id}")
    assert seen == [("dataset/file", a), ("eval/file", b)]
    assert local.dataset.path == f"/store/{a}" and local.eval._path == f"/store/{b}"  # type: ignore[union-attr]
    assert grpo.dataset.path is None and grpo.eval._path is None  # type: ignore[union-attr]

    class Notes(HoldsAFile):
        file: FileRef

    class Toy(JobBase):
        notes: list[Notes] = Field(default_factory=list)

    toy = Toy(notes=[Notes(file=a), Notes(file=c)])
    assert list(file_refs(toy)) == ["notes/0/file", "notes/1/file"]
    assert [n._path for n in with_file_paths(toy, lambda where, file_id: where).notes] == [
        "notes/0/file",
        "notes/1/file",
    ]
