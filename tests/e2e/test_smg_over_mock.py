"""The REAL Rust gateway (smg 1.13.0) serves chat through OUR mock engine.

This proves the mock speaks the wire a real frontend expects (issue 3: "must satisfy the real
Rust gateway"): smg binds ``<path>-in.sock``/``<path>-out.sock`` and the FNV-derived handshake
port, our in-process :class:`MockEngine` dials that port, and an HTTP chat completion
(non-streaming and streaming) comes back with the tokens the mock generated.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from peers.tools import smg_launch_command, smg_missing_reason
from smg_trio.mock.engine import MockEngine, MockEngineConfig
from smg_trio.tokenizer import Tokenizer
from tests.helpers.e2e import (
    HTTP_READY_S,
    assert_alive,
    chat,
    http_client,
    ipc_worker,
    log_tail,
    process_group,
    require_e2e,
    stream_chat,
)
from tests.helpers.ports import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MAX_TOKENS = 8


@pytest.mark.parametrize("backend", ["vllm", "tokenspeed"])
async def test_smg_serves_chat_through_mock(backend: str, tiny_model: Path, tmp_path: Path) -> None:
    require_e2e(smg_missing_reason())
    tokenizer = Tokenizer.from_dir(tiny_model)
    log_path = tmp_path / f"smg-{backend}.log"
    port = free_port()
    with ipc_worker() as addresses:
        cmd = smg_launch_command(
            addresses.url,
            tiny_model,
            backend=backend,
            port=port,
            prometheus_port=free_port(),
        )
        with process_group(cmd, log_path=log_path) as proc:
            # merged BPE tokens (not raw bytes), so every token decodes to visible text
            config = MockEngineConfig(protocol=backend, step_s=0.002, token_range=(300, 1000))
            engine = MockEngine(addresses.handshake, config)
            async with trio.open_nursery() as nursery:
                with trio.move_on_after(HTTP_READY_S) as handshake:
                    await nursery.start(engine.run)
                if handshake.cancelled_caught:
                    assert_alive(proc, log_path, "smg")
                    raise AssertionError(
                        f"mock never completed smg's handshake on {addresses.handshake} within "
                        f"{HTTP_READY_S}s:\n{log_tail(log_path)}"
                    )
                base = f"http://127.0.0.1:{port}"
                async with http_client(base) as client:
                    model = await _wait_model(client, proc, log_path)

                    # ---- non-streaming
                    with trio.fail_after(30):
                        resp = await chat(client, model, max_tokens=MAX_TOKENS, temperature=0)
                    assert resp.status_code == 200, f"{resp.status_code} {resp.text}"
                    body = resp.json()
                    generated = engine.requests[-1].generated
                    assert len(generated) == MAX_TOKENS
                    choice = body["choices"][0]
                    assert choice["message"]["content"], body
                    assert choice["message"]["content"] == tokenizer.decode(generated)
                    assert choice["finish_reason"] == "length"
                    assert body["usage"]["completion_tokens"] == len(generated)

                    # ---- streaming
                    with trio.fail_after(30):
                        chunks = await stream_chat(
                            client,
                            model,
                            max_tokens=MAX_TOKENS,
                            temperature=0,
                            stream_options={"include_usage": True},
                        )
                    generated = engine.requests[-1].generated
                    assert len(generated) == MAX_TOKENS
                    text = "".join(
                        c["choices"][0]["delta"].get("content") or ""
                        for c in chunks
                        if c.get("choices")
                    )
                    assert text == tokenizer.decode(generated)
                    finishes = [
                        c["choices"][0]["finish_reason"]
                        for c in chunks
                        if c.get("choices") and c["choices"][0].get("finish_reason")
                    ]
                    assert finishes == ["length"], chunks
                    usage = [c["usage"] for c in chunks if c.get("usage")]
                    assert usage, f"no usage chunk: {chunks[-2:]}"
                    assert usage[-1]["completion_tokens"] == MAX_TOKENS
                assert_alive(proc, log_path, "smg")
                nursery.cancel_scope.cancel()
        assert "panicked" not in log_tail(log_path, 100_000)


async def _wait_model(client, proc, log_path: Path) -> str:  # type: ignore[no-untyped-def]
    """Wait until smg lists a model (its worker is registered); return the model id."""
    last = None
    with trio.move_on_after(HTTP_READY_S):
        while True:
            assert_alive(proc, log_path, "smg")
            try:
                r = await client.get("/v1/models")
                if r.status_code == 200 and r.json().get("data"):
                    return str(r.json()["data"][0]["id"])
                last = f"{r.status_code} {r.text[:200]}"
            except Exception as exc:
                last = repr(exc)
            await trio.sleep(0.5)
    raise AssertionError(f"smg never listed a model ({last}):\n{log_tail(log_path)}")
