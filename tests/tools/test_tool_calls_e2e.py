"""Every case of every format module in tests/tools/cases/ through the real gateway, over real
ZMQ, with the scriptable mock engine: 1, 2 and 7 tokens per engine step, streamed and not.
The answer must equal the case, and the stream must equal the whole response byte for byte
(content, each call's name and arguments, finish_reason); call ids are ``call_...``, unique,
and sent once, in a call's first delta (Kimi K2's are the model's own ``functions.NAME:N``)."""

from __future__ import annotations

import importlib
import json
import pkgutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

import tests.tools.cases as cases_pkg
from smg_trio.mock.tiny_model import default_tiny_model_dir
from smg_trio.serve import EngineLaunchConfig, GatewayConfig, open_gateway
from tests.helpers.frontends import with_api_server_count
from tests.helpers.ports import random_worker_base_port
from tests.helpers.sse import sse_chunks
from tests.tools.toolcase import ToolCase

MODEL = "mock-tool"
STEPS = (1, 2, 7)


def all_cases() -> list[ToolCase]:
    """The ``CASES`` of every module in tests/tools/cases/ (new modules are picked up)."""
    out: list[ToolCase] = []
    for info in sorted(pkgutil.iter_modules(cases_pkg.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{cases_pkg.__name__}.{info.name}")
        out.extend(getattr(module, "CASES", []))
    ids = [c.id for c in out]
    assert len(ids) == len(set(ids)), "case ids must be unique"
    return out


def special_model_dir(case: ToolCase) -> Path | None:
    """The model directory whose vocabulary has the case's special-token markers: the
    tiny model for plain-text markers; for special tokens, the fixture module
    ``tests.tools.vocab`` (``model_dir_for(case)``) when this checkout has one."""
    if not case.special_tokens:
        return default_tiny_model_dir()
    try:
        vocab = importlib.import_module("tests.tools.vocab")
    except ImportError:
        return None
    found: Path | None = vocab.model_dir_for(case)
    return found


def _groups() -> dict[tuple[str, str | None, str], list[ToolCase]]:
    groups: dict[tuple[str, str | None, str], list[ToolCase]] = {}
    for case in all_cases():
        model_dir = special_model_dir(case)
        key = (case.parser, case.reasoning, str(model_dir) if model_dir else "")
        groups.setdefault(key, []).append(case)
    return groups


GROUPS = _groups()


def _tag(case: ToolCase, tps: int) -> str:
    return f"[case:{case.id}:{tps}]"


def _script(cases: list[ToolCase], path: Path) -> Path:
    rules = []
    for case in cases:
        for tps in STEPS:
            rule: dict[str, Any] = {
                "name": f"{case.id}/{tps}",
                "contains": _tag(case, tps),
                "text": case.text,
                "tokens_per_step": tps,
            }
            if case.finish_reason == "length":
                rule["finish_reason"] = "length"
            rules.append(rule)
    path.write_text(json.dumps({"rules": rules}))
    return path


@asynccontextmanager
async def tool_gateway(
    parser: str, reasoning: str | None, model_dir: str, script: Path, sock_dir: str
) -> AsyncIterator[str]:
    """``serve --backend mock --mock-script`` with ``--tool-call-parser parser
    --enable-auto-tool-choice`` (and ``--reasoning-parser``); yields the base URL."""
    config = GatewayConfig(
        port=0,
        served_model_name=MODEL,
        tool_call_parser=parser,
        enable_auto_tool_choice=True,
        reasoning_parser=reasoning,
        engines=EngineLaunchConfig(
            backend="mock",
            model=model_dir,
            worker_base_port=random_worker_base_port(),
            socket_dir=sock_dir,
            engine_args=("--step-ms", "0"),
            mock_script=str(script),
        ),
        allowed_model_dirs=(model_dir,),
    )
    async with open_gateway(with_api_server_count(config)) as handle:
        yield handle.base_url


def _body(case: ToolCase, tps: int, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": _tag(case, tps)}],
        "tools": case.tools,
        "tool_choice": case.tool_choice,
        "max_tokens": 512,
        "stream": stream,
    }
    if not case.parallel_tool_calls:
        body["parallel_tool_calls"] = False
    return body


Result = tuple[str | None, str | None, list[tuple[str, str]], list[str], str | None]


def whole(data: dict[str, Any]) -> Result:
    """``(content, reasoning, calls, ids, finish_reason)`` of a ``chat.completion``."""
    choice = data["choices"][0]
    msg = choice["message"]
    calls = msg.get("tool_calls") or []
    for call in calls:
        assert call["type"] == "function", call
    return (
        msg["content"],
        msg.get("reasoning"),
        [(c["function"]["name"], c["function"]["arguments"]) for c in calls],
        [c["id"] for c in calls],
        choice["finish_reason"],
    )


def streamed(chunks: list[dict[str, Any]]) -> Result:
    """The same, from the chunks: each call's ``id``/``type``/``name`` only in its first
    delta, then ``arguments`` fragments; content ``None`` when empty and calls were made."""
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, list[str]] = {}
    ids: dict[int, str] = {}
    finish = None
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            content.append(delta.get("content") or "")
            reasoning.append(delta.get("reasoning") or "")
            for tc in delta.get("tool_calls") or []:
                i = tc["index"]
                fn = tc["function"]
                if i not in calls:
                    assert tc["type"] == "function", tc
                    assert "name" in fn, tc
                    assert "id" in tc, tc
                    assert i == len(calls), f"call index {i} out of order"
                    calls[i] = [fn["name"], fn.get("arguments", "")]
                    ids[i] = tc["id"]
                else:
                    assert "id" not in tc, tc
                    assert "type" not in tc, tc
                    assert "name" not in fn, tc
                    calls[i][1] += fn.get("arguments", "")
            if choice.get("finish_reason") is not None:
                assert finish is None, "two finish reasons"
                finish = choice["finish_reason"]
    text = "".join(content)
    return (
        text if text or not calls else None,
        "".join(reasoning) or None,
        [(calls[i][0], calls[i][1]) for i in sorted(calls)],
        [ids[i] for i in sorted(ids)],
        finish,
    )


def _id_ok(case: ToolCase, call_id: str) -> bool:
    if case.parser == "kimi_k2":  # Kimi writes its own ids (functions.NAME:N): passed through
        return call_id.startswith("functions.") and call_id.rpartition(":")[2].isdigit()
    return call_id.startswith("call_") and len(call_id) > 5


def _check(case: ToolCase, got: Result, how: str) -> list[str]:
    content, reasoning, calls, ids, finish = got
    problems = []
    want = (case.content, case.calls, case.finish_reason)
    if (content, calls, finish) != want:
        problems.append(f"{how}: got {(content, calls, finish)!r}, want {want!r}")
    if case.reasoning is not None and reasoning != case.reasoning_content:
        problems.append(f"{how}: reasoning {reasoning!r}, want {case.reasoning_content!r}")
    if len(set(ids)) != len(ids) or not all(_id_ok(case, i) for i in ids):
        problems.append(f"{how}: bad call ids {ids!r}")
    return problems


async def run_case(client: httpx.AsyncClient, case: ToolCase, tps: int) -> list[str]:
    """Both modes for one case at ``tps`` tokens per step; the problems found."""
    resp = await client.post("/v1/chat/completions", json=_body(case, tps, False))
    if resp.status_code != 200:
        return [f"{case.id}/{tps}: HTTP {resp.status_code} {resp.text}"]
    full = whole(resp.json())
    resp = await client.post("/v1/chat/completions", json=_body(case, tps, True))
    if resp.status_code != 200:
        return [f"{case.id}/{tps} stream: HTTP {resp.status_code} {resp.text}"]
    parts = streamed(sse_chunks(resp.content))
    problems = _check(case, full, f"{case.id}/{tps}") + _check(case, parts, f"{case.id}/{tps} SSE")
    if full[:3] + full[4:] != parts[:3] + parts[4:]:
        problems.append(f"{case.id}/{tps}: streamed {parts!r} != whole {full!r}")
    return problems


@pytest.mark.slow
@pytest.mark.parametrize(
    "group", list(GROUPS), ids=[f"{p}-{r or 'noreasoning'}" for p, r, _ in GROUPS]
)
async def test_every_case_streamed_equals_whole(
    group: tuple[str, str | None, str], tmp_path: Path, sock_dir: str
) -> None:
    parser, reasoning, model_dir = group
    cases = GROUPS[group]
    if not model_dir:
        pytest.skip(
            f"{[c.id for c in cases]} need a vocabulary with the format's special tokens "
            "(tests/tools/vocab.py, the DeepSeek fixture) and this checkout has none"
        )
    script = _script(cases, tmp_path / "script.json")
    problems: list[str] = []
    with trio.fail_after(180):
        async with (
            tool_gateway(parser, reasoning, model_dir, script, sock_dir) as base_url,
            httpx.AsyncClient(base_url=base_url, timeout=60) as client,
        ):
            for case in cases:
                for tps in STEPS:
                    problems += await run_case(client, case, tps)
    assert not problems, "\n".join(problems)


def test_the_harness_finds_every_case_module() -> None:
    """Each module in tests/tools/cases/ contributes its cases, and each case's parser is a
    registered --tool-call-parser name."""
    from smg_trio.parsers.tools import tool_parser_names

    names = {c.parser for c in all_cases()}
    modules = {i.name for i in pkgutil.iter_modules(cases_pkg.__path__)}
    assert "hermes" in modules
    assert "hermes" in names
    assert names <= set(tool_parser_names()), names - set(tool_parser_names())
