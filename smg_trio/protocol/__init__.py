"""Engine wire protocols (vLLM EngineCore, TokenSpeed) behind one engine-neutral seam."""

from __future__ import annotations

from smg_trio.protocol.types import (
    Capabilities,
    EngineBatch,
    EngineLoad,
    EngineOutput,
    EngineProtocol,
    FinishReason,
    Frames,
    GenerateRequest,
    SamplingOptions,
    StructuredOutputs,
    TokenLogprobs,
)

__all__ = [
    "Capabilities",
    "EngineBatch",
    "EngineLoad",
    "EngineOutput",
    "EngineProtocol",
    "FinishReason",
    "Frames",
    "GenerateRequest",
    "SamplingOptions",
    "StructuredOutputs",
    "TokenLogprobs",
]
