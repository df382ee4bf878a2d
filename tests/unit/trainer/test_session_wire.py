"""Tinker's protobuf messages as a training session reads and writes them (trainer/session_wire.py),
against bytes the `tinker` SDK 0.38.0 wrote itself (its `forward_backward_request_to_proto` and its
generated `tinker_public_pb2` classes, run once outside this repository): a request with two
datums, one of them in two text chunks with a sparse 2-D `target_tokens`, a numeric and a text
config value; a forward_backward result and a sample result the SDK's decoders read."""

from __future__ import annotations

import numpy as np
import pytest

from trainer.session_wire import Sampled, decode_forward_backward, encode_forward_backward, encode_sample

pytestmark = pytest.mark.quick

SDK_REQUEST = bytes.fromhex(
    "0a09533a747261696e3a3010031a640a100a0e0a0c010000000200000003000000121e0a077765696768747312130a0c0000"
    "00000000803f0000803f180122010312300a0d7461726765745f746f6b656e73121f0a180200000000000000030000000000"
    "0000040000000000000018022201031ae9010a0c0a0a0a0805000000060000000a080a060a0407000000122b0a0777656967"
    "68747312200a180000803f000000000000803f0000003f0000803f00000000180122020302127f0a0d7461726765745f746f"
    "6b656e73126e12660a2006000000000000000700000000000000090000000000000008000000000000001220000000000000"
    "00000100000000000000030000000000000004000000000000001a2000000000000000000000000000000000010000000000"
    "0000000000000000000018022202030212210a0a616476616e746167657312130a0c0000003f000080bf0000004018012201"
    "03220370706f2a1d0a12636c69705f6c6f775f7468726573686f6c6411666666666666e63f30013a1f0a12636c69705f6c6f"
    "775f7468726573686f6c64120909666666666666e63f3a0b0a046e6f74651203120178"
)
SDK_OUTPUT = bytes.fromhex(
    "0a0b41727261795265636f72641242123e0a086c6f6770726f627312320a14000080bf000000c0000000bf000080be0000"
    "40c01218000000000000000008000000000000001400000000000000180118021a130a086c6f73733a73756d1100000000"
    "00001b40"
)
SDK_SAMPLE = bytes.fromhex(
    "0a14120805000000060000001a08cdccccbdcdcc4cbe0a0e08011204070000001a049a9999be120c0000c07f0000c0bf000000bf"
)


def test_a_forward_backward_request_the_sdk_wrote() -> None:
    call = decode_forward_backward(SDK_REQUEST)
    assert (call.model_id, call.seq_id, call.loss_fn, call.forward_only) == ("S:train:0", 3, "ppo", True)
    assert call.config == {"clip_low_threshold": pytest.approx(0.7), "note": "x"}
    first, second = call.data
    assert list(first.tokens) == [1, 2, 3] and list(second.tokens) == [5, 6, 7]  # two chunks, one sequence
    assert first.inputs["target_tokens"].tolist() == [2, 3, 4]
    assert first.inputs["weights"].dtype == np.float32 and first.inputs["weights"].tolist() == [0.0, 1.0, 1.0]
    assert second.inputs["target_tokens"].tolist() == [[6, 0], [7, 9], [8, 0]]  # sparse CSR, densified
    assert second.inputs["weights"].tolist() == [[1.0, 0.0], [1.0, 0.5], [1.0, 0.0]]
    assert second.inputs["advantages"].tolist() == [0.5, -1.0, 2.0]


def test_results_are_the_bytes_the_sdk_writes() -> None:
    assert encode_forward_backward([[-1.0, -2.0], [-0.5, -0.25, -3.0]], {"loss:sum": 6.75}) == SDK_OUTPUT
    sampled = [Sampled([5, 6], [-0.1, -0.2], "stop"), Sampled([7], [-0.3], "length")]
    assert encode_sample(sampled, [None, -1.5, -0.5]) == SDK_SAMPLE


def test_what_cannot_be_read_is_named() -> None:
    with pytest.raises(ValueError, match="truncated"):
        decode_forward_backward(SDK_REQUEST[:-3])
    image = bytes.fromhex("1a04") + bytes.fromhex("0a02") + bytes.fromhex("1200")  # a datum whose chunk is an image
    with pytest.raises(ValueError, match=r"data\[0\].model_input: only encoded_text chunks"):
        decode_forward_backward(image)
