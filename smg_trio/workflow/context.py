"""The key/value store a run's steps share, with per-attempt write buffering and step results."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

import attrs
import trio

from smg_trio.workflow.errors import StepResultUnavailable, WorkflowError
from smg_trio.workflow.state import StepStatus

if TYPE_CHECKING:
    from smg_trio.workflow.definition import WorkflowDefinition

__all__ = ["ContextKey", "WorkflowContext"]

T = TypeVar("T")
D = TypeVar("D")


@attrs.frozen
class ContextKey(Generic[T]):
    """A typed name for a context value: ``MODE: ContextKey[str] = ContextKey("connection_mode")``.

    ``ctx.get(MODE)`` is then typed ``str``. Plain ``str`` keys work too and are typed ``Any``;
    a ``ContextKey`` and a ``str`` with the same name address the same value.
    """

    name: str


_Key = ContextKey[Any] | str


def _name(key: _Key) -> str:
    return key.name if isinstance(key, ContextKey) else key


@attrs.define(eq=False)
class _Shared:
    """State every view of one run's context shares."""

    values: dict[str, object]
    instance_id: str
    definition: WorkflowDefinition | None = None
    results: dict[str, object] = attrs.Factory(dict)
    outcomes: dict[str, StepStatus] = attrs.Factory(dict)
    finished: dict[str, trio.Event] = attrs.Factory(dict)


class WorkflowContext:
    """What a run's steps read and write, plus the run's id and its steps' results.

    The context you create and pass to the engine is the *root*: writes to it take effect at
    once. Each step attempt instead receives a *view* whose writes are buffered and merged,
    key by key, into the root only when the attempt succeeds; a failed, timed-out, skipped or
    cancelled attempt leaves nothing behind. This is the per-field merge smg's #2013 review
    asked for: parallel steps never overwrite each other's unrelated keys with stale snapshots.
    A view reads its own pending writes first, then the root.

    A context can be run once; the engine binds it to the definition when the run starts.
    """

    def __init__(
        self, initial: Mapping[str, object] | None = None, *, instance_id: str | None = None
    ) -> None:
        """Create a root context.

        Args:
            initial: Starting values.
            instance_id: The run's id; a fresh uuid4 string by default, so a caller can report
                the id (``202 Accepted``) before starting the run.
        """
        self._shared = _Shared(
            values=dict(initial or {}), instance_id=instance_id or str(uuid.uuid4())
        )
        self._writes: dict[str, object] | None = None
        self._step_id: str | None = None

    # -- identity ------------------------------------------------------------------------

    @property
    def instance_id(self) -> str:
        """This run's id."""
        return self._shared.instance_id

    @property
    def workflow_id(self) -> str | None:
        """The definition's id once the run has started, else ``None``."""
        d = self._shared.definition
        return None if d is None else d.id

    @property
    def step_id(self) -> str | None:
        """The step this view belongs to; ``None`` for the root context."""
        return self._step_id

    # -- values --------------------------------------------------------------------------

    @overload
    def get(self, key: ContextKey[T]) -> T: ...
    @overload
    def get(self, key: str) -> Any: ...
    def get(self, key: _Key) -> Any:
        """The value of ``key``. Raises ``KeyError`` if it was never set."""
        name = _name(key)
        if self._writes is not None and name in self._writes:
            return self._writes[name]
        try:
            return self._shared.values[name]
        except KeyError:
            raise KeyError(f"workflow context has no value {name!r}") from None

    @overload
    def get_or(self, key: ContextKey[T], default: D) -> T | D: ...
    @overload
    def get_or(self, key: str, default: object) -> Any: ...
    def get_or(self, key: _Key, default: object) -> Any:
        """The value of ``key``, or ``default`` if it was never set."""
        try:
            return self.get(key)
        except KeyError:
            return default

    @overload
    def set(self, key: ContextKey[T], value: T) -> None: ...
    @overload
    def set(self, key: str, value: object) -> None: ...
    def set(self, key: _Key, value: object) -> None:
        """Set ``key``. In a step's view the write is buffered until the attempt succeeds."""
        if self._writes is not None:
            self._writes[_name(key)] = value
        else:
            self._shared.values[_name(key)] = value

    def __contains__(self, key: _Key) -> bool:
        name = _name(key)
        return (self._writes is not None and name in self._writes) or name in self._shared.values

    def snapshot(self) -> dict[str, object]:
        """A shallow copy of every value this context sees."""
        values = dict(self._shared.values)
        if self._writes is not None:
            values.update(self._writes)
        return values

    # -- step results --------------------------------------------------------------------

    def result(self, step_id: str) -> Any:
        """What step ``step_id``'s ``run`` returned.

        Raises:
            StepResultUnavailable: the run has not started, ``step_id`` is unknown, or the
                step has not succeeded (pending, running, skipped, failed, cancelled).
        """
        self._check_known(step_id)
        if self._shared.outcomes.get(step_id) is not StepStatus.SUCCEEDED:
            state = self._shared.outcomes.get(step_id, "not finished")
            raise StepResultUnavailable(f"step {step_id!r} has no result: {state}")
        return self._shared.results[step_id]

    async def wait_result(self, step_id: str) -> Any:
        """Wait until step ``step_id`` finishes, then return its result.

        Use it for a step that is not a declared dependency; a dependency's result is already
        there (``result``). The wait is a checkpoint and obeys the caller's cancel scopes, so it
        ends with the run that contains it.

        Raises:
            StepResultUnavailable: as for :meth:`result` once the step finished; or at once if
                ``step_id`` is this view's own step or one of its dependents, whose finishing
                would wait on this one (a deadlock).
        """
        self._check_known(step_id)
        definition = self._shared.definition
        assert definition is not None  # _check_known
        if self._step_id is not None and (
            step_id == self._step_id or step_id in definition.descendants(self._step_id)
        ):
            raise StepResultUnavailable(
                f"step {self._step_id!r} cannot wait for {step_id!r}: it depends on {self._step_id!r}"
            )
        await self._shared.finished[step_id].wait()
        return self.result(step_id)

    def _check_known(self, step_id: str) -> None:
        definition = self._shared.definition
        if definition is None:
            raise StepResultUnavailable("the workflow context has not been run yet")
        if step_id not in self._shared.finished:
            raise StepResultUnavailable(f"workflow {definition.id!r} has no step {step_id!r}")

    # -- engine side (private) -----------------------------------------------------------

    def _bind(self, definition: WorkflowDefinition) -> None:
        if self._writes is not None:
            raise WorkflowError("a step's context view cannot start a run")
        if self._shared.definition is not None:
            raise WorkflowError(
                f"context {self.instance_id} already ran workflow {self._shared.definition.id!r}; "
                "create a new WorkflowContext per run"
            )
        self._shared.definition = definition
        self._shared.finished = {step.id: trio.Event() for step in definition.steps}

    def _view(self, step_id: str) -> WorkflowContext:
        view = WorkflowContext.__new__(WorkflowContext)
        view._shared = self._shared
        view._writes = {}
        view._step_id = step_id
        return view

    def _finish(
        self,
        step_id: str,
        status: StepStatus,
        *,
        view: WorkflowContext | None = None,
        value: object = None,
    ) -> None:
        """Record a terminal step: merge a successful view's writes, store its result, and wake
        ``wait_result`` callers. Synchronous, so it happens atomically with the caller's
        publication of the step's completion."""
        if status is StepStatus.SUCCEEDED:
            if view is not None and view._writes:
                self._shared.values.update(view._writes)
            self._shared.results[step_id] = value
        self._shared.outcomes[step_id] = status
        self._shared.finished[step_id].set()

    def __repr__(self) -> str:
        where = f" step={self._step_id!r}" if self._step_id else ""
        return f"<WorkflowContext {self.instance_id}{where} keys={sorted(self.snapshot())}>"
