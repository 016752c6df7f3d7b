"""vLLM's utility-call wire: the UTILITY request and the ``utility_output`` answer, pinned with
bytes that vLLM 0.32.0's own ``MsgpackEncoder`` wrote."""

from __future__ import annotations

import pytest

from smg_trio.codec.msgpack import encoder
from smg_trio.errors import DecodeError
from smg_trio.protocol.tokenspeed import TokenSpeedProtocol
from smg_trio.protocol.types import UtilityReply
from smg_trio.protocol.vllm import UTILITY, VllmProtocol, decode_outputs

# MsgpackEncoder().encode((0, 7, "reset_prefix_cache", (False, False))) in the vLLM 0.32.0 venv.
VLLM_CALL = bytes.fromhex("940007b272657365745f7072656669785f636163686592c2c2")
# ... of (1, 2**63 + 5, "wake_up", (["weights"],)): a uuid-sized call id, client 1.
VLLM_CALL_WAKE = bytes.fromhex("9401cf8000000000000005a777616b655f75709191a777656967687473")
# EngineCoreOutputs(engine_index=1, timestamp=2.5,
#                   utility_output=UtilityOutput(7, result=UtilityResult(True)))
VLLM_ANSWER_OK = bytes.fromhex("990190c0cb40040000000000009307c092c0c3c0c0c0c0")
# ... UtilityOutput(9, failure_message="Call to sleep method failed: Sleep mode is not enabled")
VLLM_ANSWER_FAILED = bytes.fromhex(
    "990090c0cb40040000000000009309d93643616c6c20746f20736c656570206d6574686f64206661696c65"
    "643a20536c656570206d6f6465206973206e6f7420656e61626c6564c0c0c0c0c0"
)
# ... UtilityOutput(3, result=UtilityResult(("generate",))): get_supported_tasks
VLLM_ANSWER_TASKS = bytes.fromhex(
    "990090c0cb40040000000000009303c092c091a867656e6572617465c0c0c0c0"
)
# ... UtilityOutput(4, result=UtilityResult(None)): a method that returns None (sleep)
VLLM_ANSWER_NONE = bytes.fromhex("990090c0cb40040000000000009304c092c0c0c0c0c0c0")


def test_call_matches_vllm_bytes() -> None:
    frames = VllmProtocol(client_index=0).encode_utility(7, "reset_prefix_cache", [False, False])
    assert frames == [UTILITY, VLLM_CALL]
    frames = VllmProtocol(client_index=1).encode_utility(2**63 + 5, "wake_up", [["weights"]])
    assert frames == [UTILITY, VLLM_CALL_WAKE]


@pytest.mark.parametrize(
    ("wire", "reply", "engine"),
    [
        (VLLM_ANSWER_OK, UtilityReply(7, None, True), 1),
        (
            VLLM_ANSWER_FAILED,
            UtilityReply(9, "Call to sleep method failed: Sleep mode is not enabled", None),
            0,
        ),
        (VLLM_ANSWER_TASKS, UtilityReply(3, None, ["generate"]), 0),
        (VLLM_ANSWER_NONE, UtilityReply(4, None, None), 0),
    ],
)
def test_answers_decode(wire: bytes, reply: UtilityReply, engine: int) -> None:
    batch = decode_outputs([wire])
    assert batch.utility == reply
    assert batch.engine_index == engine
    assert batch.outputs == []
    assert batch.load is None


@pytest.mark.parametrize(
    "bad",
    [
        "not a list",
        [],
        ["7", None, [None, True]],
        [7, 5, None],
        [7, None, [True]],
    ],
)
def test_malformed_answer_is_a_decode_error(bad: object) -> None:
    env = [0, [], None, 0.0, bad, None, None, None]
    with pytest.raises(DecodeError, match="utility_output"):
        decode_outputs([encoder.encode(env)])


def test_tokenspeed_has_no_utility_calls() -> None:
    assert TokenSpeedProtocol().encode_utility(1, "reset_prefix_cache", []) is None
