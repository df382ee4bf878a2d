"""How the `hf` generation backend decodes GRPO's rollouts (the spec's `generation.hf_mode`), as TRL's
GRPOTrainer runs each way (HF_MODES):

- `dynamic`: transformers' `generate` with a cache that grows a token at a time, compilation off:
  TRL's default;
- `static`: a fixed-size cache and a compiled decode step, on a `DecodeCopy` of the policy in the
  run's compute dtype, synced in place before each generation;
- `continuous`: transformers' continuous batching (TRL's `use_transformers_continuous_batching`).

`decode` runs one batch (the trainer's `static` path and bench/hf_generation.py call it); `trl_args`
is what the trainer sets for `continuous`; `cuda_graphs_in_this_thread` readies overlap's thread for
the compiled step. Why `static` decodes on a copy, and each mode's figures: docs/gpu.md;
docs/vllm.md, "GRPO generation"."""

from __future__ import annotations

from typing import Any, get_args

from mathrl.specs.grpo import HFMode

HF_MODES: tuple[str, ...] = get_args(HFMode)
# the share of free GPU memory continuous batching's paged cache may take: TRL's training-aware
# default (transformers' own 0.9 leaves nothing for the backward pass)
CONTINUOUS_MEMORY = 0.5


def trl_args(mode: str) -> dict[str, Any]:
    """GRPOConfig's arguments for a mode TRL runs itself (`static` the trainer runs: `decode`)."""
    if mode == "continuous":
        return {
            "use_transformers_continuous_batching": True,
            "transformers_continuous_batching_config": {"max_memory_percent": CONTINUOUS_MEMORY},
        }
    return {}


def generation_config(mode: str, **kwargs: Any) -> Any:
    """The GenerationConfig TRL's GRPOTrainer builds for the hf path (compilation off), for `mode`:
    `static` asks for the fixed-size cache and turns compilation back on, so transformers compiles
    the decode step (on a GPU; on a CPU it compiles nothing)."""
    from transformers import GenerationConfig

    # with a cache whatever the model's config says: a trainer with gradient checkpointing sets the
    # policy's `use_cache` False, and a copy made from its config would decode without one
    # (recomputing every earlier token at every step: 6.4x slower for SmolLM2, 16 x 48 new tokens)
    if mode == "static":
        return GenerationConfig(**kwargs, use_cache=True, cache_implementation="static", disable_compile=False)
    return GenerationConfig(**kwargs, use_cache=True, disable_compile=True)


def decode(
    model: Any,
    prompts: list[list[int]],
    *,
    mode: str,
    max_new_tokens: int,
    pad_token_id: int,
    eos_token_id: int | list[int] | None,
    do_sample: bool,
    stop_strings: list[str] | None = None,
    tokenizer: Any = None,
    **sampling: Any,
) -> list[list[int]]:
    """Completions of `prompts` (token ids), up to and including the first end-of-sequence, as
    TRL's `_generate_single_turn` produces them on the hf path; `sampling`: temperature, top_p,
    top_k, min_p, repetition_penalty (with `do_sample`). With `stop_strings` (and the `tokenizer`
    transformers matches them with) a row also ends once it has written one: its ids then run on
    in padding, which the caller cuts (trainer/tool_grpo.py, a tool call's turn)."""
    import torch

    if not do_sample:
        sampling = {}
    config = generation_config(
        mode,
        max_new_tokens=max_new_tokens,
        do_sample=do_sample,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        **({"stop_strings": stop_strings} if stop_strings else {}),
        **sampling,
    )
    with torch.no_grad():
        if mode == "continuous":
            from transformers.generation.configuration_utils import ContinuousBatchingConfig

            outputs = model.generate_batch(
                prompts,
                generation_config=config,
                continuous_batching_config=ContinuousBatchingConfig(max_memory_percent=CONTINUOUS_MEMORY),
                progress_bar=False,
            )
            return [list(o.generated_tokens) for o in outputs.values()]
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        out = model.generate(
            input_ids=ids.to(model.device),
            attention_mask=mask.to(model.device),
            generation_config=config,
            **({"tokenizer": tokenizer} if stop_strings else {}),
        )
    eos = set([eos_token_id] if isinstance(eos_token_id, int) else eos_token_id or [])
    completions = []
    for row in out[:, width:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        completions.append(row[:cut])
    return completions


def cuda_graphs_in_this_thread() -> None:
    """Make this thread able to run a decode step compiled with CUDA graphs (`static` on a GPU),
    as overlap's background thread must (trainer/overlap.py). torch.compile's CUDA graphs keep
    their state (cudagraph trees) in thread-local storage, which PyTorch sets up for the thread that
    imports it and autograd's threads only: there a Python thread's first compiled call fails an
    assertion (pytorch issue 123177, open from 2024 until pull request 184357 of June 2026; the GPU
    nodes at hand have PyTorch 2.11.0). Where PyTorch has the fix (`_initialize_tls`, the 2.13 here)
    this calls it. Before it, the thread gets the state in Python's thread-local only, which
    cudagraph trees' lookup (`get_obj`) reads first, and not also in PyTorch's C++ thread-local as
    the fix does: on 2.11 an object stashed there by a Python thread corrupted memory (on the CPU, 9
    of 10 runs of its test in tests/unit/trainer/test_hf_generation.py crashed with a segmentation
    fault after its threads ended, 0 of 10 without the stash: docs/gpu.md). The stash only lets
    autograd's worker threads inherit the state, and the decode thread runs no backward pass (it
    decodes and scores under no_grad). One thread per run runs the compiled step: overlap sends
    every training generation, the first of a run too, to its one thread."""
    import threading
    from collections import defaultdict

    import torch
    from torch._inductor import cudagraph_trees as trees

    if hasattr(trees.local, "tree_manager_containers") or torch._C._is_key_in_tls("tree_manager_containers"):
        return
    initialize = getattr(trees, "_initialize_tls", None)  # PyTorch's own, since the fix
    if initialize is not None:
        initialize(trees.local)
        return
    trees.local.tree_manager_containers = {}  # one tree manager per device, this thread's own
    trees.local.tree_manager_locks = defaultdict(threading.Lock)


class DecodeCopy:
    """The policy's weights in `dtype` on its device, in a model of its own for `static` decoding,
    synced in place (the compiled decode step's CUDA graphs keep reading the same memory). A peft
    policy's adapter is merged into its base weights for the copy and unmerged again, as TRL does
    to sync vLLM."""

    def __init__(self, policy: Any, dtype: Any) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
        with torch.device(base.device):
            self.model = AutoModelForCausalLM.from_config(base.config, dtype=dtype).eval()
        self.model.requires_grad_(False)
        self.params = dict(self.model.state_dict())
        self.sync(policy)

    def sync(self, policy: Any) -> None:
        import torch

        peft = hasattr(policy, "merge_adapter")
        if peft:
            policy.merge_adapter()
        try:
            with torch.no_grad():
                for name, value in policy.state_dict().items():
                    if "lora_" in name:
                        continue
                    target = self.params.get(_plain_name(name) if peft else name)
                    if target is not None:
                        target.copy_(value)
        finally:
            if peft:
                policy.unmerge_adapter()


def _plain_name(name: str) -> str:
    """A peft model's parameter name as the plain model names it."""
    return name.removeprefix("base_model.model.").replace(".base_layer.", ".")
