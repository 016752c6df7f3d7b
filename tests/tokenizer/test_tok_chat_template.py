"""Chat-template rendering: transformers semantics, sandboxing, errors as 400s."""

from __future__ import annotations

import copy
import json
from datetime import datetime
from typing import Any

import pytest

from smg_trio.errors import ValidationError
from smg_trio.gateway.openai.errors import to_api_error
from smg_trio.tokenizer import ChatTemplate, Tokenizer, normalize_messages

USER = [{"role": "user", "content": "hi"}]


def render(source: str, messages: Any = USER, **kw: Any) -> str:
    return ChatTemplate(source).render(messages, **kw)


def test_full_chatml_conversation(tok: Tokenizer) -> None:
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    out = tok.apply_chat_template(msgs, tools=tools, add_generation_prompt=True)
    assert out.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert json.dumps(tools[0]) in out
    # arguments string parsed to a dict, then tojson with ensure_ascii=False
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>' in out
    )
    assert "<tool_response>\nsunny\n</tool_response>" in out
    assert out.endswith("<|im_start|>assistant\n")
    ids = tok.encode(out)
    assert tok.decode(ids, skip_special_tokens=False) == out


def test_variables_and_kwargs() -> None:
    src = (
        "{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ enable_thinking }}|{{ x }}"
    )
    specials = {"bos_token": "<s>", "eos_token": "</s>"}
    out = render(
        src, special_tokens=specials, chat_template_kwargs={"enable_thinking": False, "x": 3}
    )
    assert out == "<s>|</s>|False|False|3"
    # kwargs may override special tokens (transformers merges them last) ...
    out = render(src, special_tokens=specials, chat_template_kwargs={"bos_token": "B"})
    assert out.startswith("B|</s>|False||")
    # ... but not the variables the renderer owns.
    with pytest.raises(ValidationError, match="add_generation_prompt") as exc:
        render(src, chat_template_kwargs={"add_generation_prompt": True})
    assert exc.value.param == "chat_template_kwargs"
    with pytest.raises(ValidationError, match="messages"):
        render(src, chat_template_kwargs={"messages": []})


def test_content_parts_joined() -> None:
    msgs = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    ]
    assert render("{{ messages[0].content }}", msgs) == "a\nb"
    assert normalize_messages(msgs)[0]["content"] == "a\nb"


@pytest.mark.parametrize(
    ("content", "param"),
    [
        (
            [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}],
            "messages[1].content[1].type",
        ),
        ([{"type": "text", "text": 5}], "messages[1].content[0].text"),
        (["plain"], "messages[1].content[0]"),
        ({"type": "text", "text": "a"}, "messages[1].content"),
    ],
)
def test_bad_content_names_field(content: Any, param: str) -> None:
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": content}]
    with pytest.raises(ValidationError) as exc:
        render("{{ messages }}", msgs)
    assert exc.value.param == param
    assert to_api_error(exc.value).status == 400
    assert param in exc.value.message


def test_bad_messages() -> None:
    with pytest.raises(ValidationError) as exc:
        render("x", [{"content": "no role"}])
    assert exc.value.param == "messages[0].role"
    with pytest.raises(ValidationError) as exc:
        render("x", ["not a dict"])
    assert exc.value.param == "messages[0]"
    with pytest.raises(ValidationError) as exc:
        render("x", "not a list")
    assert exc.value.param == "messages"
    with pytest.raises(ValidationError) as exc:
        render("x", tools="nope")
    assert exc.value.param == "tools"


def test_bad_tool_call_arguments() -> None:
    msgs = [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{bad"}}]}]
    with pytest.raises(ValidationError) as exc:
        render("x", msgs)
    assert exc.value.param == "messages[0].tool_calls[0].function.arguments"


def test_input_not_mutated() -> None:
    msgs = [
        {"role": "user", "content": [{"type": "text", "text": "a"}]},
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
    ]
    before = copy.deepcopy(msgs)
    render("{{ messages }}", msgs)
    assert msgs == before


def test_raise_exception_is_validation_error(tok: Tokenizer) -> None:
    msgs = [{"role": "user", "content": "a"}, {"role": "system", "content": "late"}]
    with pytest.raises(ValidationError, match="System message must be at the beginning") as exc:
        tok.apply_chat_template(msgs)
    assert to_api_error(exc.value).status == 400


def test_runtime_errors_are_validation_errors() -> None:
    with pytest.raises(ValidationError, match="rendering failed"):
        render("{{ messages[0].content + 1 }}")
    with pytest.raises(ValidationError, match="chat template error"):
        render("{{ messages[0].content.nope.deeper }}")


def test_sandbox_blocks_escapes() -> None:
    with pytest.raises(ValidationError):
        render("{{ ''.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ValidationError):  # immutable sandbox: no mutating the inputs
        render("{{ messages.append(1) }}")


def test_tojson_matches_transformers() -> None:
    data = {"b": "é<>&", "a": [1, 2]}
    assert render("{{ x | tojson }}", chat_template_kwargs={"x": data}) == json.dumps(
        data, ensure_ascii=False
    )
    assert render("{{ x | tojson(indent=2) }}", chat_template_kwargs={"x": data}) == json.dumps(
        data, ensure_ascii=False, indent=2
    )
    assert render("{{ x | tojson(sort_keys=true) }}", chat_template_kwargs={"x": data}).startswith(
        '{"a"'
    )


def test_strftime_loopcontrols_generation_and_whitespace() -> None:
    assert render("{{ strftime_now('%Y') }}") == str(datetime.now().year)
    src = "{% for i in [1, 2, 3, 4] %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 4 %}{% break %}{% endif %}{{ i }}{% endfor %}"
    assert render(src) == "13"
    assert render("{% generation %}G{{ messages | length }}{% endgeneration %}") == "G1"
    # trim_blocks + lstrip_blocks: block lines leave no whitespace behind
    src = "{% for m in messages %}\n    {% if m.role == 'user' %}\nU:{{ m.content }}\n    {% endif %}\n{% endfor %}"
    assert render(src) == "U:hi\n"


def test_continue_final_message(tok: Tokenizer) -> None:
    msgs = [*USER, {"role": "assistant", "content": "The answer is "}]
    out = tok.apply_chat_template(msgs, continue_final_message=True)
    assert out == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nThe answer is "
    # a template that trims the message: cut right after the stripped text
    assert render("[{{ messages[-1].content | trim }}]", msgs, continue_final_message=True) == (
        "[The answer is"
    )
    with pytest.raises(ValidationError, match="mutually exclusive"):
        tok.apply_chat_template(msgs, continue_final_message=True, add_generation_prompt=True)
    with pytest.raises(ValidationError, match="does not appear"):
        render("nothing", msgs, continue_final_message=True)
    with pytest.raises(ValidationError, match="final message"):
        render("x", [{"role": "assistant", "content": None}], continue_final_message=True)


def test_syntax_error_is_value_error() -> None:
    with pytest.raises(ValueError, match="does not compile"):
        ChatTemplate("{% for %}")


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_assistant_reasoning_reaches_template_under_both_names(field: str) -> None:
    """vLLM 0.32 (renderers/chat_utils.py) hands an assistant turn's reasoning to the
    template as both ``reasoning`` and ``reasoning_content``, whichever name the client used
    (``reasoning`` wins when both are set)."""
    src = "{% for m in messages %}[{{ m.reasoning }}|{{ m.reasoning_content }}]{% endfor %}"
    msgs = [*USER, {"role": "assistant", "content": "ok", field: "thought"}]
    assert render(src, msgs) == "[|][thought|thought]"
    both = [
        *USER,
        {"role": "assistant", "content": "ok", "reasoning": "a", "reasoning_content": "b"},
    ]
    assert render(src, both) == "[|][a|a]"
    with pytest.raises(ValidationError) as err:
        render(src, [*USER, {"role": "assistant", "content": "ok", field: 3}])
    assert err.value.param == f"messages[1].{field}"
