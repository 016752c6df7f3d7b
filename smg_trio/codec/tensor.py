"""The ``[dtype, shape, data]`` tensor triple of vLLM's ``serial_utils`` (inline ext 3 or aux frame)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from smg_trio.errors import DecodeError

__all__ = ["decode_tensor", "encode_tensor_inline"]

# Accepted dtype names: numpy ``dtype.str`` forms and torch names (vLLM serial_utils, 0.32).
_KINDS: dict[str, str] = {
    "i4": "i4",
    "int32": "i4",
    "i8": "i8",
    "int64": "i8",
    "f4": "f4",
    "float32": "f4",
    "f2": "f2",
    "float16": "f2",
    # torch's bfloat16 (pooling outputs of bf16 models): read as its raw 16 bits, widened below.
    "bfloat16": "u2",
}


def _numpy_dtype(name: Any) -> np.dtype[Any]:
    """The numpy dtype a wire dtype name reads as (``bfloat16``: its raw ``u2`` bits)."""
    if not isinstance(name, str) or not name:
        raise DecodeError(f"tensor dtype must be a string, got {name!r}")
    order = "<"
    body = name
    if name[0] in "<>=|":
        order = "<" if name[0] in "=|" else name[0]
        body = name[1:]
    kind = _KINDS.get(body)
    if kind is None:
        raise DecodeError(
            f"unsupported tensor dtype {name!r} (expected i4/i8/f2/f4 or int32/int64/float16/"
            "bfloat16/float32)"
        )
    return np.dtype(order + kind)


def decode_tensor(triple: Any, frames: Sequence[Any]) -> npt.NDArray[Any]:
    """Resolve a ``[dtype, shape, data]`` triple to a numpy array (native byte order).

    ``data`` is a ``memoryview`` (msgpack ext 3, inline) or an int index into ``frames``
    (frame 0 is the primary payload, so aux indices start at 1). Raises ``DecodeError`` for a
    malformed triple, an unknown dtype, a bad aux index, or a byte length that does not equal
    ``prod(shape) * itemsize``. An aux frame is read in place (zero-copy, read-only) unless
    it must be converted (big-endian, ``bfloat16`` widened to ``float32``).
    """
    if not isinstance(triple, (list, tuple)) or len(triple) != 3:
        raise DecodeError(
            f"tensor must be a [dtype, shape, data] triple, got {type(triple).__name__}"
        )
    dtype_name, shape, data = triple
    dtype = _numpy_dtype(dtype_name)
    if not isinstance(shape, (list, tuple)) or not all(
        isinstance(d, int) and d >= 0 for d in shape
    ):
        raise DecodeError(f"tensor shape must be a list of non-negative ints, got {shape!r}")
    if isinstance(data, int) and not isinstance(data, bool):
        if not 1 <= data < len(frames):
            raise DecodeError(
                f"tensor aux frame index {data} out of range (have {len(frames) - 1} aux frames)"
            )
        buf: Any = frames[data]
        buf = getattr(buf, "buffer", buf)  # zmq.Frame -> memoryview
    elif isinstance(data, (memoryview, bytes, bytearray)):
        buf = data
    else:
        raise DecodeError(
            f"tensor data must be ext 3 bytes or an aux frame index, got {type(data).__name__}"
        )
    count = 1
    for d in shape:
        count *= d
    if len(memoryview(buf).cast("B")) != count * dtype.itemsize:
        raise DecodeError(
            f"tensor byte length {len(memoryview(buf).cast('B'))} != {count} x {dtype.itemsize} for shape {list(shape)}"
        )
    arr = np.frombuffer(buf, dtype=dtype, count=count).reshape(shape)
    if dtype_name == "bfloat16":  # the high half of a float32: widen (one copy)
        return (arr.astype(np.uint32) << 16).view(np.float32)
    if dtype.byteorder == ">":
        arr = arr.astype(dtype.newbyteorder("<"))
    return arr


def encode_tensor_inline(array: npt.NDArray[Any], *, torch_names: bool = False) -> list[Any]:
    """Encode ``array`` as an inline triple (ext 3 raw bytes), the way vLLM's encoder does for
    small tensors. ``torch_names`` writes ``int64``/``float32`` instead of ``<i8``/``<f4``."""
    import msgspec

    from smg_trio.codec.msgpack import CUSTOM_TYPE_RAW_VIEW

    arr = np.ascontiguousarray(array)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    name = arr.dtype.name if torch_names else arr.dtype.str
    return [name, list(arr.shape), msgspec.msgpack.Ext(CUSTOM_TYPE_RAW_VIEW, arr.tobytes())]
