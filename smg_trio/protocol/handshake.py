"""Engine-neutral handshake messages: HELLO/READY status maps, INIT, and the input registration.

Wire source: vLLM ``vllm/v1/engine/utils.py`` (``EngineHandshakeMetadata``, ``EngineZmqAddresses``)
and ``vllm/v1/engine/core.py`` (``EngineCoreReadyResponse``), vLLM 0.32.0 (0.33.0 adds three
coordinator keys to the registration), as decoded by smg 1.13.0
``crates/engine_zmq_client/src/protocol/handshake.rs``. All are msgpack MAPS (named keys), never
positional. Unknown keys are ignored, because real vLLM 0.32 sends many extra keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import msgspec

from smg_trio.codec.msgpack import decode, encoder
from smg_trio.errors import DecodeError

__all__ = [
    "EngineCoreReadyResponse",
    "EngineHandshakeMetadata",
    "EngineZmqAddresses",
    "HandshakeStatus",
    "decode_ready_response",
    "decode_status",
    "encode_init",
    "encode_ready_response",
    "encode_status",
]

ModelDtype = Literal["float16", "bfloat16", "float32"]


class HandshakeStatus(msgspec.Struct, kw_only=True):
    """HELLO / READY on the handshake socket. vLLM 0.32 sends only the first three keys."""

    status: str | None = None
    local: bool | None = None
    headless: bool | None = None
    parallel_config_hash: str | None = None


class EngineZmqAddresses(msgspec.Struct, kw_only=True):
    """The data-plane addresses in INIT: one input and one output per frontend client (one
    client unless ``--api-server-count`` is above 1)."""

    inputs: list[str]
    outputs: list[str]
    coordinator_input: str | None = None
    coordinator_output: str | None = None
    frontend_stats_publish_address: str | None = None


class EngineHandshakeMetadata(msgspec.Struct, kw_only=True):
    """INIT, the frontend's reply to HELLO. ``parallel_config`` is always empty."""

    addresses: EngineZmqAddresses
    parallel_config: dict[str, Any] = {}


class EngineCoreReadyResponse(msgspec.Struct, kw_only=True):
    """The engine's first message on the input socket (its registration).

    ``block_size`` is named ``prefix_granularity`` by TokenSpeed; exactly one of the two must be
    present (see :attr:`block_size_tokens`). ``max_num_batched_tokens`` is signed because an old
    TokenSpeed sent ``-1``. Units: lengths and sizes in tokens, ``kv_cache_max_concurrency`` a
    plain ratio.
    """

    max_model_len: int
    num_gpu_blocks: int
    dtype: ModelDtype
    vllm_version: str
    world_size: int
    data_parallel_size: int
    block_size: int | None = None
    prefix_granularity: int | None = None
    dp_stats_address: str | None = None
    tensor_parallel_size: int = 0
    pipeline_parallel_size: int = 0
    decode_context_parallel_size: int = 0
    data_parallel_rank: int = 0
    max_num_seqs: int = 0
    max_num_batched_tokens: int = 0
    instance_id: str = ""
    kv_cache_size_tokens: int | None = None
    kv_cache_max_concurrency: float | None = None
    kv_events_config: dict[str, Any] | None = None
    # vLLM 0.33: the DP coordinator's store port and addresses (0/nil without a coordinator,
    # which is always so in this topology).
    coord_store_port: int = 0
    coordinator_input_address: str | None = None
    coordinator_output_address: str | None = None
    # vLLM: whether the engine serves LoRA adapters (--enable-lora) and how many at once.
    supports_lora: bool = False
    max_loras: int = 0

    @property
    def block_size_tokens(self) -> int:
        """``block_size`` or, for TokenSpeed, ``prefix_granularity``."""
        value = self.block_size if self.block_size is not None else self.prefix_granularity
        assert value is not None  # enforced by decode_ready_response
        return value

    @property
    def is_lockstep(self) -> bool:
        """``data_parallel_size > 1``: a vLLM MoE DP group that runs in waves."""
        return self.data_parallel_size > 1


_STATUS_KEYS_VLLM = ("status", "local", "headless")
_VLLM_033_KEYS = ("coord_store_port", "coordinator_input_address", "coordinator_output_address")


def encode_status(
    status: Literal["HELLO", "READY"],
    *,
    local: bool = True,
    headless: bool = True,
    with_hash_key: bool = True,
) -> bytes:
    """Encode HELLO/READY. ``with_hash_key=False`` gives vLLM 0.32's three-key form."""
    msg: dict[str, Any] = {"status": status, "local": local, "headless": headless}
    if with_hash_key:
        msg["parallel_config_hash"] = None
    return encoder.encode(msg)


def decode_status(payload: Any) -> HandshakeStatus:
    """Decode HELLO/READY; raises ``DecodeError`` if it is not a map."""
    return decode(payload, HandshakeStatus)


def encode_init(inputs: str | Sequence[str], outputs: str | Sequence[str]) -> bytes:
    """Encode INIT with the frontend clients' input and output addresses (one string: one
    client) and nil coordinator fields. Entry ``i`` of each list is client ``i``'s: the engine
    sends a request's outputs to ``outputs[client_index]``."""
    ins = [inputs] if isinstance(inputs, str) else list(inputs)
    outs = [outputs] if isinstance(outputs, str) else list(outputs)
    if not ins or len(ins) != len(outs):
        raise ValueError(f"INIT needs as many inputs as outputs (>= 1): {ins} / {outs}")
    return encoder.encode(
        EngineHandshakeMetadata(
            addresses=EngineZmqAddresses(inputs=ins, outputs=outs),
            parallel_config={},
        )
    )


def decode_init(payload: Any) -> EngineHandshakeMetadata:
    """Decode INIT (engine side). Raises ``DecodeError`` unless it has >= 1 input and output."""
    meta = decode(payload, EngineHandshakeMetadata)
    if not meta.addresses.inputs or not meta.addresses.outputs:
        raise DecodeError("INIT must carry at least one input and one output address")
    return meta


def decode_ready_response(payload: Any) -> EngineCoreReadyResponse:
    """Decode the input registration. Raises ``DecodeError`` for an empty payload (old vLLM sent
    ``b""``), a missing required key, a dtype other than float16/bfloat16/float32, or neither
    ``block_size`` nor ``prefix_granularity``."""
    if len(payload) == 0:
        raise DecodeError(
            "empty engine registration (this vLLM version is too old for the ZMQ path)"
        )
    resp = decode(payload, EngineCoreReadyResponse)
    if resp.block_size is None and resp.prefix_granularity is None:
        raise DecodeError("engine registration has neither block_size nor prefix_granularity")
    return resp


def encode_ready_response(resp: EngineCoreReadyResponse, **extra: Any) -> bytes:
    """Encode a registration map (mock side). ``extra`` keys are appended, as newer engines do;
    exactly one of ``block_size``/``prefix_granularity`` is written."""
    msg = msgspec.structs.asdict(resp)
    if resp.block_size is None:
        del msg["block_size"]
    if resp.prefix_granularity is None:
        del msg["prefix_granularity"]
    for key in (*_VLLM_033_KEYS, "supports_lora", "max_loras"):  # written only when set (or
        if not msg[key]:  # in ``extra``): a 0.32 registration stays 0.32-shaped
            del msg[key]
    msg.update(extra)
    return encoder.encode(msg)
