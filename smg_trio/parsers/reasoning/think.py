"""The ``<think>...</think>`` family without a switch: ``qwen3``, ``glm45``, ``deepseek_r1``.

Qwen3 and GLM-4.5 write the opening ``<think>`` themselves (output starts outside the block;
with ``enable_thinking: false`` their templates close an empty block in the prompt).
DeepSeek-R1 (0528) templates open the block in the prompt, so output starts inside it and
ends it with ``</think>``.
"""

from __future__ import annotations

from smg_trio.parsers.reasoning.base import register
from smg_trio.parsers.reasoning.tags import TagFormat

register("qwen3", TagFormat(start_tag="<think>", end_tag="</think>"))
register("glm45", TagFormat(start_tag="<think>", end_tag="</think>"))
register("deepseek_r1", TagFormat(start_tag="<think>", end_tag="</think>", in_reasoning=True))
