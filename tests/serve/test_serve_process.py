"""``python -m smg_trio serve --backend mock`` as a subprocess: ready line, chat through the
official ``openai`` client, SIGTERM, clean exit, and no child process left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from tests.helpers.frontends import serve_args
from tests.helpers.ports import free_port, random_worker_base_port
from tests.helpers.procs import (
    descendants,
    engine_pids,
    kill_leftovers,
    read_until_ready,
    wait_all_gone,
)

pytest.importorskip("smg_trio.gateway.http.app", reason="the HTTP app has not landed yet")
openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow


async def _open_serve(sock_dir: str, stderr_path: Path, *args: str) -> trio.Process:
    """``python -m smg_trio serve --backend mock ARGS`` with its stdout piped (the ready line)
    and its stderr in ``stderr_path``."""
    env = {**os.environ, "SMG_ZMQ_SOCKET_DIR": sock_dir, "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "smg_trio", "serve", "--backend", "mock", *args]
    with stderr_path.open("wb") as stderr:
        return await trio.lowlevel.open_process(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr, env=env
        )


def _chat(base_url: str) -> tuple[str, str]:
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
    try:
        models = [m.id for m in client.models.list()]
        assert models == ["mock-tiny"]
        reply = client.chat.completions.create(
            model="mock-tiny",
            messages=[{"role": "user", "content": "Hello"}],
            max_tokens=8,
        )
        assert reply.choices[0].finish_reason in ("stop", "length")
        pieces = []
        for chunk in client.chat.completions.create(
            model="mock-tiny",
            messages=[{"role": "user", "content": "Hello"}],
            max_tokens=8,
            stream=True,
        ):
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
        return reply.choices[0].message.content or "", "".join(pieces)
    finally:
        client.close()


async def test_serve_mock_subprocess_sigterm_no_orphans(sock_dir: str, tmp_path: Path) -> None:
    port = free_port()
    stderr_path = tmp_path / "serve.stderr"
    proc = await _open_serve(
        sock_dir, stderr_path, *serve_args(), "--port", str(port),
        "--worker-base-port", str(random_worker_base_port()),
        "--dp-size", "2", "--shutdown-grace-period-secs", "5",
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        with trio.fail_after(60):
            line = await read_until_ready(proc.stdout)
        base_url = line.split()[3]
        assert base_url == f"http://127.0.0.1:{port}"

        children = descendants(proc.pid)
        assert len(children) >= 2, f"expected two mock engines below {proc.pid}: {children}"

        with trio.fail_after(30):
            text, streamed = await trio.to_thread.run_sync(_chat, base_url)
        assert isinstance(text, str)
        assert isinstance(streamed, str)

        proc.send_signal(signal.SIGTERM)
        with trio.fail_after(30):
            code = await proc.wait()
        log = stderr_path.read_text(errors="replace")
        assert code == 0, log[-4000:]
        assert await wait_all_gone(children) == set(), "engine processes survived serve"
        assert descendants(proc.pid) == set()
        assert "SYNTHETIC" in log
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        for pid in descendants(proc.pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("count", [1, 2])
async def test_log_format_json_writes_only_json_lines(
    sock_dir: str, tmp_path: Path, count: int
) -> None:
    """Every stderr line of serve (its engines' forwarded lines and, at N=2, its frontends'
    own lines) is one JSON object: hypercorn's "Running on" was printed raw besides (a probe's
    default hypercorn Config gave its logger a handler of its own), and the frontends wrote
    text."""
    stderr_path = tmp_path / "serve.stderr"
    proc = await _open_serve(
        sock_dir, stderr_path, "--log-format", "json", "--api-server-count", str(count),
        "--port", str(free_port()), "--worker-base-port", str(random_worker_base_port()),
    )  # fmt: skip
    children: set[int] = set()
    try:
        assert proc.stdout is not None
        with trio.fail_after(60):
            await read_until_ready(proc.stdout)
        children = descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)
        with trio.fail_after(30):
            assert await proc.wait() == 0
    finally:
        await kill_leftovers(proc, children)
    lines = stderr_path.read_text(errors="replace").splitlines()
    docs = [json.loads(line) for line in lines if line.strip()]  # each one JSON, or it raises
    running = [(d["msg"], d.get("frontend")) for d in docs if "Running on" in d["msg"]]
    assert running  # the listeners' lines are there, as JSON
    assert len(set(running)) == len(running)  # each once
    if count > 1:
        assert {d.get("frontend") for d in docs} >= {1, 2}


async def test_serve_engine_startup_failure_exits_nonzero(sock_dir: str, tmp_path: Path) -> None:
    """An engine that exits during startup fails serve at once, with its exit code."""
    argv = [
        sys.executable, "-m", "smg_trio", "serve", "--backend", "mock", *serve_args(),
        "--port", str(free_port()), "--worker-base-port", str(random_worker_base_port()),
        "--", "--no-such-mock-flag",
    ]  # fmt: skip
    env = {**os.environ, "SMG_ZMQ_SOCKET_DIR": sock_dir}
    with trio.fail_after(60):
        result = await trio.run_process(argv, env=env, capture_stdout=True, capture_stderr=True,
                                        check=False)  # fmt: skip
    err = result.stderr.decode(errors="replace")
    assert result.returncode == 1, err[-4000:]
    assert "exited with code 2" in err


async def test_serve_sigkill_leaves_no_engine_behind(sock_dir: str, tmp_path: Path) -> None:
    """``serve`` killed with SIGKILL runs no cleanup of its own, yet each engine's guard sees
    its lifeline pipe close and stops the engine's process group."""
    port = free_port()
    proc = await _open_serve(
        sock_dir, tmp_path / "serve.stderr", *serve_args(), "--port", str(port),
        "--worker-base-port", str(random_worker_base_port()), "--dp-size", "2",
    )  # fmt: skip
    children: set[int] = set()
    try:
        assert proc.stdout is not None
        with trio.fail_after(60):
            await read_until_ready(proc.stdout)
        children = descendants(proc.pid)
        assert len(engine_pids(proc.pid)) >= 2, children
        proc.kill()
        with trio.fail_after(10):
            await proc.wait()
        # the guards' stop grace is 10 s; the mock engine exits on SIGTERM at once
        assert await wait_all_gone(children, timeout_s=15) == set(), "engines outlived serve"
    finally:
        await kill_leftovers(proc, children)
