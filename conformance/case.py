"""Case model: the registry decorator, the outcome exceptions, and per-case results."""

from __future__ import annotations

import enum
import time
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


def describe_exception(exc: Exception) -> str:
    """The default failure message for an unexpected exception in a case."""
    return f"{type(exc).__name__}: {exc}"


def execute(
    case: Case, ctx: Any, describe: Callable[[Exception], str] = describe_exception
) -> CaseResult:
    """Run one case against ``ctx``; never raises (except KeyboardInterrupt and the like).
    A :class:`CaseFailed` or any other exception is a FAIL (``describe`` words the latter),
    :class:`CaseSkipped` a SKIP."""
    started = time.monotonic()
    try:
        message = case.fn(ctx)
        result = Result.PASS
    except CaseFailed as exc:
        result, message = Result.FAIL, str(exc)
    except CaseSkipped as exc:
        result, message = Result.SKIP, str(exc)
    except Exception as exc:
        result, message = Result.FAIL, describe(exc)
    return CaseResult(
        name=case.name,
        behaviour=case.behaviour,
        why=case.why,
        result=result,
        message=message,
        duration_s=time.monotonic() - started,
    )


def execute_all(
    ctx: Any,
    cases: Iterable[Case],
    *,
    describe: Callable[[Exception], str] = describe_exception,
    on_result: Callable[[CaseResult], None] | None = None,
) -> list[CaseResult]:
    """Run ``cases`` in order, reporting each result to ``on_result`` as it finishes."""
    results: list[CaseResult] = []
    for case in cases:
        res = execute(case, ctx, describe)
        results.append(res)
        if on_result is not None:
            on_result(res)
    return results
