"""DeepSeek's real vocabulary (the deepseek_vocab fixture): its tool-call markers are single
added tokens, the detokenizer keeps them, and the fixture's template renders tools."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from smg_trio.tokenizer import Tokenizer
from smg_trio.tokenizer.detokenizer import IncrementalDetokenizer
from tests.helpers.deepseek_vocab import TOOL_MARKERS
from tests.tools.cases import deepseek


@pytest.fixture(scope="module")
def tok(deepseek_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(str(deepseek_model_dir))


def test_each_tool_marker_is_one_added_token(deepseek_model_dir: Path, tok: Tokenizer) -> None:
    added = {
        t["content"]: t
        for t in json.loads((deepseek_model_dir / "tokenizer.json").read_text())["added_tokens"]
    }
    for marker in TOOL_MARKERS:
        assert marker in added, marker
        assert tok.encode(marker) == [added[marker]["id"]]
        # Added, not special: DeepSeek marks them special=false, so even
        # skip_special_tokens=True keeps them (the BOS/EOS are the special ones).
        assert added[marker]["special"] is False
        for skip in (False, True):
            assert tok.decode([added[marker]["id"]], skip_special_tokens=skip) == marker


@pytest.mark.parametrize("case", deepseek.CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("skip", [False, True])
def test_the_detokenizer_gives_back_each_case_token_by_token(
    tok: Tokenizer, case: deepseek.ToolCase, skip: bool
) -> None:
    ids = tok.encode(case.text)
    for marker in TOOL_MARKERS:  # the markers arrive as their own ids, not as text pieces
        if marker in case.text:
            assert tok.encode(marker)[0] in ids
    detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    text = "".join(detok.push([i]) for i in ids) + detok.flush()
    assert text == case.text


def test_the_template_renders_tools_and_tool_turns(tok: Tokenizer) -> None:
    tools = deepseek.TOOLS
    prompt = tok.apply_chat_template(
        [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "12°C"},
        ],
        tools=tools,
        add_generation_prompt=True,
    )
    assert "### get_weather" in prompt
    assert "### get_time" in prompt
    assert (
        '<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>'
        in prompt
    )
    assert prompt.startswith("<｜begin▁of▁sentence｜>")
    assert prompt.endswith("<｜tool▁output▁begin｜>12°C<｜tool▁output▁end｜><｜Assistant｜>")
