"""A worker's model directory: its tokenizer, EOS ids, context length, pooling and sampling
defaults, every file read confined to the model roots (blocking I/O: run it in a thread)."""

from __future__ import annotations

from collections.abc import Sequence

from smg_trio.errors import ValidationError
from smg_trio.tokenizer.core import Tokenizer, load_model_json
from smg_trio.tokenizer.eos import resolve_eos
from smg_trio.tokenizer.generation_config import sampling_defaults
from smg_trio.tokenizer.modeldir import ModelDir
from smg_trio.tokenizer.pooling_info import PoolingInfo, read_pooling_info

__all__ = ["check_model_files", "load_model"]


def _config_max_len(model_dir: ModelDir) -> int | None:
    try:
        cfg = load_model_json(model_dir, "config.json")
    except (OSError, ValueError):
        return None
    value = cfg.get("max_position_embeddings")
    return int(value) if isinstance(value, int) else None


def _open_model_dir(path: str | None, roots: Sequence[str]) -> ModelDir:
    """The confined model directory of a spec (blocking I/O: run it in a thread). Raises
    ``ModelPathError`` outside the roots, ``ValidationError`` if it is not a directory."""
    model_dir = None if path is None else ModelDir(path, roots)
    if model_dir is None or not model_dir.path.is_dir():
        raise ValidationError(
            f"model_path {path!r} is not a local model directory (the ZMQ wire carries "
            "token ids only, so the gateway needs the tokenizer)",
            param="model_path",
        )
    return model_dir


def load_model(
    path: str | None,
    roots: Sequence[str],
    chat_template: str | None = None,
    content_format: str = "auto",
) -> tuple[Tokenizer, tuple[int | None, list[int]], int | None, PoolingInfo, dict[str, float]]:
    """Tokenizer, EOS ids, ``max_position_embeddings``, pooling info and the sampling
    defaults of ``generation_config.json`` of a spec's model directory, every file read
    confined to ``roots`` (blocking I/O: run it in a thread); ``chat_template``
    (``--chat-template``'s source) replaces the model's templates."""
    model_dir = _open_model_dir(path, roots)
    tok = Tokenizer.from_dir(model_dir, chat_template=chat_template, content_format=content_format)
    info = read_pooling_info(model_dir)
    eos = resolve_eos(model_dir, tok)
    return tok, eos, _config_max_len(model_dir), info, sampling_defaults(model_dir)


def check_model_files(path: str | None, roots: Sequence[str]) -> None:
    """Check that ``path`` and each model file in it resolve inside ``roots``."""
    if path is not None:
        ModelDir(path, roots).check_files()
