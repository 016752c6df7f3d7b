"""Runs cases against a gateway, turning every outcome (and every HTTP error) into a CaseResult."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import httpx

from conformance import cases_apis, cases_errors, cases_http, cases_robust
from conformance.case import Case, CaseResult, execute, execute_all
from conformance.client import Context

__all__ = ["http_cases", "run_case", "run_cases", "select_cases"]


def http_cases() -> list[Case]:
    """Every HTTP case, in run order (disconnect cases last: they may disturb a broken server)."""
    return [*cases_http.CASES, *cases_apis.CASES, *cases_errors.CASES, *cases_robust.CASES]


def select_cases(cases: Sequence[Case], only: Iterable[str] | None) -> list[Case]:
    """The cases named in ``only`` (in registry order), or all; ValueError on an unknown name."""
    if only is None:
        return list(cases)
    wanted = {name.strip() for name in only if name.strip()}
    unknown = wanted - {c.name for c in cases}
    if unknown:
        raise ValueError(f"unknown case name(s): {', '.join(sorted(unknown))}")
    return [c for c in cases if c.name in wanted]


def _describe_http_error(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return f"timed out ({type(exc).__name__}): {exc}"
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect: {exc}"
    return f"HTTP error ({type(exc).__name__}): {exc}"


def _describe(exc: Exception) -> str:
    if isinstance(exc, httpx.HTTPError):
        return _describe_http_error(exc)
    return f"runner error {type(exc).__name__}: {exc}"


def run_case(ctx: Context, case: Case) -> CaseResult:
    """Run one case; never raises (except KeyboardInterrupt and the like)."""
    return execute(case, ctx, _describe)


def run_cases(
    ctx: Context,
    cases: Sequence[Case],
    *,
    on_result: Callable[[CaseResult], None] | None = None,
) -> list[CaseResult]:
    """Run ``cases`` in order, reporting each result to ``on_result`` as it finishes."""
    try:
        return execute_all(ctx, cases, describe=_describe, on_result=on_result)
    finally:
        ctx.close()
