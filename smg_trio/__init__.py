"""smg_trio: an OpenAI-compatible LLM gateway on trio that drives engines directly over ZMQ."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
