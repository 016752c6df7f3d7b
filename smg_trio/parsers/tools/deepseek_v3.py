"""DeepSeek V3 / R1 tool calls: ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME`` + a json fence."""

from __future__ import annotations

from smg_trio.parsers.tools._sectioned import SectionedJsonParser
from smg_trio.parsers.tools.base import register

__all__ = ["DeepSeekV3Parser"]

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"


@register("deepseek_v3")
class DeepSeekV3Parser(SectionedJsonParser):
    """``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\\n```json\\n
    {"city": "Paris"}\\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>`` (calls separated by a newline,
    as DeepSeek-V3's chat template writes them)."""

    SECTION_BEGIN = (CALLS_BEGIN,)
    SECTION_END = (CALLS_END,)
    CALL_BEGIN = CALL_BEGIN
    HEADER_END = "\n```json\n"
    ARGS_END = ("\n```" + CALL_END, CALL_END)
    CALL_END = CALL_END

    def parse_header(self, header: str) -> tuple[str, str | None] | None:
        kind, sep, name = header.partition(SEP)
        if not sep or kind.strip() != "function":
            return None
        name = name.strip()
        return (name, None) if name and not any(c.isspace() for c in name) else None
