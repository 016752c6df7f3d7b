"""Wire cases for the engine handshake (HELLO / INIT / READY maps, input registration) and the
FNV-1a handshake port."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from conformance import vectors as V
from conformance.case import Case, CaseFailed, fail_if, register
from conformance.wire_cases_vllm import captured
from conformance.wire_context import WireContext
from smg_trio.protocol.addresses import (
    HANDSHAKE_PORT_BASE,
    HANDSHAKE_PORT_SPAN,
    derive_handshake_port,
)
from smg_trio.protocol.handshake import (
    decode_init,
    decode_ready_response,
    decode_status,
    encode_init,
    encode_status,
)

__all__ = ["CASES", "fnv1a_64"]

CASES: list[Case] = []
_UTILS = "vllm/v1/engine/utils.py and vllm/v1/engine/core.py (vLLM 0.32.0)"
_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3


def fnv1a_64(data: bytes) -> int:
    """Independent FNV-1a 64-bit (xor, then multiply), to check ours against."""
    h = _FNV_OFFSET
    for b in data:
        h = ((h ^ b) * _FNV_PRIME) % 2**64
    return h


def _neq(what: str, got: Any, want: Any) -> str:
    return "" if got == want else f"{what}: got {got!r}, want {want!r}"


@register(
    CASES,
    "handshake_hello_ready_maps",
    "HELLO/READY are msgpack maps with named keys: our 4-key form matches the pinned bytes, our "
    "3-key form matches vLLM's captured HELLO/READY byte for byte, and both decode",
    f"HELLO/READY in {_UTILS}; smg 1.13.0 crates/engine_zmq_client handshake; wire-spec 1.2",
)
def handshake_hello_ready_maps(ctx: WireContext) -> str:
    """HELLO / READY encode and decode."""
    ready_hex = V.HELLO_HEX.replace("a548454c4c4f", "a55245414459")
    problems = [
        _neq("HELLO (4 keys)", encode_status("HELLO").hex(), V.HELLO_HEX),
        _neq("READY (4 keys)", encode_status("READY").hex(), ready_hex),
        _neq(
            "HELLO (vLLM 3 keys)",
            encode_status("HELLO", local=False, with_hash_key=False).hex(),
            V.VLLM_HELLO_HEX,
        ),
    ]
    st = decode_status(bytes.fromhex(V.HELLO_HEX))
    problems.append(
        _neq("decoded HELLO", (st.status, st.local, st.headless), ("HELLO", True, True))
    )
    statuses: tuple[tuple[str, Literal["HELLO", "READY"]], ...] = (
        ("handshake_hello", "HELLO"),
        ("handshake_ready", "READY"),
    )
    for kind, status in statuses:
        [(_identity, payload)] = captured(kind)
        got = decode_status(payload)
        problems.append(_neq(f"captured {status}", (got.status, got.headless), (status, True)))
        ours = encode_status(status, local=False, with_hash_key=False)
        problems.append(_neq(f"captured {status} bytes", ours.hex(), payload.hex()))
    fail_if(problems)
    return "pinned and captured HELLO/READY byte-exact"


@register(
    CASES,
    "handshake_init_map",
    "INIT (EngineHandshakeMetadata) is a map: addresses{inputs, outputs, 3 nil coordinators}, "
    "empty parallel_config; ours matches the pinned and the captured bytes",
    f"EngineHandshakeMetadata / EngineZmqAddresses in {_UTILS}; wire-spec 1.2",
)
def handshake_init_map(ctx: WireContext) -> str:
    """INIT encode (pinned + captured) and decode."""
    inputs, outputs = V.INIT_ADDRESSES
    meta = decode_init(bytes.fromhex(V.INIT_HEX))
    [(payload,)] = captured("handshake_init")
    real = decode_init(payload)
    fail_if(
        [
            _neq("INIT bytes", encode_init(inputs, outputs).hex(), V.INIT_HEX),
            _neq("decoded", (meta.addresses.inputs, meta.addresses.outputs), ([inputs], [outputs])),
            _neq("parallel_config", meta.parallel_config, {}),
            _neq(
                "captured INIT bytes",
                encode_init(real.addresses.inputs[0], real.addresses.outputs[0]).hex(),
                payload.hex(),
            ),
        ]
    )
    return "pinned and captured INIT byte-exact"


@register(
    CASES,
    "handshake_registration",
    "the engine's input registration (EngineCoreReadyResponse map) decodes; unknown keys are "
    "ignored",
    f"EngineCoreReadyResponse in {_UTILS}, captured from a real vLLM 0.32.0; wire-spec 1.2",
)
def handshake_registration(ctx: WireContext) -> str:
    """Decode the captured registration."""
    [(identity, payload)] = captured("registration")
    r = decode_ready_response(payload)
    extra = {"supports_lora", "max_loras", "mamba_block_size"} - set(
        msgspec.msgpack.decode(payload)
    )
    fail_if(
        [
            _neq("identity", identity, b"\x00\x00"),
            _neq(
                "fields",
                (r.max_model_len, r.num_gpu_blocks, r.block_size, r.dtype, r.vllm_version),
                (1024, 8192, 128, "float32", "0.32.0"),
            ),
            _neq("data_parallel_size", r.data_parallel_size, 1),
            f"capture lacks unknown keys {sorted(extra)}" if extra else "",
        ]
    )
    return "captured registration decodes"


@register(
    CASES,
    "fnv_handshake_port_pinned",
    "the handshake port of an ipc path is FNV-1a 64 folded into 20000..29999; the ports smg "
    "pins come out",
    "derive_handshake_port (smg 1.13.0 model_gateway/src/routers/grpc/zmq_client.rs) and "
    "_zmq_handshake_port (bindings/python/src/smg/serve.py); wire-spec 2.2",
)
def fnv_handshake_port_pinned(ctx: WireContext) -> str:
    """Every pinned vector."""
    fail_if(_neq(path, derive_handshake_port(path), port) for path, port in V.PINNED_PORTS)
    return f"{len(V.PINNED_PORTS)} pinned ports"


@register(
    CASES,
    "fnv_handshake_port_derived",
    "derived ports match, every port lies in 20000..29999 and equals an independent FNV-1a",
    "wire-spec 2.2 (derived vectors; the algorithm smg 1.13.0 pins)",
)
def fnv_handshake_port_derived(ctx: WireContext) -> str:
    """Derived vectors plus the band invariant against an independent hash."""
    problems = [_neq(path, derive_handshake_port(path), port) for path, port in V.DERIVED_PORTS]
    if (HANDSHAKE_PORT_BASE, HANDSHAKE_PORT_SPAN) != (20000, 10000):
        raise CaseFailed(f"band {HANDSHAKE_PORT_BASE}+{HANDSHAKE_PORT_SPAN}")
    for p in range(30000, 30050):
        path = f"/tmp/smg-zmq/engine-{p}"
        want = 20000 + fnv1a_64(path.encode()) % 10000
        problems.append(_neq(path, derive_handshake_port(f"ipc://{path}"), want))
    fail_if(problems)
    return f"{len(V.DERIVED_PORTS)} derived ports, 50 band checks"
