"""A frontend forwards the admin routes to the supervisor as they came: a path segment that
is ``.`` or ``..`` (a worker or job id, percent-encoded by the client or not) reaches the
supervisor as the same id, never as a dot segment that the HTTP client would resolve to
another path (``GET /workers/%2e%2e`` became ``GET /`` there: an HTML 404, no envelope;
``GET /workers/jobs/%2e%2e`` became the worker list), and an encoded ``?`` stays in the id."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio
from quart_trio import QuartTrio

from smg_trio.serve.control import admin_proxy_blueprint


class _Recorder:
    """Stands in for the control client: records what would go to the supervisor."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    async def forward(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> httpx.Response:
        self.sent.append((method, path))
        return httpx.Response(404, json={"error": {"message": "no worker"}})


@pytest.mark.parametrize(
    ("method", "path", "worker_path"),
    [
        ("GET", "/workers/%2e%2e", "/workers/.."),
        ("DELETE", "/workers/%2E%2E", "/workers/.."),
        ("GET", "/workers/%2e", "/workers/."),
        ("GET", "/workers/jobs/%2e%2e", "/workers/jobs/.."),
        ("GET", "/workers/a%3Fknown=1", "/workers/a?known=1"),  # not a query there
    ],
)
async def test_dot_segment_ids_reach_the_supervisor_as_ids(
    method: str, path: str, worker_path: str
) -> None:
    control: Any = _Recorder()
    app = QuartTrio(__name__)
    app.register_blueprint(admin_proxy_blueprint(control))
    with trio.fail_after(10):
        resp = await app.test_client().open(path, method=method)
    assert resp.status_code == 404
    [(sent_method, sent_path)] = control.sent
    assert sent_method == method
    # What the supervisor's router sees once httpx has built the request line.
    url = httpx.Request(sent_method, "http://supervisor" + sent_path).url
    assert url.path == worker_path


class _Client:
    def __init__(self) -> None:
        self.alive = True
        self.killed: list[str] = []

    def kill(self, reason: str) -> None:
        self.alive = False
        self.killed.append(reason)


class _Worker:
    def __init__(self) -> None:
        self.worker_id, self.url, self.generation = "w1", "ipc:///tmp/x/w", 3
        self.engine_client = _Client()


class _Manager:
    def __init__(self, worker: _Worker) -> None:
        self.worker = worker

    def get_worker(self, worker_id: str) -> _Worker | None:
        return self.worker if worker_id == self.worker.worker_id else None


async def test_a_frontends_unresponsive_report_latches_client_0_dead_for_its_generation() -> None:
    """The supervisor's client 0 is idle and never times an engine's silence: a frontend's
    report for the current generation latches it dead (so the engine is relaunched), a report
    for an older generation or an unknown worker changes nothing, a bad body is a 400."""
    from quart import Blueprint

    from smg_trio.serve.control import control_app

    worker = _Worker()
    manager: Any = _Manager(worker)
    app = control_app(manager, Blueprint("admin", __name__), lambda _: 0)
    client = app.test_client()
    with trio.fail_after(10):
        stale = {"id": "w1", "generation": 2, "reason": "frontend 1: old"}
        assert (await client.post("/_smg/unresponsive", json=stale)).status_code == 204
        unknown = {"id": "nope", "generation": 3, "reason": "x"}
        assert (await client.post("/_smg/unresponsive", json=unknown)).status_code == 204
        bad = await client.post("/_smg/unresponsive", data=b"{not json")
        assert bad.status_code == 400
        assert worker.engine_client.killed == []
        now = {"id": "w1", "generation": 3, "reason": "frontend 2: no engine output for 2 s"}
        assert (await client.post("/_smg/unresponsive", json=now)).status_code == 204
        assert worker.engine_client.killed == ["frontend 2: no engine output for 2 s"]
        assert (await client.post("/_smg/unresponsive", json=now)).status_code == 204
        assert len(worker.engine_client.killed) == 1  # latched once
