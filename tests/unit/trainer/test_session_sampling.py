"""Where a sampled sequence stops on a stop string (evaluator/backends/hf_sampling.py `first_stop`): the
first token whose prefix's text holds one, found in O(log n) decodes."""

from __future__ import annotations

import pytest

from evaluator.backends.hf_sampling import first_stop

pytestmark = pytest.mark.quick

VOCAB = ["a", "b", "\\n", "##", "END", "x"]


def test_the_first_token_whose_text_holds_a_stop_string() -> None:
    calls: list[int] = []

    def decode(ids: list[int]) -> str:
        calls.append(len(ids))
        return "".join(VOCAB[i] for i in ids)

    row = [0, 1, 0, 4, 1, 4, 0] + [5] * 1000
    assert first_stop(row, decode, ["END"]) == 3
    assert len(calls) <= 2 + 11  # the whole row, then a binary search over 1,007 prefixes
    assert first_stop(row, decode, ["zz"]) is None
    assert first_stop([0, 3, 3, 1], decode, ["##"]) == 1
    # a stop string that spans two tokens ends at the second
    assert first_stop([0, 2, 2, 1], lambda ids: "".join(VOCAB[i] for i in ids), ["\\n\\n"]) == 2
    assert first_stop([], decode, ["END"]) is None


def test_the_earliest_of_several_stop_strings() -> None:
    def decode(ids: list[int]) -> str:
        return "".join(VOCAB[i] for i in ids)

    assert first_stop([0, 3, 1, 4], decode, ["END", "##"]) == 1
