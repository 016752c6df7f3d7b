"""The mock engine's pooler: deterministic embeddings from the prompt and a classifier head with
configured labels, answering vLLM ``PoolingParams`` as a pooling model would."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

__all__ = ["MockPooler", "PoolingFault"]

#: Faults a test can inject into the pooled output: a NaN value, or a tensor whose byte length
#: does not match its shape.
PoolingFault = str


@attrs.define
class MockPooler:
    """A pooling model: ``hidden_size``-wide embeddings (``embed``) and, with ``labels``, a
    classifier head (``classify``, one logit per label). ``matryoshka`` allows ``dimensions``
    (vLLM checks it in its frontend; the mock takes what it is sent). Each token contributes a
    fixed pseudo-random vector, so prompts that share tokens have similar embeddings."""

    hidden_size: int = 32
    labels: tuple[str, ...] = ()
    matryoshka: bool = True
    #: ``"nan"`` or ``"malformed"``: every pooled output carries that fault.
    fault: PoolingFault | None = None
    #: ``False``: no ``embed`` task (a sequence-classification model: with one label, a
    #: cross-encoder, whose ``classify`` output is the sigmoid of its one logit, as vLLM's).
    embed: bool = True

    @property
    def tasks(self) -> tuple[str, ...]:
        """What ``get_supported_tasks`` answers."""
        own = ("embed",) if self.embed else ()
        return (*own, "classify") if self.labels else own

    def _token_vector(self, token: int, width: int) -> npt.NDArray[np.float64]:
        rng = np.random.default_rng(zlib.crc32(token.to_bytes(8, "little", signed=True)))
        return rng.standard_normal(width)

    def pool(self, prompt: Sequence[int], params: Sequence[Any]) -> npt.NDArray[np.float32]:
        """The pooled output of ``prompt`` under the wire ``PoolingParams`` array ``params``
        (``[use_activation, dimensions, step_tag_id, returned_token_ids, task, ...]``)."""
        use_activation = params[0] if len(params) > 0 else None
        dimensions = params[1] if len(params) > 1 else None
        task = params[4] if len(params) > 4 else "embed"
        width = len(self.labels) if task == "classify" else self.hidden_size
        total = np.zeros(max(width, 1), dtype=np.float64)[:width]
        for tok in prompt:
            total += self._token_vector(int(tok), width)
        vec = total / max(len(prompt), 1)
        if task == "classify":
            if use_activation is not False and width == 1:
                vec = 1.0 / (1.0 + np.exp(-vec))
            elif use_activation is not False and width:
                exp = np.exp(vec - vec.max())
                vec = exp / exp.sum()
        else:
            if dimensions is not None:
                vec = vec[: int(dimensions)]
            if use_activation is not False:
                norm = float(np.linalg.norm(vec))
                vec = vec / norm if norm else vec
        out = vec.astype(np.float32)
        if self.fault == "nan" and out.size:
            out[0] = np.nan
        return out
