"""Tracing against a REAL vLLM 0.32.0 engine (CPU, tiny random Llama): the gateway's
``trace_headers`` ride in ``EngineCoreRequest`` to the engine, which accepts them and hands
them back on its ``EngineCoreOutput``s (its scheduler does so for vLLM's frontend, whose
``llm_request`` span is made from them: smg_trio plays that frontend). The engine runs with
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` set, as vLLM's own frontend would start it with
``--otlp-traces-endpoint``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from peers.tools import vllm_engine_command, vllm_engine_env, vllm_missing_reason
from smg_trio.connector import EngineClient, open_engine_client
from smg_trio.protocol import GenerateRequest, SamplingOptions
from smg_trio.protocol.types import EngineBatch, Frames
from smg_trio.protocol.vllm import EngineCoreOutputs, VllmProtocol
from tests.helpers.e2e import (
    ENGINE_STARTUP_S,
    assert_alive,
    handshake_port,
    ipc_worker,
    process_group,
    require_e2e,
)
from tests.helpers.portal import TrioPortal

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class RecordingVllm(VllmProtocol):
    """The vLLM dialect, also keeping each output's raw ``trace_headers`` by request id."""

    def __init__(self) -> None:
        super().__init__()
        self.trace_headers: dict[str, list[Any]] = {}

    def decode_batch(self, frames: Frames) -> EngineBatch:
        try:
            raw = msgspec.msgpack.decode(bytes(frames[0]), type=EngineCoreOutputs)
            for out in raw.outputs:
                self.trace_headers.setdefault(out.request_id, []).append(out.trace_headers)
        except msgspec.DecodeError:
            pass  # the real decoder below reports it
        return super().decode_batch(frames)


@pytest.fixture(scope="module")
def engine(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrioPortal]:
    require_e2e(vllm_missing_reason())
    log_path = tmp_path_factory.mktemp("vllm-engine") / "vllm.log"
    env = vllm_engine_env()
    # vLLM's frontend hands its --otlp-traces-endpoint to the engine this way; nothing listens
    # there, and the engine must serve all the same
    env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = "http://127.0.0.1:9/v1/traces"
    env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
    protocol = RecordingVllm()
    with ipc_worker() as addresses:
        cmd = vllm_engine_command(tiny_model, handshake_port(addresses))
        with process_group(cmd, log_path=log_path, env=env) as proc:
            portal = TrioPortal(
                lambda: open_engine_client(protocol, addresses, ready_timeout_s=ENGINE_STARTUP_S)
            )
            try:
                portal.start(
                    ENGINE_STARTUP_S + 10,
                    check=lambda: assert_alive(proc, log_path, "vLLM engine"),
                )
                yield portal
            finally:
                portal.close()


def test_engine_carries_the_trace_context(engine: TrioPortal) -> None:
    client: EngineClient = engine.value
    protocol = client.protocol
    assert isinstance(protocol, RecordingVllm)
    headers = {"traceparent": TRACEPARENT, "tracestate": "smg=1"}

    async def body() -> int:
        req = GenerateRequest(
            request_id="e2e-trace-0",
            prompt_token_ids=[200, 201, 202, 203],
            sampling=SamplingOptions(max_tokens=4, temperature=0.0),
            trace_headers=headers,
        )
        with trio.fail_after(60):
            async with client.generate(req) as stream:
                outs = [o async for o in stream]
        assert outs[-1].finish_reason == "length"
        return sum(len(o.new_token_ids) for o in outs)

    assert engine.run(body) == 4
    echoed = protocol.trace_headers["e2e-trace-0"]
    assert echoed
    assert all(h == headers for h in echoed)
