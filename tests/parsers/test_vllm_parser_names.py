"""vLLM 0.32's parser names (``vllm/tool_parsers/__init__.py``, ``vllm/reasoning/__init__.py``)
work here: aliases for formats smg_trio has under another name, and ``granite``."""

from __future__ import annotations

from smg_trio.parsers.reasoning import get_reasoning_format, reasoning_parser_names
from smg_trio.parsers.tools import get_tool_parser, tool_parser_names


def test_vllm_tool_parser_names_resolve_to_the_same_format() -> None:
    for alias, name in (
        ("llama4_json", "llama3_json"),
        ("llama4_pythonic", "pythonic"),
        ("qwen3_xml", "qwen3_coder"),
        ("qwen3_json", "hermes"),
        ("glm47", "glm45"),
    ):
        assert alias in tool_parser_names()
        assert get_tool_parser(alias) is get_tool_parser(name)
    assert "granite" in tool_parser_names()


def test_vllm_reasoning_parser_names_resolve_to_the_same_format() -> None:
    for alias, name in (("openai_gptoss", "openai"), ("glm47", "glm45")):
        assert alias in reasoning_parser_names()
        assert get_reasoning_format(alias) is get_reasoning_format(name)
