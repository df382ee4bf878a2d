"""A training session's primitives (trainer/session.py) on the tiny model: the loss goes down over
forward_backward + optim_step calls, the losses are Tinker's formulas, gradients accumulate until
the step, and a saved state resumes to the same next loss, bit for bit."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from mathrl.errors import UnknownName
from trainer.session import AdamParams, Datum, LoraOptions, TrainingSession
from trainer.session_losses import LOSSES

pytestmark = pytest.mark.slow  # the tiny model, trained

LORA = LoraOptions(rank=8, seed=0)
ADAM = AdamParams(learning_rate=1e-2)


def sft_datum(session: TrainingSession, prompt: str, answer: str) -> Datum:
    """Tinker's supervised datum: the sequence shifted by one, weight 1 on the answer's tokens."""
    tok = session.tokenizer
    p, a = tok.encode(prompt, add_special_tokens=False), tok.encode(answer, add_special_tokens=False)
    tokens = p + a + [tok.eos_token_id]
    weights = [0.0] * (len(p) - 1) + [1.0] * (len(a) + 1)
    return Datum(tokens[:-1], {"target_tokens": tokens[1:], "weights": weights})


@pytest.fixture(scope="module")
def session(tiny_model: str) -> TrainingSession:
    return TrainingSession(tiny_model, LORA)


def test_the_loss_goes_down_over_twenty_steps(tiny_model: str) -> None:
    s = TrainingSession(tiny_model, LORA)
    data = [sft_datum(s, f"{a}+{b}=", str(a + b)) for a, b in [(1, 2), (3, 4), (5, 1), (2, 2)]]
    losses = []
    for _ in range(20):
        out = s.forward_backward(data, "cross_entropy")
        losses.append(out.metrics["loss:sum"])
        s.optim_step(ADAM)
    assert losses[-1] < 0.5 * losses[0], losses
    assert [len(lp) for lp in out.logprobs] == [len(d.tokens) for d in data]
    # the loss is the weighted sum of the returned log-probabilities
    pairs = [zip(lps, d.inputs["weights"], strict=True) for d, lps in zip(data, out.logprobs, strict=True)]
    manual = -sum(lp * w for pair in pairs for lp, w in pair)
    assert math.isclose(out.metrics["loss:sum"], manual, rel_tol=1e-5)


def test_forward_only_leaves_no_gradient_and_forward_backward_accumulates(session: TrainingSession) -> None:
    datum = sft_datum(session, "2+2=", "4")
    before = session.forward_backward([datum], "cross_entropy", forward_only=True)
    assert all(p.grad is None for p in session.params)
    once = session.forward_backward([datum], "cross_entropy")
    assert once.metrics == before.metrics and once.logprobs == before.logprobs
    first = [p.grad.clone() for p in session.params]  # type: ignore[union-attr]
    session.forward_backward([datum], "cross_entropy")
    for g, p in zip(first, session.params, strict=True):
        assert torch.allclose(p.grad, 2 * g, atol=1e-6)  # type: ignore[arg-type]
    session.optimizer.zero_grad(set_to_none=True)


def test_the_rl_losses_are_tinkers_formulas(session: TrainingSession) -> None:
    lp = torch.tensor([-1.0, -2.0, -0.5])
    sampled = torch.tensor([-1.2, -1.0, -0.5])
    adv = torch.tensor([1.0, -1.0, 2.0])
    inputs = {"logprobs": sampled, "advantages": adv}
    ratio = torch.exp(lp - sampled)
    assert torch.isclose(LOSSES["importance_sampling"](lp, inputs, {}), -(ratio * adv).sum())
    clipped = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv).sum()
    assert torch.isclose(LOSSES["ppo"](lp, inputs, {}), clipped)
    wide = -(ratio * adv).sum()  # a clip range wide enough to clip nothing
    assert torch.isclose(LOSSES["ppo"](lp, inputs, {"clip_low_threshold": 0.0, "clip_high_threshold": 10.0}), wide)
    assert torch.isclose(LOSSES["dro"](lp, inputs, {"beta": 0.5}), -(lp * adv - 0.25 * (lp - sampled) ** 2).sum())
    with pytest.raises(ValueError, match="beta"):
        LOSSES["dro"](lp, inputs, {})
    with pytest.raises(UnknownName, match="Did you mean 'ppo'"):
        LOSSES["ppp"]


def test_gspo_clips_the_sequence_ratio_and_keeps_each_tokens_gradient() -> None:
    sampled = torch.tensor([-1.2, -1.0, -0.5, -3.0])
    adv = torch.tensor([1.0, 1.0, 1.0, 0.0])
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])  # the last token (a prompt token, say) is not in the ratio
    inputs = {"logprobs": sampled, "advantages": adv, "sequence_ratio_mask": mask}

    def run(values: list[float], config: dict[str, float]) -> tuple[torch.Tensor, torch.Tensor]:
        lp = torch.tensor(values, requires_grad=True)
        loss = LOSSES["gspo"](lp, inputs, config)
        loss.backward()  # type: ignore[no-untyped-call]
        assert lp.grad is not None
        return loss.detach(), lp.grad

    # inside the clip range: every token carries s = exp(mean log-ratio over the mask), gradient -A * s
    near = [-1.1, -1.05, -0.5, 99.0]  # the masked-out token's log-probability does not enter s
    s = torch.exp(torch.tensor([0.1, -0.05, 0.0]).mean())
    loss, grad = run(near, {})
    assert torch.isclose(loss, -(s * adv).sum())
    assert torch.allclose(grad, -s * adv)
    # a sequence ratio above 1 + eps_high with positive advantages is clipped: no gradient at all
    far = [-0.2, -0.1, 0.0, 0.0]  # mean log-ratio 0.8: s = 2.23
    loss, grad = run(far, {})
    assert torch.isclose(loss, -1.2 * adv.sum())
    assert torch.count_nonzero(grad) == 0
    _, grad = run(far, {"clip_high_threshold": 10.0})  # a wider range lets it through
    assert torch.count_nonzero(grad) == 3
    # a datum whose mask marks nothing has ratio 1: plain REINFORCE
    none = {**inputs, "sequence_ratio_mask": torch.zeros(4)}
    lp = torch.tensor(near)
    assert torch.isclose(LOSSES["gspo"](lp, none, {}), -adv.sum())
    # without a mask, the tokens with an advantage make the ratio (here the same three)
    unmasked = {k: v for k, v in inputs.items() if k != "sequence_ratio_mask"}
    assert torch.isclose(LOSSES["gspo"](lp, unmasked, {}), -(s * adv).sum())


def test_stable_reinforce_is_refused_with_the_reason_and_the_losses_served(session: TrainingSession) -> None:
    datum = sft_datum(session, "1+1=", "2")
    with pytest.raises(ValueError, match="not published") as refused:
        session.forward_backward([datum], "stable_reinforce")
    assert "gspo" in str(refused.value) and "ppo" in str(refused.value)
    with pytest.raises(ValueError, match=r"needs \['logprobs', 'advantages'\]"):
        session.forward_backward([datum], "gspo")


def test_importance_sampling_raises_the_likelihood_of_an_advantaged_completion(tiny_model: str) -> None:
    s = TrainingSession(tiny_model, LORA)
    datum = sft_datum(s, "7+1=", "8")
    weights = datum.inputs["weights"]
    sampled = s.forward_backward([datum], "cross_entropy", forward_only=True).logprobs[0]
    targets = datum.inputs["target_tokens"]
    rl = Datum(datum.tokens, {"target_tokens": targets, "logprobs": sampled, "advantages": weights})
    before = -s.forward_backward([datum], "cross_entropy", forward_only=True).metrics["loss:sum"]
    s.forward_backward([rl], "importance_sampling")
    s.optim_step(ADAM)
    after = -s.forward_backward([datum], "cross_entropy", forward_only=True).metrics["loss:sum"]
    assert after > before


def test_a_saved_state_resumes_to_the_same_next_loss_bit_for_bit(tiny_model: str, tmp_path: Path) -> None:
    def steps(s: TrainingSession, n: int, data: list[Datum]) -> list[float]:
        out = []
        for _ in range(n):
            out.append(s.forward_backward(data, "cross_entropy").metrics["loss:sum"])
            s.optim_step(ADAM)
        return out

    a = TrainingSession(tiny_model, LORA)
    data = [sft_datum(a, "3+5=", "8"), sft_datum(a, "6+1=", "7")]
    steps(a, 3, data)
    a.save(tmp_path / "state")
    a.save(tmp_path / "weights-only", optimizer=False)
    straight = steps(a, 2, data)

    b = TrainingSession(tiny_model, LoraOptions(rank=8, seed=1))  # another start: the load replaces it
    b.load(tmp_path / "state", optimizer=True)
    assert steps(b, 2, data) == straight  # the same floats, not close ones
    c = TrainingSession(tiny_model, LoraOptions(rank=8, seed=1))
    c.load(tmp_path / "weights-only", optimizer=False)
    first = c.forward_backward(data, "cross_entropy", forward_only=True).metrics["loss:sum"]
    assert first == straight[0]  # the same weights; a fresh optimizer steps differently after
    with pytest.raises(ValueError, match="without its optimizer state"):
        c.load(tmp_path / "weights-only", optimizer=True)
    with pytest.raises(ValueError, match="rank 8"):
        TrainingSession(tiny_model, LoraOptions(rank=4)).load(tmp_path / "state", optimizer=False)


def test_bad_data_names_the_field(session: TrainingSession) -> None:
    needs = r"data\[0\].loss_fn_inputs: importance_sampling needs \['logprobs', 'advantages'\]"
    with pytest.raises(ValueError, match=needs):
        session.forward_backward([Datum([1, 2], {"target_tokens": [2, 3]})], "importance_sampling")
    with pytest.raises(ValueError, match=r"data\[0\].loss_fn_inputs.weights: 1 values for 2 tokens"):
        session.forward_backward([Datum([1, 2], {"target_tokens": [2, 3], "weights": [1.0]})], "cross_entropy")
    with pytest.raises(ValueError, match="no linear module"):
        TrainingSession(session.model_path, LoraOptions(train_attn=False, train_mlp=False, train_unembed=False))


def test_a_stop_string_ends_a_sample_at_its_first_stop_in_the_generated_text(session: TrainingSession) -> None:
    """A stop string ends a sample once the sampled text holds it, and not before: one that begins
    in the prompt does not count (transformers' `stop_strings`, which `sample` used before, matched
    across the prompt and cut this sample after one token). The untrained tiny model answers
    "=========" to "12+34=": with the stop "==", the sample is its first two tokens."""
    from evaluator.backends.hf_sampling import first_stop, sample
    from evaluator.backends.token_sampler import SampleCall
    from trainer.session_sampling import use_weights

    tok = session.tokenizer
    model, device = session.model, session.device
    prompt = tok.encode("12+34=", add_special_tokens=False)
    with use_weights(session, None):  # eval mode, no gradients
        (free,), _ = sample(model, tok, device, SampleCall(prompt=prompt, max_tokens=8, temperature=0.0, stop=[]))
        text = tok.decode(free.tokens)
        assert len(free.tokens) == 8 and text.startswith("=="), text
        (ended,), _ = sample(model, tok, device, SampleCall(prompt=prompt, max_tokens=8, temperature=0.0, stop=["=="]))
        at = first_stop(list(free.tokens), tok.decode, ["=="])
        assert at is not None and at >= 1
        assert ended.stop_reason == "stop" and list(ended.tokens) == list(free.tokens[: at + 1]), (ended, free)
        # a stop string the reply never holds: it runs to max_tokens
        (long,), _ = sample(model, tok, device, SampleCall(prompt=prompt, max_tokens=8, temperature=0.0, stop=["zz"]))
        assert long.stop_reason == "length" and list(long.tokens) == list(free.tokens)


def test_a_calls_samples_share_one_prefill_and_their_logprobs_are_the_learners(session: TrainingSession) -> None:
    """n samples of one prompt run the prompt once (`shared_prefill`), then generate from copies of
    its cache. A wrong cache would change what the rows see: each sampled token's log-probability
    must still be the learner's for the same tokens, and a greedy row the one-sample greedy text."""
    from evaluator.backends.hf_sampling import sample
    from evaluator.backends.token_sampler import SampleCall
    from trainer.session_sampling import use_weights

    tok = session.tokenizer
    model, device = session.model, session.device
    prompt = tok.encode("Q: 12 + 30 = ? A: 42. Q: 7 + 8 = ? A:", add_special_tokens=False)
    with use_weights(session, None):
        rows, _ = sample(model, tok, device, SampleCall(prompt=prompt, num_samples=4, max_tokens=6, stop=[], seed=3))
        (one,), _ = sample(model, tok, device, SampleCall(prompt=prompt, max_tokens=6, temperature=0.0, stop=[]))
        greedy, _ = sample(
            model, tok, device, SampleCall(prompt=prompt, num_samples=3, max_tokens=6, temperature=0.0, stop=[])
        )
    assert len({tuple(r.tokens) for r in rows}) > 1  # sampled: the rows differ
    assert all(list(g.tokens) == list(one.tokens) for g in greedy)
    for row in rows:
        full = prompt + list(row.tokens)
        datum = Datum(full[:-1], {"target_tokens": full[1:], "weights": [1.0] * (len(full) - 1)})
        learner = session.forward_backward([datum], "cross_entropy", forward_only=True).logprobs[0]
        assert row.logprobs == pytest.approx(learner[len(prompt) - 1 :], abs=1e-4)
