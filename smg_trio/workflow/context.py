"""The key/value store a run's steps share, with per-attempt write buffering."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any, Generic, TypeVar, overload

import attrs

from smg_trio.workflow.errors import WorkflowError

__all__ = ["ContextKey", "WorkflowContext"]

T = TypeVar("T")


@attrs.frozen
class ContextKey(Generic[T]):
    """A typed name for a context value: ``WORKER: ContextKey[Worker] = ContextKey("worker")``.

    ``ctx.get(WORKER)`` is then typed ``Worker``. Plain ``str`` keys work too and are typed
    ``Any``; a ``ContextKey`` and a ``str`` with the same name address the same value.
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
    bound: bool = False


class WorkflowContext:
    """What a run's steps read and write, plus the run's id.

    The context you create and pass to the engine is the *root*: writes to it take effect at
    once. Each step attempt instead receives a *view* whose writes are buffered and merged,
    key by key, into the root only when the attempt succeeds; a failed, timed-out, skipped or
    cancelled attempt leaves nothing behind. This is the per-field merge smg's #2013 review
    asked for: parallel steps never overwrite each other's unrelated keys with stale snapshots.
    A view reads its own pending writes first, then the root.

    A context can be run once; the engine binds it when the run starts.
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

    @property
    def instance_id(self) -> str:
        """This run's id."""
        return self._shared.instance_id

    @property
    def step_id(self) -> str | None:
        """The step this view belongs to; ``None`` for the root context."""
        return self._step_id

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
    def set(self, key: ContextKey[T], value: T) -> None: ...
    @overload
    def set(self, key: str, value: object) -> None: ...
    def set(self, key: _Key, value: object) -> None:
        """Set ``key``. In a step's view the write is buffered until the attempt succeeds."""
        if self._writes is not None:
            self._writes[_name(key)] = value
        else:
            self._shared.values[_name(key)] = value

    def snapshot(self) -> dict[str, object]:
        """A shallow copy of every value this context sees."""
        values = dict(self._shared.values)
        if self._writes is not None:
            values.update(self._writes)
        return values

    # -- engine side (private) -----------------------------------------------------------

    def _bind(self) -> None:
        if self._writes is not None:
            raise WorkflowError("a step's context view cannot start a run")
        if self._shared.bound:
            raise WorkflowError(
                f"context {self.instance_id} already ran; create a new WorkflowContext per run"
            )
        self._shared.bound = True

    def _view(self, step_id: str) -> WorkflowContext:
        view = WorkflowContext.__new__(WorkflowContext)
        view._shared = self._shared
        view._writes = {}
        view._step_id = step_id
        return view

    def _merge(self, view: WorkflowContext) -> None:
        """Merge a successful attempt's writes into the root. Synchronous, so it happens
        atomically with the step's completion."""
        if view._writes:
            self._shared.values.update(view._writes)

    def __repr__(self) -> str:
        where = f" step={self._step_id!r}" if self._step_id else ""
        return f"<WorkflowContext {self.instance_id}{where} keys={sorted(self.snapshot())}>"
