"""An engine's supported tasks (``generate``, ``embed``, ``classify``...), learnt once per engine
client from vLLM's ``get_supported_tasks`` utility call, and waited on (bounded) by the routes."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from smg_trio.errors import ClientClosed, EngineDeadError, UtilityCallFailed, UtilityUnsupported

if TYPE_CHECKING:
    from smg_trio.connector.client import EngineClient

__all__ = [
    "TASKS_TIMEOUT_S",
    "DEFAULT_TASKS",
    "GENERATION_TASKS",
    "POOLING_TASKS",
    "EngineTasks",
    "learn_tasks",
    "model_pooling_task",
]

log = logging.getLogger(__name__)

#: The default bound on an engine's ``get_supported_tasks`` answer.
TASKS_TIMEOUT_S = 10.0
#: What an engine that does not answer (or has no utility calls: TokenSpeed) is taken to do.
DEFAULT_TASKS: frozenset[str] = frozenset({"generate"})
#: vLLM ``GenerationTask`` and ``PoolingTask`` (``vllm/tasks.py``, 0.32).
GENERATION_TASKS: frozenset[str] = frozenset({"generate", "transcription", "realtime"})
POOLING_TASKS: frozenset[str] = frozenset(
    {"embed", "classify", "token_embed", "token_classify", "plugin", "embed&token_classify"}
)

#: vLLM's ``ModelConfig.get_pooling_task`` order: a model's own pooling task is the first of
#: these it supports (the pooler config's task aside, which the wire does not show).
_POOLING_PRIORITY = ("embed&token_classify", "embed", "classify", "token_embed", "token_classify")


def model_pooling_task(tasks: frozenset[str]) -> str | None:
    """The model's own pooling task as vLLM picks it from its supported tasks (what
    ``/pooling`` runs without a ``task``, and what decides bi- or cross-encoder scoring);
    ``None`` for a model that does not pool."""
    return next((t for t in (*_POOLING_PRIORITY, "plugin") if t in tasks), None)


class EngineTasks:
    """One engine client's tasks: unknown (``None``) until :func:`learn_tasks` settles them."""

    def __init__(self) -> None:
        self.tasks: frozenset[str] | None = None
        self.known = trio.Event()
        self._learning = False

    def settle(self, tasks: frozenset[str]) -> None:
        """Set the tasks (once; later calls are ignored)."""
        if not self.known.is_set():
            self.tasks = tasks
            self.known.set()

    async def wait(self) -> frozenset[str]:
        """The tasks, once known (the caller bounds the wait with a cancel scope)."""
        await self.known.wait()
        assert self.tasks is not None
        return self.tasks

    async def ensure(self, client: EngineClient, bound_s: float, name: str) -> frozenset[str]:
        """The tasks, learning them now when nobody has yet (a client made outside the worker
        manager); at most about ``bound_s``, then :data:`DEFAULT_TASKS`."""
        if not self.known.is_set() and not self._learning:
            self._learning = True
            try:
                await learn_tasks(client, bound_s, name)
            finally:
                self._learning = False
        with trio.move_on_after(bound_s):
            return await self.wait()
        return DEFAULT_TASKS

    def refuses_generation(self) -> bool:
        """Known, and no generation task among them (a pooling-only engine)."""
        return self.tasks is not None and not (self.tasks & GENERATION_TASKS)


async def learn_tasks(client: EngineClient, bound_s: float, name: str) -> None:
    """Ask ``client``'s engine for its tasks and settle ``client.tasks``: with its answer, or
    with :data:`DEFAULT_TASKS` (logged) when it has no utility calls, fails the call, answers
    something else, or does not answer within ``bound_s``. A closed client settles nothing."""
    answer: object = None
    with trio.move_on_after(bound_s):
        try:
            answer = await client.call_utility("get_supported_tasks")
        except (UtilityUnsupported, UtilityCallFailed) as exc:
            log.info("worker %s: no supported tasks (%s); taking it as generate-only", name, exc)
            client.tasks.settle(DEFAULT_TASKS)
            return
        except (EngineDeadError, ClientClosed):
            return
    if isinstance(answer, (list, tuple)) and answer and all(isinstance(t, str) for t in answer):
        tasks = frozenset(str(t) for t in answer)
        log.info("worker %s: supported tasks %s", name, ", ".join(sorted(tasks)))
        client.tasks.settle(tasks)
        return
    log.warning(
        "worker %s: get_supported_tasks gave no usable answer within %.1f s (%r); taking it "
        "as generate-only",
        name,
        bound_s,
        answer,
    )
    client.tasks.settle(DEFAULT_TASKS)
