"""vLLM pooling wire: ``PoolingParams`` out (0.32 field order), ``pooling_output`` tensors in.

Wire source: ``vllm/pooling_params.py`` (``PoolingParams``, ``LateInteractionParams``: msgspec
structs, ``array_like`` with ``omit_defaults``, so trailing defaults are left off),
``vllm/sampling_params.py`` (``RequestOutputKind``) and ``vllm/v1/engine/__init__.py``
(``EngineCoreOutput.pooling_output``, a tensor triple: inline below
``VLLM_MSGPACK_ZERO_COPY_THRESHOLD`` bytes, else an aux frame index), vLLM 0.32.0. The layout
is not append-only across versions (older vLLMs led with ``truncate_prompt_tokens`` and
``normalize``); 0.33's has not been checked against its wheel. The params are sent as vLLM's own frontend leaves them after
``PoolingParams.verify`` (``use_activation`` and ``skip_reading_prefix_cache`` resolved): the
engine core does not verify them again.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from smg_trio.codec.tensor import decode_tensor
from smg_trio.errors import DecodeError
from smg_trio.protocol.types import Frames, PoolingOptions

__all__ = ["FINAL_ONLY", "LateInteractionParams", "PoolingParams", "decode_pooling_output"]

#: ``RequestOutputKind.FINAL_ONLY``: a pooling request has one output, its last.
FINAL_ONLY = 2


class LateInteractionParams(msgspec.Struct, array_like=True, omit_defaults=True):
    """vLLM ``LateInteractionParams`` (worker-side late-interaction scoring); never sent yet."""

    mode: str
    query_key: str
    query_uses: int | None = None


class PoolingParams(msgspec.Struct, array_like=True, omit_defaults=True):
    """vLLM 0.32 ``PoolingParams``: ten positional fields, trailing defaults omitted."""

    use_activation: bool | None = None
    dimensions: int | None = None
    step_tag_id: int | None = None
    returned_token_ids: list[int] | None = None
    task: str | None = None
    requires_token_ids: bool = False
    skip_reading_prefix_cache: bool | None = None
    late_interaction_params: LateInteractionParams | None = None
    extra_kwargs: dict[str, Any] | None = None
    output_kind: int = FINAL_ONLY

    @classmethod
    def of(cls, opts: PoolingOptions) -> PoolingParams:
        """The params vLLM's frontend sends for ``opts`` after ``verify``: activation on by
        default, the prefix cache read except for per-token tasks."""
        return cls(
            use_activation=True if opts.use_activation is None else opts.use_activation,
            dimensions=opts.dimensions,
            task=opts.task,
            skip_reading_prefix_cache=opts.task in ("token_embed", "token_classify"),
            extra_kwargs=None
            if opts.token_type_start is None
            else {"compressed_token_type_ids": opts.token_type_start},
        )


def decode_pooling_output(wire: Any, frames: Frames) -> npt.NDArray[Any]:
    """The ``pooling_output`` tensor as a numpy array (read in place from an aux frame where
    its dtype allows). Raises ``DecodeError`` for a malformed triple or frame, and for a
    non-finite value (an engine fault: a NaN must never reach a client as a number)."""
    arr = decode_tensor(wire, frames)
    if arr.dtype.kind != "f":
        raise DecodeError(f"pooling_output must be a float tensor, got {arr.dtype}")
    if not bool(np.isfinite(arr).all()):
        raise DecodeError("pooling_output holds a NaN or infinite value")
    return arr
