"""The level of an engine's log line (vLLM's, TokenSpeed's and Python's formats), so that its
forwarded copy keeps the engine's level and ``--engine-log-level`` can filter it."""

from __future__ import annotations

import logging
import re

__all__ = ["ENGINE_LOG_LEVELS", "EngineLogLevels"]

#: ``--engine-log-level`` choices.
ENGINE_LOG_LEVELS = ("debug", "info", "warning", "error")

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# vLLM: "(EngineCore_DP0 pid=12) WARNING 12-01 18:00:00 [file.py:3] msg"; Python's logging
# and TokenSpeed: "2026-12-01 18:00:00,123 WARNING name: msg" / "[2026-12-01 18:00:00] INFO": the
# level is the first level word of the line's head.
_LEVEL = re.compile(r"\b(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\b")
_HEAD = 100
# the warnings module: "/path/file.py:12: DeprecationWarning: msg"
_PY_WARNING = re.compile(r"\.py:\d+: [A-Z]\w*Warning: ")
_NAMES = {"WARN": logging.WARNING, "FATAL": logging.CRITICAL}


class EngineLogLevels:
    """Reads one engine's lines in order. A line without a level takes ``INFO``, except the
    continuation of a record (an indented line, a traceback up to its last line), which keeps
    the level of the record it continues."""

    def __init__(self) -> None:
        self._last = logging.INFO
        self._traceback = False

    def level(self, line: str) -> int:
        """The logging level of ``line``."""
        bare = _ANSI.sub("", line)
        found = _LEVEL.search(bare[:_HEAD])
        if found is not None:
            word = found.group(1)
            self._last = _NAMES.get(word) or logging.getLevelNamesMapping()[word]
            self._traceback = False
        elif bare.startswith("Traceback (most recent call last)"):
            self._last = logging.ERROR
            self._traceback = True
        elif _PY_WARNING.search(bare):
            self._last = logging.WARNING
        elif not self._traceback and not bare[:1].isspace():
            self._last = logging.INFO
        return self._last
