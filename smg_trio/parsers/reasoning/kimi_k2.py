"""Kimi K2 (Thinking): ``<think>...</think>`` behind the ``thinking`` switch (default on).

Output starts inside the block (the model may open it without writing ``<think>``; a leading
one is dropped). Reasoning ends at ``</think>`` or, implicitly, where the model opens its
tool-call section (``<|tool_calls_section_begin|>``, which stays in the content for the
``kimi_k2`` tool parser). ``chat_template_kwargs.thinking`` (or ``enable_thinking``) false:
no split. The markers are special tokens of Kimi's vocabulary.
"""

from __future__ import annotations

from smg_trio.parsers.reasoning.base import register
from smg_trio.parsers.reasoning.tags import TagFormat

register(
    "kimi_k2",
    TagFormat(
        start_tag="<think>",
        end_tag="</think>",
        in_reasoning=True,
        switch=("thinking", "enable_thinking"),
        switch_default=True,
        implicit_ends=("<|tool_calls_section_begin|>",),
        special_tokens=True,
    ),
)
