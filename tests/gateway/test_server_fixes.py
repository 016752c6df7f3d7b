"""Each hypercorn/h11 fix checks, before smg_trio's server starts, that what it relies on is
there, and fails loudly (naming the fix, the release it was written against and the missing
name) when an upgrade has removed it, instead of quietly serving without the fix."""

from __future__ import annotations

import logging

import pytest
import trio
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.tcp_server import TCPServer

from smg_trio.gateway.http.app import hyper_config, serve_http
from smg_trio.gateway.server import direct, hypercorn_close, hypercorn_errors, serve
from smg_trio.gateway.server.fixes import Fix, FixTargetMissing


def test_every_fix_passes_against_the_installed_releases() -> None:
    assert {hypercorn_close.FIX, hypercorn_errors.FIX, direct.FIX} <= set(serve.FIXES)
    for fix in serve.FIXES:
        fix.check()


@pytest.mark.parametrize(
    ("fix", "owner", "name"),
    [
        (hypercorn_errors.FIX, H11Protocol, "_send_error_response"),
        (hypercorn_close.FIX, TCPServer, "_close"),
        (direct.FIX, TCPServer, "protocol_send"),
    ],
)
def test_a_fix_whose_target_is_gone_names_it(
    monkeypatch: pytest.MonkeyPatch, fix: Fix, owner: type, name: str
) -> None:
    monkeypatch.delattr(owner, name)
    with pytest.raises(FixTargetMissing) as info:
        fix.check()
    message = str(info.value)
    assert fix.name in message
    assert "hypercorn 0.18.x" in message  # the release it was written against
    assert f"{owner.__name__}.{name}" in message


def test_a_missing_instance_attribute_is_found_by_the_probe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_init = TCPServer.__init__

    def init(self: TCPServer, *args: object) -> None:
        real_init(self, *args)  # type: ignore[arg-type]
        del self.send_lock

    monkeypatch.setattr(TCPServer, "__init__", init)
    with pytest.raises(FixTargetMissing, match=r"TCPServer\(\)\.send_lock"):
        hypercorn_close.FIX.check()


async def test_the_server_refuses_to_start_without_a_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(H11Protocol, "_send_error_response")
    serve.check_fixes.cache_clear()  # an earlier server's passing check is cached
    started = False

    async def app(scope: object, receive: object, send: object) -> None:
        nonlocal started
        started = True

    with trio.fail_after(10), pytest.raises(FixTargetMissing, match="_send_error_response"):
        await serve_http(app, "127.0.0.1", 0)  # type: ignore[arg-type]
    assert not started
    monkeypatch.undo()
    serve.check_fixes.cache_clear()
    serve.check_fixes()


def test_another_release_with_every_target_only_warns(caplog: pytest.LogCaptureFixture) -> None:
    fix = Fix(name="probe", verified={"hypercorn": "0.1"}, targets=("hypercorn.config:Config",))
    with caplog.at_level(logging.WARNING):
        fix.check()
    assert "verified against hypercorn 0.1.x" in caplog.text


def test_the_serve_loop_refuses_http3() -> None:
    cfg = hyper_config("127.0.0.1", 0, 1.0)
    cfg.quic_bind = ["127.0.0.1:0"]

    async def main() -> None:
        await serve.serve(lambda *a: None, cfg)

    with pytest.raises(ValueError, match="HTTP/3"):
        trio.run(main)
