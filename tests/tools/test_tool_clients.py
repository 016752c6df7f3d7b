"""Real clients against the real gateway and the scripted mock (``--tool-call-parser hermes
--enable-auto-tool-choice``): the openai SDK (``chat.completions.create`` with a tool from
``openai.pydantic_function_tool``, whole and through the streaming iterator), and one complete
agent loop with ``openai-agents`` through ``OpenAIChatCompletionsModel``: the model calls the
tool, the agent runs it and sends the result back, the final answer arrives."""

from __future__ import annotations

import asyncio  # noqa: TID251 (openai-agents is asyncio-only: it runs in its own thread)
import json
from pathlib import Path
from typing import Any

import openai
import pydantic
import pytest
import trio

from smg_trio.mock.tiny_model import default_tiny_model_dir
from tests.tools.test_tool_calls_e2e import MODEL, tool_gateway

CALL = '<tool_call>\n{"name": "GetWeather", "arguments": {"city": "Zürich"}}\n</tool_call>'
AGENT_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
FINAL = "It is sunny in Paris, 21 °C."


class GetWeather(pydantic.BaseModel):
    """Get the weather of a city."""

    city: str


def _script(path: Path) -> Path:
    rules = [
        {"name": "answer", "contains": "<tool_response>", "text": FINAL, "tokens_per_step": 3},
        {"name": "agent", "contains": "Weather in Paris?", "text": AGENT_CALL},
        {"name": "sdk", "contains": "[sdk]", "text": "Let me check. " + CALL, "tokens_per_step": 2},
    ]
    path.write_text(json.dumps({"rules": rules}))
    return path


# The openai client stops reading its SSE generators at [DONE] without closing them; trio's
# async-generator finalizer then warns when they are collected. That is the client's issue.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.slow
async def test_openai_sdk_tool_calls_whole_and_streamed(tmp_path: Path, sock_dir: str) -> None:
    script = _script(tmp_path / "script.json")
    model_dir = str(default_tiny_model_dir())
    with trio.fail_after(90):
        async with tool_gateway("hermes", None, model_dir, script, sock_dir) as base_url:
            client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0)
            try:
                kw: Any = {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "[sdk] weather?"}],
                    "tools": [openai.pydantic_function_tool(GetWeather)],
                }
                res = await client.chat.completions.create(**kw)
                choice = res.choices[0]
                assert choice.finish_reason == "tool_calls"
                assert choice.message.content == "Let me check. "
                calls = choice.message.tool_calls or []
                assert len(calls) == 1
                call = calls[0]
                assert call.type == "function"
                assert call.id.startswith("call_")
                assert call.function.name == "GetWeather"  # type: ignore[union-attr]
                assert GetWeather.model_validate_json(call.function.arguments).city == "Zürich"  # type: ignore[union-attr]

                stream = await client.chat.completions.create(stream=True, **kw)
                content, names, args, ids, finish = "", [], "", [], None
                async for chunk in stream:
                    for c in chunk.choices:
                        content += c.delta.content or ""
                        for tc in c.delta.tool_calls or []:
                            assert tc.index == 0
                            if tc.id is not None:
                                ids.append(tc.id)
                            if tc.function and tc.function.name:
                                names.append(tc.function.name)
                            args += (tc.function.arguments or "") if tc.function else ""
                        finish = c.finish_reason or finish
                assert content == "Let me check. "
                assert names == ["GetWeather"]
                assert len(ids) == 1
                assert ids[0].startswith("call_")
                assert args == call.function.arguments  # type: ignore[union-attr]
                assert finish == "tool_calls"
            finally:
                await client.close()


def _run_agent(base_url: str) -> tuple[str, list[str]]:
    """One openai-agents run (asyncio, so in its own thread): the final output and the
    cities the tool was called with."""
    from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner, function_tool

    seen: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the weather of a city."""
        seen.append(city)
        return f"sunny in {city}"

    async def main() -> str:
        client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0)
        try:
            agent = Agent(
                name="weather",
                instructions="Answer with the weather.",
                tools=[get_weather],
                model=OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
            )
            result = await Runner.run(
                agent, "Weather in Paris?", run_config=RunConfig(tracing_disabled=True)
            )
            return str(result.final_output)
        finally:
            await client.close()

    return asyncio.run(main()), seen


@pytest.mark.slow
async def test_openai_agents_loop_calls_the_tool_and_answers(tmp_path: Path, sock_dir: str) -> None:
    pytest.importorskip("agents", reason="openai-agents is in the test extra")
    script = _script(tmp_path / "script.json")
    model_dir = str(default_tiny_model_dir())
    with trio.fail_after(120):
        async with tool_gateway("hermes", None, model_dir, script, sock_dir) as base_url:
            final, seen = await trio.to_thread.run_sync(_run_agent, base_url)
    assert seen == ["Paris"]
    assert final == FINAL
