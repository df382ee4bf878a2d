"""A Tinker session's samplers, as its backend's token sampler (evaluator/backends/token_sampler.py)
samples them: `sample_call` reads an `asample` body, and `SnapshotWeights` is a sampler's weights,
a snapshot of the session's adapter (`lora_weights`), put in the session's model for a call
(`use_weights`) or written as an adapter directory for an engine."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from evaluator.backends.token_sampler import SampleCall
from mathrl.specs.generate import MAX_TOKENS
from trainer.session import TrainingSession


def sample_call(body: Mapping[str, Any]) -> SampleCall:
    """An `asample` JSON body as a call; ValueError naming the field that cannot be served."""
    tokens: list[int] = []
    for i, chunk in enumerate((body.get("prompt") or {}).get("chunks") or []):
        if chunk.get("type", "encoded_text") != "encoded_text":
            raise ValueError(f"prompt.chunks[{i}]: only encoded_text chunks are supported (no images)")
        tokens.extend(int(t) for t in chunk.get("tokens") or [])
    if not tokens:
        raise ValueError("prompt: give at least one token")
    params = body.get("sampling_params") or {}
    stop = params.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if int(body.get("topk_prompt_logprobs") or 0) or int(body.get("topk_sample_logprobs") or 0):
        raise ValueError("topk_prompt_logprobs/topk_sample_logprobs: top-k log-probabilities are not served; send 0")
    n = int(1 if body.get("num_samples") is None else body["num_samples"])  # 0 is 0: refused, not one sample
    if not 1 <= n <= 128:
        raise ValueError(f"num_samples: {n} is out of range; give 1 to 128")
    max_tokens = params.get("max_tokens")
    if max_tokens is not None and not 1 <= int(max_tokens) <= MAX_TOKENS:
        raise ValueError(f"sampling_params.max_tokens: {max_tokens} is out of range; give 1 to {MAX_TOKENS}")
    temperature, top_p = float(params.get("temperature", 1.0)), float(params.get("top_p", 1.0))
    if not 0.0 <= temperature <= 100.0:  # NaN fails too; a negative one was served as greedy
        raise ValueError(f"sampling_params.temperature: {temperature} is out of range; give 0 (greedy) to 100")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"sampling_params.top_p: {top_p} is out of range; give more than 0, at most 1")
    return SampleCall(
        prompt=tokens,
        num_samples=n,
        max_tokens=None if max_tokens is None else int(max_tokens),
        temperature=temperature,
        top_p=top_p,
        top_k=int(params.get("top_k", -1)),
        stop=stop,
        seed=params.get("seed"),
        prompt_logprobs=bool(body.get("prompt_logprobs")),
        prompt_logprobs_last_n=body.get("prompt_logprobs_last_n"),
    )


def lora_weights(session: TrainingSession) -> dict[str, Any]:
    """A copy of the adapter's weights now: a sampler's snapshot."""
    return {name: p.detach().clone() for name, p in session.model.named_parameters() if p.requires_grad}


@contextmanager
def use_weights(session: TrainingSession, weights: Mapping[str, Any] | None) -> Iterator[None]:
    """The model with these adapter weights (None: as it is) for the block, then as it was; the
    accumulated gradients are untouched, so a sample between forward_backward calls changes no step."""
    import torch

    was_training = session.model.training
    session.model.eval()
    saved = lora_weights(session) if weights is not None else {}
    try:
        with torch.no_grad():
            if weights is not None:
                for name, p in session.model.named_parameters():
                    if name in weights:
                        p.copy_(weights[name])
            yield
    finally:
        with torch.no_grad():
            for name, p in session.model.named_parameters():
                if name in saved:
                    p.copy_(saved[name])
        session.model.train(was_training)


class SnapshotWeights:
    """One sampler's weights (evaluator.backends.token_sampler.SamplerWeights): `weights`, a snapshot
    of the session's adapter, in its model for a call; as a directory, `saved` where the sampler came
    from a save (its adapter as written), else written under `spill` at the first ask."""

    def __init__(self, session: TrainingSession, weights: Mapping[str, Any], saved: Path | None, spill: Path) -> None:
        self.session, self.weights, self.saved, self.spill = session, weights, saved, spill

    def held(self) -> AbstractContextManager[None]:
        return use_weights(self.session, self.weights)

    def directory(self) -> Path:
        if self.saved is None:
            with use_weights(self.session, self.weights):
                self.session.model.save_pretrained(str(self.spill))
            self.saved = self.spill
        return self.saved
