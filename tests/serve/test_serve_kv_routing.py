"""``launch --api-server-count 2`` as a subprocess with two engines that publish KV events:
each frontend subscribes to the engines itself, so a conversation whose turns alternate
between the frontends stays on the engine that holds its prefix."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import pytest
import trio

from smg_trio.mock.tiny_model import default_tiny_model_dir
from tests.helpers.frontends import find_run_dir, frontend_client, single_frontend
from tests.helpers.ipc import free_handshake_address
from tests.helpers.kv_publisher import BLOCK, PublishedEngine, PublishingMock, kv_publisher
from tests.helpers.ports import free_port
from tests.helpers.procs import read_until_ready, spawned

pytestmark = [
    pytest.mark.slow,
    single_frontend("it starts --api-server-count 2 itself: the first pass runs it"),
]


async def batches_seen(run_dir: str, index: int) -> float:
    async with frontend_client(run_dir, index) as c:
        text = (await c.get("/_smg/metrics")).text
    return sum(
        float(m.group(1))
        for m in re.finditer(r"^smg_kv_event_batches_total\{[^}]*\} (\S+)", text, re.M)
    )


async def test_two_frontends_route_a_conversation_to_the_engine_holding_it(
    sock_dir: str, tmp_path: Path
) -> None:
    port = free_port()
    names = ("a", "b")
    entries = [
        {"url": f"ipc://{sock_dir}/engine-{n}", "zmq_handshake_address": free_handshake_address()}
        for n in names
    ]
    discovery = tmp_path / "workers.json"
    discovery.write_text(json.dumps(entries))
    env = {**os.environ, "SMG_ZMQ_SOCKET_DIR": sock_dir, "PYTHONUNBUFFERED": "1"}
    argv = [
        sys.executable, "-m", "smg_trio", "launch", "--api-server-count", "2",
        "--port", str(port), "--model-path", str(default_tiny_model_dir()),
        "--served-model-name", "m", "--discovery-provider", "file",
        "--discovery-file", str(discovery),
    ]  # fmt: skip
    async with spawned(argv, stderr_path=tmp_path / "launch.stderr", env=env) as proc:
        async with AsyncExitStack() as stack, trio.open_nursery() as nursery:
            engines = []
            for n, entry in zip(names, entries, strict=True):
                endpoint = f"ipc://{sock_dir}/kv-{n}"
                pub = await stack.enter_async_context(kv_publisher(endpoint))
                mock = PublishingMock(entry["zmq_handshake_address"], endpoint)
                nursery.start_soon(mock.run)
                engines.append(PublishedEngine(mock, pub))
            with trio.fail_after(90):
                assert proc.stdout is not None
                await read_until_ready(proc.stdout, "launch")
                run_dir = find_run_dir(sock_dir)
                url = f"http://127.0.0.1:{port}"
                async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                    while (await http.get("/readiness")).status_code != 200:  # noqa: ASYNC110
                        await trio.sleep(0.05)  # polling another process
                for e in engines:  # each frontend subscribed to each engine
                    assert e.pub is not None
                    for _ in (1, 2):
                        await e.pub.wait_subscribed()
                system = [7] * (2 * BLOCK)
                published = 0
                homes: dict[int, int] = {}
                for s in range(4):
                    history: list[int] = []
                    for t in range(4):
                        history += [100 + s] * BLOCK + [300 + t] * 40
                        prompt = system + history
                        before = [len(e.mock.requests) for e in engines]
                        async with frontend_client(run_dir, 1 + (s + t) % 2) as c:
                            r = await c.post(
                                "/v1/completions",
                                json={"model": "m", "prompt": prompt, "max_tokens": 2},
                            )
                        assert r.status_code == 200, r.text
                        served = [
                            i for i, e in enumerate(engines) if len(e.mock.requests) > before[i]
                        ]
                        assert len(served) == 1
                        homes.setdefault(s, served[0])
                        assert served[0] == homes[s], f"session {s} turn {t} moved"
                        await engines[served[0]].store(prompt)
                        published += 1
                        for i in (1, 2):  # both frontends applied it
                            while await batches_seen(run_dir, i) < published:  # noqa: ASYNC110
                                await trio.sleep(0.02)  # polling another process
                assert sorted(list(homes.values()).count(i) for i in range(2)) == [2, 2]
            nursery.cancel_scope.cancel()
        proc.send_signal(signal.SIGTERM)
        with trio.fail_after(30):
            await proc.wait()
