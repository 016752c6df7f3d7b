"""The argparse value types of the CLI's flags: bounded numbers, durations, JSON values."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from typing import Any


def _api_server_count(text: str) -> int | str:
    """An argparse type: ``--api-server-count`` (a positive integer or ``auto``)."""
    from smg_trio.serve.frontends import parse_api_server_count

    try:
        return parse_api_server_count(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _int_at_least(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an int in ``[low, high]``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value

    return parse


def _float_range(low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a finite float in ``[low, high]``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not low <= value <= high or value != value or value == float("inf"):
            bound = f"at least {low}" if high == float("inf") else f"between {low} and {high}"
            raise argparse.ArgumentTypeError(f"must be a finite number {bound}, got {text}")
        return value

    return parse


def _seconds(*, allow_zero: bool, allow_inf: bool = False) -> Callable[[str], float]:
    """An argparse type: a duration in seconds (positive, or also 0; finite unless inf is
    allowed)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
        if math.isnan(value) or (math.isinf(value) and not allow_inf):
            raise argparse.ArgumentTypeError(f"must be a finite number of seconds, got {text}")
        if value < 0 or (value == 0 and not allow_zero):
            kind = "non-negative" if allow_zero else "positive"
            raise argparse.ArgumentTypeError(f"must be {kind}, got {text}")
        return value

    return parse


def _stall_timeout(text: str) -> float:
    """An argparse type: ``--frontend-stall-timeout-secs`` (0 or inf: off; else at least
    1 s: below that, a long busy stretch of a healthy loop could read as a stall)."""
    value = _seconds(allow_zero=True, allow_inf=True)(text)
    if 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be 0 (off) or at least 1 second, got {text}")
    return value


def _json_object(text: str) -> dict[str, Any]:
    """A flag's JSON object (``--default-chat-template-kwargs``), else a usage error."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"a JSON object is needed, got {text!r}")
    return value


def _cors_item(text: str) -> list[str]:
    """One CORS flag value: a name, or a JSON list of names (older vLLM's spelling)."""
    if text.startswith("["):
        try:
            items = json.loads(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a JSON list: {text!r}") from None
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise argparse.ArgumentTypeError(f"not a JSON list of strings: {text!r}")
        return items
    return [text]
