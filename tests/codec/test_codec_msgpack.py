"""The shared msgpack codec: ext-type policy, error messages, and the msgspec encodings we rely on."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from smg_trio.codec import CUSTOM_TYPE_RAW_VIEW, decode, encoder, ext_hook, preview
from smg_trio.errors import CodecError, DecodeError
from smg_trio.protocol.handshake import HandshakeStatus


def test_raw_view_ext_code_is_three() -> None:
    assert CUSTOM_TYPE_RAW_VIEW == 3


def test_ext_hook_keeps_raw_view_bytes_as_memoryview() -> None:
    data = memoryview(b"\x01\x02\x03\x04")
    out = ext_hook(3, data)
    assert isinstance(out, memoryview)
    assert bytes(out) == b"\x01\x02\x03\x04"


@pytest.mark.parametrize("code", [1, 2, 7, 0, 127])
def test_ext_hook_rejects_every_other_code(code: int) -> None:
    with pytest.raises(DecodeError, match=rf"ext type {code}\b"):
        ext_hook(code, memoryview(b"x"))


@pytest.mark.parametrize("code", [1, 2, 7])
def test_decode_rejects_pickle_and_unknown_ext_codes_inside_a_payload(code: int) -> None:
    payload = encoder.encode(["<i8", [1], msgspec.msgpack.Ext(code, b"\x00" * 8)])
    with pytest.raises(DecodeError, match=f"unsupported msgpack ext type {code}"):
        decode(payload, list[Any])


def test_decode_resolves_ext_three_inside_a_payload() -> None:
    payload = encoder.encode(["<i4", [1], msgspec.msgpack.Ext(3, b"\x05\x00\x00\x00")])
    dtype, shape, data = decode(payload, list[Any])
    assert (dtype, shape) == ("<i4", [1])
    assert bytes(data) == b"\x05\x00\x00\x00"


def test_decode_error_names_the_target_type_and_previews_the_payload() -> None:
    with pytest.raises(DecodeError) as info:
        decode(b"\x93\x01\x02\x03", HandshakeStatus)
    msg = str(info.value)
    assert "HandshakeStatus" in msg
    assert "93010203" in msg  # the hex preview of the payload
    assert isinstance(info.value, CodecError)


def test_decode_error_on_invalid_msgpack_byte() -> None:
    with pytest.raises(DecodeError, match="c1"):
        decode(b"\xc1", HandshakeStatus)


def test_preview_truncates_long_payloads() -> None:
    assert preview(b"\xab" * 4) == "abababab"
    long = preview(b"\x00" * 100, limit=4)
    assert long == "00000000…"


def test_encoder_uses_the_msgpack_forms_the_engines_expect() -> None:
    # Python floats go out as float64, ints in their smallest form, None as nil, sets as arrays.
    assert encoder.encode(0.5) == bytes.fromhex("cb3fe0000000000000")
    assert encoder.encode(1 << 30) == bytes.fromhex("ce40000000")
    assert encoder.encode(-1) == b"\xff"
    assert encoder.encode(None) == b"\xc0"
    assert encoder.encode(["req-1"]) == bytes.fromhex("91a57265712d31")
