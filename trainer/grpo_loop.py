"""mathrl's GRPO loop on TRL's GRPOTrainer (`MathrlGRPOTrainer`, `LoopOptions`): what it does that the
trainer it wraps does not.

- Dynamic sampling (trainer/dynamic_sampling.py) and a pass-rate curriculum (trainer/curriculum.py).
- No work for no gradient: the forward and backward of zero-advantage completions are skipped where
  the update stays TRL's (SKIPPABLE_LOSSES).
- Overlapped generation on the hf backend (trainer/overlap.py).
- One forward fewer with vLLM: the sampler/trainer ratio is taken from the training forward.

Every step logs what it did: `dynamic_sampling/*`, `curriculum/*`, `skip/trained_fraction`,
`overlap/*`, and with vLLM the mismatch. How each part works and what was measured:
docs/grpo-loop.md."""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from trainer.curriculum import PassRateCurriculum
from trainer.dynamic_sampling import COMPLETION_SIDE, informative, join_rows
from trainer.hf_generation import DecodeCopy, decode
from trainer.importance_ratio import importance_ratio, mismatch_metrics
from trainer.overlap import BackgroundGenerator, Lookahead
from trainer.vllm_generation import TimedGRPOTrainer

if TYPE_CHECKING:
    from trl import GRPOConfig

    from mathrl.specs.loop import Curriculum, DynamicSampling
    from mathrl.specs.resolved import ResolvedGRPO

# loss types whose per-token loss is zero for a zero advantage when beta is 0
SKIPPABLE_LOSSES = ("grpo", "dapo", "dr_grpo", "bnpo", "cispo", "sapo")
# ... and how each normalises: over rows ("rows"), over this batch's tokens ("tokens"), or over
# the whole generation batch's tokens (num_items_in_batch: nothing to rescale)
_NORMALISED_OVER = {"grpo": "rows", "sapo": "rows", "dr_grpo": "rows", "bnpo": "tokens", "dapo": None, "cispo": None}


@dataclass(frozen=True)
class LoopOptions:
    """The resolved loop settings (mathrl/specs/presets.py resolve_loop): None turns a part off."""

    dynamic_sampling: DynamicSampling | None = None
    curriculum: Curriculum | None = None
    skip_zero_advantage: bool = False
    signal_reward: int | None = None  # index of the reward whose value > 0 means "correct"
    overlap: bool = False  # generate the next step while this one trains (hf backend; trainer/overlap.py)

    @classmethod
    def from_config(cls, config: ResolvedGRPO, reward_names: list[str]) -> LoopOptions:
        checked = [i for i, n in enumerate(reward_names) if n in ("accuracy", "binary")]
        return cls(
            dynamic_sampling=config.dynamic_sampling,
            curriculum=config.curriculum,
            skip_zero_advantage=bool(config.skip_zero_advantage),
            signal_reward=checked[0] if checked else None,
            overlap=config.generation.overlap,
        )


class MathrlGRPOTrainer(TimedGRPOTrainer):
    # what TRL's GRPOTrainer sets up, as this loop uses it (TRL types these wider)
    args: GRPOConfig
    model: torch.nn.Module  # the policy
    train_dataset: Any  # a datasets.Dataset (map-style: len and indexing)
    num_generations: int

    def __init__(self, *, loop: LoopOptions, hf_mode: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hf_mode = None if self.use_vllm else hf_mode  # how the hf backend decodes (trainer/hf_generation.py)
        self._decode_copy: DecodeCopy | None = None  # `static` decodes on it (made at the first generation)
        self.loop = loop
        cur = loop.curriculum
        self.curriculum = (
            PassRateCurriculum(len(self.train_dataset), self.args.seed, cur.decay, cur.floor) if cur else None
        )
        if loop.skip_zero_advantage and not self.skip_is_exact():  # resolution stores it only where exact
            raise ValueError(
                "skip_zero_advantage is on, but this trainer's update has a term a zero-advantage completion "
                "still feeds (beta > 0, entropy or auxiliary losses, an off-policy mask): it would not skip"
            )
        self.skip_zero_advantage = loop.skip_zero_advantage
        self.reuse_logprobs = bool(
            self.use_vllm
            and self.vllm_importance_sampling_correction
            and self.num_iterations == 1
            and self.args.gradient_accumulation_steps % cast(int, self.args.steps_per_generation) == 0  # set by TRL
        )
        self._gathered_rewards: torch.Tensor | None = None
        self._reward_seconds: list[float] = []
        overlap = loop.overlap and not self.use_vllm
        self._lookahead = Lookahead() if overlap else None  # the next update's batch, read one step early
        self._background: BackgroundGenerator | None = None  # made at the first generation

    def _generate_single_turn(self, prompt_ids: Any, *args: Any, **kwargs: Any) -> Any:
        if self._lookahead is not None and self.model.training:
            return self._timed_generation(self._take_background, prompt_ids, *args, **kwargs)
        if self.hf_mode != "static":
            return super()._generate_single_turn(prompt_ids, *args, **kwargs)
        return self._timed_generation(self._decode_static, prompt_ids, *args, **kwargs)

    def _decoding(self) -> dict[str, Any]:
        """How the hf path samples, as `decode` takes it (the generation config TRL builds)."""
        return {
            "mode": self.hf_mode or "dynamic",
            "max_new_tokens": int(self.max_completion_length or 0),
            "eos_token_id": self.eos_token_ids,
            "do_sample": True,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty,
        }

    @property
    def _copy_dtype(self) -> torch.dtype:
        """The dtype of a decode copy of the policy (`static`, overlap): the run's compute dtype."""
        return torch.bfloat16 if self.args.bf16 else torch.float32

    def _decode_static(self, prompt_ids: list[list[int]], *_: Any, **__: Any) -> tuple[list[list[int]], None]:
        """`static` decoding (trainer/hf_generation.py) on a copy of the policy in the run's compute
        dtype, synced first (its time is weight-sync time, as a vLLM engine's sync is)."""
        self._sync_decode_copy()
        assert self._decode_copy is not None
        completions = decode(
            self._decode_copy.model, prompt_ids, pad_token_id=self._tokenizer.pad_token_id, **self._decoding()
        )
        return completions, None

    def _sync_decode_copy(self) -> None:
        """Make the decode copy of the policy, or sync it: weight-sync time."""
        t0 = time.perf_counter()
        policy = self.accelerator.unwrap_model(self.model)
        if self._decode_copy is None:
            self._decode_copy = DecodeCopy(policy, self._copy_dtype)
        else:
            self._decode_copy.sync(policy)
        self.timings["weight_sync_seconds"] += time.perf_counter() - t0

    # -- overlapped generation (trainer/overlap.py) ------------------------------------------

    def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> tuple[list[Any], Any]:
        if self._lookahead is None:
            return super().get_batch_samples(epoch_iterator, num_batches, device)
        batches = self._lookahead.take(epoch_iterator, num_batches)
        return batches, self._get_num_items_in_batch(batches, device)

    def _launch_background(self, prompt_ids: list[list[int]]) -> None:
        """Start generating `prompt_ids` on a copy of the policy as it is now (before this step's update)."""
        policy = self.accelerator.unwrap_model(self.model)
        if self._background is None:
            self._background = BackgroundGenerator(
                policy,
                self._copy_dtype,
                temperature=self.temperature,
                cast_lm_head_to_fp32=bool(self.args.cast_lm_head_to_fp32),
            )
        self.timings["weight_sync_seconds"] += self._background.launch(
            policy,
            self.state.global_step,
            prompt_ids,
            pad_token_id=self._tokenizer.pad_token_id,
            pad_to_multiple_of=cast("int | None", self.pad_to_multiple_of),
            score_batch=self.args.per_device_train_batch_size,
            **self._decoding(),
        )

    def _take_background(self, prompt_ids: list[list[int]], *_: Any, **__: Any) -> tuple[list[list[int]], Any]:
        """This round's completions and their sampler log-probabilities: prefetched during the last
        step's training where its prompts were read ahead, else generated on the copy now."""
        taken = self._background.take(prompt_ids) if self._background is not None else None
        if taken is None:
            self._launch_background(prompt_ids)
            assert self._background is not None
            taken = self._background.take(prompt_ids)
            assert taken is not None
        t0 = time.perf_counter()
        completions, logps, decoding, scoring = taken.future.result()
        metrics = self._metrics["train"]
        metrics["overlap/wait_seconds"].append(time.perf_counter() - t0)
        metrics["overlap/staleness"].append(float(self.state.global_step - taken.step))
        metrics["overlap/scoring_seconds"].append(scoring)  # the sampler's log-probabilities, after decoding
        self.timings["background_generation_seconds"] += decoding
        return completions, logps

    def _prepare_inputs(self, generation_batch: Any) -> Any:
        inputs = super()._prepare_inputs(generation_batch)
        if self._lookahead is not None and self.model.training:
            self._prefetch_next()
        return inputs

    def _prefetch_next(self) -> None:
        """Start generating the next update's batch, if the dataloader has one and the run goes on:
        once an update, after TRL has scored and shuffled this one (its shuffle draws from the
        global RNG the thread samples from: drawn in this order, a run is the same every time)."""
        assert self._lookahead is not None
        batch = self._lookahead.next_batch
        self._lookahead.next_batch = None  # one prefetch per update (dynamic sampling's rounds are refused)
        if batch is None or 0 < self.state.max_steps <= self.state.global_step + 1:
            return
        prompt_ids, _, _ = self._tokenize_prompts(copy.deepcopy([x["prompt"] for x in batch]))
        self._launch_background(prompt_ids)

    def train(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().train(*args, **kwargs)
        finally:
            if self._background is not None:
                self._background.close()
                self._background = None

    def skip_is_exact(self) -> bool:
        """Whether a zero-advantage completion adds exactly nothing to this run's update."""
        return (
            self.beta == 0.0
            and self.loss_type in SKIPPABLE_LOSSES
            and self.top_entropy_quantile == 1.0
            and not self._entropy_bonus_enabled
            and not self.aux_loss_enabled
            and self.off_policy_mask_threshold is None
        )

    # -- generation: dynamic sampling and the curriculum ------------------------------------

    def _calculate_rewards(self, inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any) -> Any:
        t0 = time.perf_counter()
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._reward_seconds.append(time.perf_counter() - t0)
        self._gathered_rewards = rewards  # every process's rows: the grading signal is read from here
        return rewards

    def pop_timings(self) -> dict[str, float]:
        """TimedGRPOTrainer's timings, and the latency of scoring one round's completions on this
        rank (every reward function, gathering included): median and 95th percentile."""
        out = super().pop_timings()
        if self._reward_seconds:
            out["reward/seconds_p50"] = float(np.percentile(self._reward_seconds, 50))
            out["reward/seconds_p95"] = float(np.percentile(self._reward_seconds, 95))
        self._reward_seconds = []
        return out

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        if not self.model.training:
            return super()._generate_and_score_completions(inputs)
        return self._sample_groups(inputs)

    def _one_round(self, batch: list[dict[str, Any]]) -> tuple[dict[str, Any], torch.Tensor, torch.Tensor]:
        """Generate and score one batch: TRL's output, and per local row the verdict (1 correct, 0
        not, NaN unscored) and the weighted reward."""
        with self._defer_logprob_pass():
            out = super()._generate_and_score_completions(batch)
        if self._lookahead is not None:  # overlap sampled it on the copy: its log-probs are the ratio's old policy
            out["old_per_token_logps"] = out["sampling_per_token_logps"]
        rewards = self._gathered_rewards
        assert rewards is not None
        n, rank = len(batch), self.accelerator.process_index
        local = rewards[rank * n : (rank + 1) * n]
        weights = self.reward_weights.to(local.device)
        total = (local * weights.unsqueeze(0)).nansum(dim=1)
        i = self.loop.signal_reward
        if i is None:
            verdict = torch.full((n,), float("nan"), device=local.device)
        else:
            verdict = torch.where(torch.isnan(local[:, i]), local[:, i], (local[:, i] > 0).float())
        return out, verdict.cpu(), total.cpu()

    def _sample_groups(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        g = self.num_generations
        want = len(inputs) // g
        ds = self.loop.dynamic_sampling
        rounds = ds.max_rounds if ds else 1
        step, rank = self.state.global_step, self.accelerator.process_index
        questions: list[int] | None = None
        batch = inputs
        if self.curriculum is not None:
            questions = self.curriculum.draw(want, step, 0, rank)
            batch = self._rows(questions)
        parts: list[dict[str, Any]] = []
        good: list[tuple[int, list[int]]] = []
        spare: list[tuple[int, list[int]]] = []
        generated = zero_groups = 0
        used = 0
        for r in range(rounds):
            out, verdict, total = self._one_round(batch)
            parts.append(out)
            used = r + 1
            generated += len(batch)
            signal = verdict if ds and ds.metric == "correct" else total
            flags = informative(signal, g)
            zero_groups += flags.count(False)
            for k, ok in enumerate(flags):
                (good if ok or not ds else spare).append((r, list(range(k * g, (k + 1) * g))))
            if self.curriculum is not None and questions is not None:
                self._update_curriculum(questions, verdict, g)
            short = self._max_over_ranks(max(0, want - len(good)))
            if short == 0 or r == rounds - 1:
                break
            questions = self._refill(short, step, r + 1, rank)
            batch = self._rows(questions)
        picks = sorted((good + spare)[:want], key=lambda pick: (pick[0], pick[1][0]))  # in the order generated
        metrics = self._metrics["train"]
        groups_seen = generated // g
        metrics["dynamic_sampling/zero_variance_fraction"].append(self._mean_over_ranks(zero_groups / groups_seen))
        if ds:
            kept = min(len(good), want)
            metrics["dynamic_sampling/kept_fraction"].append(self._mean_over_ranks(kept / want))
            metrics["dynamic_sampling/rounds"].append(float(used))
            metrics["dynamic_sampling/generated_completions"].append(self._sum_over_ranks(generated))
        if self.curriculum is not None:
            for name, value in self.curriculum.summary().items():
                metrics[name].append(value)
        if len(parts) == 1 and len(picks) == want:
            return parts[0]  # one round, every group kept: TRL's batch as it is
        out = join_rows(parts, picks, self._tokenizer.pad_token_id)
        out["num_items_in_batch"] = self.accelerator.gather(out["completion_mask"].sum()).sum()
        return out

    def _rows(self, questions: list[int]) -> list[dict[str, Any]]:
        """The dataset rows of `questions`, each repeated for its group (as TRL's sampler does)."""
        rows: list[dict[str, Any]] = []
        for q in questions:
            row = dict(self.train_dataset[q])
            rows.extend(dict(row) for _ in range(self.num_generations))
        return rows

    def _refill(self, n: int, step: int, round_: int, rank: int) -> list[int]:
        if self.curriculum is not None:
            return self.curriculum.draw(n, step, round_, rank)
        size = len(self.train_dataset)
        rng = np.random.default_rng([self.args.seed, step, round_, rank])
        return [int(i) for i in rng.choice(size, size=n, replace=n > size)]

    def _update_curriculum(self, questions: list[int], verdict: torch.Tensor, g: int) -> None:
        assert self.curriculum is not None
        rates = torch.nan_to_num(verdict, nan=0.0).view(-1, g).mean(dim=1).tolist()
        mine = list(zip(questions, rates, strict=True))
        if self.accelerator.num_processes > 1:  # every rank keeps the same table
            from accelerate.utils import gather_object

            mine = gather_object([mine])
            mine = [pair for part in mine for pair in part]
        self.curriculum.update(mine)

    def _max_over_ranks(self, value: int) -> int:
        if self.accelerator.num_processes == 1:
            return value
        t = torch.tensor([value], device=self.accelerator.device)
        return int(self.accelerator.gather(t).max().item())

    def _sum_over_ranks(self, value: float) -> float:
        if self.accelerator.num_processes == 1:
            return float(value)
        t = torch.tensor([float(value)], device=self.accelerator.device)
        return float(self.accelerator.gather(t).sum().item())

    def _mean_over_ranks(self, value: float) -> float:
        processes: int = self.accelerator.num_processes
        return self._sum_over_ranks(value) / processes

    @contextlib.contextmanager
    def _defer_logprob_pass(self) -> Iterator[None]:
        """With `reuse_logprobs`, TRL's post-generation no-grad forward is skipped: the ratio is
        taken from the training forward (_compute_loss)."""
        if not self.reuse_logprobs:
            yield
            return
        self.vllm_importance_sampling_correction = False
        try:
            yield
        finally:
            self.vllm_importance_sampling_correction = True

    # -- the curriculum's state travels with each checkpoint ----------------------------

    def _save_rng_state(self, output_dir: str) -> None:
        super()._save_rng_state(output_dir)
        if self.curriculum is not None and self.accelerator.is_main_process:
            self.curriculum.save(output_dir)

    def _load_rng_state(self, checkpoint: str | None) -> None:
        super()._load_rng_state(checkpoint)
        if self.curriculum is not None and checkpoint is not None:
            self.curriculum.load(checkpoint)

    # -- training: skip what carries no gradient, reuse the forward's log-probabilities -----

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        scale = 1.0
        full = inputs["advantages"].size(0)
        if self.skip_zero_advantage and self.model.training:
            inputs, scale = self._informative_rows(inputs)
            self._metrics["train"]["skip/trained_fraction"].append(
                self._mean_over_ranks(float((inputs["advantages"] != 0).sum()) / full)
            )
        if self.model.training:
            rows = inputs["completion_mask"]
            self.timings["trained_tokens"] += float(rows.sum())
            self.timings["forward_tokens"] += float(rows.sum() + inputs["prompt_mask"].sum())
            self.timings["forward_rows"] += float(rows.size(0))
        loss: torch.Tensor
        if self.reuse_logprobs and "importance_sampling_ratio" not in inputs and "sampling_per_token_logps" in inputs:
            with self._ratio_from_training_forward(inputs):
                loss = super()._compute_loss(model, inputs)
        else:
            loss = super()._compute_loss(model, inputs)
        return loss * scale if scale != 1.0 else loss

    def _informative_rows(self, inputs: dict[str, Any]) -> tuple[dict[str, Any], float]:
        """The rows that move the update, padded with zero-advantage rows to the same count on every
        rank (the loss's metrics gather one value per row), with the completion width trimmed to
        what they use; and the factor that keeps the loss TRL's."""
        adv, mask = inputs["advantages"], inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        full = adv.size(0)
        lengths = mask.sum(dim=1)
        live = ((adv != 0) & (lengths > 0)).nonzero().flatten().tolist()
        n = self._max_over_ranks(max(1, len(live)))
        if n >= full:
            return inputs, 1.0
        taken = set(live)
        idle = sorted((i for i in range(full) if i not in taken), key=lambda i: int(lengths[i]))
        rows = sorted(live + idle[: n - len(live)])
        index = torch.tensor(rows, device=adv.device)
        width = int(mask[index].nonzero()[:, 1].max().item()) + 1 if mask[index].any() else 1
        c = inputs["completion_ids"].size(1)
        sub: dict[str, Any] = {}
        for key, value in inputs.items():
            if isinstance(value, torch.Tensor) and value.ndim >= 1 and value.size(0) == full:
                value = value[index]
                if key in COMPLETION_SIDE and value.ndim == 2 and value.size(1) == c:
                    value = value[:, :width]
            sub[key] = value
        over = _NORMALISED_OVER[self.loss_type]
        if over == "rows":
            scale = len(rows) / full
        elif over == "tokens":
            scale = float(mask[index].sum().clamp(min=1.0) / mask.sum().clamp(min=1.0))
        else:
            scale = 1.0
        return sub, scale

    @contextlib.contextmanager
    def _ratio_from_training_forward(self, inputs: dict[str, Any]) -> Iterator[None]:
        """While TRL's loss runs: once its training forward returns the log-probabilities, put the
        sampler/trainer importance ratio into `inputs` before the loss reads it."""
        forward = self._get_per_token_logps_and_entropies

        def hooked(*args: Any, **kwargs: Any) -> Any:
            logps, entropies, aux = forward(*args, **kwargs)
            if kwargs.get("compute_entropy"):  # the training forward (TRL's other passes do not ask)
                mask = inputs["completion_mask"]
                if "tool_mask" in inputs:
                    mask = mask * inputs["tool_mask"]
                inputs["importance_sampling_ratio"] = self.importance_ratio(
                    logps.detach(), inputs["sampling_per_token_logps"], mask
                )
            return logps, entropies, aux

        self._get_per_token_logps_and_entropies = hooked  # type: ignore[method-assign]
        try:
            yield
        finally:
            del self._get_per_token_logps_and_entropies  # the class's method again

    def importance_ratio(self, old: torch.Tensor, sampling: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """TRL 1.16's vLLM importance-sampling ratio from the trainer's log-probabilities `old` and the
        sampler's (trainer/importance_ratio.py), its `sampling/*` metrics logged."""
        mode = self.vllm_importance_sampling_mode
        lo, hi = self.vllm_importance_sampling_clip_min, self.vllm_importance_sampling_clip_max
        ratio = importance_ratio(old, sampling, mask, mode, lo, hi)
        for name, value in mismatch_metrics(old, sampling, mask, ratio, mode, self.accelerator.gather).items():
            self._metrics["train"][name].append(value)
        return ratio
