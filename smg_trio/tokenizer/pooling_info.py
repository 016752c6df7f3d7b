"""What a model directory's ``config.json`` says about pooling: the classifier's labels
(``id2label``), the Matryoshka dimensions and the embedding width, as vLLM's ``ModelConfig``
reads them."""

from __future__ import annotations

from typing import Any

import attrs

from smg_trio.tokenizer.core import load_model_json
from smg_trio.tokenizer.modeldir import ModelDir

__all__ = ["PoolingInfo", "read_pooling_info"]


@attrs.frozen
class PoolingInfo:
    """``labels`` by class index (``LABEL_i`` where the config names none); ``matryoshka``
    whether ``dimensions`` may be asked, ``matryoshka_dimensions`` the allowed ones (``None``:
    any in ``[1, hidden_size]``); ``hidden_size`` ``None`` when unknown."""

    labels: tuple[str, ...] = ()
    matryoshka: bool = False
    matryoshka_dimensions: tuple[int, ...] | None = None
    hidden_size: int | None = None

    def label(self, index: int) -> str:
        """The name of class ``index`` (vLLM: ``id2label``, else ``LABEL_{index}``)."""
        return self.labels[index] if index < len(self.labels) else f"LABEL_{index}"


def pooling_info_of(cfg: dict[str, Any]) -> PoolingInfo:
    """:class:`PoolingInfo` of a parsed ``config.json``; malformed entries are ignored."""
    raw = cfg.get("id2label")
    labels: tuple[str, ...] = ()
    if isinstance(raw, dict):
        try:
            pairs = sorted((int(k), str(v)) for k, v in raw.items())
        except (TypeError, ValueError):
            pairs = []
        if [k for k, _ in pairs] == list(range(len(pairs))):
            labels = tuple(v for _, v in pairs)
    dims = cfg.get("matryoshka_dimensions")
    mds = (
        tuple(int(d) for d in dims)
        if isinstance(dims, list) and dims and all(isinstance(d, int) for d in dims)
        else None
    )
    hidden = cfg.get("hidden_size")
    return PoolingInfo(
        labels=labels,
        matryoshka=mds is not None or cfg.get("is_matryoshka") is True,
        matryoshka_dimensions=mds,
        hidden_size=hidden if isinstance(hidden, int) and hidden > 0 else None,
    )


def read_pooling_info(model_dir: ModelDir) -> PoolingInfo:
    """The directory's :class:`PoolingInfo` (blocking I/O); empty when it has no readable
    ``config.json``."""
    try:
        return pooling_info_of(load_model_json(model_dir, "config.json"))
    except (OSError, ValueError):
        return PoolingInfo()
