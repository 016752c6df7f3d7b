"""DeepSeek-V3.1: ``<think>...</think>`` behind the ``thinking`` switch (default off).

``chat_template_kwargs.thinking`` (or ``enable_thinking``) true: the template ends the prompt
with ``<think>``, output is reasoning up to ``</think>``, then content (DeepSeek-R1's split).
Off (the default): the template ends the prompt with ``</think>`` and nothing is split.
"""

from __future__ import annotations

from smg_trio.parsers.reasoning.base import register
from smg_trio.parsers.reasoning.tags import TagFormat

register(
    "deepseek_v31",
    TagFormat(
        start_tag="<think>",
        end_tag="</think>",
        in_reasoning=True,
        switch=("thinking", "enable_thinking"),
        switch_default=False,
    ),
)
