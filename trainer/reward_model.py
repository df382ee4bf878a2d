"""Reward-model jobs, with training data built the Math-Shepherd way.

Outcome RM: sample N solutions per question from a policy, label each by checking its final
answer with math-verify, train TRL's RewardTrainer on (correct, incorrect) pairs.
Process RM: for each step of a sampled solution, complete k times from that prefix; the step
is good if any completion reaches the gold answer. A token classifier learns to label the
step ends. Both report held-out pairwise accuracy and best-of-N reranking accuracy against
majority vote, as scores.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evaluator import prompts
from evaluator.backends import Backend, BackendOptions, Decoding, Generator, backend
from evaluator.data import Problem
from evaluator.grading import grade
from evaluator.metrics import maj_at_k, wilson_interval
from evaluator.models import check_loaded_from_hub, load_tokenizer
from mathrl.specs import RewardModelSpec
from runtime.errors import StopRequested
from runtime.processes import is_main
from runtime.sink import Sink
from trainer.data import load_problems
from trainer.training_args import TrainingArgs, training_args

if TYPE_CHECKING:
    from transformers import TrainingArguments
    from trl import RewardConfig

STEP_TAG = "\n"  # a step is a line of the solution


@dataclass
class Sampled:
    problem: Problem
    prompt: str
    completions: list[str]
    answers: list[str | None]
    correct: list[bool]


def load_policy(
    spec: RewardModelSpec, policy_path: str, prompts_for_length: list[str], tok: Any,
    options: BackendOptions | None = None,
) -> tuple[Backend, Generator]:  # fmt: skip
    """(backend, the policy it holds) for the spec's sampling backend."""
    engine = backend(spec.backend, options)
    max_model_len = None
    if engine.sized_by_sequence:
        longest = max((len(tok(t, add_special_tokens=False).input_ids) for t in prompts_for_length), default=0)
        # process-RM rollouts continue a prefix of a sampled solution: room for two completions
        max_new_tokens = spec.sampling.max_new_tokens
        max_model_len = longest + max_new_tokens * (2 if spec.type == "process" else 1)
    return engine, engine.load(policy_path, tok, seed=spec.seed, max_model_len=max_model_len)


def sample_solutions(
    spec: RewardModelSpec,
    sink: Sink,
    policy_path: str,
    problems: list[Problem],
    template: str,
    policy: tuple[Backend, Generator] | None = None,
) -> list[Sampled]:
    tok = load_tokenizer(policy_path)
    texts = [prompts.render(template, p.question, tok) for p in problems]
    sampler, gen = policy or load_policy(spec, policy_path, texts, tok)
    sink.event(
        "sampling",
        f"sampling with the {spec.backend} backend ({sampler.version()})",
        data={"backend": spec.backend, "version": sampler.version()},
    )
    s = spec.sampling
    decoding = Decoding(
        s.max_new_tokens, (), s.temperature, s.top_p, spec.samples_per_question, spec.seed,
        batch_size=max(spec.samples_per_question, 32),
    )  # fmt: skip
    gens = gen.generate(
        texts, decoding, on_batch=lambda d, t: sink.progress(d, t, "sampling solutions"), should_stop=sink.should_stop
    )
    out = []
    for p, text, outs in zip(problems, texts, gens, strict=True):
        verdicts = [grade(g.text, p.gold, truncated=g.truncated) for g in outs]
        out.append(
            Sampled(p, text, [g.text for g in outs], [v.extracted for v in verdicts], [v.correct for v in verdicts])
        )
    return out


def outcome_pairs(sampled: list[Sampled], max_pairs_per_question: int = 16, seed: int = 0) -> list[dict[str, str]]:
    rng = random.Random(seed)
    rows = []
    for s in sampled:
        good = [c for c, ok in zip(s.completions, s.correct, strict=True) if ok]
        bad = [c for c, ok in zip(s.completions, s.correct, strict=True) if not ok]
        pairs = [(g, b) for g in good for b in bad]
        rng.shuffle(pairs)
        rows += [{"prompt": s.prompt, "chosen": g, "rejected": b} for g, b in pairs[:max_pairs_per_question]]
    return rows


def step_rollout_correct(solved: str, rollout: Any, gold: str) -> bool:
    """Does the solution made of the solved steps and this rollout's continuation reach gold?"""
    return grade(solved + rollout.text, gold, truncated=rollout.truncated).correct


def process_labels(
    spec: RewardModelSpec, sink: Sink, policy: Generator, sampled: list[Sampled]
) -> list[dict[str, Any]]:
    """Math-Shepherd hard labels: step i is good if one of k completions from steps[:i+1] is right.
    A completion is graded as the whole solution it finishes (the prefix's steps, then the
    continuation): a prefix that already states the answer is not judged by a continuation that
    need not repeat it."""
    k = spec.completions_per_step
    decoding = Decoding(spec.sampling.max_new_tokens, temperature=spec.sampling.temperature, n=k, batch_size=k)
    rows = []
    total = sum(len(s.completions) for s in sampled)
    done = 0
    for s in sampled:
        for completion, ok in zip(s.completions, s.correct, strict=True):
            steps = [x for x in completion.split(STEP_TAG) if x.strip()]
            labels: list[int] = []
            for i in range(len(steps)):
                if i == len(steps) - 1:
                    labels.append(int(ok))  # the last step's label is the outcome itself
                    continue
                solved = STEP_TAG.join(steps[: i + 1]) + STEP_TAG
                gens = policy.generate([s.prompt + solved], decoding.but(seed=spec.seed + i))[0]
                labels.append(int(any(step_rollout_correct(solved, g, s.problem.gold) for g in gens)))
            if steps:
                rows.append({"prompt": s.prompt, "steps": steps, "labels": labels})
            done += 1
            sink.progress(done, total, "labelling steps")
    return rows


def _rm_training_args(spec: RewardModelSpec, out_dir: Path, use_cpu: bool) -> TrainingArgs:
    """What both reward models train with: the spec's rate and batch, metrics every 5 steps, and
    no checkpoints (run_reward_model saves the trained model itself)."""
    return training_args(
        out_dir,
        use_cpu=use_cpu,
        seed=spec.seed,
        learning_rate=spec.learning_rate,
        per_device_train_batch_size=spec.per_device_train_batch_size,
        logging_steps=5,
        save_steps=None,
        gradient_checkpointing=spec.gradient_checkpointing,  # unset: the trainer class's default
    )


def outcome_args(spec: RewardModelSpec, out_dir: Path, use_cpu: bool) -> RewardConfig:
    """TRL's RewardConfig for the outcome RM (pairs of whole solutions, cut at max_length)."""
    from trl import RewardConfig

    return RewardConfig(
        **_rm_training_args(spec, out_dir, use_cpu),
        num_train_epochs=spec.num_train_epochs,
        max_length=spec.max_length,
    )


def process_args(spec: RewardModelSpec, out_dir: Path, use_cpu: bool) -> TrainingArguments:
    """transformers' TrainingArguments for the process RM (a token classifier; its rows are
    already encoded and cut, and keep their columns for the collator)."""
    from transformers import TrainingArguments

    return TrainingArguments(
        **_rm_training_args(spec, out_dir, use_cpu),
        num_train_epochs=spec.num_train_epochs,
        remove_unused_columns=False,
    )


def _train_outcome(
    spec: RewardModelSpec, pairs: list[dict[str, str]], model_path: str, out_dir: Path, sink: Sink
) -> Any:
    import torch
    from datasets import Dataset
    from trl import RewardTrainer

    from trainer.callbacks import SinkCallback

    args = outcome_args(spec, out_dir, use_cpu=not torch.cuda.is_available())
    tok = load_tokenizer(model_path)
    trainer = RewardTrainer(
        model=model_path,
        args=args,
        train_dataset=Dataset.from_list(pairs),
        processing_class=tok,
        callbacks=[callback := SinkCallback(sink, sample_every=10**9)],
    )
    model: Any = trainer.model  # a PreTrainedModel (TRL types it as any torch module, or None)
    check_loaded_from_hub(model_path, model)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tok.pad_token_id
    trainer.train()
    if callback.stopped:  # cancelled or drained: no half-trained reward model is reported
        raise StopRequested("stop requested")
    return trainer.model, tok, trainer.state.global_step


def _train_process(
    spec: RewardModelSpec, rows: list[dict[str, Any]], model_path: str, out_dir: Path, sink: Sink
) -> Any:
    """Token classification on step ends (label at the last token of each step)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForTokenClassification, Trainer

    from trainer.callbacks import SinkCallback

    tok = load_tokenizer(model_path)
    model = AutoModelForTokenClassification.from_pretrained(model_path, num_labels=2, dtype=torch.float32)
    check_loaded_from_hub(model_path, model)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tok.pad_token_id

    def encode(row: dict[str, Any]) -> dict[str, Any]:
        ids = tok(row["prompt"], add_special_tokens=False).input_ids
        labels = [-100] * len(ids)
        for step, lab in zip(row["steps"], row["labels"], strict=True):
            step_ids = tok(step + STEP_TAG, add_special_tokens=False).input_ids
            ids += step_ids
            labels += [-100] * (len(step_ids) - 1) + [lab]
        return {"input_ids": ids[: spec.max_length], "labels": labels[: spec.max_length]}

    data = Dataset.from_list([encode(r) for r in rows])

    def collate(batch: list[dict[str, Any]]) -> dict[str, Any]:
        n = max(len(b["input_ids"]) for b in batch)
        ids = [b["input_ids"] + [tok.pad_token_id] * (n - len(b["input_ids"])) for b in batch]
        labels = [b["labels"] + [-100] * (n - len(b["labels"])) for b in batch]
        mask = [[1] * len(b["input_ids"]) + [0] * (n - len(b["input_ids"])) for b in batch]
        return {"input_ids": torch.tensor(ids), "labels": torch.tensor(labels), "attention_mask": torch.tensor(mask)}

    args = process_args(spec, out_dir, use_cpu=not torch.cuda.is_available())
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=data,
        data_collator=collate,
        callbacks=[callback := SinkCallback(sink, sample_every=10**9)],
    )
    trainer.train()
    if callback.stopped:
        raise StopRequested("stop requested")
    return model, tok, trainer.state.global_step


def rm_text(tok: Any, prompt: str, completion: str) -> str:
    """The text an outcome RM scores, exactly as TRL's RewardTrainer trained it: prompt +
    completion + EOS (the score is read at the last token; without the EOS it is read at a
    position the RM never learned to score)."""
    text = prompt + completion
    eos = tok.eos_token or ""
    return text if text.endswith(eos) else text + eos


def outcome_scores(model: Any, tok: Any, prompt: str, completions: list[str]) -> list[float]:
    import torch

    enc = tok(
        [rm_text(tok, prompt, c) for c in completions],
        return_tensors="pt",
        padding=True,
        truncation=True,
        max_length=2048,
    )
    enc = {k: v.to(model.device) for k, v in enc.items()}
    with torch.inference_mode():
        return [float(x) for x in model(**enc).logits[:, 0]]


def process_scores(model: Any, tok: Any, prompt: str, completions: list[str]) -> list[float]:
    """A solution's PRM score: the lowest probability that any of its steps is good."""
    import torch

    out = []
    for c in completions:
        steps = [x for x in c.split(STEP_TAG) if x.strip()] or [c]
        ids = tok(prompt, add_special_tokens=False).input_ids
        ends = []
        for step in steps:
            ids += tok(step + STEP_TAG, add_special_tokens=False).input_ids
            ends.append(len(ids) - 1)
        t = torch.tensor([ids[:2048]], device=model.device)
        with torch.inference_mode():
            probs = model(input_ids=t).logits[0].softmax(-1)[:, 1]
        out.append(min(float(probs[e]) for e in ends if e < t.shape[1]) if any(e < t.shape[1] for e in ends) else 0.0)
    return out


def split_heldout(problems: list[Problem], fraction: float, seed: int) -> tuple[list[Problem], list[Problem]]:
    """(held out, train), split by distinct question: a question asked twice in the set (two-digit
    sums repeat in a few thousand) is on one side only, so held-out scores are never on questions
    the RM trained on."""
    questions = list(dict.fromkeys(p.question for p in problems))
    random.Random(seed).shuffle(questions)
    held_q = set(questions[: max(1, int(len(questions) * fraction))])
    return [p for p in problems if p.question in held_q], [p for p in problems if p.question not in held_q]


def heldout_scores(
    s_held: list[Sampled], score_fn: Any, model: Any, tok: Any, samples: int, seed: int
) -> tuple[dict[str, float | None], dict[str, tuple[int, int]]]:
    """Pairwise accuracy over each held-out question's own (correct, incorrect) pairs, and
    best-of-N by the RM against majority vote: (values, (hits, total) per metric). A value is
    None where there is nothing to score (no held-out pairs: every sample right, or every one wrong)."""
    wins = n_pairs = best_correct = maj_correct = 0
    for i, s in enumerate(s_held):
        scores = score_fn(model, tok, s.prompt, s.completions)
        by_text = dict(zip(s.completions, scores, strict=True))
        pairs = outcome_pairs([s], seed=seed + 1 + i)
        wins += sum(by_text[p["chosen"]] > by_text[p["rejected"]] for p in pairs)
        n_pairs += len(pairs)
        best = max(range(len(scores)), key=lambda j: scores[j])
        best_correct += s.correct[best]
        maj_correct += int(maj_at_k(s.answers, s.correct, len(s.answers)))
    n = len(s_held)
    counts = {
        "pairwise_accuracy": (wins, n_pairs),
        f"best_of_{samples}_accuracy": (best_correct, n),
        f"maj_at_{samples}_accuracy": (maj_correct, n),
    }
    return {k: (c / total if total else None) for k, (c, total) in counts.items()}, counts


def run_reward_model(
    spec: RewardModelSpec,
    sink: Sink,
    *,
    model_path: str,
    policy_path: str,
    data_dir: str | None,
    out_dir: Path,
    model_ref: str,
    work_dir: Path | None = None,
    backend_options: BackendOptions | None = None,
) -> dict[str, float | None]:
    """Sample, label, train, and evaluate on held-out questions; the model ends up in
    out_dir/final (written into work_dir first when given, and moved there by the sink).
    `backend_options`: the operator's engine settings for the sampling backend."""
    t0 = time.monotonic()
    work = work_dir or out_dir
    problems, template = load_problems(spec.dataset, data_dir)
    held, train = split_heldout(problems, spec.heldout_fraction, spec.seed)
    sink.event(
        "sampling",
        f"{spec.samples_per_question} solutions for each of {len(problems)} questions "
        f"({len(train)} train, {len(held)} held out) from {policy_path}",
    )
    policy_tok = load_tokenizer(policy_path)
    texts = [prompts.render(template, p.question, policy_tok) for p in train + held]
    policy = load_policy(spec, policy_path, texts, policy_tok, backend_options)
    sampler_version = policy[0].version()
    sampled = sample_solutions(spec, sink, policy_path, train + held, template, policy)
    s_train, s_held = sampled[: len(train)], sampled[len(train) :]
    frac = sum(sum(s.correct) for s in sampled) / max(sum(len(s.correct) for s in sampled), 1)
    sink.metrics(0, {"rm/sample_accuracy": frac})

    if spec.type == "outcome":
        del policy  # the sampler's memory (an engine's KV cache) goes before the RM trains
        pairs = outcome_pairs(s_train, seed=spec.seed)
        if not pairs:
            raise ValueError(
                f"no (correct, incorrect) pairs: the policy was right on {frac:.0%} of samples; "
                "use more questions, more samples_per_question, or a policy that is sometimes right"
            )
        sink.event("labelled", f"{len(pairs)} (correct, incorrect) pairs", data={"pairs": len(pairs)})
        model, tok, steps = _train_outcome(spec, pairs, model_path, work, sink)
        score_fn = outcome_scores
    else:
        rows = process_labels(spec, sink, policy[1], s_train)
        good = sum(sum(r["labels"]) for r in rows)
        total = sum(len(r["labels"]) for r in rows)
        sink.event("labelled", f"{total} steps labelled, {good} good", data={"steps": total, "good": good})
        del policy
        model, tok, steps = _train_process(spec, rows, model_path, work, sink)
        score_fn = process_scores

    model.eval()
    final = work / "final"
    if is_main():  # several data-parallel ranks: the main one saves
        model.save_pretrained(str(final))
        tok.save_pretrained(str(final))
    sink.checkpoint(steps, str(out_dir / "final"), kind="final", data={"type": spec.type}, source=str(final))

    values, counts = heldout_scores(s_held, score_fn, model, tok, spec.samples_per_question, spec.seed)
    n = len(s_held)
    for metric, value in values.items():
        if value is None:  # nothing to score
            continue
        c, total = counts[metric]
        low, high = wilson_interval(int(c), total)
        sink.score(
            {
                "model_ref": model_ref,
                "checkpoint": None,
                "benchmark": f"rm-heldout:{spec.dataset.name or 'custom'}",
                "benchmark_version": "1.0",
                "metric": metric,
                "value": value,
                "ci_low": low,
                "ci_high": high,
                "n": total,
                "sampling": spec.sampling.model_dump(),
                "backend": spec.backend,
                "backend_version": sampler_version,
                "prompt_hash": None,
                "seed": spec.seed,
            }
        )
    sink.metrics(0, {f"rm/{k}": v for k, v in values.items() if v is not None})
    sink.event(
        "scored",
        ", ".join(f"{k} {v:.1%}" if v is not None else f"{k} undefined (no held-out pairs)" for k, v in values.items())
        + f" on {n} held-out questions ({time.monotonic() - t0:.0f}s)",
        data=values,
    )
    return values
