"""Overlapped generation (the spec's `generation.overlap`, hf backend): the next step's completions are
generated on a copy of the policy in a background thread while this step trains, so that a step can
take about the longer of the two instead of their sum.

`Lookahead` reads the dataloader one optimizer step ahead. `BackgroundGenerator` syncs the copy
(trainer/hf_generation.py DecodeCopy) before this step's update, decodes the next batch on it and
scores its sampled tokens (`sampler_logprobs`), on a CUDA stream of its own on a GPU. That batch
(`Prefetched`) trains one step stale, its sampler log-probabilities as the PPO ratio's old policy; a
step with nothing prefetched generates on the spot. How, why and what it measured:
docs/grpo-loop.md, "Overlapped generation"."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from trainer.hf_generation import DecodeCopy, cuda_graphs_in_this_thread, decode


class Lookahead:
    """`Trainer.get_batch_samples` one optimizer step ahead: it returns the same batches in the same
    order, and `next_batch` is the first batch of the next update (None at an epoch's end)."""

    def __init__(self) -> None:
        self._iterator: Iterator[Any] | None = None
        self._ahead: list[Any] = []
        self.next_batch: Any = None

    def take(self, iterator: Iterator[Any], n: int) -> list[Any]:
        if iterator is not self._iterator:  # a new epoch: what was read ahead belongs to no one
            self._iterator, self._ahead = iterator, []
        while len(self._ahead) < 2 * n:
            try:
                self._ahead.append(next(iterator))
            except StopIteration:
                break
        batches, self._ahead = self._ahead[:n], self._ahead[n:]
        self.next_batch = self._ahead[0] if self._ahead else None
        return batches


@dataclass
class Prefetched:
    """One batch generated in the background: its prompts (token ids), the global step whose
    weights generated it, and the thread's result."""

    prompt_ids: list[list[int]]
    step: int
    future: Future[tuple[list[list[int]], list[list[float]], float, float]]  # ..., decode and scoring seconds


class BackgroundGenerator:
    """Generates one batch at a time on a DecodeCopy of the policy, in a thread of its own."""

    def __init__(self, policy: Any, dtype: Any, temperature: float, cast_lm_head_to_fp32: bool) -> None:
        import torch
        from trl.trainer.utils import add_fused_lm_head

        self.copy = DecodeCopy(policy, dtype)
        add_fused_lm_head(self.copy.model, temperature=temperature, cast_lm_head_to_fp32=cast_lm_head_to_fp32)
        self.device = self.copy.model.device
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None  # type: ignore[no-untyped-call]
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mathrl-overlap")
        self.pending: Prefetched | None = None

    def launch(
        self,
        policy: Any,
        step: int,
        prompt_ids: list[list[int]],
        *,
        pad_token_id: int,
        pad_to_multiple_of: int | None,
        score_batch: int,
        **decoding: Any,
    ) -> float:
        """Sync the copy to `policy` (now, before the update) and start generating `prompt_ids` on
        it; the sync's seconds."""
        import torch

        assert self.pending is None, "the last prefetched batch was never taken"
        t0 = time.perf_counter()
        self.copy.sync(policy)
        if self.stream is not None:  # the thread's stream sees the synced weights
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
        synced = time.perf_counter() - t0
        future = self._pool.submit(self._generate, prompt_ids, pad_token_id, pad_to_multiple_of, score_batch, decoding)
        self.pending = Prefetched(prompt_ids, step, future)
        return synced

    def take(self, prompt_ids: list[list[int]]) -> Prefetched | None:
        """The prefetched batch if it is for exactly these prompts (else it is dropped, and None)."""
        pending, self.pending = self.pending, None
        if pending is None:
            return None
        if pending.prompt_ids != prompt_ids:
            pending.future.result()  # let it finish: the copy is synced again next
            return None
        return pending

    def close(self) -> None:
        if self.pending is not None:
            with contextlib.suppress(Exception):
                self.pending.future.result()
            self.pending = None
        self._pool.shutdown(wait=True)

    def _generate(
        self,
        prompt_ids: list[list[int]],
        pad_token_id: int,
        pad_to_multiple_of: int | None,
        score_batch: int,
        decoding: dict[str, Any],
    ) -> tuple[list[list[int]], list[list[float]], float, float]:
        import torch

        if self.stream is not None:
            torch.cuda.set_device(self.device)  # a new thread's current device is cuda:0, whatever the rank's
            if decoding["mode"] == "static":
                cuda_graphs_in_this_thread()  # its compiled decode step is replayed here
        side = torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()
        with side:
            t0 = time.perf_counter()
            completions = decode(self.copy.model, prompt_ids, pad_token_id=pad_token_id, **decoding)
            t1 = time.perf_counter()  # decode returns lists: its kernels are done
            logps = sampler_logprobs(
                self.copy.model, prompt_ids, completions, pad_token_id, pad_to_multiple_of, score_batch
            )
        if self.stream is not None:
            self.stream.synchronize()
        return completions, logps, t1 - t0, time.perf_counter() - t1


def sampler_logprobs(
    model: Any,
    prompt_ids: list[list[int]],
    completions: list[list[int]],
    pad_token_id: int,
    pad_to_multiple_of: int | None,
    batch: int,
) -> list[list[float]]:
    """Each completion token's log-probability under `model` (patched with TRL's fused LM head),
    computed as GRPOTrainer's training forward computes it: prompts left-padded and completions
    right-padded to the batch's widths, labels only on the completions."""
    import torch

    prompts, prompt_mask = _padded(prompt_ids, pad_token_id, "left", pad_to_multiple_of)
    done, done_mask = _padded(completions, pad_token_id, "right", pad_to_multiple_of)
    ids = torch.cat([prompts, done], dim=1).to(model.device)
    mask = torch.cat([prompt_mask, done_mask], dim=1).to(model.device)
    keep = done.size(1)
    out: list[list[float]] = []
    with torch.no_grad():
        for start in range(0, ids.size(0), batch):
            rows, rows_mask = ids[start : start + batch], mask[start : start + batch]
            labels = rows.masked_fill(rows_mask == 0, -100)
            labels[:, :-keep] = -100
            logps = model(input_ids=rows, attention_mask=rows_mask, labels=labels, fused_lm_head=True).log_probs
            for i, row in enumerate(logps[:, -keep:].float().cpu().tolist()):
                out.append(row[: len(completions[start + i])])
    return out


def _padded(rows: list[list[int]], pad_token_id: int, side: str, multiple: int | None) -> tuple[Any, Any]:
    """`rows` as one padded tensor and its attention mask, with TRL's `pad` (as the trainer pads)."""
    import torch
    from trl.trainer.utils import pad

    ids = pad(
        [torch.tensor(r) for r in rows], padding_value=pad_token_id, padding_side=side, pad_to_multiple_of=multiple
    )
    ones = [torch.ones(len(r), dtype=torch.long) for r in rows]
    return ids, pad(ones, padding_value=0, padding_side=side, pad_to_multiple_of=multiple)
