"""The process's log handler on stderr: text, or one JSON object per line (``--log-format``),
for the CLI and for serve's frontend processes alike."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping
from typing import Any

__all__ = ["TEXT_FORMAT", "JsonFormatter", "root_log_format", "setup_logging"]

#: The text lines' layout.
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "msg"}`` (plus ``exc`` and the fixed ``fields``) per line."""

    def __init__(self, fields: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.fields = dict(fields or {})

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **self.fields,
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


def setup_logging(
    level: str,
    fmt: str,
    *,
    text_format: str = TEXT_FORMAT,
    fields: Mapping[str, Any] | None = None,
) -> None:
    """Make the root logger write ``fmt`` (``text`` or ``json``) lines at ``level`` to stderr,
    and nothing else; the access logs of hypercorn and quart are kept to warnings."""
    handler = logging.StreamHandler(sys.stderr)
    formatter = JsonFormatter(fields) if fmt == "json" else logging.Formatter(text_format)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("hypercorn.access", "quart.serving"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def root_log_format() -> str:
    """``json`` if the root logger writes JSON lines (:func:`setup_logging`), else ``text``:
    what a child process is told to write."""
    json_lines = any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers)
    return "json" if json_lines else "text"
