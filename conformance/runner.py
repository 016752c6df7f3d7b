"""Runs cases against a gateway, turning every outcome (and every HTTP error) into a CaseResult."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

import httpx

from conformance import cases_errors, cases_http, cases_robust
from conformance.case import Case, CaseFailed, CaseResult, CaseSkipped, Result
from conformance.client import Context

__all__ = ["http_cases", "run_case", "run_cases", "select_cases"]


def http_cases() -> list[Case]:
    """Every HTTP case, in run order (disconnect cases last: they may disturb a broken server)."""
    return [*cases_http.CASES, *cases_errors.CASES, *cases_robust.CASES]


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


def run_case(ctx: Context, case: Case) -> CaseResult:
    """Run one case; never raises (except KeyboardInterrupt and the like)."""
    started = time.monotonic()
    try:
        message = case.fn(ctx)
        result = Result.PASS
    except CaseFailed as exc:
        result, message = Result.FAIL, str(exc)
    except CaseSkipped as exc:
        result, message = Result.SKIP, str(exc)
    except httpx.HTTPError as exc:
        result, message = Result.FAIL, _describe_http_error(exc)
    except Exception as exc:
        result, message = Result.FAIL, f"runner error {type(exc).__name__}: {exc}"
    return CaseResult(
        name=case.name,
        behaviour=case.behaviour,
        why=case.why,
        result=result,
        message=message,
        duration_s=time.monotonic() - started,
    )


def run_cases(
    ctx: Context,
    cases: Sequence[Case],
    *,
    on_result: Callable[[CaseResult], None] | None = None,
) -> list[CaseResult]:
    """Run ``cases`` in order, reporting each result to ``on_result`` as it finishes."""
    results: list[CaseResult] = []
    try:
        for case in cases:
            res = run_case(ctx, case)
            results.append(res)
            if on_result is not None:
                on_result(res)
    finally:
        ctx.close()
    return results
