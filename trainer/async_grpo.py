"""Asynchronous GRPO (experimental): TRL's AsyncGRPOTrainer on the job's vLLM server
(`build_async_trainer`).

A rollout worker process keeps generating on the server (worker.vllm_server) while the trainer
trains on finished samples at most `max_staleness` weight updates old; weights reach the server as
LoRA adapters, or over NCCL without LoRA (GPUs only). TRL 1.16's async trainer assumes CUDA in two
places, both replaced on a CPU only (`_cpu_shims`): its tree attention's FlashAttention-3 kernel
(`varlen_causal_attention`: torch's SDPA) and the GPU name its MFU metric reads. docs/vllm.md, "GRPO
generation"."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from mathrl.specs import GRPOSpec
from mathrl.specs.resolved import ResolvedGRPO
from runtime.sink import Sink


def varlen_causal_attention(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float | None = None,
    causal: bool = True,
    window_size: tuple[int, int] = (-1, -1),
    **_: Any,
) -> Any:
    """flash_attn_varlen_func's contract on any device: q (total_q, heads, dim), k/v (total_k,
    kv_heads, dim); segment i's queries attend to its keys with the causal mask aligned to the
    bottom right (query j of Lq sees keys 0 .. Lk - Lq + j), as FlashAttention does."""
    import torch
    import torch.nn.functional as F

    if window_size != (-1, -1):
        raise NotImplementedError("sliding-window attention is not supported by the CPU tree attention")
    out = torch.empty_like(q)
    groups = q.shape[1] // k.shape[1]
    bounds_q, bounds_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for i in range(len(bounds_q) - 1):
        qs, qe, ks, ke = bounds_q[i], bounds_q[i + 1], bounds_k[i], bounds_k[i + 1]
        if qe == qs:
            continue
        qi = q[qs:qe].transpose(0, 1)
        ki = k[ks:ke].transpose(0, 1).repeat_interleave(groups, dim=0)
        vi = v[ks:ke].transpose(0, 1).repeat_interleave(groups, dim=0)
        lq, lk = qe - qs, ke - ks
        mask = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(diagonal=lk - lq) if causal else None
        out[qs:qe] = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=softmax_scale).transpose(0, 1)
    return out


def _stop_without_hanging() -> None:
    """TRL 1.16's AsyncRolloutWorker.stop sets a multiprocessing Event the rollout child waits
    on; when the child has already died (a reward raised in it), Event.set waits forever for the
    dead waiter to wake (multiprocessing.Condition.notify), so a failed async job never ends.
    With the child gone there is nothing to tell: skip the event and let the error propagate."""
    from trl.experimental.async_grpo.async_rollout_worker import AsyncRolloutWorker

    if getattr(AsyncRolloutWorker.stop, "_mathrl", False):
        return
    original = AsyncRolloutWorker.stop

    def stop(self: Any) -> None:
        proc = self._process
        if proc is not None and proc._popen is not None and not proc.is_alive():
            proc.join(timeout=0)
            self._process = None
            return
        original(self)

    stop._mathrl = True  # type: ignore[attr-defined]
    AsyncRolloutWorker.stop = stop  # type: ignore[method-assign]


def _cpu_shims() -> None:
    from transformers import AttentionInterface
    from trl.experimental.async_grpo import async_grpo_trainer, packing

    async_grpo_trainer.get_peak_flops_per_device = lambda accelerator, dtype: None

    def tree_attention_cpu(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kw: Any) -> Any:
        q, k, v = (x.transpose(1, 2)[0] for x in (query, key, value))
        out = varlen_causal_attention(
            q,
            k.index_select(0, kw["tree_kv_index"]),
            v.index_select(0, kw["tree_kv_index"]),
            kw["tree_cu_seqlens_q"],
            kw["tree_cu_seqlens_k"],
            kw["tree_max_seqlen_q"],
            kw["tree_max_seqlen_k"],
            softmax_scale=kw.get("scaling"),
            window_size=(kw["sliding_window"] - 1, 0) if kw.get("sliding_window") else (-1, -1),
        )
        return out.unsqueeze(0), None

    # AsyncGRPOTrainer.__init__ registers the FA3 version; the model looks the name up per call
    async_grpo_trainer.register_tree_attention = lambda: AttentionInterface.register(
        packing.TREE_ATTENTION, tree_attention_cpu
    )
    AttentionInterface.register(packing.TREE_ATTENTION, tree_attention_cpu)


# How TRL's async rollout worker parses a ChatML reply (SmolLM2, the tiny test model): content up
# to <|im_end|>. TRL ships response templates for Qwen, Llama, Gemma and others and asks for one
# to be set for any other chat template.
CHATML_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {"content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"}},
}


def with_response_template(tokenizer: Any) -> Any:
    """Set the ChatML response template on a ChatML tokenizer TRL does not know; leave others as
    they are (TRL sets the known ones, and says so for the rest)."""
    from trl.chat_template_utils import add_response_schema

    if getattr(tokenizer, "response_template", None) is not None:
        return tokenizer
    try:
        return add_response_schema(tokenizer)
    except ValueError:
        if "<|im_start|>" in (tokenizer.chat_template or ""):
            tokenizer.response_template = CHATML_RESPONSE_TEMPLATE
        return tokenizer


def async_args(config: ResolvedGRPO, output_dir: Path, use_cpu: bool, server_url: str) -> Any:
    from trl.experimental.async_grpo import AsyncGRPOConfig

    kwargs: dict[str, Any] = {}
    if config.max_staleness is not None:
        kwargs["max_staleness"] = config.max_staleness
    from trainer.grpo_config import common_args

    return AsyncGRPOConfig(
        **common_args(config, output_dir, use_cpu, server_url),
        dtype="float32" if use_cpu else "bfloat16",
        **kwargs,
    )


def build_async_trainer(
    spec: GRPOSpec,
    config: ResolvedGRPO,
    sink: Sink,
    *,
    model_path: str,
    dataset: Any,
    tokenizer: Any,
    rewards: list[Any],
    weights: list[float],
    out_dir: Path,
    server_url: str,
    callbacks: list[Any],
    peft_config: Any,
) -> Any:
    import torch
    from trl.experimental.async_grpo import AsyncGRPOTrainer

    from evaluator.models import check_loaded_from_hub

    use_cpu = not torch.cuda.is_available()
    args = async_args(config, out_dir, use_cpu, server_url)
    args.reward_weights = weights
    t0 = time.monotonic()
    _stop_without_hanging()
    if use_cpu:
        _cpu_shims()
    trainer = AsyncGRPOTrainer(
        model=model_path,
        reward_funcs=rewards,
        args=args,
        train_dataset=dataset,
        processing_class=with_response_template(tokenizer),
        callbacks=callbacks,
        peft_config=peft_config,
    )
    check_loaded_from_hub(model_path, trainer.model, getattr(trainer, "ref_model", None))
    sink.event(
        "generation",
        f"async GRPO (experimental) on the job's vLLM server, max_staleness "
        f"{args.max_staleness} (ready in {time.monotonic() - t0:.0f}s)",
        data={"backend": "vllm", "mode": "server", "algorithm": "async", "max_staleness": args.max_staleness},
    )
    return trainer
