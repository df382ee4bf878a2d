"""The losses a training session's `forward_backward` computes, by the names Tinker's SDK gives them
(`loss_fn`): `cross_entropy`, `importance_sampling`, `ppo`, `cispo`, `dro` and `gspo` (GSPO-token),
in LOSSES.

Each takes one datum's learner log-probabilities of its target tokens and that datum's inputs
(`loss_fn_inputs`, aligned with the tokens; `sampling_logprobs` is its `logprobs` input) and returns
the datum's loss, summed over its tokens, as Tinker sums. `stable_reinforce` is not served
(NOT_SERVED): `forward_backward` refuses it and names the losses that are. The formulas, and why
stable_reinforce is left out: docs/tinker.md, "What is compatible, and what is not"."""

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
