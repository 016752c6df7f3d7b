"""Workflow and step definitions, validated when built (smg ``wfaas`` ``StepDefinition``)."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from smg_trio.workflow.errors import WorkflowDefinitionError

if TYPE_CHECKING:
    from smg_trio.workflow.context import WorkflowContext

__all__ = [
    "RetryPolicy",
    "RunIf",
    "StepDefinition",
    "StepFn",
    "WorkflowDefinition",
]

#: A step body. It reads and writes the context; its return value becomes the step's result.
StepFn = Callable[["WorkflowContext"], Awaitable[Any]]

#: A synchronous predicate deciding whether a ready step runs (``False``: skipped).
RunIf = Callable[["WorkflowContext"], bool]


@attrs.frozen
class RetryPolicy:
    """How often a step is attempted and how long to wait between attempts.

    The wait after failed attempt ``n`` (1-based) is ``min(max_s, initial_s * multiplier**(n-1))``
    seconds; ``multiplier=1`` gives a fixed interval. With ``jitter_ratio`` ``j`` in ``[0, 1]`` the
    wait is scaled by ``1 - j * u``, ``u`` drawn from the engine's (seedable) RNG, so jitter only
    ever shortens a wait and never exceeds ``max_s``.

    Raises:
        WorkflowDefinitionError: ``max_attempts < 1``, a negative duration, ``multiplier < 1``
            or ``jitter_ratio`` outside ``[0, 1]``.
    """

    max_attempts: int = 1
    initial_s: float = 1.0
    multiplier: float = 2.0
    max_s: float = 30.0
    jitter_ratio: float = 0.0

    def __attrs_post_init__(self) -> None:
        if self.max_attempts < 1:
            raise WorkflowDefinitionError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.initial_s < 0 or self.max_s < 0:
            raise WorkflowDefinitionError(
                f"backoff durations must be >= 0 s, got initial_s={self.initial_s}, "
                f"max_s={self.max_s}"
            )
        if self.multiplier < 1:
            raise WorkflowDefinitionError(f"multiplier must be >= 1, got {self.multiplier}")
        if not 0.0 <= self.jitter_ratio <= 1.0:
            raise WorkflowDefinitionError(
                f"jitter_ratio must be within [0, 1], got {self.jitter_ratio}"
            )

    def delay_s(self, failed_attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after attempt ``failed_attempt`` (1-based) failed.

        ``rng`` supplies the jitter draw; pass a seeded ``random.Random`` for reproducible
        waits. Without one, jitter uses the module-level RNG.
        """
        try:
            base = self.initial_s * self.multiplier ** (failed_attempt - 1)
        except OverflowError:
            base = self.max_s
        delay = min(self.max_s, base)
        if self.jitter_ratio:
            draw = (rng or random).random()
            delay *= 1.0 - self.jitter_ratio * draw
        return delay


def _step_ids(value: Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        raise WorkflowDefinitionError(
            f"dependencies must be a sequence of step ids, not the string {value!r}"
        )
    return tuple(value)


def _steps(value: Iterable[StepDefinition]) -> tuple[StepDefinition, ...]:
    return tuple(value)


@attrs.frozen
class StepDefinition:
    """One node of a workflow DAG (or a workflow's failure step).

    Attributes:
        id: Unique within its workflow.
        run: The body, called once per attempt with a per-attempt view of the context. Its
            writes become visible to other steps only if the attempt succeeds.
        depends_on: All of these must be satisfied (succeeded or skipped) before the step
            becomes ready.
        run_if: Evaluated once when the step becomes ready; ``False`` skips it (a skipped step
            satisfies its dependents). An exception fails the step with that exception.
        retry: Attempts and backoff. Every ``Exception`` (including :class:`StepTimeoutError`)
            is retried unless ``is_retryable`` says otherwise.
        timeout_s: Per-attempt limit in seconds, or ``None`` for none.
        is_retryable: Optional predicate on a failed attempt's exception.

    A step's final failure fails the run and cancels its other running steps.

    Raises:
        WorkflowDefinitionError: an empty id, a non-positive ``timeout_s``, or a string given
            where a sequence of ids is expected.
    """

    id: str
    run: StepFn
    depends_on: tuple[str, ...] = attrs.field(default=(), converter=_step_ids)
    run_if: RunIf | None = None
    retry: RetryPolicy = RetryPolicy()
    timeout_s: float | None = None
    is_retryable: Callable[[Exception], bool] | None = None

    def __attrs_post_init__(self) -> None:
        if not self.id:
            raise WorkflowDefinitionError("a step id must be a non-empty string")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise WorkflowDefinitionError(
                f"step {self.id!r}: timeout_s must be > 0 s or None, got {self.timeout_s}"
            )


@attrs.frozen
class WorkflowDefinition:
    """A validated DAG of steps, and the step that compensates for a failed run.

    Validation runs here, at definition time (smg runs it at ``register_workflow``).

    ``on_failure`` is the compensation: when any step's final failure fails the run, the
    engine first lets every other step end (they are cancelled), then runs ``on_failure``
    with the run's context, under its own ``timeout_s`` and ``retry``. It sees what the
    succeeded steps wrote, so it can undo exactly what was done. It does not run for a
    completed run (it ends ``SKIPPED``) nor for a run whose caller cancelled it (the caller
    owns that cleanup; it ends ``CANCELLED``). Its own failure is recorded in its step state
    and does not change the run's error.

    Raises:
        WorkflowDefinitionError: no steps, a duplicate step id, a dependency on an unknown step,
            a dependency cycle (the message names the cycle), or an ``on_failure`` step that
            has dependencies or reuses a step id.
    """

    id: str
    steps: tuple[StepDefinition, ...] = attrs.field(converter=_steps)
    on_failure: StepDefinition | None = None
    _by_id: Mapping[str, StepDefinition] = attrs.field(init=False, repr=False, eq=False)
    _dependents: Mapping[str, tuple[str, ...]] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        if not self.steps:
            raise WorkflowDefinitionError(f"workflow {self.id!r} has no steps")
        by_id: dict[str, StepDefinition] = {}
        for step in self.steps:
            if step.id in by_id:
                raise WorkflowDefinitionError(
                    f"workflow {self.id!r}: duplicate step id {step.id!r}"
                )
            by_id[step.id] = step
        dependents: dict[str, list[str]] = {step.id: [] for step in self.steps}
        for step in self.steps:
            for dep in step.depends_on:
                if dep not in by_id:
                    raise WorkflowDefinitionError(
                        f"workflow {self.id!r}: step {step.id!r} depends on unknown step {dep!r}"
                    )
                dependents[dep].append(step.id)
        cycle = _find_cycle(self.steps, by_id)
        if cycle is not None:
            raise WorkflowDefinitionError(
                f"workflow {self.id!r}: dependency cycle {' -> '.join(cycle)} "
                "(each step depends on the next)"
            )
        if self.on_failure is not None:
            if self.on_failure.id in by_id:
                raise WorkflowDefinitionError(
                    f"workflow {self.id!r}: the on_failure step reuses step id "
                    f"{self.on_failure.id!r}"
                )
            if self.on_failure.depends_on:
                raise WorkflowDefinitionError(
                    f"workflow {self.id!r}: the on_failure step {self.on_failure.id!r} runs "
                    "after the run failed and cannot have dependencies"
                )
        object.__setattr__(self, "_by_id", by_id)
        object.__setattr__(self, "_dependents", {k: tuple(v) for k, v in dependents.items()})

    @property
    def roots(self) -> tuple[str, ...]:
        """Ids of the steps with no dependencies, in definition order."""
        return tuple(step.id for step in self.steps if not step.depends_on)

    def step(self, step_id: str) -> StepDefinition:
        """The step named ``step_id``. Raises ``KeyError`` if there is none."""
        return self._by_id[step_id]

    def dependents(self, step_id: str) -> tuple[str, ...]:
        """Ids of the steps that list ``step_id`` as a dependency."""
        return self._dependents[step_id]


def _find_cycle(
    steps: tuple[StepDefinition, ...], by_id: Mapping[str, StepDefinition]
) -> list[str] | None:
    """Depth-first search along dependency edges; returns the first cycle found, closed."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(step_id: str) -> list[str] | None:
        path.append(step_id)
        on_path.add(step_id)
        for dep in by_id[step_id].depends_on:
            if dep in on_path:
                return [*path[path.index(dep) :], dep]
            if dep not in done:
                found = visit(dep)
                if found is not None:
                    return found
        path.pop()
        on_path.discard(step_id)
        done.add(step_id)
        return None

    for step in steps:
        if step.id not in done:
            found = visit(step.id)
            if found is not None:
                return found
    return None
