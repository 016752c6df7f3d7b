"""The model directory with the vocabulary a special-token case needs (the e2e harness asks)."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.deepseek_vocab import deepseek_model_dir
from tests.tools.toolcase import ToolCase

__all__ = ["model_dir_for"]

#: The parsers whose markers DeepSeek's vocabulary has as tokens of their own.
_DEEPSEEK_PARSERS = frozenset({"deepseek_v3", "deepseek_v31"})


def model_dir_for(case: ToolCase) -> Path | None:
    """DeepSeek's real vocabulary for the DeepSeek formats; ``None`` (skipped) otherwise."""
    return deepseek_model_dir() if case.parser in _DEEPSEEK_PARSERS else None
