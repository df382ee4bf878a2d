"""The losses a training session's `forward_backward` computes, by the names Tinker's SDK gives
them (`loss_fn`). Each takes one datum's learner log-probabilities of its target tokens and that
datum's inputs (`loss_fn_inputs`, aligned with the tokens) and returns the datum's loss, summed
over its tokens (Tinker's convention: token losses are summed, never averaged; a user who wants a
mean scales `weights` or `advantages`).

- `cross_entropy`: `-(logprobs * weights).sum()`
- `importance_sampling`: `r = exp(logprobs - sampling_logprobs)`, `-(r * advantages).sum()`
- `ppo`: `-min(r * A, clip(r, low, high) * A).sum()`, `low`/`high` per token from the datum's
  inputs or the config (`clip_low_threshold`, `clip_high_threshold`: 0.8 and 1.2 when unset)
- `cispo`: `-(clip(r, low, high).detach() * logprobs * A).sum()`
- `dro`: `-(logprobs * A - beta / 2 * (logprobs - sampling_logprobs) ** 2).sum()` (`beta` from the config)
- `gspo` (GSPO-token, Zheng et al. 2025): the sequence ratio `s = exp(mean(logprobs - sampling_logprobs))` over
  the tokens `sequence_ratio_mask` marks; each token's ratio has `s`'s value and its own log-probability's
  gradient, `s_t = sg(s) * exp(logprobs - sg(logprobs))`, then `-min(s_t * A, clip(s_t, low, high) * A).sum()`
  (the clip range as ppo's). A datum whose mask marks no token has `s = 1`. Without a `sequence_ratio_mask`
  the ratio runs over the tokens with a nonzero advantage: the sampled tokens, in the SDK's and the cookbook's
  datums, whose prompt positions carry advantage 0 (Tinker does not publish its own default; the cookbook's
  `rl.train` sends gspo datums without a mask).

Not served: `stable_reinforce`. Tinker's page for it (alpha) does not publish its objective, only that it
reads information recorded at sampling time, so there is nothing here to implement faithfully;
`forward_backward` refuses it and names the losses that are served.

`sampling_logprobs` is the datum's `logprobs` input: what the sampler gave each token."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mathrl.registry import Registry

if TYPE_CHECKING:
    import torch

Inputs = Mapping[str, "torch.Tensor"]  # a datum's loss inputs, one value per token
Config = Mapping[str, float]  # the call's loss_fn_config
LossFn = Callable[["torch.Tensor", Inputs, Config], "torch.Tensor"]


@dataclass(frozen=True)
class Loss:
    """A loss and the datum inputs it reads besides `target_tokens` (checked before it runs)."""

    fn: LossFn
    reads: tuple[str, ...]

    def __call__(self, logprobs: torch.Tensor, inputs: Inputs, config: Config) -> torch.Tensor:
        return self.fn(logprobs, inputs, config)


LOSSES: Registry[Loss] = Registry("loss function")
RL_INPUTS = ("logprobs", "advantages")  # the sampler's log-probabilities and each token's advantage


def loss(name: str, *reads: str) -> Callable[[LossFn], LossFn]:
    """Register a loss under Tinker's name, with the inputs it reads."""

    def add(fn: LossFn) -> LossFn:
        LOSSES.add(name, Loss(fn, reads))
        return fn

    return add


NOT_SERVED = {
    "stable_reinforce": "its objective is not published (Tinker's page for it is an alpha that names only the"
    " sampling-time information it reads)",
    "custom": "the SDK's forward_backward_custom computes a custom loss on the client and sends the gradient"
    " as a cross_entropy call; a custom loss_fn itself does not reach a server",
}


def loss_named(name: str) -> Loss:
    """The loss `forward_backward` asked for; one that is not served raises why, with the ones that are."""
    if name in NOT_SERVED:
        served = ", ".join(sorted(LOSSES))
        raise ValueError(f"loss_fn {name!r} is not served: {NOT_SERVED[name]}. Use one of: {served}")
    return LOSSES[name]


CLIP_LOW, CLIP_HIGH = 0.8, 1.2  # Tinker's ppo and cispo defaults


def _ratio(logprobs: torch.Tensor, inputs: Inputs) -> torch.Tensor:
    import torch

    return torch.exp(logprobs - inputs["logprobs"])


def _clip(inputs: Inputs, config: Config) -> tuple[torch.Tensor, torch.Tensor]:
    """The clip range per token: the datum's own `clip_*_threshold` inputs, else the config's, else Tinker's."""
    import torch

    def bound(name: str, default: float) -> torch.Tensor:
        given = inputs.get(name)
        return given if given is not None else torch.tensor(float(config.get(name, default)))

    return bound("clip_low_threshold", CLIP_LOW), bound("clip_high_threshold", CLIP_HIGH)


@loss("cross_entropy", "weights")
def cross_entropy(logprobs: torch.Tensor, inputs: Inputs, config: Config) -> torch.Tensor:
    return -(logprobs * inputs["weights"]).sum()


@loss("importance_sampling", *RL_INPUTS)
def importance_sampling(logprobs: torch.Tensor, inputs: Inputs, config: Config) -> torch.Tensor:
    return -(_ratio(logprobs, inputs) * inputs["advantages"]).sum()


@loss("ppo", *RL_INPUTS)
def ppo(logprobs: torch.Tensor, inputs: Inputs, config: Config) -> torch.Tensor:
    import torch

    ratio, advantages = _ratio(logprobs, inputs), inputs["advantages"]
    low, high = _clip(inputs, config)
    return -torch.minimum(ratio * advantages, ratio.clamp(low, high) * advantages).sum()


@loss("cispo", *RL_INPUTS)
def cispo(logprobs: torch.Tensor, inputs: Inputs, config: Config) -> torch.Tensor:
    low, high = _clip(inputs, config)
    return -(_ratio(logprobs, inputs).clamp(low, high).detach() * logprobs * inputs["advantages"]).sum()


@loss("gspo", *RL_INPUTS)
def gspo(logprobs: torch.Tensor, inputs: Inputs, config: Config) -> torch.Tensor:
    import torch

    mask = inputs.get("sequence_ratio_mask")
    marked = (mask if mask is not None else inputs["advantages"]) != 0
    log_ratio = (logprobs.detach() - inputs["logprobs"])[marked]
    sequence = log_ratio.mean() if log_ratio.numel() else torch.zeros((), device=logprobs.device)
    ratio = torch.exp(sequence + logprobs - logprobs.detach())  # the sequence's value, each token's own gradient
    advantages = inputs["advantages"]
    low, high = _clip(inputs, config)
    return -torch.minimum(ratio * advantages, ratio.clamp(low, high) * advantages).sum()


@loss("dro", *RL_INPUTS)
def dro(logprobs: torch.Tensor, inputs: Inputs, config: Config) -> torch.Tensor:
    if "beta" not in config:
        raise ValueError("loss_fn_config.beta: the dro loss needs beta (the weight of its quadratic penalty)")
    beta = float(config["beta"])
    advantages, sampled = inputs["advantages"], inputs["logprobs"]
    return -(logprobs * advantages - 0.5 * beta * (logprobs - sampled) ** 2).sum()
