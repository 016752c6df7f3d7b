"""The ``[dtype, shape, data]`` tensor triple: inline ext 3, aux frames, dtypes, and rejections."""

from __future__ import annotations

import struct
from typing import Any

import msgspec
import numpy as np
import pytest

from smg_trio.codec import decode, decode_tensor, encode_tensor_inline, encoder
from smg_trio.errors import DecodeError

PRIMARY = b"frame-0"


def inline(dtype: str, shape: list[int], raw: bytes) -> list[Any]:
    """A triple as it arrives after decoding: ext 3 resolved to a memoryview."""
    return [dtype, shape, memoryview(raw)]


class FakeZmqFrame:
    """Stands in for ``zmq.Frame``: the payload is reachable as ``.buffer``."""

    def __init__(self, raw: bytes) -> None:
        self.buffer = memoryview(raw)


def test_inline_int64_matrix() -> None:
    raw = struct.pack("<2q", 7, 8)
    arr = decode_tensor(inline("<i8", [1, 2], raw), [PRIMARY])
    assert arr.shape == (1, 2)
    assert arr.tolist() == [[7, 8]]


def test_aux_frame_index_resolves_into_the_frame_list() -> None:
    raw = struct.pack("<3i", 10, 20, 30)
    arr = decode_tensor(["<i4", [3], 1], [PRIMARY, raw])
    assert arr.tolist() == [10, 20, 30]


def test_aux_frames_with_a_buffer_attribute_are_read_without_copying() -> None:
    frame = FakeZmqFrame(struct.pack("<2f", 1.5, -2.0))
    arr = decode_tensor(["float32", [2], 2], [PRIMARY, b"unused", frame])
    assert arr.tolist() == [1.5, -2.0]


@pytest.mark.parametrize(
    ("dtype", "raw", "expected"),
    [
        ("<i4", struct.pack("<i", -3), -3),
        (">i4", struct.pack(">i", 123456), 123456),
        ("=i4", struct.pack("=i", 9), 9),
        ("|i4", struct.pack("<i", 11), 11),
        ("int32", struct.pack("<i", 12), 12),
        ("<i8", struct.pack("<q", 2**40), 2**40),
        (">i8", struct.pack(">q", 7), 7),
        ("int64", struct.pack("<q", -5), -5),
        ("<f4", struct.pack("<f", 2.5), 2.5),
        (">f4", struct.pack(">f", -0.25), -0.25),
        ("=f4", struct.pack("=f", 0.5), 0.5),
        ("float32", struct.pack("<f", 4.0), 4.0),
    ],
)
def test_dtype_prefixes_and_torch_names(dtype: str, raw: bytes, expected: float) -> None:
    arr = decode_tensor(inline(dtype, [1], raw), [PRIMARY])
    assert arr.tolist() == [expected]
    # Whatever the wire byte order, the caller gets a native-order array.
    assert arr.dtype.byteorder in ("=", "<", "|")


def test_big_endian_matrix_is_byteswapped() -> None:
    raw = struct.pack(">4q", 1, 2, 3, 4)
    arr = decode_tensor([">i8", [2, 2], 1], [PRIMARY, raw])
    assert arr.tolist() == [[1, 2], [3, 4]]


@pytest.mark.parametrize("dtype", ["<c8", "<f8", "float64", "bool", "<u1", "i2", ""])
def test_unsupported_dtypes_are_rejected(dtype: str) -> None:
    with pytest.raises(DecodeError, match="dtype"):
        decode_tensor(inline(dtype, [1], b"\x00" * 8), [PRIMARY])


def test_non_string_dtype_is_rejected() -> None:
    with pytest.raises(DecodeError, match="dtype must be a string"):
        decode_tensor([4, [1], memoryview(b"\x00" * 4)], [PRIMARY])


def test_wrong_byte_length_is_rejected() -> None:
    # A 3-byte buffer cannot hold one int32.
    with pytest.raises(DecodeError, match="byte length 3"):
        decode_tensor(inline("<i4", [1], b"\x00\x00\x00"), [PRIMARY])
    with pytest.raises(DecodeError, match="byte length"):
        decode_tensor(inline("<f4", [2, 2], b"\x00" * 12), [PRIMARY])
    with pytest.raises(DecodeError, match="byte length"):
        decode_tensor(["<i8", [2], 1], [PRIMARY, b"\x00" * 24])


@pytest.mark.parametrize("index", [0, 2, 5, -1])
def test_bad_aux_index_is_rejected(index: int) -> None:
    with pytest.raises(DecodeError, match="aux frame index"):
        decode_tensor(["<i4", [1], index], [PRIMARY, b"\x00" * 4])


def test_bool_is_not_an_aux_index() -> None:
    with pytest.raises(DecodeError, match="ext 3 bytes or an aux frame index"):
        decode_tensor(["<i4", [1], True], [PRIMARY, b"\x00" * 4])


@pytest.mark.parametrize("shape", [[-1], "3", [1.0], None])
def test_bad_shape_is_rejected(shape: Any) -> None:
    with pytest.raises(DecodeError, match="shape"):
        decode_tensor(["<i4", shape, memoryview(b"\x00" * 4)], [PRIMARY])


@pytest.mark.parametrize("triple", [None, ["<i4", [1]], ["<i4", [1], b"", 0], "tensor"])
def test_malformed_triple_is_rejected(triple: Any) -> None:
    with pytest.raises(DecodeError, match="triple"):
        decode_tensor(triple, [PRIMARY])


def test_empty_tensor_is_valid() -> None:
    arr = decode_tensor(inline("<i8", [0, 3], b""), [PRIMARY])
    assert arr.shape == (0, 3)


def test_inline_encode_matches_vllm_wire_form_and_round_trips() -> None:
    src = np.array([[7, 8]], dtype="<i8")
    triple = encode_tensor_inline(src)
    assert triple[0] == "<i8"
    assert triple[1] == [1, 2]
    assert isinstance(triple[2], msgspec.msgpack.Ext)
    assert triple[2].code == 3
    assert triple[2].data == struct.pack("<2q", 7, 8)
    # Through the wire and back.
    back = decode(encoder.encode(triple), list[Any])
    assert decode_tensor(back, [PRIMARY]).tolist() == [[7, 8]]


def test_inline_encode_with_torch_names_and_big_endian_input() -> None:
    src = np.array([1.5, -2.0], dtype=">f4")
    triple = encode_tensor_inline(src, torch_names=True)
    assert triple[0] == "float32"
    assert triple[2].data == struct.pack("<2f", 1.5, -2.0)  # little-endian on the wire
    back = decode(encoder.encode(triple), list[Any])
    assert decode_tensor(back, [PRIMARY]).tolist() == [1.5, -2.0]
