"""Kimi K2 tool calls: ``<|tool_call_begin|>functions.NAME:N<|tool_call_argument_begin|>{json}``."""

from __future__ import annotations

from smg_trio.parsers.tools._sectioned import SectionedJsonParser
from smg_trio.parsers.tools.base import register

__all__ = ["KimiK2Parser"]


@register("kimi_k2")
class KimiK2Parser(SectionedJsonParser):
    """``<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0
    <|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>``.
    The model's call id (``functions.get_weather:0``) is passed through as the call's ``id``
    (Kimi's template writes it back into the next prompt); the section marker's singular
    spelling (``<|tool_call_section_begin|>``), which the model also produces, is accepted."""

    SECTION_BEGIN = ("<|tool_calls_section_begin|>", "<|tool_call_section_begin|>")
    SECTION_END = ("<|tool_calls_section_end|>", "<|tool_call_section_end|>")
    CALL_BEGIN = "<|tool_call_begin|>"
    HEADER_END = "<|tool_call_argument_begin|>"
    ARGS_END = ("<|tool_call_end|>",)
    CALL_END = "<|tool_call_end|>"

    def parse_header(self, header: str) -> tuple[str, str | None] | None:
        call_id = header.strip()
        name = call_id.removeprefix("functions.")
        head, colon, index = name.rpartition(":")
        if colon and index.isdigit():
            name = head
        if not name or any(c.isspace() for c in call_id):
            return None
        return name, call_id
