"""Startup checks of the model: a local tokenizer directory, a Hugging Face id, a mock script."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from smg_trio.cli.usage import _usage_error

log = logging.getLogger("smg_trio")


def _check_model_dir(path: str, flag: str) -> None:
    """Exit with a usage error unless ``path`` is a local model directory the gateway can
    tokenize with (checked before any engine is launched)."""
    p = Path(path)
    if not p.is_dir():
        raise SystemExit(
            f"smg_trio: error: {flag} {path}: not a local directory, nor a Hugging Face "
            "model id (org/name); pass the directory holding config.json and tokenizer.json, "
            "or the model's id"
        )
    if not (p / "tokenizer.json").is_file():
        if (p / "tokenizer.model").is_file():
            raise SystemExit(
                f"smg_trio: error: {flag} {path}: the model ships only a SentencePiece "
                "tokenizer.model, no tokenizer.json; the gateway tokenizes with a fast "
                "tokenizer.json. Make one once: download the model into a directory "
                '(`hf download ORG/NAME --local-dir DIR`), run `python -c "from transformers '
                "import AutoTokenizer as T; T.from_pretrained('DIR').save_pretrained('DIR')\"` "
                "(needs transformers and sentencepiece), then pass --model DIR (docs/models.md)"
            )
        raise SystemExit(
            f"smg_trio: error: {flag} {path}: no tokenizer.json there (the gateway tokenizes "
            "with a fast tokenizer.json)"
        )


def _resolve_model(ref: str, flag: str, revision: str | None) -> Any:
    """``ref`` as given when it is a local directory (or not spelled like a hub id: the model
    dir check reports it), else its :class:`~smg_trio.tokenizer.hub.HubModel`: the snapshot in
    the HF cache, fetched (tokenizer and config files only) when missing and allowed. A usage
    error names the id and how to fetch it."""
    from smg_trio.tokenizer.hub import HubModelError, is_hub_id, resolve_hub_model

    if os.path.isdir(ref) or not is_hub_id(ref):
        return None
    try:
        hub = resolve_hub_model(ref, revision, progress=lambda line: log.info("%s", line))
    except HubModelError as exc:
        _usage_error(f"{flag} {ref}: {exc}")
    log.info("%s %s: Hugging Face snapshot %s (%s)", flag, ref, hub.commit, hub.path)
    return hub


def _check_mock_script(path: str, tok: Any) -> None:
    """A usage error (exit 2) naming the file and the rule unless the mock script compiles."""
    from smg_trio.mock.script import MockScriptError, load_script

    try:
        load_script(path, tok)
    except MockScriptError as exc:
        _usage_error(str(exc))
