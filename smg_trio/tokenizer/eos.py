"""EOS resolution: the primary and extra end-of-sequence ids a token-only engine must be sent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from smg_trio.tokenizer.core import Tokenizer, load_model_json
from smg_trio.tokenizer.modeldir import ModelDir

__all__ = ["resolve_eos"]


def _eos_ids(config: dict[str, Any], path: Path) -> list[int]:
    """``eos_token_id`` of one config file (int, list of ints or null) as a list."""
    value = config.get("eos_token_id")
    if value is None and isinstance(config.get("text_config"), dict):
        value = config["text_config"].get("eos_token_id")  # multimodal wrappers nest it
    if value is None:
        return []
    values = value if isinstance(value, list) else [value]
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{path}: eos_token_id must be an id or a list of ids, got {value!r}")
    return list(values)


def resolve_eos(
    model_dir: str | Path | ModelDir, tokenizer: Tokenizer | None = None
) -> tuple[int | None, list[int]]:
    """Return ``(primary, extras)`` EOS ids for a model directory.

    Reads ``eos_token_id`` (an int or a list) from ``config.json`` and then
    ``generation_config.json``. ``primary`` is the first id of ``config.json`` (else the first
    of ``generation_config.json``); ``extras`` are all other distinct ids of both files, in
    order. With neither, falls back to ``tokenizer.eos_token_id`` (``(None, [])`` if that is
    unknown too). Example: config ``5`` + generation config ``[5, 7, 9]`` gives ``(5, [7, 9])``.
    Raises ``ValueError`` for malformed JSON or ids (``ModelPathError`` for a file of a
    confined :class:`~smg_trio.tokenizer.modeldir.ModelDir` outside its roots).
    """
    md = model_dir if isinstance(model_dir, ModelDir) else ModelDir(model_dir)
    ids: list[int] = []
    for name in ("config.json", "generation_config.json"):
        ids.extend(_eos_ids(load_model_json(md, name), md.path / name))
    ordered = list(dict.fromkeys(ids))
    if not ordered:
        fallback = tokenizer.eos_token_id if tokenizer is not None else None
        return fallback, []
    return ordered[0], ordered[1:]
