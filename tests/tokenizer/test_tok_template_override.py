"""vLLM's gateway-side chat template options (issue 29, item 2): ``--chat-template`` (a file or
inline, as vLLM's ``load_chat_template`` reads it), ``--chat-template-content-format`` and a
request's own template, compiled in the same sandbox."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from smg_trio.errors import ValidationError
from smg_trio.mock.tiny_model import default_tiny_model_dir
from smg_trio.tokenizer import ChatTemplate, Tokenizer, request_template
from smg_trio.tokenizer.template_arg import MAX_TEMPLATE_BYTES, load_chat_template_arg
from smg_trio.worker.model_files import load_model

PARTS = "{% for m in messages %}{% for p in m['content'] %}<{{ p.text }}>{% endfor %}{% endfor %}"
STRING = "{% for m in messages %}[{{ m.content }}]{% endfor %}"
MSGS = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]


def test_content_format_auto_detects_templates_that_loop_over_content() -> None:
    assert ChatTemplate(PARTS).content_format == "openai"
    assert ChatTemplate(STRING).content_format == "string"
    assert ChatTemplate(PARTS).render(MSGS) == "<a><b>"
    assert ChatTemplate(PARTS).render([{"role": "user", "content": "s"}]) == "<s>"
    assert ChatTemplate(STRING).render(MSGS) == "[a\nb]"
    assert ChatTemplate(STRING, content_format="openai").content_format == "openai"
    assert ChatTemplate(PARTS, content_format="string").render(MSGS) == "<>" * 3
    with pytest.raises(ValueError, match="content format"):
        ChatTemplate(STRING, content_format="xml")


def test_chat_template_arg_is_a_file_or_the_template_inline(tmp_path: Path) -> None:
    f = tmp_path / "t.jinja"
    f.write_text(STRING)
    assert load_chat_template_arg(str(f)) == STRING
    assert load_chat_template_arg(STRING) == STRING
    with pytest.raises(ValueError, match="looks like a file path"):
        load_chat_template_arg(str(tmp_path / "missing.jinja"))
    with pytest.raises(ValueError, match="cannot be opened"):
        load_chat_template_arg(str(tmp_path))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        load_chat_template_arg(str(fifo))
    big = tmp_path / "big.jinja"
    big.write_text("x" * (MAX_TEMPLATE_BYTES + 1))
    with pytest.raises(ValueError, match="larger than"):
        load_chat_template_arg(str(big))
    with pytest.raises(ValueError, match="does not compile"):
        load_chat_template_arg("{% for %}")


def test_the_override_replaces_the_model_template() -> None:
    model = str(default_tiny_model_dir())
    tok, *_ = load_model(model, [model], "X{{ messages[0]['content'] }}", "string")
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "Xhi"
    plain = Tokenizer.from_dir(model)
    assert plain.apply_chat_template([{"role": "user", "content": "hi"}]) != "Xhi"


def test_request_template_is_sandboxed_and_a_bad_one_is_a_400() -> None:
    assert request_template(STRING).render(MSGS) == "[a\nb]"
    with pytest.raises(ValidationError) as err:
        request_template("{% if %}")
    assert err.value.param == "chat_template"
    escape = request_template("{{ ''.__class__.__mro__ }}")
    with pytest.raises(ValidationError):
        escape.render(MSGS)
