"""SIGTERM drains: requests still running when the grace period ends get a 503 ``draining``
(an SSE error event then ``[DONE]`` for streams), the process exits 0, and a second signal
skips the rest of the drain instead of killing the process."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from smg_trio.serve.launcher import ENGINE_STOP_GRACE_S
from tests.helpers.frontends import serve_args as frontend_args
from tests.helpers.ports import free_port, random_worker_base_port
from tests.helpers.procs import descendants, kill_leftovers, wait_all_gone
from tests.helpers.sse import sse_payloads

httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.slow

#: Long enough for requests to be mid-generation at SIGTERM, short enough to expire.
GRACE_S = 1.0


async def _start(
    sock_dir: str, tmp_path: Path, grace_s: float, *serve_args: str
) -> tuple[trio.Process, str]:
    port = free_port()
    env = {**os.environ, "SMG_ZMQ_SOCKET_DIR": sock_dir, "PYTHONUNBUFFERED": "1"}
    argv = [
        sys.executable, "-m", "smg_trio", "serve", "--backend", "mock", *frontend_args(),
        "--port", str(port), "--worker-base-port", str(random_worker_base_port()),
        "--shutdown-grace-period-secs", str(grace_s), *serve_args, "--", "--step-ms", "20",
    ]  # fmt: skip
    with (tmp_path / "serve.stderr").open("wb") as stderr:
        proc = await trio.lowlevel.open_process(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr, env=env
        )
    assert proc.stdout is not None
    buf = b""
    with trio.fail_after(60):
        async for chunk in proc.stdout:
            buf += chunk
            if b"smg_trio ready on " in buf:
                return proc, f"http://127.0.0.1:{port}"
    raise AssertionError(f"serve exited before it was ready: {buf!r}")


def _body(stream: bool) -> dict[str, object]:
    return {
        "model": "mock-tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1000,  # 20 s at 20 ms per step: still running when the grace ends
        "ignore_eos": True,
        "stream": stream,
    }


async def test_grace_period_expiry_ends_requests_with_draining_errors(
    sock_dir: str, tmp_path: Path
) -> None:
    proc, base = await _start(sock_dir, tmp_path, GRACE_S)
    children = descendants(proc.pid)
    try:
        events: list[str] = []
        statuses: list[int] = []
        bodies: list[dict[str, object]] = []
        started = trio.Event()

        async def stream(client: httpx.AsyncClient) -> None:
            async with client.stream("POST", "/v1/chat/completions", json=_body(True)) as resp:
                assert resp.status_code == 200
                async for data in sse_payloads(resp):
                    events.append(data)
                    if '"content"' in data:
                        started.set()

        async def plain(client: httpx.AsyncClient) -> None:
            resp = await client.post("/v1/chat/completions", json=_body(False))
            statuses.append(resp.status_code)
            bodies.append(resp.json())

        with trio.fail_after(30):
            async with (
                httpx.AsyncClient(base_url=base, timeout=30) as client,
                trio.open_nursery() as nursery,
            ):
                nursery.start_soon(stream, client)
                nursery.start_soon(plain, client)
                await started.wait()
                proc.send_signal(signal.SIGTERM)
            code = await proc.wait()
        log = (tmp_path / "serve.stderr").read_text(errors="replace")
        assert code == 0, log[-3000:]
        assert events[-1] == "[DONE]", events[-3:]
        error = json.loads(events[-2])["error"]
        assert error["code"] == "draining", error
        assert statuses == [503], bodies
        assert bodies[0]["error"]["code"] == "draining"  # type: ignore[index]
        # the stream for sure (it was mid-generation); the plain request too unless SIGTERM
        # beat it to the gateway, where it was refused with the same 503 draining
        assert re.search(r"ended [12] request\(s\) in flight", log), log[-3000:]
        assert await wait_all_gone(children) == set()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_second_signal_skips_the_drain_and_exits_zero(sock_dir: str, tmp_path: Path) -> None:
    proc, base = await _start(sock_dir, tmp_path, grace_s=600.0)
    children = descendants(proc.pid)
    try:
        started = trio.Event()
        ended = trio.Event()

        async def stream(client: httpx.AsyncClient) -> None:
            try:
                async with client.stream("POST", "/v1/chat/completions", json=_body(True)) as resp:
                    async for line in resp.aiter_lines():
                        if '"content"' in line:
                            started.set()
            except httpx.HTTPError:
                pass  # the forced stop may cut it: that is what a second signal asks for
            ended.set()

        with trio.fail_after(30):
            async with (
                httpx.AsyncClient(base_url=base, timeout=30) as client,
                trio.open_nursery() as nursery,
            ):
                nursery.start_soon(stream, client)
                await started.wait()
                proc.send_signal(signal.SIGTERM)
                # the first signal is handled once readiness turns 503 (two signals sent
                # back to back could be merged into one by the kernel)
                # (with several frontends a draining one may close the idle keep-alive
                # connection instead: the drain has begun either way)
                while True:
                    try:
                        if (await client.get("/readiness")).status_code == 503:
                            break
                    except httpx.TransportError:
                        break
                proc.send_signal(signal.SIGTERM)
                code = await proc.wait()  # well before the 600 s grace
                await ended.wait()
        log = (tmp_path / "serve.stderr").read_text(errors="replace")
        assert code == 0, log[-3000:]
        assert "stopping now" in log
        assert await wait_all_gone(children) == set()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


#: An engine interpreter that ignores SIGTERM for good (it runs ``python -m MODULE ...``).
_DEAF_ENGINE = """\
import runpy, signal, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
_real = signal.signal
signal.signal = lambda s, h: signal.SIG_IGN if s == signal.SIGTERM else _real(s, h)
sys.argv = sys.argv[2:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


async def test_second_signal_while_engines_stop_kills_them_at_once(
    sock_dir: str, tmp_path: Path
) -> None:
    """The drain is over and serve is stopping an engine that ignores SIGTERM (up to
    ENGINE_STOP_GRACE_S before SIGKILL): a second signal is still heard, the engine is
    SIGKILLed at once, and serve exits 0."""
    script = tmp_path / "deaf_engine.py"
    script.write_text(_DEAF_ENGINE)
    wrapper = tmp_path / "deaf-python"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{script}" "$@"\n')
    wrapper.chmod(0o755)
    proc, base = await _start(sock_dir, tmp_path, 5.0, "--engine-python", str(wrapper))
    children = descendants(proc.pid)
    try:
        with trio.fail_after(30):
            proc.send_signal(signal.SIGTERM)  # nothing in flight: the drain ends at once
            async with httpx.AsyncClient(base_url=base, timeout=5) as client:
                while True:  # the listener closes when serve starts stopping its engines
                    try:
                        await client.get("/liveness")
                    except httpx.TransportError:
                        break
            stopping_at = trio.current_time()
            proc.send_signal(signal.SIGTERM)
            code = await proc.wait()
        log = (tmp_path / "serve.stderr").read_text(errors="replace")
        assert code == 0, log[-3000:]
        assert "stopping now" in log, log[-3000:]
        assert trio.current_time() - stopping_at < ENGINE_STOP_GRACE_S
        assert await wait_all_gone(children) == set()
    finally:
        await kill_leftovers(proc, children)


async def test_client_that_stops_reading_does_not_hold_shutdown(
    sock_dir: str, tmp_path: Path
) -> None:
    """A streaming client that never reads fills the socket buffers, leaving a write blocked;
    shutdown must still finish (grace, then DRAIN_FLUSH_S, then the blocked write's socket is
    closed) instead of waiting for that client to go away."""
    proc, base = await _start(sock_dir, tmp_path, GRACE_S)
    children = descendants(proc.pid)
    url = httpx.URL(base)
    assert url.host is not None
    assert url.port is not None
    sock = trio.socket.socket()
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        await sock.connect((url.host, url.port))
        payload = json.dumps({**_body(True), "max_tokens": 4000, "n": 4}).encode()
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n"
        ).encode()
        await sock.send(head + payload)
        # never read: wait until the gateway is mid-generation for it, then stop the gateway
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            while "smg_router_requests_in_flight 1.0" not in (await client.get("/metrics")).text:
                pass
        proc.send_signal(signal.SIGTERM)
        with trio.fail_after(GRACE_S + 30):
            code = await proc.wait()
        assert code == 0, (tmp_path / "serve.stderr").read_text(errors="replace")[-3000:]
        assert await wait_all_gone(children) == set()
    finally:
        sock.close()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_sigterm_during_mixed_abuse_exits_in_time(sock_dir: str, tmp_path: Path) -> None:
    """Issue 18 finding 9 (two SIGTERMs once ignored after mixed attacks): with a stream whose
    client never reads, a slowloris, a huge upload in progress and a WebSocket attempt all
    open, one SIGTERM still ends the process (grace, flush and write bounds), exit 0, with no
    traceback logged."""
    proc, base = await _start(sock_dir, tmp_path, GRACE_S)
    children = descendants(proc.pid)
    url = httpx.URL(base)
    assert url.host is not None
    assert url.port is not None
    socks: list[trio.socket.SocketType] = []

    async def connect(rcvbuf: int | None = None) -> trio.socket.SocketType:
        sock = trio.socket.socket()
        socks.append(sock)
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        await sock.connect((url.host, url.port))
        return sock

    try:
        payload = json.dumps({**_body(True), "max_tokens": 4000, "n": 4}).encode()
        deaf = await connect(rcvbuf=4096)
        await deaf.send(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        slowloris = await connect()
        await slowloris.send(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: a")
        upload = await connect()
        await upload.send(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 30000000\r\n\r\n" + b'{"prompt": "' + b"a" * 1_000_000
        )
        ws = await connect()
        await ws.send(
            b"GET /v1/models HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        # both the stream and the upload are in flight (the upload waits for its body)
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            while "smg_router_requests_in_flight 2.0" not in (await client.get("/metrics")).text:
                pass
        proc.send_signal(signal.SIGTERM)
        with trio.fail_after(GRACE_S + 30):
            code = await proc.wait()
        stderr = (tmp_path / "serve.stderr").read_text(errors="replace")
        assert code == 0, stderr[-3000:]
        assert "Traceback" not in stderr, stderr[-3000:]
        assert await wait_all_gone(children) == set()
    finally:
        for sock in socks:
            sock.close()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_second_signal_exits_even_when_a_connection_holds_the_server(
    sock_dir: str, tmp_path: Path
) -> None:
    """With --enable-http2, an HTTP/2 client that never opens its flow-control window holds
    the server's stop (the breaker's report: hypercorn cannot close it). The second signal
    still ends the process (after FORCED_EXIT_AFTER_S), leaving no engine behind."""
    h2_connection = pytest.importorskip("h2.connection")
    h2_config = pytest.importorskip("h2.config")
    h2_settings = pytest.importorskip("h2.settings")
    from smg_trio.cli import FORCED_EXIT_AFTER_S

    proc, base = await _start(sock_dir, tmp_path, 1.0, "--enable-http2")
    children = descendants(proc.pid)
    try:
        host, port = base.removeprefix("http://").rsplit(":", 1)
        conn = h2_connection.H2Connection(h2_config.H2Configuration(client_side=True))
        conn.initiate_connection()
        conn.update_settings({h2_settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
        body = json.dumps(_body(True)).encode()
        headers = [
            (":method", "POST"), (":path", "/v1/chat/completions"), (":scheme", "http"),
            (":authority", "x"), ("content-type", "application/json"),
            ("content-length", str(len(body))),
        ]  # fmt: skip
        conn.send_headers(1, headers)
        conn.send_data(1, body, end_stream=True)
        with trio.fail_after(FORCED_EXIT_AFTER_S + 30):
            async with httpx.AsyncClient(base_url=base, timeout=30) as client:
                async with await trio.open_tcp_stream(host, int(port)) as stream:
                    await stream.send_all(conn.data_to_send())
                    # in flight, its output stuck behind the closed window (the client acks
                    # what the server sends, opening nothing); then the client goes away
                    # without a word (the socket closes, the server's stream stays)
                    while (
                        "smg_router_requests_in_flight 1.0"
                        not in (await client.get("/metrics")).text
                    ):
                        conn.receive_data(await stream.receive_some(65536))
                        await stream.send_all(conn.data_to_send())
                    for _ in range(3):  # a few more exchanges: the server has output queued
                        with trio.move_on_after(0.3):
                            conn.receive_data(await stream.receive_some(65536))
                            await stream.send_all(conn.data_to_send())
                proc.send_signal(signal.SIGTERM)
                with contextlib.suppress(httpx.HTTPError):  # it may stop before answering
                    while (await client.get("/readiness")).status_code != 503:
                        pass
            proc.send_signal(signal.SIGTERM)
            code = await proc.wait()
        log = (tmp_path / "serve.stderr").read_text(errors="replace")
        assert code in (0, 1), log[-3000:]
        assert "stopping now" in log
        assert await wait_all_gone(children) == set()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
