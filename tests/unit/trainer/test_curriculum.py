"""The pass-rate curriculum (trainer/curriculum.py) and dynamic sampling's group arithmetic
(trainer/dynamic_sampling.py), without a model."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.quick


def test_questions_neither_always_nor_never_solved_are_drawn_most() -> None:
    from trainer.curriculum import PassRateCurriculum

    cur = PassRateCurriculum(3, seed=1, decay=1.0, floor=0.01)
    cur.update([(0, 0.0), (1, 0.5), (2, 1.0)])
    counts = [0, 0, 0]
    for step in range(300):
        for i in cur.draw(1, step, 0, 0):
            counts[i] += 1
    assert counts[1] > 10 * max(counts[0], counts[2]), counts
    assert counts[0] > 0 and counts[2] > 0, counts  # the floor: nothing is never drawn again
    # an unseen question counts as a coin flip (most learnable), so new questions get tried
    fresh = PassRateCurriculum(4, seed=1)
    fresh.update([(0, 0.0), (1, 1.0), (2, 0.0)])
    assert fresh.weights().argmax() == 3


def test_pass_rates_move_by_decay_and_draws_are_seeded() -> None:
    from trainer.curriculum import PassRateCurriculum

    cur = PassRateCurriculum(10, seed=3, decay=0.5)
    cur.update([(4, 1.0), (4, 0.0)])
    assert cur.pass_rate[4] == 0.5 and cur.seen[4] == 2
    assert cur.draw(5, step=2, round_=1, rank=0) == cur.draw(5, step=2, round_=1, rank=0)
    assert cur.draw(5, step=2, round_=1, rank=0) != cur.draw(5, step=2, round_=1, rank=1)
    assert len(set(cur.draw(10, 0, 0, 0))) == 10  # distinct while the set has enough


def test_the_state_survives_a_checkpoint(tmp_path: Path) -> None:
    from trainer.curriculum import PassRateCurriculum

    cur = PassRateCurriculum(6, seed=3)
    cur.update([(1, 0.25), (5, 1.0)])
    cur.save(tmp_path)
    back = PassRateCurriculum(6, seed=3)
    assert back.load(tmp_path)
    assert back.pass_rate.tolist() == cur.pass_rate.tolist() and back.seen.tolist() == cur.seen.tolist()
    assert back.draw(3, 7, 0, 0) == cur.draw(3, 7, 0, 0)
    assert not PassRateCurriculum(6, seed=3).load(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match="same dataset"):
        PassRateCurriculum(7, seed=3).load(tmp_path)


def test_groups_without_signal_are_found_and_rows_join_across_rounds() -> None:
    import torch

    from trainer.dynamic_sampling import informative, join_rows

    values = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, float("nan"), 1.0, float("nan"), float("nan")])
    assert informative(values, 2) == [False, False, True, False, False, False]
    assert informative(values, 4) == [False, True, False]

    def part(prompt_len: int, completion_len: int, rows: int, base: float) -> dict[str, torch.Tensor]:
        return {
            "prompt_ids": torch.full((rows, prompt_len), 5),
            "prompt_mask": torch.ones(rows, prompt_len, dtype=torch.long),
            "completion_ids": torch.full((rows, completion_len), 7),
            "completion_mask": torch.ones(rows, completion_len, dtype=torch.long),
            "advantages": torch.arange(rows, dtype=torch.float) + base,
            "num_items_in_batch": torch.tensor(rows * completion_len),
        }

    out = join_rows([part(3, 2, 4, 0.0), part(2, 5, 4, 10.0)], [(0, [2, 3]), (1, [0, 1])], pad_token_id=0)
    assert out["advantages"].tolist() == [2.0, 3.0, 10.0, 11.0]
    assert out["prompt_ids"].shape == (4, 3) and out["completion_ids"].shape == (4, 5)
    # prompts padded on the left, completions on the right, masks with zeros
    assert out["prompt_mask"][2].tolist() == [0, 1, 1] and out["prompt_ids"][2].tolist() == [0, 5, 5]
    assert out["completion_mask"][0].tolist() == [1, 1, 0, 0, 0]
    assert "num_items_in_batch" not in out  # counted over every process by the caller
    with pytest.raises(ValueError, match="text batches only"):
        join_rows([{**part(1, 1, 2, 0.0), "pixel_values": torch.zeros(2, 3)}], [(0, [0])], 0)


def test_two_step_word_problems_have_a_fixed_held_out_set_and_true_answers() -> None:
    import re

    from evaluator import synthetic
    from evaluator.benchmarks import find_benchmark
    from evaluator.data import load_benchmark

    held = load_benchmark(find_benchmark("twostep-words", "test"), None, None)
    assert len(held) == 300 and held == synthetic.heldout(task="twostep-words")  # fixed: same every time
    train = synthetic.train(2000, task="twostep-words")
    assert not {p.question for p in held} & {p.question for p in train}
    for p in held + train:
        start, first, second = (int(x) for x in re.findall(r"\d+", p.question))
        gain_first = re.search(r"(buys|finds|is given|wins) \d+ more and then", p.question) is not None
        gain, loss = (first, second) if gain_first else (second, first)
        assert int(p.gold) == start + gain - loss >= 1, p
    assert held[0].question.startswith(tuple(synthetic.NAMES)) and held[0].question.endswith("have now?")
