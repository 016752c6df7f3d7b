"""Reasoning end to end: the scripted mock (docs/mock.md) behind the real gateway over real
ZMQ, each --reasoning-parser, streamed and not, 1/2/7 tokens per engine step, markers split
across tokens, multi-byte characters split across tokens, and the thinking switches."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from smg_trio.mock.script import load_script
from smg_trio.tokenizer import Tokenizer
from tests.helpers.gateway import DEADLINE_S, HarnessFactory


@attrs.frozen(kw_only=True)
class Case:
    """``text`` (or ``pieces``: encoded one by one, so a marker spans several tokens) under
    ``parser``; the answer's ``reasoning`` (``None``: no ``reasoning_content`` at all)."""

    id: str
    parser: str
    reasoning: str | None
    content: str
    text: str = ""
    pieces: tuple[str, ...] = ()
    kwargs: dict[str, Any] | None = None


HARMONY = (
    "<|channel|>analysis<|message|>User asks 2+2 😀. Easy.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4 ✓.<|return|>"
)

CASES = [
    Case(
        id="qwen3",
        parser="qwen3",
        text="<think>Let me think é😀.</think>\n\nAnswer 🙂",
        reasoning="Let me think é😀.",
        content="\n\nAnswer 🙂",
    ),
    Case(
        id="qwen3-split-tags",
        parser="qwen3",
        pieces=("<th", "ink>", "r😀", "</", "think", ">", "c"),
        reasoning="r😀",
        content="c",
    ),
    Case(id="qwen3-plain", parser="qwen3", text="Just 🙂", reasoning=None, content="Just 🙂"),
    Case(
        id="r1",
        parser="deepseek_r1",
        text="Thinking 中文…</think>Done",
        reasoning="Thinking 中文…",
        content="Done",
    ),
    Case(id="glm45", parser="glm45", text="<think>g</think>ok", reasoning="g", content="ok"),
    Case(
        id="v31-on",
        parser="deepseek_v31",
        kwargs={"thinking": True},
        text="why 😀</think>answer",
        reasoning="why 😀",
        content="answer",
    ),
    Case(
        id="v31-off",
        parser="deepseek_v31",
        text="why 😀</think>answer",
        reasoning=None,
        content="why 😀</think>answer",
    ),
    Case(
        id="v31-off-explicit",
        parser="deepseek_v31",
        kwargs={"thinking": False},
        text="a</think>b",
        reasoning=None,
        content="a</think>b",
    ),
    Case(
        id="kimi",
        parser="kimi_k2",
        text="<think>plan é</think>answer",
        reasoning="plan é",
        content="answer",
    ),
    Case(
        id="kimi-off",
        parser="kimi_k2",
        kwargs={"thinking": False},
        text="<think>x</think>y",
        reasoning=None,
        content="<think>x</think>y",
    ),
    Case(
        id="mistral",
        parser="mistral",
        text="[THINK]Hmm 😀[/THINK]Bonjour é",
        reasoning="Hmm 😀",
        content="Bonjour é",
    ),
    Case(
        id="harmony",
        parser="openai",
        text=HARMONY,
        reasoning="User asks 2+2 😀. Easy.",
        content="2 + 2 = 4 ✓.",
    ),
]

PARSERS = sorted({c.parser for c in CASES})


def _script(tmp_path: Path, tok: Tokenizer) -> Path:
    rules: list[dict[str, Any]] = []
    for c in CASES:
        for tps in (1, 2, 7):
            key = f"[{c.id}/{tps}]"
            if c.pieces:
                ids = [i for p in c.pieces for i in tok.encode(p)]
                assert tok.decode(ids) == "".join(c.pieces)
                rules.append({"contains": key, "token_ids": ids, "tokens_per_step": tps})
            else:
                rules.append({"contains": key, "text": c.text, "tokens_per_step": tps})
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"rules": rules}))
    return path


async def _both(h: Any, body: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    full = await h.chat(**body)
    assert full.status_code == 200, full.text
    res, events = await h.stream("/v1/chat/completions", {**body, "stream": True})
    assert res.status_code == 200
    assert events[-1] == "[DONE]"
    return full.json(), [c for ev in events[:-1] for c in ev["choices"]]


@pytest.mark.parametrize("parser", PARSERS)
async def test_reasoning_split_streamed_and_whole(
    harness: HarnessFactory, tok: Tokenizer, tmp_path: Path, parser: str
) -> None:
    script = load_script(_script(tmp_path, tok), tok)
    with trio.fail_after(DEADLINE_S * 3):
        async with harness(script=script, reasoning_parser=parser) as h:
            for c in (c for c in CASES if c.parser == parser):
                for tps in (1, 2, 7):
                    body: dict[str, Any] = {
                        "model": "M",
                        "messages": [{"role": "user", "content": f"[{c.id}/{tps}]"}],
                        "max_tokens": 200,
                    }
                    if c.kwargs is not None:
                        body["chat_template_kwargs"] = c.kwargs
                    full, chunks = await _both(h, body)
                    where = f"{c.id} at {tps} tokens per step"
                    msg = full["choices"][0]["message"]
                    assert full["choices"][0]["finish_reason"] == "stop", where
                    assert msg["content"] == c.content, where
                    if c.reasoning is None:
                        assert msg.get("reasoning") is None, where
                    else:
                        assert msg["reasoning"] == c.reasoning, where
                    streamed_c = "".join(ch["delta"].get("content") or "" for ch in chunks)
                    streamed_r = "".join(ch["delta"].get("reasoning") or "" for ch in chunks)
                    assert streamed_c == c.content, where
                    assert streamed_r == (c.reasoning or ""), where
                    if c.kwargs is not None and not any(c.kwargs.values()):
                        # the switch is off: no split, no reasoning_content anywhere
                        assert "reasoning" not in msg, where
                        assert all("reasoning" not in ch["delta"] for ch in chunks)
