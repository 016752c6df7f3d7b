"""Mistral (Magistral 2507 and later): ``[THINK]...[/THINK]``, special tokens.

The model opens the block itself (output starts outside it; text before ``[THINK]`` is
content), reasoning runs to ``[/THINK]``, the rest is content.
"""

from __future__ import annotations

from smg_trio.parsers.reasoning.base import register
from smg_trio.parsers.reasoning.tags import TagFormat

register("mistral", TagFormat(start_tag="[THINK]", end_tag="[/THINK]", special_tokens=True))
