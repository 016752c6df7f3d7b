"""The worker registry: indexes, collision rejection, routable filtering and selection."""

from __future__ import annotations

from collections import Counter

import pytest

from smg_trio.errors import SmgError
from smg_trio.protocol.types import EngineLoad
from smg_trio.worker.circuit import CircuitBreaker
from smg_trio.worker.policies import make_policy
from smg_trio.worker.registry import (
    Worker,
    WorkerConflictError,
    WorkerNotFoundError,
    WorkerRegistry,
)


def _ready(url: str, model: str = "m", **kwargs: object) -> Worker:
    return Worker(url=url, model_id=model, status="ready", **kwargs)  # type: ignore[arg-type]


async def test_register_and_look_up() -> None:
    reg = WorkerRegistry()
    a = reg.register(_ready("ipc:///tmp/a", "llama", handshake_address="tcp://127.0.0.1:5001"))
    b = reg.add(Worker(url="ipc:///tmp/b", model_id="qwen", runtime="tokenspeed", dp_size=2))
    assert len(a.worker_id) == 36
    assert reg.get(a.worker_id) is a
    assert reg.get("nope") is None
    assert reg.get_by_url("ipc:///tmp/b") is b
    assert reg.list() == (a, b)
    assert reg.list(model="qwen") == (b,)
    assert reg.models() == ("llama", "qwen")
    assert reg.workers_for("llama") == (a,)
    assert reg.workers_for("qwen") == ()  # pending
    assert a.worker_id in reg
    assert list(reg) == [a, b]


async def test_duplicate_url_rejected() -> None:
    reg = WorkerRegistry()
    first = reg.register(_ready("ipc:///tmp/a"))
    with pytest.raises(WorkerConflictError, match=r"ipc:///tmp/a is already registered") as info:
        reg.register(_ready("ipc:///tmp/a"))
    assert info.value.existing_id == first.worker_id
    assert isinstance(info.value, SmgError)


async def test_handshake_collision_names_both_urls() -> None:
    reg = WorkerRegistry()
    reg.register(_ready("ipc:///tmp/a", handshake_address="tcp://127.0.0.1:6000"))
    with pytest.raises(WorkerConflictError) as info:
        reg.register(_ready("ipc:///tmp/b", handshake_address="tcp://127.0.0.1:6000"))
    message = str(info.value)
    assert "ipc:///tmp/a" in message
    assert "ipc:///tmp/b" in message
    assert "tcp://127.0.0.1:6000" in message
    assert info.value.url == "ipc:///tmp/b"
    assert info.value.existing_url == "ipc:///tmp/a"
    assert len(reg) == 1


async def test_duplicate_id_rejected() -> None:
    reg = WorkerRegistry()
    reg.register(_ready("ipc:///tmp/a", worker_id="w1"))
    with pytest.raises(
        WorkerConflictError, match=r"w1 of ipc:///tmp/b is already used by ipc:///tmp/a"
    ):
        reg.register(_ready("ipc:///tmp/b", worker_id="w1"))


async def test_remove_frees_url_and_handshake_address() -> None:
    reg = WorkerRegistry()
    a = reg.register(_ready("ipc:///tmp/a", handshake_address="tcp://127.0.0.1:6000"))
    assert reg.remove(a.worker_id) is a
    assert a.status == "removed"
    assert reg.list() == ()
    reg.register(_ready("ipc:///tmp/a", handshake_address="tcp://127.0.0.1:6000"))
    with pytest.raises(WorkerNotFoundError):
        reg.remove(a.worker_id)


async def test_only_routable_workers_are_candidates() -> None:
    reg = WorkerRegistry()
    ready = reg.register(_ready("ipc:///tmp/ready"))
    for status in ("pending", "unhealthy", "draining"):
        reg.register(Worker(url=f"ipc:///tmp/{status}", model_id="m", status=status))
    tripped = reg.register(
        _ready("ipc:///tmp/tripped", circuit=CircuitBreaker(failure_threshold=1))
    )
    tripped.circuit.record_failure()
    assert reg.workers_for("m") == (ready,)
    assert reg.workers_for("other") == ()


@pytest.mark.parametrize("name", ["round_robin", "random", "least_load", "power_of_two"])
async def test_select_spreads_over_routable_workers(name: str) -> None:
    reg = WorkerRegistry()
    a = reg.register(_ready("ipc:///tmp/a"))
    b = reg.register(_ready("ipc:///tmp/b"))
    tripped = reg.register(_ready("ipc:///tmp/c", circuit=CircuitBreaker(failure_threshold=1)))
    tripped.circuit.record_failure()
    reg.register(Worker(url="ipc:///tmp/d", model_id="m", status="unhealthy"))
    policy = make_policy(name, seed=99)
    picks: Counter[str] = Counter()
    for _ in range(40):
        chosen = reg.select("m", policy)
        assert chosen is not None
        picks[chosen.url] += 1
        chosen.inflight += 1  # in flight until the end of the test
    assert set(picks) == {a.url, b.url}
    assert min(picks.values()) >= 10


async def test_select_with_no_routable_worker_is_none() -> None:
    reg = WorkerRegistry()
    reg.register(Worker(url="ipc:///tmp/a", model_id="m"))
    assert reg.select("m", make_policy("round_robin")) is None
    assert reg.select("unknown", make_policy("least_load")) is None


async def test_least_load_uses_engine_loads_and_tracked_inflight() -> None:
    reg = WorkerRegistry()
    busy = reg.register(_ready("ipc:///tmp/busy", dp_size=2))
    idle = reg.register(_ready("ipc:///tmp/idle"))
    busy.loads = (EngineLoad(num_running=3, num_waiting=1), EngineLoad(num_running=2))
    assert busy.load_score() == 6.0
    policy = make_policy("least_load")
    assert reg.select("m", policy) is idle
    with idle.track(), idle.track():
        assert idle.inflight == 2
        assert reg.select("m", policy) is idle
        idle.loads = (EngineLoad(num_running=9),)
        assert reg.select("m", policy) is busy
    assert idle.inflight == 0


def test_worker_validation() -> None:
    with pytest.raises(ValueError, match="runtime"):
        Worker(url="ipc:///tmp/a", model_id="m", runtime="sglang")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dp_size"):
        Worker(url="ipc:///tmp/a", model_id="m", dp_size=0)
    with pytest.raises(ValueError, match="status"):
        Worker(url="ipc:///tmp/a", model_id="m", status="gone")  # type: ignore[arg-type]
