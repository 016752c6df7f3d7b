"""``ChoicePipeline``: text that arrives in the same batch as an engine failure still goes out,
before the error (the gateway may drain several engine outputs at once)."""

from __future__ import annotations

from typing import Any

import pytest

from smg_trio.gateway.openai.errors import EngineRequestFailed
from smg_trio.gateway.openai.textgen import ChoiceParams, ChoicePipeline
from smg_trio.protocol.types import EngineOutput


@pytest.mark.parametrize(
    ("reason", "code"), [("error", "engine_error"), ("abort", "engine_aborted")]
)
def test_text_before_a_failure_in_the_same_batch_is_returned_first(
    tok: Any, reason: str, code: str
) -> None:
    ids = tok.encode("hello world")
    pipeline = ChoicePipeline(0, tok, ChoiceParams(limit=100))
    delta = pipeline.feed(
        [EngineOutput("r", ids[:1]), EngineOutput("r", ids[1:]), EngineOutput("r", [], reason)]  # type: ignore[arg-type]
    )
    assert delta is not None
    assert delta.text == "hello world"
    assert delta.finish_reason is None
    assert pipeline.failure is not None
    assert pipeline.failure.code == code
    with pytest.raises(EngineRequestFailed):
        pipeline.feed([])  # the caller sent the text; the failure is raised from here on


def test_a_failure_alone_raises_at_once(tok: Any) -> None:
    pipeline = ChoicePipeline(0, tok, ChoiceParams(limit=100))
    with pytest.raises(EngineRequestFailed):
        pipeline.feed([EngineOutput("r", [], "error")])
    assert pipeline.failure is None
