"""vLLM's ``LoRARequest`` on the EngineCore wire (in ``EngineCoreRequest.lora_request`` and as the
``add_lora`` utility argument), pinned with bytes that vLLM 0.32.0's own ``MsgpackEncoder``
wrote; TokenSpeed's request carries no adapter (a 400 naming ``model``)."""

from __future__ import annotations

import msgspec
import pytest

from smg_trio.codec.msgpack import encoder
from smg_trio.errors import UnsupportedField
from smg_trio.protocol.tokenspeed import TokenSpeedProtocol
from smg_trio.protocol.types import GenerateRequest, LoraRequest, SamplingOptions
from smg_trio.protocol.vllm import ADD, UTILITY, VllmProtocol

# MsgpackEncoder().encode(LoRARequest("sql", 7, "/models/sql-lora")) in the vLLM 0.32.0 venv.
VLLM_LORA = bytes.fromhex("96a373716c07b02f6d6f64656c732f73716c2d6c6f7261c0c2c2")
# ... LoRARequest("sql", 7, "/models/sql-lora", base_model_name="tiny")
VLLM_LORA_BASE = bytes.fromhex("96a373716c07b02f6d6f64656c732f73716c2d6c6f7261a474696e79c2c2")
# ... (0, 5, "add_lora", (LoRARequest("sql", 7, "/models/sql-lora"),)): the utility call
VLLM_ADD_LORA = bytes.fromhex(
    "940005a86164645f6c6f72619196a373716c07b02f6d6f64656c732f73716c2d6c6f7261c0c2c2"
)
# ... (0, 6, "remove_lora", (7,))
VLLM_REMOVE_LORA = bytes.fromhex("940006ab72656d6f76655f6c6f72619107")

SQL = LoraRequest("sql", 7, "/models/sql-lora")


def _req(lora: LoraRequest | None) -> GenerateRequest:
    return GenerateRequest(
        request_id="r1", prompt_token_ids=[1, 2], sampling=SamplingOptions(max_tokens=4), lora=lora
    )


def test_lora_request_matches_vllm_bytes() -> None:
    assert encoder.encode(SQL) == VLLM_LORA
    assert encoder.encode(LoraRequest("sql", 7, "/models/sql-lora", "tiny")) == VLLM_LORA_BASE


def test_add_request_carries_lora_request_in_field_6() -> None:
    frames = VllmProtocol().encode_add(_req(SQL))
    assert frames[0] == ADD
    wire = msgspec.msgpack.decode(frames[1])
    assert wire[6] == ["sql", 7, "/models/sql-lora", None, False, False]
    assert msgspec.msgpack.decode(VllmProtocol().encode_add(_req(None))[1])[6] is None


def test_utility_calls_match_vllm_bytes() -> None:
    assert VllmProtocol().encode_utility(5, "add_lora", [SQL]) == [UTILITY, VLLM_ADD_LORA]
    assert VllmProtocol().encode_utility(6, "remove_lora", [7]) == [UTILITY, VLLM_REMOVE_LORA]


def test_tokenspeed_refuses_an_adapter() -> None:
    TokenSpeedProtocol().validate(_req(None))
    with pytest.raises(UnsupportedField) as err:
        TokenSpeedProtocol().validate(_req(SQL))
    assert err.value.param == "model"
    assert VllmProtocol.capabilities.lora_adapters
    assert not TokenSpeedProtocol.capabilities.lora_adapters
