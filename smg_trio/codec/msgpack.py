"""Shared msgpack encoder/decoders on msgspec, with decode errors that name the target type."""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from smg_trio.errors import DecodeError

__all__ = ["CUSTOM_TYPE_RAW_VIEW", "decode", "encoder", "ext_hook", "preview"]

T = TypeVar("T")

#: vLLM ``serial_utils.CUSTOM_TYPE_RAW_VIEW``: a tensor's raw little-endian bytes, inline.
CUSTOM_TYPE_RAW_VIEW = 3

encoder = msgspec.msgpack.Encoder()


def ext_hook(code: int, data: memoryview) -> Any:
    """Keep ext type 3 (raw tensor bytes) as a ``memoryview``; reject every other ext code.

    Raises ``DecodeError`` for codes 1 (pickle) and 2 (cloudpickle) and anything unknown.
    """
    if code == CUSTOM_TYPE_RAW_VIEW:
        return data
    raise DecodeError(f"unsupported msgpack ext type {code} (only raw-view ext 3 is accepted)")


_decoders: dict[Any, msgspec.msgpack.Decoder[Any]] = {}


def decode(buf: Any, type_: type[T]) -> T:
    """Decode ``buf`` (bytes-like) as ``type_``; raises ``DecodeError`` naming the type and a preview."""
    dec = _decoders.get(type_)
    if dec is None:
        dec = _decoders[type_] = msgspec.msgpack.Decoder(type_, ext_hook=ext_hook)
    try:
        return dec.decode(buf)  # type: ignore[no-any-return]
    except DecodeError:
        raise
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError) as exc:
        name = getattr(type_, "__name__", str(type_))
        raise DecodeError(f"cannot decode {name}: {exc} (payload {preview(buf)})") from exc


def preview(buf: Any, limit: int = 48) -> str:
    """A short hex preview of a payload for error messages."""
    raw = bytes(buf[:limit])
    more = "…" if len(buf) > limit else ""
    return raw.hex() + more
