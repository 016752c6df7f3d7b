"""The registration jobs table: running jobs stay, finished ones expire by count and age."""

from __future__ import annotations

import math

import pytest

from smg_trio.worker.jobs import JobTable, RegistrationJob
from smg_trio.worker.manager import WorkerSpec


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def job(n: int) -> RegistrationJob:
    return RegistrationJob(job_id=f"j{n}", spec=WorkerSpec(url=f"ipc:///tmp/w{n}"))


def finish(table: JobTable, j: RegistrationJob) -> None:
    j.finish("failed", "boom")
    table.finished(j)


def test_finished_jobs_beyond_the_count_expire_oldest_first() -> None:
    table = JobTable(max_finished=2, ttl_s=math.inf, clock=Clock())
    jobs = [job(i) for i in range(4)]
    for j in jobs:
        table.add(j)
    finish(table, jobs[2])
    finish(table, jobs[0])
    finish(table, jobs[3])  # the third finished: jobs[2], the oldest finished, expires
    assert "j2" not in table
    assert table.get("j2") is None
    assert set(table) == {"j0", "j1", "j3"}  # j1 still runs: never expired
    assert table["j1"] is jobs[1]


def test_finished_jobs_expire_after_the_ttl() -> None:
    clock = Clock()
    table = JobTable(max_finished=100, ttl_s=10.0, clock=clock)
    a, b = job(0), job(1)
    table.add(a)
    table.add(b)
    finish(table, a)
    clock.now = 9.0
    assert "j0" in table
    finish(table, b)
    clock.now = 10.5
    assert set(table) == {"j1"}
    clock.now = 19.5
    assert len(table) == 0
    assert not table


def test_zero_keeps_no_finished_job() -> None:
    table = JobTable(max_finished=0, clock=Clock())
    a = job(0)
    table.add(a)
    assert table["j0"] is a
    finish(table, a)
    assert "j0" not in table


def test_finished_job_keeps_its_step_states_but_no_handle() -> None:
    a = job(0)
    a.finish("cancelled", "worker removed during registration")
    assert a.done.is_set()
    assert a.run is None
    assert a.to_json()["steps"] == {}
    assert a.to_json()["error"] == "worker removed during registration"


@pytest.mark.parametrize("kwargs", [{"max_finished": -1}, {"ttl_s": -1.0}, {"ttl_s": math.nan}])
def test_bad_bounds_rejected(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be >= 0"):
        JobTable(**kwargs)  # type: ignore[arg-type]
