"""The sampler/trainer importance ratio GRPO on vLLM weighs its loss with (trainer/importance_ratio.py,
TRL 1.16's arithmetic): per token or per completion, truncated or masked at its limits, padding left
out, and the mismatch metrics over every rank."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.importance_ratio import importance_ratio, mismatch_metrics

pytestmark = pytest.mark.quick

OLD = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -0.1, -3.0]])
SAMPLING = torch.tensor([[-1.5, -1.0, -3.5], [-0.2, -0.4, -1.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])  # the first row's last token is padding


def test_per_token_ratios_are_truncated_or_masked_at_their_limits() -> None:
    raw = [math.exp(0.5), math.exp(-1.0), 1.0, 1.0, math.exp(0.3), math.exp(-2.0)]  # padding: 1
    got = importance_ratio(OLD, SAMPLING, MASK, "token_truncate", None, 1.2)
    assert got.flatten().tolist() == pytest.approx([min(r, 1.2) for r in raw])
    got = importance_ratio(OLD, SAMPLING, MASK, "token_mask", 0.5, 1.5)
    assert got.flatten().tolist() == pytest.approx([r if 0.5 <= r <= 1.5 else 0.0 for r in raw])


def test_a_sequence_ratio_is_one_per_completion_over_its_own_tokens() -> None:
    got = importance_ratio(OLD, SAMPLING, MASK, "sequence_truncate", None, 3.0)
    assert got.shape == (2, 1)  # padding counts for nothing
    assert got.flatten().tolist() == pytest.approx([math.exp(-0.5), math.exp(-1.7)])
    got = importance_ratio(OLD, SAMPLING, MASK, "sequence_mask", 0.5, 3.0)
    assert got.flatten().tolist() == pytest.approx([math.exp(-0.5), 0.0])
    with pytest.raises(ValueError, match="Unknown vLLM importance sampling level: tokens"):
        importance_ratio(OLD, SAMPLING, MASK, "tokens", None, None)


def test_the_mismatch_metrics_cover_every_ranks_tokens() -> None:
    sampling = SAMPLING.clone()
    sampling[1, 2] = float("nan")  # a token the sampler gave no log-probability for: ratio 1, no difference
    ratio = importance_ratio(OLD, sampling, MASK, "token_truncate", None, 10.0)
    other_rank = torch.tensor(4.0)  # what a second rank's gather adds

    def gather(t: torch.Tensor) -> torch.Tensor:
        return torch.stack([t.reshape(()), other_rank])

    got = mismatch_metrics(OLD, sampling, MASK, ratio, "token_truncate", gather)
    diffs = [0.5, 1.0, 0.0, 0.3]  # the completion tokens' |old - sampling|, padding and the nan left out
    assert got["sampling/sampling_logp_difference/mean"] == pytest.approx((sum(diffs) / 4 + 4.0) / 2)
    assert got["sampling/sampling_logp_difference/max"] == 4.0
    kept = [math.exp(0.5), math.exp(-1.0), 1.0, math.exp(0.3), 1.0]
    assert got["sampling/importance_sampling_ratio/min"] == pytest.approx(min(kept))
    assert got["sampling/importance_sampling_ratio/mean"] == pytest.approx((sum(kept) / 5 + 4.0) / 2)
    assert got["sampling/importance_sampling_ratio/max"] == 4.0
