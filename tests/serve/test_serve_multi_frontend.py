"""``serve --backend mock --api-server-count 2`` as a subprocess: both frontends serve, any
frontend answers the same, admin changes reach every frontend, ``/metrics`` is one merged
target, load balancing sees every frontend's requests, a killed frontend is restarted and
its engine requests ABORTed, SIGTERM drains, SIGKILL leaves no process behind."""

from __future__ import annotations

import glob
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import httpx
import pytest
import trio

from tests.helpers.frontends import (
    find_run_dir,
    frontend_client,
    hold_chat_stream,
    single_frontend,
    start_chat_stream,
)
from tests.helpers.ports import free_port, random_worker_base_port
from tests.helpers.procs import descendants, read_until_ready, spawned, wait_all_gone

pytestmark = [
    pytest.mark.slow,
    single_frontend("it starts --api-server-count 2 itself: the first pass runs it"),
]

CHAT = {"model": "mock-tiny", "messages": [{"role": "user", "content": "Hello"}]}


@attrs.define
class Served:
    proc: trio.Process
    base_url: str
    log_path: Path
    run_dir: str

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def frontend(self, index: int) -> httpx.AsyncClient:
        """A client of one frontend only (its unix socket serves the same app)."""
        return frontend_client(self.run_dir, index)

    def frontend_pids(self) -> dict[int, int]:
        out = {}
        for pid in descendants(self.proc.pid):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"smg_trio.serve.frontend" in argv:
                out[int(argv[argv.index(b"smg_trio.serve.frontend") + 2])] = pid
        return out


@asynccontextmanager
async def serve_two(sock_dir: str, tmp_path: Path, *extra: str) -> AsyncIterator[Served]:
    port = free_port()
    log_path = tmp_path / "serve.stderr"
    env = {**os.environ, "SMG_ZMQ_SOCKET_DIR": sock_dir, "PYTHONUNBUFFERED": "1"}
    argv = [
        sys.executable, "-m", "smg_trio", "serve", "--backend", "mock",
        "--port", str(port), "--worker-base-port", str(random_worker_base_port()),
        "--dp-size", "2", "--api-server-count", "2", "--allow-insecure-admin",
        "--shutdown-grace-period-secs", "20", "--engine-log-level", "debug", *extra,
        "--", "--log-level", "DEBUG", "--step-ms", "10",
    ]  # fmt: skip
    async with spawned(argv, stderr_path=log_path, env=env) as proc:
        assert proc.stdout is not None
        with trio.fail_after(120):
            line = await read_until_ready(proc.stdout)
        yield Served(proc, line.split()[3], log_path, find_run_dir(sock_dir))


async def _local_requests(served: Served, index: int) -> float:
    async with served.frontend(index) as client:
        text = (await client.get("/_smg/metrics")).text
    return sum(
        float(m.group(1))
        for m in re.finditer(
            r'^smg_router_requests_total\{endpoint="chat",status="200"\} (\S+)', text, re.M
        )
    )


async def _wait_log(served: Served, pattern: str) -> re.Match[str]:
    while True:
        found = re.search(pattern, served.log(), re.M)
        if found is not None:
            return found
        await trio.sleep(0.05)


async def test_two_frontends_share_routes_metrics_admin_and_load(
    sock_dir: str, tmp_path: Path
) -> None:
    async with serve_two(sock_dir, tmp_path, "--policy", "least_load") as served:
        url = served.base_url
        # fresh connections, so the kernel hands them to either frontend
        for i in range(30):
            async with httpx.AsyncClient(timeout=30) as c:
                body = {**CHAT, "max_tokens": 4, "n": 2 if i % 3 == 0 else 1}
                resp = await c.post(f"{url}/v1/chat/completions", json=body)
                assert resp.status_code == 200, resp.text
                assert len(resp.json()["choices"]) == body["n"]
        per_frontend = [await _local_requests(served, i) for i in (1, 2)]
        assert sum(per_frontend) == 30
        assert all(n > 0 for n in per_frontend), per_frontend  # both frontends served
        async with httpx.AsyncClient(timeout=30) as c:
            merged = (await c.get(f"{url}/metrics")).text
            # one frontend's own exposition is on its private unix socket only
            assert (await c.get(f"{url}/_smg/metrics")).status_code == 404
        assert 'smg_router_requests_total{endpoint="chat",status="200"} 30.0' in merged

        # every frontend answers the same
        answers = []
        for index in (1, 2):
            async with served.frontend(index) as c:
                models = (await c.get("/v1/models")).json()
                workers = (await c.get("/workers")).json()
                ready = (await c.get("/readiness")).json()
            answers.append(
                (
                    [m["id"] for m in models["data"]],
                    sorted(w["id"] for w in workers["workers"]),
                    ready["total_workers"],
                    ready["status"],
                )
            )
        assert answers[0] == answers[1]
        assert answers[0][0] == ["mock-tiny"]
        assert answers[0][2] == 2

        # one Responses store: stored on frontend 1, read, chained and deleted on frontend 2
        turn = {"model": "mock-tiny", "input": "Hello", "max_output_tokens": 4}
        async with served.frontend(1) as one, served.frontend(2) as two:
            first = (await one.post("/v1/responses", json=turn)).json()
            assert first["status"] in ("completed", "incomplete"), first
            got = await two.get(f"/v1/responses/{first['id']}")
            assert got.status_code == 200, got.text
            assert got.json()["output"] == first["output"]
            chained = await two.post(
                "/v1/responses", json={**turn, "previous_response_id": first["id"]}
            )
            assert chained.status_code == 200, chained.text
            # the stored conversation came along: the second prompt is the longer one
            assert chained.json()["usage"]["input_tokens"] > first["usage"]["input_tokens"]
            assert (await two.delete(f"/v1/responses/{first['id']}")).status_code == 200
            assert (await one.get(f"/v1/responses/{first['id']}")).status_code == 404

        # rank balance with load that both frontends see: 8 long streams at once
        log_before = len(served.log())
        body = {**CHAT, "max_tokens": 300, "stream": True, "ignore_eos": True}
        streams = []
        with trio.fail_after(60):
            for _ in range(8):  # one at a time: each choice sees the ones before it
                streams.append((await _raw_stream(url, body))[0])
            added: list[str] = []
            while len(added) < 8:
                await trio.sleep(0.05)
                added = re.findall(r"\[(engine-\d+)\] .*mock: add ", served.log()[log_before:])
        for stream in streams:
            await stream.aclose()
        counts = {name: added.count(name) for name in set(added)}
        assert sum(counts.values()) == 8, counts
        assert len(counts) == 2, counts
        assert min(counts.values()) >= 2, counts  # spread over both engines

        # admin on any frontend reaches every frontend
        async with served.frontend(1) as c:
            worker = (await c.get("/workers")).json()["workers"][1]
            assert (await c.delete(f"/workers/{worker['id']}")).status_code == 200
        for index in (1, 2):
            async with served.frontend(index) as c:
                with trio.fail_after(10):
                    while (await c.get("/readiness")).json()["total_workers"] != 1:  # noqa: ASYNC110 (polling another process)
                        await trio.sleep(0.05)
        # a worker added on frontend 2 (its engine is not up: the job keeps running) shows
        # in every frontend, and its job reads the same from each
        extra = f"ipc://{sock_dir}/engine-extra"
        async with served.frontend(2) as c:
            resp = await c.post("/workers", json={"url": extra, "model_id": "mock-tiny"})
            assert resp.status_code == 202, resp.text
            status_url = resp.json()["status_url"]
        jobs = []
        for index in (1, 2):
            async with served.frontend(index) as c:
                job = (await c.get(status_url)).json()
                jobs.append((job["job_id"], job["worker_id"]))
                assert job["status"] in ("pending", "running"), job
                with trio.fail_after(10):
                    while (await c.get("/readiness")).json()["total_workers"] != 2:  # noqa: ASYNC110 (polling another process)
                        await trio.sleep(0.05)
        assert jobs[0] == jobs[1]


async def _connect(url: str) -> trio.SocketStream:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return await trio.open_tcp_stream(host, int(port))


async def _raw_stream(url: str, body: dict[str, object]) -> tuple[trio.SocketStream, str]:
    """A streaming chat on a raw TCP connection: the connection and the response id."""
    stream = await _connect(url)
    return stream, await start_chat_stream(stream, body)


async def _first_chunk_then(
    url: str, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
) -> None:
    body = {**CHAT, "max_tokens": 2000, "stream": True, "ignore_eos": True}
    await hold_chat_stream(await _connect(url), body, task_status=task_status)


async def test_disconnect_and_frontend_kill_abort_at_the_engine(
    sock_dir: str, tmp_path: Path
) -> None:
    async with serve_two(sock_dir, tmp_path) as served:
        # a client that goes away: its engine request is ABORTed
        async with trio.open_nursery() as nursery:
            rid = await nursery.start(_first_chunk_then, served.base_url)
            nursery.cancel_scope.cancel()
        with trio.fail_after(30):
            await _wait_log(served, rf"mock: abort {re.escape(rid)}")

        # a frontend killed mid-stream: restarted, and its request ABORTed at the engine
        pids = served.frontend_pids()
        assert sorted(pids) == [1, 2]
        async with trio.open_nursery() as nursery:
            rid = await nursery.start(_first_chunk_then, served.base_url)
            busy = None
            for index in (1, 2):
                async with served.frontend(index) as c:
                    text = (await c.get("/_smg/metrics")).text
                if re.search(r"^smg_router_requests_in_flight 1\.0", text, re.M):
                    busy = index
            assert busy is not None
            os.kill(pids[busy], signal.SIGKILL)
            with trio.fail_after(60):
                await _wait_log(served, rf"frontend {busy} exited")
                await _wait_log(served, rf"mock: abort {re.escape(rid)}")
                while served.frontend_pids().get(busy) in (None, pids[busy]):  # noqa: ASYNC110 (polling another process)
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
        with trio.fail_after(60):
            await _wait_log(served, rf"frontend {busy} ready.*\n(.*\n)*.*frontend {busy} ready")
        async with httpx.AsyncClient(timeout=30) as c:
            for _ in range(6):
                resp = await c.post(
                    f"{served.base_url}/v1/chat/completions", json={**CHAT, "max_tokens": 4}
                )
                assert resp.status_code == 200


async def test_sigterm_drains_every_frontend(sock_dir: str, tmp_path: Path) -> None:
    async with serve_two(sock_dir, tmp_path) as served:
        children = descendants(served.proc.pid)
        assert len(served.frontend_pids()) == 2
        results: list[str] = []

        async def finish(client: httpx.AsyncClient) -> None:
            body = {**CHAT, "max_tokens": 200, "stream": True, "ignore_eos": True}
            async with client.stream(
                "POST", f"{served.base_url}/v1/chat/completions", json=body
            ) as resp:
                lines = [line async for line in resp.aiter_lines() if line]
            results.append(lines[-1])

        clients = [httpx.AsyncClient(timeout=60) for _ in range(4)]
        async with trio.open_nursery() as nursery:
            for client in clients:
                nursery.start_soon(finish, client)
            with trio.fail_after(30):
                while served.log().count("mock: add ") < 4:  # noqa: ASYNC110 (polling another process)
                    await trio.sleep(0.05)
            served.proc.send_signal(signal.SIGTERM)
        for client in clients:
            await client.aclose()
        assert results == ["data: [DONE]"] * 4  # every stream finished during the drain
        with trio.fail_after(60):
            code = await served.proc.wait()
        assert code == 0, served.log()[-4000:]
        assert "draining" in served.log()
        assert await wait_all_gone(children, timeout_s=15) == set()
        assert glob.glob(os.path.join(sock_dir, "*")) == []  # sockets and run dir removed


async def test_sigkill_of_serve_leaves_no_process(sock_dir: str, tmp_path: Path) -> None:
    async with serve_two(sock_dir, tmp_path) as served:
        children = descendants(served.proc.pid)
        assert len(served.frontend_pids()) == 2
        served.proc.kill()
        with trio.fail_after(10):
            await served.proc.wait()
        assert await wait_all_gone(children, timeout_s=20) == set(), "outlived serve"
