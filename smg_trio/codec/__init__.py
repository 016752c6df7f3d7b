"""Engine-agnostic wire primitives: the msgpack codec and the tensor triple."""

from __future__ import annotations

from smg_trio.codec.msgpack import CUSTOM_TYPE_RAW_VIEW, decode, encoder, ext_hook, preview
from smg_trio.codec.tensor import decode_tensor, encode_tensor_inline

__all__ = [
    "CUSTOM_TYPE_RAW_VIEW",
    "decode",
    "decode_tensor",
    "encode_tensor_inline",
    "encoder",
    "ext_hook",
    "preview",
]
