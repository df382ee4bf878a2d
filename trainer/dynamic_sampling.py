"""Dynamic sampling (DAPO, Yu et al. 2025, section 3.2): a group whose grading signal has zero variance
gives no gradient, so such groups are dropped and more questions are generated until the step holds
as many informative groups as it asked for, or `max_rounds` rounds have run; a step still short is
filled with the dropped groups. The signal is the correctness verdict by default, not the shaped
reward.

What is here works on the tensors TRL's `_generate_and_score_completions` returns: which groups
carry signal (`informative`), and the rows of several rounds joined into one batch (`join_rows`).
Why, and what it costs: docs/grpo-loop.md, "Dynamic sampling"."""

from __future__ import annotations

from typing import Any

import torch

# (B, P) tensors, left-padded; (B, C) tensors, right-padded; (B,) tensors
PROMPT_SIDE = ("prompt_ids", "prompt_mask")
COMPLETION_SIDE = (
    "completion_ids",
    "completion_mask",
    "old_per_token_logps",
    "sampling_per_token_logps",
    "ref_per_token_logps",
    "importance_sampling_ratio",
    "tool_mask",
)
PER_ROW = ("advantages",)
SCALARS = ("num_items_in_batch",)


def informative(values: torch.Tensor, group_size: int, tol: float = 1e-6) -> list[bool]:
    """Per group of `group_size` consecutive rows: whether its values differ (NaN rows, which no
    reward scored, are left out; a group with fewer than two scored rows carries nothing)."""
    out = []
    for group in values.view(-1, group_size):
        scored = group[~torch.isnan(group)]
        out.append(bool(scored.numel() >= 2 and float(scored.max() - scored.min()) > tol))
    return out


def join_rows(parts: list[dict[str, Any]], picks: list[tuple[int, list[int]]], pad_token_id: int) -> dict[str, Any]:
    """One batch of the rows `picks` names, as (part index, row indices) in order, padded to the
    widest part: prompts on the left, completions on the right. `num_items_in_batch` is left to
    the caller (it counts tokens over every process)."""
    keys = set(parts[0])
    unknown = keys - set(PROMPT_SIDE + COMPLETION_SIDE + PER_ROW + SCALARS)
    if unknown:
        raise ValueError(f"dynamic sampling joins text batches only; this batch also holds {sorted(unknown)}")
    out: dict[str, Any] = {}
    for key in keys - set(SCALARS):
        pieces = [parts[p][key][rows] for p, rows in picks if rows]
        if key in PER_ROW:
            out[key] = torch.cat(pieces)
            continue
        width = max(t.size(1) for t in pieces)
        value = pad_token_id if key in ("prompt_ids", "completion_ids") else 0
        left = key in PROMPT_SIDE
        padded = []
        for t in pieces:
            extra = width - t.size(1)
            if extra:
                fill = t.new_full((t.size(0), extra), value)
                t = torch.cat([fill, t] if left else [t, fill], dim=1)
            padded.append(t)
        out[key] = torch.cat(padded)
    return out
