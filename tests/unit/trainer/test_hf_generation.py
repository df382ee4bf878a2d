"""The hf backend's decoding modes (trainer/hf_generation.py) on the tiny model: 'static' decodes
what 'dynamic' (TRL's default) decodes, greedy, token for token; the policy's copy that 'static'
decodes on follows the policy's weights (a full model, and a peft model whose adapter is merged
for the copy and unmerged again); a GRPO job with hf_mode 'static', and one with overlap, trains
through it; and the spec
refuses hf_mode on a vLLM job, naming the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from mathrl.specs import parse_spec
from trainer.hf_generation import DecodeCopy, cuda_graphs_in_this_thread, decode

pytestmark = pytest.mark.slow  # the tiny model, loaded and trained


def _model(path: str) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _prompts(path: str) -> tuple[list[list[int]], Any]:
    from evaluator.models import load_tokenizer

    tok = load_tokenizer(path)
    texts = ["1+2=", "what is 3 plus 4?", "5+1", "a much longer prompt about 2 + 2 and more words"]
    return [tok(t, add_special_tokens=False).input_ids for t in texts for _ in range(2)], tok


def test_static_decodes_what_dynamic_decodes(tiny_model: str) -> None:
    model = _model(tiny_model)
    prompts, tok = _prompts(tiny_model)
    kw = dict(max_new_tokens=12, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, do_sample=False)
    dynamic = decode(model, prompts, mode="dynamic", **kw)
    static = decode(model, prompts, mode="static", **kw)
    assert static == dynamic
    assert all(0 < len(c) <= 12 for c in dynamic)


def test_the_copy_follows_the_policy(tiny_model: str) -> None:
    policy = _model(tiny_model)
    copy = DecodeCopy(policy, torch.bfloat16)
    for name, value in policy.state_dict().items():
        assert torch.equal(copy.params[name], value.to(torch.bfloat16)), name
    with torch.no_grad():  # an optimizer step, as far as the copy can tell
        for p in policy.parameters():
            p.add_(0.01 * torch.randn_like(p))
    assert not torch.equal(
        copy.params["model.layers.0.mlp.up_proj.weight"], policy.model.layers[0].mlp.up_proj.weight.to(torch.bfloat16)
    )
    copy.sync(policy)
    for name, value in policy.state_dict().items():
        assert torch.equal(copy.params[name], value.to(torch.bfloat16)), name


@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_the_copy_decodes_with_a_cache_though_the_training_policy_has_none(mode: str, tiny_model: str) -> None:
    # a trainer with gradient checkpointing turns the policy's use_cache off, and the copy is made
    # from its config: each decode step must still feed one new token, not the whole sequence
    policy = _model(tiny_model)
    policy.config.use_cache = False
    copy = DecodeCopy(policy, torch.float32)
    prompts, tok = _prompts(tiny_model)
    widths: list[int] = []
    hook = copy.model.register_forward_pre_hook(
        lambda _m, _a, kw: widths.append(kw["input_ids"].size(1)), with_kwargs=True
    )
    try:
        torch.manual_seed(0)
        kw = dict(max_new_tokens=6, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, do_sample=True)
        decode(copy.model, prompts, mode=mode, min_new_tokens=6, **kw)
    finally:
        hook.remove()
    assert len(widths) == 6 and widths[0] > 1 and widths[1:] == [1] * 5, widths


def test_the_copy_of_a_peft_policy_holds_the_merged_weights(tiny_model: str) -> None:
    from peft import LoraConfig, get_peft_model

    policy = get_peft_model(_model(tiny_model), LoraConfig(r=4, target_modules=["q_proj", "up_proj"], lora_alpha=8))
    with torch.no_grad():  # a trained adapter: B is zero at initialisation
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.add_(0.05 * torch.randn_like(p))
    base = policy.base_model.model.model.layers[0].self_attn.q_proj.base_layer.weight.detach().clone()
    copy = DecodeCopy(policy, torch.float32)
    merged = policy.merge_and_unload()
    for name, value in merged.state_dict().items():
        assert torch.allclose(copy.params[name], value, atol=1e-6), name
    assert not torch.equal(copy.params["model.layers.0.self_attn.q_proj.weight"], base)  # the adapter is in it


@pytest.mark.quick
@pytest.mark.parametrize("pytorch", ["before-the-fix", "installed"])
def test_a_python_thread_gets_cuda_graph_state_of_its_own(pytorch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """overlap's thread can run `static`'s compiled decode step: torch.compile's CUDA graphs keep
    their state in thread-local storage, and a PyTorch before pull request 184357 (the GPU nodes'
    2.11) asserted that it was there on a Python thread's first compiled call. 'before-the-fix' is
    that PyTorch's lookup, `get_obj` below, without the fix's `_initialize_tls`
    (torch/_inductor/cudagraph_trees.py); 'installed' is the PyTorch installed, unpatched: the
    2.13 here sets it up lazily, and on a PyTorch without the fix (2.11, run on the CPU by hand) a
    bare thread asserts and the helper's own setup is what runs. Before the fix the helper keeps
    the state out of PyTorch's C++ thread-local: on 2.11 an object stashed there by a Python thread
    crashed this test 9 times in 10 (docs/gpu.md)."""
    import threading

    from torch._inductor import cudagraph_trees as trees

    def get_obj_before_the_fix(local: Any, attr_name: str) -> Any:
        if hasattr(local, attr_name):
            return getattr(local, attr_name)
        assert torch._C._is_key_in_tls(attr_name)
        return torch._C._get_obj_in_tls(attr_name)

    if pytorch == "before-the-fix":
        monkeypatch.setattr(trees, "get_obj", get_obj_before_the_fix)
        monkeypatch.delattr(trees, "_initialize_tls", raising=False)
    found: dict[str, Any] = {}

    def in_a_thread(name: str, prepare: bool) -> None:
        try:
            if prepare:
                cuda_graphs_in_this_thread()
            found[name] = trees.get_container(0)
            if prepare:
                cuda_graphs_in_this_thread()  # each generation calls it: it keeps the thread's state
            found[name + " again"] = trees.get_container(0)
            found[name + " containers"] = trees.get_obj(trees.local, "tree_manager_containers")
            found[name + " stashed"] = torch._C._is_key_in_tls("tree_manager_containers")
        except AssertionError as exc:
            found[name] = exc

    for name, prepare in (("bare", False), ("prepared", True)):
        thread = threading.Thread(target=in_a_thread, args=(name, prepare))
        thread.start()
        thread.join()
    if pytorch == "before-the-fix" or not hasattr(trees, "_initialize_tls"):  # what overlap's thread met before this
        assert isinstance(found["bare"], AssertionError)
    else:
        assert isinstance(found["bare"], trees.TreeManagerContainer)
    assert isinstance(found["prepared"], trees.TreeManagerContainer)
    assert found["prepared"] is found["prepared again"]  # one tree manager per thread and device
    assert found["prepared containers"] is not trees.get_obj(trees.local, "tree_manager_containers")  # not main's
    if pytorch == "before-the-fix":  # Python's thread-local only, never PyTorch's C++ one
        assert found["prepared stashed"] is False


@pytest.mark.parametrize(
    "generation",
    [{"hf_mode": "static"}, {"overlap": True}, {"hf_mode": "static", "overlap": True}],
    ids=["static", "overlap", "static-overlap"],
)
def test_a_grpo_job_trains_with_decoding_on_a_copy(generation: dict[str, Any], tiny_model: str, tmp_path: Path) -> None:
    result, sink = _grpo_job(generation, tiny_model, tmp_path, steps=2)
    assert result["steps"] == 2
    event = next(e for e in sink.events if e["type"] == "generation")
    mode = generation.get("hf_mode", "dynamic")
    assert event["data"]["hf_mode"] == mode and f"decoding '{mode}'" in event["message"]
    steps = [v for _, v in sorted(sink.metrics_by_step.items()) if "generation_tokens_per_second" in v]
    assert len(steps) == 2 and all(v["generation_tokens_per_second"] > 0 for v in steps)
    # the copy synced before each generation: weight-sync time, which TRL's own hf path never has
    if generation.get("overlap"):
        assert event["data"]["overlap"] and "(overlap)" in event["message"]
        # step 1 generated on the spot, then synced again to start step 2's batch while it trained;
        # step 2, the last, starts none
        assert [v["overlap/staleness"] for v in steps] == [0.0, 1.0], steps
        assert steps[0]["weight_sync_seconds"] > 0 and steps[1]["weight_sync_seconds"] == 0
        assert all(v["background_generation_seconds"] > 0 for v in steps)
    else:
        assert all(v["weight_sync_seconds"] > 0 for v in steps)
        assert not event["data"]["overlap"] and not any("overlap/staleness" in v for v in steps)
    assert json.loads((tmp_path / "final" / "config.json").read_text())["model_type"]


@pytest.mark.parametrize("overlap", [False, True], ids=["main-thread", "overlap-thread"])
def test_statics_compiled_decode_step_trains(
    overlap: bool, tiny_model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`static` compiles its decode step (torch.compile) on a GPU only; here transformers is told to
    compile on the CPU too (its `_compile_all_devices`, there for testing), so that a GRPO job runs
    the compiled step inside a training run: on the main thread, and in overlap's thread. What the
    GPU adds, CUDA graphs, is not here."""
    from torch._dynamo.utils import counters
    from transformers.generation.configuration_utils import CompileConfig

    import trainer.hf_generation as hf_generation

    plain = hf_generation.generation_config

    def compiling_on_any_device(mode: str, **kwargs: Any) -> Any:
        config = plain(mode, **kwargs)
        if mode == "static":
            config.compile_config = CompileConfig()
            config.compile_config._compile_all_devices = True
        return config

    monkeypatch.setattr(hf_generation, "generation_config", compiling_on_any_device)
    torch._dynamo.reset()
    compiled = counters["stats"]["unique_graphs"]
    try:
        result, sink = _grpo_job({"hf_mode": "static", "overlap": overlap}, tiny_model, tmp_path, steps=3)
        assert counters["stats"]["unique_graphs"] > compiled  # the decode step was compiled
    finally:
        torch._dynamo.reset()
    assert result["steps"] == 3
    steps = [v for _, v in sorted(sink.metrics_by_step.items()) if "generation_tokens_per_second" in v]
    assert len(steps) == 3 and all(v["generation_tokens_per_second"] > 0 for v in steps)
    if overlap:
        assert [v["overlap/staleness"] for v in steps] == [0.0, 1.0, 1.0], steps
    assert json.loads((tmp_path / "final" / "config.json").read_text())["model_type"]


def _grpo_job(generation: dict[str, Any], tiny_model: str, out: Path, steps: int) -> tuple[dict[str, Any], Any]:
    """A GRPO job on the tiny model through `run_grpo`, as a worker runs it: its result and what it recorded."""
    from kinds import resolve_config
    from mathrl.specs.resolved import ResolvedGRPO
    from service.gpu_check import _data_dir
    from service.gpu_figures import RecordSink
    from trainer.grpo import run_grpo

    spec = parse_spec(
        {
            "kind": "grpo",
            "model": tiny_model,
            "dataset": {"name": "add2-words-train", "limit": 40},
            "max_steps": steps,
            "num_generations": 4,
            "per_device_train_batch_size": 8,
            "max_completion_length": 8,
            "rewards": [{"name": "accuracy"}],
            "save_steps": 10**6,
            "generation": {"backend": "hf", **generation},
            "logging_steps": 1,
        }
    )
    sink = RecordSink(echo=False)
    result = run_grpo(
        spec, resolve_config(spec).of(ResolvedGRPO), sink, model_path=tiny_model, data_dir=_data_dir(), out_dir=out
    )
    return result, sink


def test_hf_mode_is_the_hf_backends_setting(tiny_model: str) -> None:
    job = {"kind": "grpo", "model": tiny_model, "dataset": {"name": "add2-words-train"}}
    assert parse_spec(job).generation.resolved_hf_mode() == "dynamic"
    assert parse_spec({**job, "generation": {"hf_mode": "static"}}).generation.resolved_hf_mode() == "static"
    with pytest.raises(ValueError, match="hf_mode is how the 'hf' backend decodes.*set generation.backend='hf'"):
        parse_spec({**job, "generation": {"backend": "vllm", "hf_mode": "static"}})
    zero3 = {**job, "deepspeed_zero3": True, "resources": {"gpus": 2}}
    with pytest.raises(ValueError, match="hf_mode 'static' decodes on a full copy of the policy"):
        parse_spec({**zero3, "generation": {"backend": "hf", "hf_mode": "static"}})
    assert parse_spec({**zero3, "generation": {"backend": "hf"}}).deepspeed_zero3
