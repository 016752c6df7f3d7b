"""File discovery (issue 15 item 3): ``--discovery-file`` entries register, removed ones
drain, changed ones are replaced; a malformed file keeps the last good set; a bad entry
(unknown key, bad URL, duplicate) is refused by name while the others apply."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from smg_trio.mock.engine import MockEngine, MockEngineConfig
from smg_trio.mock.tiny_model import default_tiny_model_dir
from smg_trio.serve import GatewayConfig, ServeHandle, serve
from smg_trio.serve.discovery import DiscoveryFileError, DiscoveryWatcher, parse_discovery
from tests.helpers.frontends import with_api_server_count
from tests.helpers.ipc import IpcNamespace, free_handshake_address

DEADLINE_S = 60.0
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def test_parse_discovery_shapes() -> None:
    assert parse_discovery(b'[{"url": "ipc:///a"}]', toml=False) == [{"url": "ipc:///a"}]
    assert parse_discovery(b'{"workers": [{"url": "ipc:///a"}]}', toml=False) == [
        {"url": "ipc:///a"}
    ]
    toml = b'[[workers]]\nurl = "ipc:///a"\ndp_size = 2\n[[workers]]\nurl = "ipc:///b"\n'
    assert parse_discovery(toml, toml=True) == [
        {"url": "ipc:///a", "dp_size": 2},
        {"url": "ipc:///b"},
    ]
    assert parse_discovery(b"", toml=True) == []
    for bad, is_toml in [
        (b"{not json", False),
        (b'"x"', False),
        (b'{"workers": 1}', False),
        (b'{"servers": []}', False),
        (b"\xff", False),
        (b"[[workers]\n", True),
        (b"workers = 3", True),
    ]:
        with pytest.raises(DiscoveryFileError):
            parse_discovery(bad, toml=is_toml)


@asynccontextmanager
async def discovering_gateway(
    ns: IpcNamespace, path: Path
) -> AsyncIterator[tuple[ServeHandle, DiscoveryWatcher, trio.Nursery]]:
    config = GatewayConfig(
        port=0,
        model_path=str(default_tiny_model_dir()),  # the entries' default model_path
        allowed_socket_dirs=(ns.directory,),
        discovery_file=str(path),
    )
    async with trio.open_nursery() as nursery:
        handle: ServeHandle = await nursery.start(serve, with_api_server_count(config))
        assert handle.discovery is not None
        yield handle, handle.discovery, nursery
        nursery.cancel_scope.cancel()


def entry(ns: IpcNamespace, name: str, **kw: Any) -> dict[str, Any]:
    return {
        "url": ns.worker_url(name),
        "model_id": "m",
        "zmq_handshake_address": free_handshake_address(),
        **kw,
    }


def by_url(handle: ServeHandle) -> dict[str, Any]:
    return {w.url: w for w in handle.manager.workers}


async def serve_engine(handle: ServeHandle, nursery: trio.Nursery, e: dict[str, Any]) -> MockEngine:
    engine = MockEngine(e["zmq_handshake_address"], MockEngineConfig())
    nursery.start_soon(engine.run)
    worker = by_url(handle)[e["url"]]
    while not worker.healthy:
        await trio.lowlevel.checkpoint()
    return engine


async def test_entries_added_removed_changed_and_bad_ones_refused(
    ns: IpcNamespace, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    path = tmp_path / "workers.json"
    a, b = entry(ns, "a"), entry(ns, "b")
    path.write_text(json.dumps([a]))
    with trio.fail_after(DEADLINE_S):
        async with discovering_gateway(ns, path) as (handle, watcher, nursery):
            assert list(by_url(handle)) == [a["url"]]  # registering when serve started
            await serve_engine(handle, nursery, a)
            a_id = by_url(handle)[a["url"]].worker_id

            bad_key = entry(ns, "k", bogus=1)
            outside = entry(ns, "o", url="ipc:///var/tmp/elsewhere/w")
            duplicate = entry(ns, "d", url=a["url"], model_id="other")
            path.write_text(json.dumps([a, bad_key, b, outside, duplicate]))
            await watcher.poll_once()
            assert list(by_url(handle)) == [a["url"], b["url"]]
            assert by_url(handle)[a["url"]].worker_id == a_id  # untouched
            refused = [
                r.getMessage()
                for r in caplog.records
                if r.name == "smg_trio.serve.discovery" and "refused" in r.getMessage()
            ]
            assert len(refused) == 3, refused
            assert "bogus" in refused[0]
            assert bad_key["url"] in refused[0]
            assert "ipc:///var/tmp/elsewhere/w" in refused[1]  # not widened by the file
            assert "duplicate" in refused[2]
            assert a["url"] in refused[2]
            engine_b = await serve_engine(handle, nursery, b)

            caplog.clear()
            for broken in ("{not json", '{"workers": 7}'):
                path.write_text(broken)
                await watcher.poll_once()
                assert watcher.error is not None
                assert list(by_url(handle)) == [a["url"], b["url"]]  # the last good set
            logged = [r for r in caplog.records if r.name == "smg_trio.serve.discovery"]
            assert [r.levelno for r in logged] == [logging.ERROR] * 2
            assert "last good set of 2" in logged[0].getMessage()

            # A removed (drained), B changed (replaced); the gateway keeps serving model m
            # (a new engine dials the changed worker: a fresh handshake address, so that the
            # old engine, still dialling the old one, cannot take the new engine's identity)
            # The old engine is stopped first (hard: its sockets do not linger), as an
            # operator replacing it would. Alive, or lingering to deliver a queued message, it
            # would reconnect to the re-bound data-plane paths with the same engine identity
            # and take the new engine's place on the input ROUTER (seen under load at N=2:
            # the first request on a frontend went into the old engine's closed socket).
            b2 = {**b, "model_id": "m2", "zmq_handshake_address": free_handshake_address()}
            engine_b.die_silently()
            await engine_b.dead.wait()
            path.write_text(json.dumps([b2]))
            await watcher.poll_once()
            assert watcher.error is None
            workers = by_url(handle)
            assert list(workers) == [b["url"]]
            assert workers[b["url"]].model_id == "m2"
            await serve_engine(handle, nursery, b2)
            async with httpx.AsyncClient(base_url=handle.base_url, timeout=30) as http:
                resp = await http.post("/v1/chat/completions", json={**CHAT, "model": "m2"})
                assert resp.status_code == 200, resp.text

            path.write_text("[]")
            await watcher.poll_once()
            assert handle.manager.workers == []
            assert watcher.applied == {}
            if handle.frontends is not None:
                # a replaced worker (same URL, new id) is taken in by every frontend without
                # a crash: the new entry waits there for the old one to drain and detach
                assert [f.restarts for f in handle.frontends.frontends] == [0, 0]


async def test_the_file_is_watched_toml(ns: IpcNamespace, tmp_path: Path) -> None:
    """No manual poll: the watcher notices a file that appears and changes (TOML)."""
    path = tmp_path / "workers.toml"
    a = entry(ns, "a")
    with trio.fail_after(DEADLINE_S):
        async with discovering_gateway(ns, path) as (handle, watcher, nursery):
            assert watcher.error is not None  # no file yet: logged, empty set kept
            assert handle.manager.workers == []
            updated = watcher.updated
            toml = "".join(f"{k} = {json.dumps(v)}\n" for k, v in a.items())
            path.write_text(f"[[workers]]\n{toml}")
            await updated.wait()
            assert list(by_url(handle)) == [a["url"]]
            await serve_engine(handle, nursery, a)
            updated = watcher.updated
            path.write_text("workers = []\n")
            await updated.wait()
            assert handle.manager.workers == []


async def test_an_entry_that_fails_unexpectedly_is_refused_and_serve_goes_on(
    ns: IpcNamespace,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The whole kind of a fault found once (a hub revision that raised IsADirectoryError in
    the checks ended serve): whatever an entry's checks raise, that entry is refused with
    the error logged, and the others and serve go on."""
    path = tmp_path / "workers.json"
    path.write_text("[]")
    a, b = entry(ns, "a"), entry(ns, "b")
    with trio.fail_after(DEADLINE_S):
        async with discovering_gateway(ns, path) as (handle, watcher, _):
            check = handle.manager.check_spec

            async def flaky(spec: Any) -> Any:
                if spec.url == a["url"]:
                    raise OSError(21, "Is a directory")
                return await check(spec)

            monkeypatch.setattr(handle.manager, "check_spec", flaky)
            path.write_text(json.dumps([a, b]))
            await watcher.poll_once()
            assert list(by_url(handle)) == [b["url"]]
            refused = [
                r.getMessage()
                for r in caplog.records
                if r.name == "smg_trio.serve.discovery" and "refused" in r.getMessage()
            ]
            assert refused == [
                f"discovery file {path}: refused entry 0 ({a['url']}): internal error: IsADirectoryError"
            ]
