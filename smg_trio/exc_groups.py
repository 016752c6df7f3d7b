"""Walking exception groups: the one place that looks inside a ``BaseExceptionGroup``."""

from __future__ import annotations

import trio

__all__ = ["first_failure", "is_cancellation", "leaves", "sole_exception"]


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions that are not groups, depth first (``[exc]`` for a plain exception)."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in leaves(e)]
    return [exc]


def is_cancellation(exc: BaseException) -> bool:
    """Whether ``exc`` is ``trio.Cancelled``, or a group holding nothing else."""
    return all(isinstance(leaf, trio.Cancelled) for leaf in leaves(exc))


def first_failure(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first leaf of ``group`` that is not ``Cancelled``; the group itself when it holds
    only cancellations (so trio still sees its ``Cancelled``)."""
    for leaf in leaves(group):
        if not isinstance(leaf, trio.Cancelled):
            return leaf
    return group


def sole_exception(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception ``group`` holds (its only leaf), else the group itself: what a
    context manager that runs a background task re-raises, so that its body's own exception
    leaves it as raised, not wrapped by the nursery."""
    found = leaves(group)
    return found[0] if len(found) == 1 else group
