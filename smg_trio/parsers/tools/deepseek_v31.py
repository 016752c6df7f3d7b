"""DeepSeek V3.1 tool calls: ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{json}<｜tool▁call▁end｜>``."""

from __future__ import annotations

from smg_trio.parsers.tools._sectioned import SectionedJsonParser
from smg_trio.parsers.tools.base import register
from smg_trio.parsers.tools.deepseek_v3 import CALL_BEGIN, CALL_END, CALLS_BEGIN, CALLS_END, SEP

__all__ = ["DeepSeekV31Parser"]


@register("deepseek_v31")
class DeepSeekV31Parser(SectionedJsonParser):
    """``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}
    <｜tool▁call▁end｜><｜tool▁calls▁end｜>`` (no type, no fence, calls back to back, as
    DeepSeek-V3.1's chat template writes them)."""

    SECTION_BEGIN = (CALLS_BEGIN,)
    SECTION_END = (CALLS_END,)
    CALL_BEGIN = CALL_BEGIN
    HEADER_END = SEP
    ARGS_END = (CALL_END,)
    CALL_END = CALL_END

    def parse_header(self, header: str) -> tuple[str, str | None] | None:
        name = header.strip()
        return (name, None) if name and not any(c.isspace() for c in name) else None
