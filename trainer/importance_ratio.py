"""The sampler/trainer importance ratio of a GRPO step on vLLM, as TRL 1.16 computes it
(GRPOTrainer._generate_and_score_completions), and the mismatch metrics it logs with it. mathrl's
loop (trainer/grpo_loop.py) takes the trainer's log-probabilities from the training forward instead
of a pass of their own, and calls these with them."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch


def sequence_level(mode: str) -> bool:
    """Whether `mode` (vllm_importance_sampling_mode) weighs a whole completion, not each token."""
    return mode in ("sequence_mask", "sequence_truncate")


def importance_ratio(
    old: torch.Tensor,
    sampling: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    clip_min: float | None,
    clip_max: float | None,
) -> torch.Tensor:
    """exp(trainer - sampler log-probabilities) over the completion `mask`, per token or per
    sequence, truncated to or masked outside [clip_min, clip_max] as `mode` says."""
    diff = torch.nan_to_num((old - sampling) * mask, nan=0.0)
    ratio = torch.exp(diff.sum(dim=-1, keepdim=True) if sequence_level(mode) else diff)
    if mode in ("sequence_truncate", "token_truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    if mode in ("sequence_mask", "token_mask"):
        low = clip_min if clip_min is not None else -math.inf
        high = clip_max if clip_max is not None else math.inf
        return ratio.masked_fill((ratio < low) | (ratio > high), value=0.0)
    raise ValueError(f"Unknown vLLM importance sampling level: {mode}")


def mismatch_metrics(
    old: torch.Tensor,
    sampling: torch.Tensor,
    mask: torch.Tensor,
    ratio: torch.Tensor,
    mode: str,
    gather: Callable[[torch.Tensor], torch.Tensor],
) -> dict[str, float]:
    """TRL's `sampling/*` metrics of a batch: the log-probability differences and the ratio's
    min, mean and max, each over every rank (`gather`: the accelerator's)."""
    bool_mask = mask.bool()
    delta = torch.abs(old - sampling)[bool_mask]
    delta = delta[~torch.isnan(delta)]
    zero = torch.tensor(0.0, device=old.device)
    out = {
        "sampling/sampling_logp_difference/mean": gather(delta.mean() if delta.numel() else zero).mean().item(),
        "sampling/sampling_logp_difference/max": gather(delta.max() if delta.numel() else zero).max().item(),
    }
    flat = ratio.flatten() if sequence_level(mode) else ratio[bool_mask]
    reducers: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "min": torch.min,
        "mean": torch.mean,
        "max": torch.max,
    }
    for stat, reduce in reducers.items():
        value = reduce(flat) if flat.numel() else zero
        out[f"sampling/importance_sampling_ratio/{stat}"] = reduce(gather(value.reshape(1))).item()
    return out
