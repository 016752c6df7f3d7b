"""DeepSeek's real vocabulary end to end: ``serve --backend mock --model <DeepSeek fixture>
--tool-call-parser deepseek_v3 --enable-auto-tool-choice`` as a process, the openai SDK as the
client. The markers travel as DeepSeek's own token ids; an agent turn (call, tool result,
answer) renders through the fixture's template."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
import trio

from tests.helpers.frontends import serve_args
from tests.helpers.ports import free_port, random_worker_base_port
from tests.helpers.procs import read_until_ready
from tests.helpers.sse import sse_chunks
from tests.tools.cases.deepseek import TOOLS, B, E, v3_call

pytestmark = pytest.mark.slow

MODEL = "deepseek-vocab"
ANSWER = "It is 12°C in Paris (晴れ)."
ARGS = '{"city": "Paris"}'
CALL_TEXT = f"Checking.{B}{v3_call('get_weather', ARGS)}{E}"


def _script(path: Path) -> Path:
    rules = [
        # The second turn: the tool's result is in the prompt, between DeepSeek's markers.
        {"name": "answer", "contains": "<｜tool▁output▁begin｜>12°C", "text": ANSWER},
        {"name": "call", "contains": "Weather in Paris?", "text": CALL_TEXT},
    ]
    path.write_text(json.dumps({"rules": rules}, ensure_ascii=False))
    return path


async def test_an_agent_turn_with_deepseeks_vocabulary(
    deepseek_model_dir: Path, sock_dir: str, tmp_path: Path
) -> None:
    port = free_port()
    argv = [
        sys.executable, "-m", "smg_trio", "serve", "--backend", "mock", *serve_args(),
        "--model", str(deepseek_model_dir), "--served-model-name", MODEL,
        "--mock-script", str(_script(tmp_path / "script.json")),
        "--tool-call-parser", "deepseek_v3", "--enable-auto-tool-choice",
        "--port", str(port), "--worker-base-port", str(random_worker_base_port()),
    ]  # fmt: skip
    env = {**os.environ, "SMG_ZMQ_SOCKET_DIR": sock_dir, "PYTHONUNBUFFERED": "1"}
    stderr_path = tmp_path / "serve.stderr"
    with stderr_path.open("wb") as stderr:
        proc = await trio.lowlevel.open_process(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr, env=env
        )
    try:
        assert proc.stdout is not None
        with trio.fail_after(90):
            await read_until_ready(proc.stdout)
            client = openai.AsyncOpenAI(
                base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0
            )
            messages: list[dict[str, object]] = [{"role": "user", "content": "Weather in Paris?"}]
            res = await client.chat.completions.create(
                model=MODEL,
                messages=messages,
                tools=TOOLS,  # type: ignore[arg-type]
            )
            choice = res.choices[0]
            assert choice.finish_reason == "tool_calls"
            assert choice.message.content == "Checking."
            calls = choice.message.tool_calls or []
            assert [(c.function.name, c.function.arguments) for c in calls] == [
                ("get_weather", '{"city": "Paris"}')
            ]

            # Streamed (over httpx: the SDK's stream leaves async generators to the GC).
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
                body = {"model": MODEL, "messages": messages, "tools": TOOLS, "stream": True}
                resp = await http.post("/v1/chat/completions", json=body, timeout=30)
            assert resp.status_code == 200, resp.text
            content, args, names, finish = "", "", [], None
            for chunk in sse_chunks(resp.content):
                for part in chunk["choices"]:
                    content += part["delta"].get("content") or ""
                    for tc in part["delta"].get("tool_calls") or []:
                        if "name" in tc["function"]:
                            names.append(tc["function"]["name"])
                        args += tc["function"].get("arguments", "")
                    finish = part.get("finish_reason") or finish
            assert (content, names, args, finish) == (
                "Checking.",
                ["get_weather"],
                '{"city": "Paris"}',
                "tool_calls",
            )

            messages.append(choice.message.model_dump(exclude_none=True))
            messages.append({"role": "tool", "tool_call_id": calls[0].id, "content": "12°C"})
            final = await client.chat.completions.create(
                model=MODEL,
                messages=messages,
                tools=TOOLS,  # type: ignore[arg-type]
            )
            assert final.choices[0].message.content == ANSWER
            assert final.choices[0].message.tool_calls in (None, [])
            assert final.choices[0].finish_reason == "stop"
            await client.close()
        proc.send_signal(signal.SIGTERM)
        with trio.fail_after(30):
            code = await proc.wait()
        assert code == 0, stderr_path.read_text(errors="replace")[-4000:]
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
