"""Engine control routes (vLLM's ``/sleep``, ``/wake_up``, ``/pause``, ``/reset_prefix_cache``...)
as utility calls to every engine of the targeted workers, added to the admin blueprint."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import msgspec
import trio
from quart import Blueprint, Response, request

from smg_trio.errors import (
    ClientClosed,
    EngineDeadError,
    UtilityCallFailed,
    UtilityUnsupported,
)
from smg_trio.gateway.openai.errors import ApiError
from smg_trio.worker.manager import WorkerManager, WorkerState
from smg_trio.worker.registry import Held

__all__ = ["CONTROL_CALL_TIMEOUT_S", "ENGINE_CONTROL_PATHS", "add_engine_control_routes"]

log = logging.getLogger(__name__)

#: How long a control route waits for every engine's answer before it answers 504 naming the
#: engines that did not (a sleep or wake-up of a large model takes seconds).
CONTROL_CALL_TIMEOUT_S = 60.0
#: The routes (Quart rules and methods); a frontend process forwards them to the supervisor.
ENGINE_CONTROL_PATHS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("/reset_prefix_cache", ("POST",)),
    ("/sleep", ("POST",)),
    ("/wake_up", ("POST",)),
    ("/is_sleeping", ("GET",)),
    ("/pause", ("POST",)),
    ("/resume", ("POST",)),
    ("/is_paused", ("GET",)),
    ("/server_info", ("GET",)),
)
#: vLLM's ``PauseMode``.
_PAUSE_MODES = ("abort", "wait", "keep")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@attrs.frozen
class _Answer:
    worker: WorkerState
    rank: int
    result: Any = None
    error: ApiError | None = None


def _error(exc: ApiError) -> Response:
    resp = Response(exc.body(), status=exc.status, content_type="application/json")
    for name, value in exc.headers.items():
        resp.headers[name] = value
    return resp


def _json(doc: dict[str, Any]) -> Response:
    return Response(msgspec.json.encode(doc), content_type="application/json")


def _bool_arg(name: str, default: bool) -> bool:
    raw = request.args.get(name)
    if raw is None:
        return default
    if raw.lower() in _TRUE:
        return True
    if raw.lower() in _FALSE:
        return False
    raise ApiError(400, f"{name} must be true or false, got {raw!r}", param=name)


def _choice_arg(name: str, default: str, choices: Sequence[str]) -> str:
    raw = request.args.get(name, default)
    if raw not in choices:
        raise ApiError(400, f"{name} must be one of {', '.join(choices)}, got {raw!r}", param=name)
    return raw


def _targets(manager: WorkerManager) -> list[WorkerState]:
    """The workers a control call goes to: ``?worker_id=`` (one), ``?model=`` (every worker of
    it), else every worker. 404 for a missing worker or model; 503 when a target has no live
    engine connection."""
    worker_id = request.args.get("worker_id")
    model = request.args.get("model")
    if worker_id is not None:
        worker = manager.get_worker(worker_id)
        if worker is None:
            raise ApiError(404, f"no worker {worker_id!r}", code="worker_not_found")
        workers = [worker]
    else:
        workers = [w for w in manager.workers if model is None or w.model_id == model]
        if model is not None and not workers:
            raise ApiError(404, f"no worker serves model {model!r}", code="model_not_found")
    down = [w for w in workers if w.engine_client is None or not w.engine_client.alive]
    if down and (worker_id is not None or len(down) == len(workers)):
        names = ", ".join(f"{w.worker_id} ({w.url}, {w.status})" for w in down)
        raise ApiError(
            503, f"worker {names} has no live engine connection", code="service_unavailable"
        )
    live = [w for w in workers if w not in down]
    if not live:
        raise ApiError(503, "no worker is registered", code="service_unavailable")
    return live


def _refusal(worker: WorkerState, exc: Exception) -> ApiError:
    if isinstance(exc, UtilityUnsupported):
        return ApiError(
            400,
            f"worker {worker.worker_id} ({worker.url}): {exc}",
            code="unsupported_by_engine",
        )
    if isinstance(exc, UtilityCallFailed):
        return ApiError(
            400, f"worker {worker.worker_id} ({worker.url}): {exc}", code="engine_refused"
        )
    return ApiError(
        503, f"worker {worker.worker_id} ({worker.url}): {exc}", code="service_unavailable"
    )


async def call_engines(
    workers: Sequence[WorkerState], method: str, args: Sequence[Any], bound_s: float
) -> list[_Answer]:
    """``method(*args)`` on every engine (DP rank) of ``workers``, gathered in one nursery
    under one bound: one answer per engine, a refusal (4xx) or loss (503) as its ``error``.
    Raises the 504 ``ApiError`` naming the engines that did not answer within ``bound_s``; a
    call cut by the bound leaves nothing pending (the connector's call is cancelled)."""
    answers: dict[tuple[str, int], _Answer] = {}

    async def one(worker: WorkerState, rank: int) -> None:
        client = worker.engine_client
        try:
            if client is None:
                raise ClientClosed("the worker's engine connection is gone")
            result = await client.call_utility(method, *args, rank=rank)
        except (UtilityCallFailed, UtilityUnsupported, EngineDeadError, ClientClosed) as exc:
            answers[worker.worker_id, rank] = _Answer(worker, rank, error=_refusal(worker, exc))
        else:
            answers[worker.worker_id, rank] = _Answer(worker, rank, result)

    calls = [(w, r) for w in workers for r in (w.engine_client.ranks if w.engine_client else [])]
    with trio.move_on_after(bound_s):
        async with trio.open_nursery() as nursery:
            for worker, rank in calls:
                nursery.start_soon(one, worker, rank)
    missing = [(w, r) for w, r in calls if (w.worker_id, r) not in answers]
    if missing:
        names = ", ".join(f"worker {w.worker_id} ({w.url}) engine {r}" for w, r in missing)
        log.warning("engine control: %s did not answer %s within %g s", names, method, bound_s)
        raise ApiError(
            504,
            f"{names} did not answer {method} within {bound_s:g} s",
            code="engine_timeout",
        )
    return [answers[w.worker_id, r] for w, r in calls]


class _Epochs:
    """How many times control calls changed each worker's held state: an answer to a call
    sent before another call changed it (a read-back of ``is_paused``, a wake-up overtaken by
    a sleep) must not undo that change."""

    def __init__(self) -> None:
        self._n: dict[str, int] = {}

    def snapshot(self, workers: Sequence[WorkerState]) -> dict[str, int]:
        """The workers' counts now (before the engines are called)."""
        return {w.worker_id: self._n.get(w.worker_id, 0) for w in workers}

    def unchanged(self, worker: WorkerState, snap: dict[str, int]) -> bool:
        """Whether no control call changed ``worker``'s held state since ``snap``."""
        return self._n.get(worker.worker_id, 0) == snap.get(worker.worker_id)

    def hold(self, worker: WorkerState, held: Held | None) -> None:
        """Set ``worker``'s held state (counted)."""
        if worker.held != held:
            worker.held = held
            self._n[worker.worker_id] = self._n.get(worker.worker_id, 0) + 1


class _Flight:
    """One read of the engines' state (``is_sleeping``, ``is_scheduler_paused``) that the
    readers arriving while it is on its way share."""

    def __init__(self, snap: dict[str, int]) -> None:
        self.snap = snap
        self.done = trio.Event()
        self.answers: list[_Answer] | None = None
        self.error: ApiError | None = None


def _check(answers: Sequence[_Answer]) -> list[_Answer]:
    """``answers``, or raise the first engine's error."""
    for answer in answers:
        if answer.error is not None:
            raise answer.error
    return list(answers)


async def _hold(
    workers: Sequence[WorkerState],
    held: Held,
    method: str,
    args: Sequence[Any],
    bound_s: float,
    epochs: _Epochs,
) -> None:
    """Take ``workers`` out of routing, then call ``method`` (sleep, pause) on their engines,
    so that no request is routed to an engine that is pausing. A worker whose every engine
    refused is put back as it was, unless its engines say they are paused after all (vLLM's
    ``sleep`` pauses the scheduler before the executor refuses); one that did not answer stays
    held (``/is_sleeping`` and ``/is_paused`` read the engines' own state back)."""
    before = {w.worker_id: w.held for w in workers}
    for worker in workers:
        if worker.held is None or held == "sleeping":
            epochs.hold(worker, held)
    snap = epochs.snapshot(workers)
    answers = await call_engines(workers, method, args, bound_s)
    refused = [w for w in workers if all(a.error is not None for a in answers if a.worker is w)]
    if refused:
        try:
            probe = await call_engines(refused, "is_sleeping", (), bound_s)
        except ApiError:
            probe = [_Answer(w, -1, True) for w in refused]  # no word: keep them held
        for worker in refused:
            if not epochs.unchanged(worker, snap):
                continue  # another control call changed it meanwhile: that one stands
            if not any(a.error is None and a.result for a in probe if a.worker is worker):
                epochs.hold(worker, before[worker.worker_id])
    _check(answers)


def _per_engine(answers: Sequence[_Answer], key: str) -> list[dict[str, Any]]:
    return [{"worker_id": a.worker.worker_id, "dp_rank": a.rank, key: a.result} for a in answers]


def _sync_held(
    answers: Sequence[_Answer], state: str, epochs: _Epochs, snap: dict[str, int]
) -> None:
    """Take the engines' own word (``is_sleeping``, ``is_scheduler_paused``) for a worker's
    held state: the engine is the source of truth, and a restarted one is awake. Not for a
    worker whose held state a control call changed while these answers were on their way
    (they may predate it)."""
    for worker in {a.worker for a in answers}:
        if not epochs.unchanged(worker, snap):
            continue
        any_held = any(bool(a.result) for a in answers if a.worker is worker)
        if any_held and worker.held is None:
            epochs.hold(worker, "sleeping" if state == "sleeping" else "paused")
        elif not any_held and worker.held == state:
            epochs.hold(worker, None)


def add_engine_control_routes(
    bp: Blueprint,
    manager: WorkerManager,
    *,
    bound_s: float | None = None,
) -> None:
    """Add vLLM's engine control routes to the admin blueprint ``bp`` (so its auth guards
    them: ``POST`` needs the admin key, ``GET`` is open without one). Each targets every
    worker, ``?model=``, or ``?worker_id=``; see docs/admin.md. ``bound_s`` bounds each call
    (:data:`CONTROL_CALL_TIMEOUT_S` by default, read at each call)."""

    epochs = _Epochs()

    def bound() -> float:
        return CONTROL_CALL_TIMEOUT_S if bound_s is None else bound_s

    flights: dict[tuple[str, tuple[str, ...]], _Flight] = {}

    async def shared_read(
        method: str, workers: list[WorkerState]
    ) -> tuple[list[_Answer], dict[str, int]]:
        """``method()`` on ``workers``' engines, shared with the readers of the same state
        whose call is on its way (the read routes are open without an admin key: a flood of
        them makes one call per engine at a time, not one per reader). A reader whose shared
        call was abandoned (its first reader went away) makes it again."""
        key = (method, tuple(w.worker_id for w in workers))
        while True:
            flight = flights.get(key)
            if flight is None:
                break
            await flight.done.wait()
            if flight.error is not None:
                raise flight.error
            if flight.answers is not None:
                return flight.answers, flight.snap
        flight = flights[key] = _Flight(epochs.snapshot(workers))
        try:
            flight.answers = await call_engines(workers, method, (), bound())
        except ApiError as exc:
            flight.error = exc
            raise
        finally:
            del flights[key]
            flight.done.set()
        return flight.answers, flight.snap

    async def run(
        method: str,
        args: Sequence[Any],
        respond: Callable[[list[_Answer], dict[str, int]], dict[str, Any]],
        *,
        read: bool = False,
    ) -> Response:
        try:
            workers = _targets(manager)
            if read:
                answers, snap = await shared_read(method, workers)
            else:
                snap = epochs.snapshot(workers)
                answers = await call_engines(workers, method, args, bound())
            return _json(respond(_check(answers), snap))
        except ApiError as exc:
            return _error(exc)

    @bp.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> Response:
        try:
            running = _bool_arg("reset_running_requests", False)
            external = _bool_arg("reset_external", False)
        except ApiError as exc:
            return _error(exc)
        log.info("resetting the prefix cache")

        def respond(answers: list[_Answer], snap: dict[str, int]) -> dict[str, Any]:
            return {
                "success": all(bool(a.result) for a in answers),
                "engines": _per_engine(answers, "success"),
            }

        return await run("reset_prefix_cache", (running, external), respond)

    @bp.post("/sleep")
    async def sleep() -> Response:
        try:
            raw = request.args.get("level", "1")
            if raw not in ("0", "1", "2"):
                raise ApiError(400, f"level must be 0, 1 or 2, got {raw!r}", param="level")
            mode = _choice_arg("mode", "abort", _PAUSE_MODES)
            workers = _targets(manager)
        except ApiError as exc:
            return _error(exc)
        level = int(raw)
        try:
            await _hold(workers, "sleeping", "sleep", (level, mode), bound(), epochs)
        except ApiError as exc:
            return _error(exc)
        return _json({"status": "sleeping", "level": level})

    @bp.post("/wake_up")
    async def wake_up() -> Response:
        tags: list[str] | None = request.args.getlist("tags") or None
        try:
            workers = _targets(manager)
            snap = epochs.snapshot(workers)
            answers = _check(await call_engines(workers, "wake_up", (tags,), bound()))
        except ApiError as exc:
            return _error(exc)
        for worker in workers:
            if epochs.unchanged(worker, snap) and all(
                bool(a.result) for a in answers if a.worker is worker
            ):
                epochs.hold(worker, None)
        fully_awake = all(bool(a.result) for a in answers)
        return _json({"status": "awake" if fully_awake else "sleeping", "tags": tags})

    @bp.get("/is_sleeping")
    async def is_sleeping() -> Response:
        def respond(answers: list[_Answer], snap: dict[str, int]) -> dict[str, Any]:
            _sync_held(answers, "sleeping", epochs, snap)
            return {
                "is_sleeping": any(bool(a.result) for a in answers),
                "engines": _per_engine(answers, "is_sleeping"),
            }

        return await run("is_sleeping", (), respond, read=True)

    @bp.post("/pause")
    async def pause() -> Response:
        try:
            mode = _choice_arg("mode", "abort", _PAUSE_MODES)
            clear_cache = _bool_arg("clear_cache", True)
            workers = _targets(manager)
        except ApiError as exc:
            return _error(exc)
        try:
            await _hold(workers, "paused", "pause_scheduler", (mode, clear_cache), bound(), epochs)
        except ApiError as exc:
            return _error(exc)
        return _json({"status": "paused"})

    @bp.post("/resume")
    async def resume() -> Response:
        def respond(answers: list[_Answer], snap: dict[str, int]) -> dict[str, Any]:
            for worker in {a.worker for a in answers}:
                if worker.held == "paused" and epochs.unchanged(worker, snap):
                    epochs.hold(worker, None)
            return {"status": "resumed"}

        return await run("resume_scheduler", (), respond)

    @bp.get("/is_paused")
    async def is_paused() -> Response:
        def respond(answers: list[_Answer], snap: dict[str, int]) -> dict[str, Any]:
            _sync_held(answers, "paused", epochs, snap)
            return {
                "is_paused": any(bool(a.result) for a in answers),
                "engines": _per_engine(answers, "is_paused"),
            }

        return await run("is_scheduler_paused", (), respond, read=True)

    @bp.get("/server_info")
    async def server_info() -> Response:
        try:
            workers = _targets(manager)
        except ApiError as exc:
            return _error(exc)
        doc = []
        for w in workers:
            client = w.engine_client
            doc.append(
                {
                    **w.to_json(),
                    "engines": [
                        {"dp_rank": e.index, "registration": msgspec.to_builtins(e.ready)}
                        for e in (client.engines if client is not None else [])
                    ],
                }
            )
        return _json({"workers": doc})
