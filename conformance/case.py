"""Case model: the registry decorator, the outcome exceptions, and per-case results."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Case",
    "CaseFailed",
    "CaseResult",
    "CaseSkipped",
    "Result",
    "fail_if",
    "register",
]


class Result(enum.StrEnum):
    """The verdict of one case."""

    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"


class CaseFailed(Exception):
    """Raised by a case when the server violated the behaviour it checks."""


class CaseSkipped(Exception):
    """Raised by a case that cannot be judged against this server (said why in the message)."""


CaseFn = Callable[[Any], str]
"""A case body: takes its suite's context (``http``: :class:`conformance.client.Context`,
``wire``: :class:`conformance.wire_context.WireContext`), returns a note on success, raises
CaseFailed / CaseSkipped otherwise."""


@dataclass(frozen=True, slots=True)
class Case:
    """One black-box check: a name, the behaviour it checks, and why that behaviour is required."""

    name: str
    behaviour: str
    why: str
    fn: CaseFn


@dataclass(frozen=True, slots=True)
class CaseResult:
    """What running one case produced."""

    name: str
    behaviour: str
    why: str
    result: Result
    message: str
    duration_s: float


def register(
    registry: list[Case], name: str, behaviour: str, why: str
) -> Callable[[CaseFn], CaseFn]:
    """Decorator that appends the decorated function to ``registry`` as a :class:`Case`."""

    def wrap(fn: CaseFn) -> CaseFn:
        if any(c.name == name for c in registry):
            raise ValueError(f"duplicate conformance case name {name!r}")
        registry.append(Case(name=name, behaviour=behaviour, why=why, fn=fn))
        return fn

    return wrap


def fail_if(problems: Iterable[str]) -> None:
    """Raise :class:`CaseFailed` listing every problem, if there are any."""
    found = [p for p in problems if p]
    if found:
        raise CaseFailed("; ".join(found))
