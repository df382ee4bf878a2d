"""The memory plan (trainer/memory_plan.py): the estimate against known configurations and against
peaks measured on an H100, the refusal at submit (api/admission.py), the same check on the worker
before the model loads (worker/child.py), the pools' GPU memory from the chart, and the GPU recipe
example. No service, no model, no GPU: the config.json values are written here (no hub access)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from kinds import resolve_config, training_of
from mathrl.specs import PipelineSpec, parse_spec
from mathrl.specs.resolved import ResolvedGRPO, ResolvedSFT, resolved
from tests.helpers.env import ROOT
from trainer.memory_plan import (
    GIB,
    ModelShape,
    Training,
    check_job,
    estimate,
    plan_job,
    read_model_config,
)

pytestmark = pytest.mark.quick

EXAMPLE = ROOT / "examples" / "qwen2.5-math-1.5b-grpo.yaml"

# config.json values of the published models (Qwen2 architecture: biases on q/k/v)
QWEN25_05B = {
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
}
QWEN25_15B = {
    "model_type": "qwen2",
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
}
QWEN25_7B = {
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
}
# Qwen2.5-Math-1.5B has Qwen2.5-1.5B's shape with a 4,096-position context (rope_theta 10000);
# assumed tied embeddings like Qwen2.5-1.5B (the example's test checks the untied variant too)
QWEN25_MATH_15B = {**QWEN25_15B, "max_position_embeddings": 4096, "rope_theta": 10000.0}
SHAPES = {"q05": QWEN25_05B, "q15": QWEN25_15B, "q7": QWEN25_7B}

# Peaks measured on one H100 80GB with TRL 1.16 GRPO (transformers 5.17, torch 2.11, bf16 autocast,
# fp32 weights, AdamW fused, hf generation, beta 0), step 2 after the generation (bench/memory_plan.py):
# (shape, LoRA r=16 all-linear?, gradient checkpointing?, micro-batch, tokens per sequence,
#  torch.cuda.max_memory_allocated, GPU memory in use (nvidia-smi's view)), bytes
MEASURED = [
    ("q05", False, False, 4, 576, 11_929_000_000, 13_210_000_000),
    ("q05", False, False, 8, 576, 16_250_000_000, 18_340_000_000),
    ("q15", False, False, 4, 768, 33_596_267_520, 36_533_239_808),
    ("q15", False, False, 8, 768, 45_174_067_712, 50_422_677_504),
    ("q15", False, True, 8, 768, 25_792_797_184, 30_621_368_320),
    ("q15", False, True, 16, 576, 26_510_000_000, 29_070_000_000),
    ("q15", True, False, 8, 576, 29_050_000_000, 30_880_000_000),
    ("q7", True, False, 2, 576, 55_690_000_000, 56_890_000_000),
    ("q7", True, False, 2, 768, 57_910_059_520, 59_146_829_824),
    ("q7", True, False, 4, 576, 66_690_000_000, 78_510_000_000),
]


def grpo_config(**fields: Any) -> ResolvedGRPO:
    spec = {"kind": "grpo", "model": "/models/m", "dataset": {"name": "math-train"}, "resources": {"gpus": 1}}
    return resolve_config(parse_spec({**spec, **fields})).of(ResolvedGRPO)


# ---- the estimate -----------------------------------------------------------------------------


def test_parameter_counts_match_the_published_models() -> None:
    # what transformers' Qwen2ForCausalLM counts for these configs (the H100 runs above)
    assert ModelShape.from_config(QWEN25_15B).parameter_count() == 1_543_714_304
    assert ModelShape.from_config(QWEN25_7B).parameter_count() == 7_615_616_512
    assert ModelShape.from_config(QWEN25_05B).parameter_count() == 494_032_768
    # peft's trainable count for LoRA r=16 on all linear layers of the 7B
    assert ModelShape.from_config(QWEN25_7B).lora_parameters(16, "all-linear")[0] == 40_370_176


def test_full_fine_tuning_holds_16_bytes_per_parameter_before_activations() -> None:
    """TRL loads the path in float32 and trains under bf16 autocast: fp32 weights 4 + fp32
    gradients 4 + AdamW's two fp32 moments 8 = 16 bytes per parameter (no separate master copy)."""
    plan = estimate(ModelShape.from_config(QWEN25_15B), Training(micro_batch=8, seq_len=1024))
    states = plan.terms["weights"] + plan.terms["gradients"] + plan.terms["optimizer"]
    per_param = states / plan.params
    print(f"Qwen2.5-1.5B full fine-tuning: {per_param:.2f} bytes/parameter before activations")
    assert per_param == pytest.approx(16, abs=0.01)
    assert plan.trainable == plan.params == 1_543_714_304
    assert plan.terms["reference_model"] == 0 and plan.terms["vllm"] == 0


def test_qwen25_7b_with_lora_fits_far_lower_than_full_fine_tuning() -> None:
    shape = ModelShape.from_config(QWEN25_7B)
    full = estimate(shape, Training(micro_batch=8, seq_len=1024, gradient_checkpointing=True), 80 * GIB)
    lora = estimate(shape, Training(micro_batch=8, seq_len=1024, gradient_checkpointing=True, lora_r=16), 80 * GIB)
    print(
        f"Qwen2.5-7B on 80 GiB, 8 x 1,024 tokens, gradient checkpointing: full fine-tuning "
        f"{full.estimate_gib:.1f} GiB, LoRA r=16 {lora.estimate_gib:.1f} GiB"
    )
    assert full.fits is False and lora.fits is True
    assert lora.peak < full.peak / 2
    # the frozen base in float32, the adapters at 16 bytes a parameter
    assert lora.terms["weights"] == 4 * (lora.params + lora.trainable)
    assert lora.terms["gradients"] + lora.terms["optimizer"] == 12 * lora.trainable == 12 * 40_370_176


@pytest.mark.parametrize(("shape", "lora", "gc", "batch", "seq", "peak", "used"), MEASURED)
def test_estimate_against_peaks_measured_on_an_h100(
    shape: str, lora: bool, gc: bool, batch: int, seq: int, peak: int, used: int
) -> None:
    plan = estimate(
        ModelShape.from_config(SHAPES[shape]),
        Training(micro_batch=batch, seq_len=seq, lora_r=16 if lora else None, gradient_checkpointing=gc),
    )
    torch_part = plan.peak - plan.terms["allocator_slack"] - plan.terms["cuda_overhead"]
    assert torch_part == pytest.approx(peak, rel=0.06), f"{torch_part / peak - 1:+.1%}"
    # with the allocator and CUDA overheads: not far under what the GPU really had in use
    assert plan.peak > 0.95 * used


def test_each_term_moves_the_way_the_trainer_does() -> None:
    shape = ModelShape.from_config(QWEN25_15B)
    base = Training(micro_batch=8, seq_len=1536)
    plain = estimate(shape, base, 80 * GIB)
    checkpointed = estimate(shape, Training(micro_batch=8, seq_len=1536, gradient_checkpointing=True), 80 * GIB)
    assert checkpointed.terms["activations"] < plain.terms["activations"] / 5
    twice = estimate(shape, Training(micro_batch=16, seq_len=1536), 80 * GIB)
    assert twice.terms["activations"] == pytest.approx(2 * plain.terms["activations"], rel=1e-6)
    # GRPO with beta > 0 and no LoRA: a frozen float32 reference model
    ref = estimate(shape, Training(micro_batch=8, seq_len=1536, reference_model=True), 80 * GIB)
    assert ref.terms["reference_model"] == 4 * shape.parameter_count()
    # colocated vLLM: its share of the GPU; unknown GPU size: not counted, and said so
    vllm = estimate(shape, Training(micro_batch=8, seq_len=1536, vllm_fraction=0.3), 80 * GIB)
    assert vllm.terms["vllm"] == int(0.3 * 80 * GIB) and vllm.peak - plain.peak == vllm.terms["vllm"]
    unknown = estimate(shape, Training(micro_batch=8, seq_len=1536, vllm_fraction=0.3))
    assert unknown.fits is None and unknown.terms["vllm"] == 0 and "not counted" in unknown.notes[0]


def test_resolved_configs_map_onto_the_plan() -> None:
    colocated = grpo_config(beta=0.04)  # auto -> vLLM colocated on a GPU job, TRL's 0.3 of the GPU
    plan = plan_job(training_of(colocated), QWEN25_15B, 80)
    assert plan.terms["vllm"] == int(0.3 * 80 * GIB) and plan.terms["reference_model"] > 0
    lora = plan_job(training_of(grpo_config(beta=0.04, lora={"r": 16})), QWEN25_15B, 80)
    assert lora.terms["reference_model"] == 0  # TRL switches the adapter off instead
    server = grpo_config(resources={"gpus": 2}, generation={"backend": "vllm", "mode": "server"})
    assert plan_job(training_of(server), QWEN25_15B, 80).terms["vllm"] == 0  # the server has GPUs of its own
    low = plan_job(training_of(grpo_config(generation={"gpu_memory_utilization": 0.5})), QWEN25_15B, 80)
    assert low.terms["vllm"] == int(0.5 * 80 * GIB)
    sft = resolve_config(parse_spec({"kind": "sft", "model": "/m", "dataset": {"name": "math-train"}}))
    assert plan_job(training_of(sft), QWEN25_15B, 80).terms["vllm"] == 0
    with pytest.raises(ValueError, match="hidden_size"):
        ModelShape.from_config({"model_type": "bert"})
    with pytest.raises(ValueError, match="mixture-of-experts"):
        ModelShape.from_config({**QWEN25_15B, "num_experts": 60})


def test_a_decode_copy_static_or_overlap_holds_bf16_weights_and_a_cache_for_the_generation_batch() -> None:
    shape = ModelShape.from_config(QWEN25_15B)
    plain = estimate(shape, Training(micro_batch=16, seq_len=1536), 80 * GIB)
    static = estimate(shape, Training(micro_batch=16, seq_len=1536, copy_decode_batch=128), 80 * GIB)
    assert plain.terms["decode_copy"] == plain.terms["decode_cache"] == 0
    assert static.terms["decode_copy"] == 2 * shape.parameter_count()
    # 28 layers x keys and values x 2 KV heads x 128 per head x 2 bytes, per token of 128 x 1,536
    assert static.terms["decode_cache"] == 128 * 1536 * 28 * 2 * 2 * 128 * 2
    held = static.terms["decode_copy"] + static.terms["decode_cache"]
    assert static.peak - plain.peak == pytest.approx(held * 1.1, rel=1e-6)  # and the allocator's slack
    # from a spec: the generation batch over the training processes, only on the hf path's `static`
    hf = {"backend": "hf", "hf_mode": "static"}
    config = grpo_config(generation=hf, global_batch_size=128)
    seq = config.max_prompt_length + config.max_completion_length
    one = plan_job(training_of(config), QWEN25_15B, 80)
    assert one.terms["decode_cache"] == 128 * seq * shape.kv_cache_bytes_per_token(2)
    two = grpo_config(generation=hf, global_batch_size=128, resources={"gpus": 2})
    assert training_of(two).copy_decode_batch == 64
    assert training_of(grpo_config(generation={"backend": "hf"})).copy_decode_batch == 0  # auto: dynamic
    assert training_of(grpo_config(generation={"backend": "vllm"})).copy_decode_batch == 0
    # a static run that does not fit is told what `dynamic` would need
    big = grpo_config(generation=hf, global_batch_size=512, per_device_train_batch_size=4)
    _, refusal = check_job(training_of(big), QWEN25_7B, 80)
    assert refusal is not None and "/generation/hf_mode" in dict(refusal.errors)
    assert "generation.hf_mode='dynamic'" in refusal.detail
    # overlap decodes on the same copy, with the generation batch's cache live while training runs
    overlap = training_of(grpo_config(generation={"backend": "hf", "overlap": True}, global_batch_size=128))
    assert overlap.copy_decode_batch == 128 and overlap.copy_decode_why == "overlap"
    # the same copy and cache as static's (counted once with both on), and the thread's working
    # memory beside the training step: here the prefill of 128 prompts of 512 tokens (one layer's
    # hidden states and two MLP intermediates in bf16) and three fp32 copies of the sampler's logits
    with_overlap = plan_job(overlap, QWEN25_15B, 80)
    prefill = 128 * 512 * 2 * (2 * 1536 + 2 * 8960) + 128 * 151936 * 4 * 3
    assert with_overlap.terms.pop("overlap_working") == prefill
    static_terms = dict(one.terms)
    assert static_terms.pop("overlap_working") == 0
    for name in ("allocator_slack",):  # the slack grows with the peak
        with_overlap.terms.pop(name), static_terms.pop(name)
    assert with_overlap.terms == static_terms
    assert with_overlap.peak - one.peak == pytest.approx(prefill * 1.1, rel=1e-6)
    both = training_of(grpo_config(generation={**hf, "overlap": True}, global_batch_size=128))
    assert both.copy_decode_why == "static+overlap"
    assert plan_job(both, QWEN25_15B, 80).terms == plan_job(overlap, QWEN25_15B, 80).terms
    big_overlap = grpo_config(
        generation={"backend": "hf", "overlap": True}, global_batch_size=512, per_device_train_batch_size=4
    )
    _, refusal = check_job(training_of(big_overlap), QWEN25_7B, 80)
    assert refusal is not None and "generation.overlap: false" in dict(refusal.errors)["/generation/overlap"]


def test_gradient_checkpointing_is_resolved_and_reaches_trl() -> None:
    """TRL 1.16's GRPOConfig and SFTConfig turn gradient checkpointing on by default: unset, the
    job stores (and runs with) that; the spec can turn it off."""
    from trainer.grpo_config import common_args

    on, off = grpo_config(), grpo_config(gradient_checkpointing=False)
    assert on.gradient_checkpointing is True and off.gradient_checkpointing is False
    assert common_args(off, Path("/tmp/x"), True, None)["gradient_checkpointing"] is False
    old = resolved({k: v for k, v in on.record().items() if k != "gradient_checkpointing"})  # stored before it
    assert common_args(old.of(ResolvedGRPO), Path("/tmp/x"), True, None)["gradient_checkpointing"] is True
    sft = parse_spec({"kind": "sft", "model": "/m", "dataset": {"name": "math-train"}})
    assert resolve_config(sft).of(ResolvedSFT).gradient_checkpointing is True
    sft_off = parse_spec({**sft.model_dump(), "gradient_checkpointing": False})
    assert resolve_config(sft_off).of(ResolvedSFT).gradient_checkpointing is False


def test_model_config_read_from_a_directory_or_an_adapters_base(tmp_path: Path) -> None:
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text(json.dumps(QWEN25_15B))
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(base)}))
    assert read_model_config(base) == QWEN25_15B
    assert read_model_config(adapter) == QWEN25_15B
    assert read_model_config(tmp_path / "missing") is None


# ---- refusal at submit ------------------------------------------------------------------------


def settings_for(tmp_path: Path, **memory: Any) -> Any:
    from config.settings import Settings

    return Settings(  # type: ignore[call-arg]
        artifact_dir=str(tmp_path / "artifacts"),
        sources={"model_roots": [str(tmp_path)]},  # type: ignore[arg-type]
        memory=memory or {"pools": {"gpu-1": 80}},  # type: ignore[arg-type]
    )


def model_dir(tmp_path: Path, config: dict[str, Any], name: str = "qwen2.5-7b") -> Path:
    path = tmp_path / name
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_submit_refuses_a_7b_full_fine_tuning_on_an_80_gib_pool_and_admits_it_with_lora(tmp_path: Path) -> None:
    from api.admission import admit_spec
    from api.problems import Problem

    settings = settings_for(tmp_path)
    model = str(model_dir(tmp_path, QWEN25_7B))
    spec = {"kind": "grpo", "model": model, "dataset": {"name": "math-train"}, "resources": {"gpus": 1}}
    with pytest.raises(Problem) as refused:
        admit_spec(parse_spec(spec), settings)
    problem = refused.value
    assert problem.status == 422 and problem.title == "Does not fit in GPU memory"
    pointers = [e["pointer"] for e in problem.errors or []]
    assert pointers[0] == "/lora" and "/per_device_train_batch_size" in pointers
    assert "/generation/gpu_memory_utilization" in pointers
    assert re.search(r"LoRA r=16 \('lora: \{r: 16\}'\) would need ~\d+\.\d GiB", problem.detail or "")
    assert "this pool's GPUs have 80.0 GiB" in (problem.detail or "")
    print(problem.detail)

    config = admit_spec(parse_spec({**spec, "lora": {"r": 16}}), settings)
    plan = config.memory_plan
    assert plan is not None
    assert plan["fits"] is True and plan["gpu_memory_gib"] == 80 and plan["estimate_gib"] < 80
    assert plan["trainable_params"] == 40_370_176 and plan["terms_gib"]["vllm"] == 24.0
    print(f"Qwen2.5-7B GRPO, LoRA r=16 (TRL defaults): ~{plan['estimate_gib']} GiB of 80 GiB")


def test_submit_points_at_gradient_checkpointing_and_sft_jobs_are_checked_too(tmp_path: Path) -> None:
    from api.admission import admit_spec
    from api.problems import Problem

    settings = settings_for(tmp_path)
    model = str(model_dir(tmp_path, QWEN25_7B))
    spec = {
        "kind": "sft",
        "model": model,
        "dataset": {"name": "math-train"},
        "lora": {"r": 16},
        "gradient_checkpointing": False,
        "max_length": 4096,
        "resources": {"gpus": 1},
    }
    with pytest.raises(Problem) as refused:
        admit_spec(parse_spec(spec), settings)
    errors = {e["pointer"]: e["detail"] for e in refused.value.errors or []}
    assert re.match(r"gradient_checkpointing: true would need ~\d+\.\d GiB", errors["/gradient_checkpointing"])
    assert "/generation/gpu_memory_utilization" not in errors  # no vLLM in an SFT job


def test_what_submit_cannot_see_is_left_to_the_worker(tmp_path: Path) -> None:
    from api.admission import admit_spec

    hub = {"kind": "grpo", "model": "Qwen/Qwen2.5-7B", "dataset": {"name": "math-train"}, "resources": {"gpus": 1}}
    assert admit_spec(parse_spec(hub), settings_for(tmp_path)).memory_plan is None
    cpu = {**hub, "model": str(model_dir(tmp_path, QWEN25_7B)), "resources": {"gpus": 0}}
    assert admit_spec(parse_spec(cpu), settings_for(tmp_path)).memory_plan is None
    # a pool whose GPU memory is not configured: the plan is stored, not checked
    other = {**cpu, "resources": {"gpus": 2}}
    plan = admit_spec(parse_spec(other), settings_for(tmp_path)).memory_plan
    assert plan is not None
    assert plan["fits"] is None and plan["gpu_memory_gib"] is None and plan["estimate_gib"] > 80


def test_submit_reads_another_jobs_saved_model(tmp_path: Path) -> None:
    from api.admission import admit_spec
    from api.problems import Problem

    job_id = "01937a3e-8f4c-7a1b-9c2d-3e4f5a6b7c8d"
    model_dir(tmp_path / "artifacts" / "jobs" / job_id / "train", QWEN25_7B, "final")
    spec = {"kind": "grpo", "model": f"job:{job_id}", "dataset": {"name": "math-train"}, "resources": {"gpus": 1}}
    with pytest.raises(Problem, match="LoRA r=16"):
        admit_spec(parse_spec(spec), settings_for(tmp_path))
    # a checkpoint not saved yet (a later step of a pipeline): the worker checks it
    assert "memory_plan" not in admit_spec(
        parse_spec({**spec, "model": f"job:{job_id}@step-50"}), settings_for(tmp_path)
    )


# ---- before launch, on the worker ---------------------------------------------------------------


class Events:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str, Any]] = []

    def event(self, type: str, message: str = "", level: str = "info", data: Any = None) -> None:
        self.events.append((type, message, level, data))


def test_worker_fails_the_job_before_the_model_loads_with_the_submit_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hub id: the API cannot read its config.json, the worker fetches that file alone (here a
    stand-in for huggingface_hub's download: no network) and refuses the job with the same message
    as the API's, before anything loads the model."""
    import huggingface_hub

    from worker import child

    path = model_dir(tmp_path, QWEN25_7B)
    asked: list[tuple[str, str]] = []

    def download(repo: str, filename: str) -> str:
        asked.append((repo, filename))
        return str(path / filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    spec = parse_spec(
        {"kind": "grpo", "model": "Qwen/Qwen2.5-7B", "dataset": {"name": "math-train"}, "resources": {"gpus": 1}}
    )
    config = resolve_config(spec)
    settings = settings_for(tmp_path)
    sink = Events()
    with pytest.raises(child.MemoryRefused) as refused:
        child._check_memory(spec, config, "Qwen/Qwen2.5-7B", settings, sink)
    assert asked == [("Qwen/Qwen2.5-7B", "config.json")]
    _, same = check_job(training_of(config), QWEN25_7B, 80)
    assert same is not None and str(refused.value) == same.detail
    assert refused.value.event == "memory_plan" and refused.value.data["fits"] is False

    # with LoRA it fits: an event records the plan and the job goes on
    lora = parse_spec({**spec.model_dump(), "lora": {"r": 16}})
    child._check_memory(lora, resolve_config(lora), str(path), settings, sink)
    (kind, message, level, data) = sink.events[-1]
    assert kind == "memory_plan" and level == "info" and data["fits"] is True
    assert re.match(r"memory plan: ~\d+\.\d GiB per GPU of 80\.0 GiB", message)

    # checked at submit already: not again; no config.json to read: a warning, and the job goes on
    checked = resolve_config(lora).model_copy(update={"memory_plan": {"gpu_memory_gib": 80, "fits": True}})
    child._check_memory(lora, checked, str(tmp_path / "nowhere"), settings, sink)
    assert len(sink.events) == 1
    child._check_memory(lora, resolve_config(lora), str(tmp_path / "nowhere"), settings, sink)
    assert sink.events[-1][2] == "warning" and "not checked" in sink.events[-1][1]


def test_worker_records_the_refusal_as_the_jobs_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """worker.child._main: a MemoryRefused is written to the attempt's error.txt (the job's error)
    and exits with EXIT_UNAVAILABLE, like any job this worker cannot run."""
    from worker import child

    def refuse(*_: Any) -> int:
        raise child.MemoryRefused("the memory plan needs ~156.2 GiB per GPU ...", {"fits": False})

    monkeypatch.setattr(child, "run", refuse)
    monkeypatch.setattr(child, "is_main", lambda: False)  # no database here: only the error file
    err = tmp_path / "error.txt"
    assert child._main("job", "owner", 1, settings_for(tmp_path), err) == child.EXIT_UNAVAILABLE
    assert err.read_text().startswith("the memory plan needs ~156.2 GiB")


# ---- the chart ----------------------------------------------------------------------------------


def test_chart_gives_api_and_workers_each_gpu_pools_memory() -> None:
    from config.worker_settings import MemorySettings
    from tests.helpers.deploy import container, env_of, render, workers

    values = {
        "workerDefaults": {"gpuMemoryGiB": 80},
        "workerPools": [
            {"name": "cpu", "queues": ["cpu"], "gpus": 0},
            {"name": "gpu-1", "queues": ["gpu-1"], "gpus": 1},
            {"name": "l40s", "queues": ["gpu-2", "l40s"], "gpus": 2, "gpuMemoryGiB": 45},
            {"name": "unknown", "queues": ["mystery"], "gpus": 1, "gpuMemoryGiB": 0},
        ],
    }
    rendered = render(values)
    api = env_of(container(rendered.get("Deployment", "mathrl-api")))["MATHRL_MEMORY__POOLS"]["value"]
    pools = json.loads(api)
    assert pools == {"gpu-1": 80, "gpu-2": 45, "l40s": 45}  # no CPU pool, no pool left at 0
    for deployment in workers(rendered).values():
        assert env_of(container(deployment))["MATHRL_MEMORY__POOLS"]["value"] == api
    memory = MemorySettings.model_validate({"pools": pools})
    assert memory.for_queue("l40s") == 45 and memory.for_queue("mystery") is None
    assert "MATHRL_MEMORY__POOLS" not in env_of(container(render().get("Deployment", "mathrl-api")))


# ---- the GPU recipe example ---------------------------------------------------------------------


@pytest.mark.parametrize("tied", [True, False])
def test_the_gpu_recipe_example_fits_one_80_gib_gpu(tied: bool) -> None:
    text = EXAMPLE.read_text()
    pipeline = PipelineSpec.model_validate(yaml.safe_load(text))
    assert pipeline.dependencies() == {"eval-base": [], "grpo": [], "eval-grpo": ["grpo"]}
    grpo = pipeline.jobs["grpo"]
    assert grpo.kind == "grpo" and grpo.model == "Qwen/Qwen2.5-Math-1.5B"
    assert [r.name for r in grpo.rewards] == ["binary"] and grpo.dataset.name == "math-train"
    assert {pipeline.jobs[s].benchmark for s in ("eval-base", "eval-grpo")} == {"math500"}  # type: ignore[union-attr]
    config = resolve_config(grpo)
    assert (config.generation_backend, config.generation_mode) == ("vllm", "colocate")
    assert config.max_prompt_length + config.max_completion_length <= 4096  # the model's positions
    plan, refusal = check_job(training_of(config), {**QWEN25_MATH_15B, "tie_word_embeddings": tied}, 80)
    print(f"examples/{EXAMPLE.name} (tied embeddings: {tied}): ~{plan.estimate_gib:.1f} GiB of 80 GiB")
    assert refusal is None and plan.fits
    if tied:  # the figure the file's comment gives
        assert f"~{plan.estimate_gib:.0f} GiB per GPU" in text
        off, _ = check_job(
            training_of(config.model_copy(update={"gradient_checkpointing": False})), QWEN25_MATH_15B, 80
        )
        assert f"~{off.estimate_gib:.0f} GiB" in text
