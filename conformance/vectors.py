"""Pinned wire vectors for ``conformance wire`` (wire-spec sections 1.2, 2.2, 4, 5.6) and the
captured vLLM 0.32.0 session; tests/protocol imports them from here."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

__all__ = [
    "DERIVED_PORTS",
    "HELLO_HEX",
    "INIT_ADDRESSES",
    "INIT_HEX",
    "PINNED_PORTS",
    "PREFIX_VECTOR",
    "PYTHON_OUTPUT_VECTOR",
    "PYTHON_OUTPUT_VECTOR_PRE_DP",
    "PYTHON_OUTPUT_VECTOR_PRE_LOAD",
    "PYTHON_REQUEST_VECTOR",
    "SPEC_PREFIX_HEX_AS_PRINTED",
    "VLLM_ABORT_HEX",
    "VLLM_CAPTURE_FILE",
    "VLLM_HELLO_HEX",
    "VLLM_OUTPUTS_LOGPROBS_HEX",
    "VLLM_OUTPUTS_STOP_HEX",
    "VLLM_START_WAVE_HEX",
    "vllm_session",
]

# -- handshake (wire-spec 1.2) ---------------------------------------------------------------

#: TokenSpeed / smg mock HELLO: a 4-key map, key order status/local/headless/hash.
HELLO_HEX = (
    "84a6737461747573a548454c4c4fa56c6f63616cc3a8686561646c657373c3b4706172616c6c656c5f636f6e"
    "6669675f68617368c0"
)
#: vLLM 0.32.0's own HELLO (captured): three keys, local false.
VLLM_HELLO_HEX = "83a6737461747573a548454c4c4fa56c6f63616cc2a8686561646c657373c3"
#: INIT for these input/output addresses.
INIT_ADDRESSES = ("ipc:///tmp/w-in.sock", "ipc:///tmp/w-out.sock")
INIT_HEX = (
    "82a961646472657373657385a6696e7075747391b46970633a2f2f2f746d702f772d696e2e736f636ba76f75"
    "747075747391b56970633a2f2f2f746d702f772d6f75742e736f636bb1636f6f7264696e61746f725f696e70"
    "7574c0b2636f6f7264696e61746f725f6f7574707574c0be66726f6e74656e645f73746174735f7075626c69"
    "73685f61646472657373c0af706172616c6c656c5f636f6e66696780"
)

# -- FNV-1a handshake port (wire-spec 2.2) ---------------------------------------------------

#: Pinned by smg's Rust and Python tests.
PINNED_PORTS: tuple[tuple[str, int], ...] = (
    ("/tmp/smg-zmq/ts0.ipc", 25152),
    ("/tmp/smg-zmq/engine-31000", 22714),
    ("ipc:///tmp/smg-zmq/ts0.ipc", 25152),
    ("ipc:///tmp/smg-zmq/ts1.ipc", 22735),
    ("ipc:///tmp/smg-zmq/engine-31000", 22714),
    ("ts0.ipc", 23912),
)
#: Derived in the spec from the same algorithm (not pinned upstream).
DERIVED_PORTS: tuple[tuple[str, int], ...] = (
    ("", 26037),
    ("a", 21996),
    ("/x/y/z.ipc", 25483),
    ("very/long/path/with/segments.sock", 24856),
    ("ipc:///tmp/smg-zmq-0/engine-31000", 27937),
    ("ipc:///tmp/smg-zmq-1000/engine-31000", 24640),
    ("ipc:///tmp/smg-zmq-1000/engine-31001", 22851),
)

# -- vLLM EngineCore (wire-spec 4) -----------------------------------------------------------

#: ABORT ``["req-1"]`` and START_DP_WAVE ``[9, nil]`` payloads.
VLLM_ABORT_HEX = "91a57265712d31"
VLLM_START_WAVE_HEX = "9209c0"
#: Derived with msgspec: the 8-element envelope, 17-element outputs (wire-spec 4.6).
VLLM_OUTPUTS_STOP_HEX = (
    "980091dc0011a57265712d31926465c0c0c000c0c0c0c0c0c0c000c0c0c0c0cb3ff8000000000000c091a572"
    "65712d31c0c0"
)
VLLM_OUTPUTS_LOGPROBS_HEX = (
    "980091dc0011a57265712d3191079493a33c6938920102d8030700000000000000080000000000000093a33c"
    "6634920102d703000000bf000000c093a33c69389101d7030200000000000000c0c0c0c0c0c0c0c0c0c0c000"
    "c0c0c0c0cb3ff8000000000000c0c0c0c0"
)
#: vLLM 0.33.0 (struct definitions read from the vllm-0.33.0 wheel: ``EngineCoreOutput`` in
#: ``vllm/v1/engine/__init__.py`` gains a 19th field ``error``, a ``vllm.outputs.RequestError``
#: dataclass sent as a map): a 9-element envelope (timestamp 1.5, finished ``["req-1"]``) holding
#: one ERROR (3) output for ``req-1`` with no tokens, encoded by msgspec from those definitions.
#: A paused engine's rejection (``engine_paused``, retryable, core.py's own message):
VLLM033_OUTPUTS_PAUSED_HEX = (
    "990091dc0013a57265712d3190c0c0c003c0c0c0c0c0c0c000c0c0c0c083a4636f6465ad656e67696e655f70"
    "6175736564a76d657373616765d93447656e65726174696f6e206973207061757365642e20506c6561736520"
    "726574727920616674657220697420726573756d65732ea9726574727961626c65c3c0cb3ff8000000000000"
    "c091a57265712d31c0c0c0"
)
#: A validation failure (``validation_error``, message ``bad prompt``, not retryable):
VLLM033_OUTPUTS_VALIDATION_HEX = (
    "990091dc0013a57265712d3190c0c0c003c0c0c0c0c0c0c000c0c0c0c083a4636f6465b076616c6964617469"
    "6f6e5f6572726f72a76d657373616765aa6261642070726f6d7074a9726574727961626c65c2c0cb3ff80000"
    "00000000c091a57265712d31c0c0c0"
)
#: The wire-spec STOP example (tokens ``[100, 101]``) in the 0.33 layout: 19 fields, nil error.
VLLM033_OUTPUTS_STOP_HEX = (
    "990091dc0013a57265712d31926465c0c0c000c0c0c0c0c0c0c000c0c0c0c0c0c0cb3ff8000000000000c091"
    "a57265712d31c0c0c0"
)
#: One real session against a headless vLLM 0.32.0 engine (package data).
VLLM_CAPTURE_FILE = "vllm0.32.0_engine_wire.jsonl"

# -- TokenSpeed (wire-spec 5.6) --------------------------------------------------------------

#: The full 24-element request from TokenSpeed's Python encoder (152 bytes).
PYTHON_REQUEST_VECTOR = bytes.fromhex(
    "dc0018b9546f6b656e697a656447656e6572617465526571496e707574a57665632d31c0c0"
    "93010203dc001d08c09102cb3fe0000000000000cb3feccccccccccccdce40000000cb0000"
    "000000000000cb0000000000000000cb0000000000000000cb3ff000000000000000c0c0c0"
    "c0c2c3c3c2c0c0c0c02ac0019000c3c3ff00c0c3c0c0c0c2cb0000000000000000c0c0c0c0"
    "c0c0c0c0"
)
#: The 14-element BatchTokenIDOutSlim (with the PR #1079 load columns).
PYTHON_OUTPUT_VECTOR = bytes.fromhex(
    "9eb34261746368546f6b656e49444f7574536c696d91a57665632d3191920a0b91a66c656e"
    "6774689103910291019192cbbfe0000000000000cbbfd000000000000091920a0b01020564"
    "cd0190"
)
PYTHON_OUTPUT_VECTOR_PRE_LOAD = bytes.fromhex(
    "9ab34261746368546f6b656e49444f7574536c696d91a57665632d3191920a0b91a66c656e"
    "6774689103910291019192cbbfe0000000000000cbbfd000000000000091920a0b01"
)
PYTHON_OUTPUT_VECTOR_PRE_DP = bytes.fromhex(
    "99b34261746368546f6b656e49444f7574536c696d91a57665632d3191920a0b91a66c656e"
    "6774689103910291019192cbbfe0000000000000cbbfd000000000000091920a0b"
)
#: wire-spec 5.6 prints the derived 11-element prefix vector as this hex, but it stops 4 bytes
#: short of the "129 bytes" it announces: the last four prefix fields (logprob_start_len -1,
#: top_logprobs_num 0, token_ids_logprob nil, stream true) are missing.
SPEC_PREFIX_HEX_AS_PRINTED = (
    "9bb9546f6b656e697a656447656e6572617465526571496e707574a57665632d31c0c093010203dc001d08c0"
    "9102cb3fe0000000000000cb3feccccccccccccdce40000000cb0000000000000000cb0000000000000000cb"
    "0000000000000000cb3ff000000000000000c0c0c0c0c2c3c3c2c0c0c0c02ac0019000c3c3"
)
PREFIX_VECTOR = bytes.fromhex(SPEC_PREFIX_HEX_AS_PRINTED + "ff00c0c3")


#: The fields of PYTHON_OUTPUT_VECTOR, the 14-element batch (wire-spec 5.6).
VEC1_OUTPUT_FIELDS: dict[str, object] = {
    "rids": ["vec-1"],
    "output_ids": [[10, 11]],
    "finished_reasons": ["length"],
    "prompt_tokens": [3],
    "completion_tokens": [2],
    "cached_tokens": [1],
    "output_token_logprobs_val": [[-0.5, -0.25]],
    "output_token_logprobs_idx": [[10, 11]],
    "engine_index": 1,
    "num_running": 2,
    "num_waiting": 5,
    "kv_active_pages": 100,
    "kv_total_pages": 400,
}
#: The BatchTokenIDOutSlim both reference round trips build (conformance/reference_roundtrip.py
#: builds the same one with TokenSpeed's own struct, in the peers' interpreter).
REFERENCE_BATCH_FIELDS: dict[str, object] = {
    "rids": ["vec-1", "r2", "r3"],
    "output_ids": [[10, 11], [12], []],
    "finished_reasons": ["length", "", "abort"],
    "prompt_tokens": [3, 4, 5],
    "completion_tokens": [2, 1, 0],
    "cached_tokens": [1, 0, 0],
    "output_token_logprobs_val": [[-0.5, -0.25], [], []],
    "output_token_logprobs_idx": [[10, 11], [], []],
    "engine_index": 1,
    "num_running": 2,
    "num_waiting": 5,
    "kv_active_pages": 100,
    "kv_total_pages": 400,
}


@cache
def vllm_session() -> tuple[tuple[str, tuple[bytes, ...]], ...]:
    """The captured vLLM 0.32.0 session as ``(kind, frames)`` records, in capture order."""
    text = resources.files("conformance").joinpath("data", VLLM_CAPTURE_FILE).read_text("utf-8")
    records = []
    for line in text.splitlines():
        rec = json.loads(line)
        records.append((str(rec["kind"]), tuple(bytes.fromhex(f) for f in rec["frames_hex"])))
    return tuple(records)
