"""``ChoicePipeline``: text that arrives in the same batch as an engine failure still goes out,
before the error (the gateway may drain several engine outputs at once); a whole (non-streamed)
choice, decoded once at its finish, has the text of the same ids streamed."""

from __future__ import annotations

from typing import Any

import pytest

from smg_trio.gateway.openai.errors import EngineRequestFailed
from smg_trio.gateway.openai.textgen import ChoiceParams, ChoicePipeline
from smg_trio.protocol.types import EngineOutput

#: An engine failure's finish reason, and the error code the gateway gives it.
FAILURES = pytest.mark.parametrize(
    ("reason", "code"), [("error", "engine_error"), ("abort", "engine_aborted")]
)


def _text_then_failure(ids: list[int], reason: str) -> list[EngineOutput]:
    """Two outputs of text, then a failure finish: one engine batch, or three steps."""
    return [EngineOutput("r", ids[:1]), EngineOutput("r", ids[1:]), EngineOutput("r", [], reason)]  # type: ignore[arg-type]


@FAILURES
def test_text_before_a_failure_in_the_same_batch_is_returned_first(
    tok: Any, reason: str, code: str
) -> None:
    ids = tok.encode("hello world")
    pipeline = ChoicePipeline(0, tok, ChoiceParams(limit=100))
    delta = pipeline.feed(_text_then_failure(ids, reason))
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


TEXTS = [
    "hello world, plain ASCII",
    "héllo wörld — ünïcode ✓ and 中文字符 with emoji 🚀🎉 in the middle",
    "\U0001f468\u200d\U0001f469\u200d\U0001f467 family, then text",
]


def _run(pipeline: ChoicePipeline, ids: list[int], step: int, finish: str) -> tuple[str, str]:
    text = ""
    finish_reason = ""
    for k in range(0, len(ids), step):
        last = k + step >= len(ids)
        out = EngineOutput("r", ids[k : k + step], finish if last else None)  # type: ignore[arg-type]
        delta = pipeline.feed([out])
        if delta is not None:
            text += delta.text
            finish_reason = delta.finish_reason or finish_reason
    return text, finish_reason


@pytest.fixture(scope="module")
def deepseek_tok(deepseek_model_dir: Any) -> Any:
    from smg_trio.tokenizer.core import Tokenizer

    return Tokenizer.from_dir(deepseek_model_dir)


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("step", [1, 2, 5])
@pytest.mark.parametrize("prompt", ["", "a prompt that ends in ü", "emoji 🚀"])
def test_a_whole_choice_decoded_at_the_finish_gives_the_streamed_text(
    deepseek_tok: Any, text: str, step: int, prompt: str
) -> None:
    """``whole=True`` (a non-streamed choice) decodes its ids once at the finish; the text and
    finish reason are those of the same ids pushed token by token, with the production
    vocabulary, a prompt whose last character may be split, and a length cut."""
    tok = deepseek_tok
    ids = tok.encode(text)
    prompt_ids = tok.encode(prompt)
    for limit in (100, max(1, len(ids) - 3)):
        params = ChoiceParams(limit=limit)
        streamed = _run(ChoicePipeline(0, tok, params, prompt_ids), ids, step, "stop")
        whole_pipeline = ChoicePipeline(0, tok, params, prompt_ids, whole=True)
        whole = _run(whole_pipeline, ids, step, "stop")
        assert whole == streamed
        assert whole_pipeline.completion_tokens == min(limit, len(ids))
        assert whole[0]  # some text came out


def test_a_whole_choice_with_a_stop_string_still_stops_at_it(tok: Any) -> None:
    """A stop string is matched as the text arrives, whole or not."""
    ids = tok.encode("one two three four five")
    params = ChoiceParams(limit=100, stops=(" three",))
    pipeline = ChoicePipeline(0, tok, params, whole=True)
    text, finish = _run(pipeline, ids, 1, "length")
    assert text == "one two"
    assert finish == "stop"
    assert pipeline.gateway_stopped


def test_a_long_whole_choice_is_decoded_in_bounded_runs(
    deepseek_tok: Any, monkeypatch: Any
) -> None:
    """Past ``WHOLE_DECODE_IDS`` pending ids a whole choice decodes what it holds (no single
    long decode on the event loop); the text is still the streamed one."""
    from smg_trio.gateway.openai import textgen

    monkeypatch.setattr(textgen, "WHOLE_DECODE_IDS", 4)
    ids = deepseek_tok.encode(TEXTS[1] * 3)
    pipeline = ChoicePipeline(0, deepseek_tok, ChoiceParams(limit=1000), whole=True)
    early = pipeline.feed([EngineOutput("r", ids[:10])])  # type: ignore[arg-type]
    assert early is not None
    assert early.text  # decoded before the finish
    rest = _run(pipeline, ids[10:], 3, "stop")
    streamed = _run(ChoicePipeline(0, deepseek_tok, ChoiceParams(limit=1000)), ids, 1, "stop")
    assert (early.text + rest[0], rest[1]) == streamed


@pytest.mark.parametrize("text", TEXTS)
def test_outputs_taken_together_give_one_delta_with_the_text_of_each(
    deepseek_tok: Any, text: str
) -> None:
    """Outputs taken together (a stream that fell behind the engine) give one delta, as
    vLLM's output collector merges them: the text and finish of feeding them one at a time."""
    ids = deepseek_tok.encode(text)
    outputs = [
        EngineOutput("r", [t], "length" if k == len(ids) - 1 else None)  # type: ignore[arg-type]
        for k, t in enumerate(ids)
    ]
    params = ChoiceParams(limit=100)
    one_by_one = ChoicePipeline(0, deepseek_tok, params)
    apart = [d for o in outputs if (d := one_by_one.feed([o])) is not None]
    merged = ChoicePipeline(0, deepseek_tok, params).feed(outputs)
    assert merged is not None
    assert len(apart) > 1
    assert merged.text == "".join(d.text for d in apart) == text
    assert merged.finish_reason == apart[-1].finish_reason == "length"


@FAILURES
def test_outputs_taken_together_give_the_text_before_a_failure_first(
    tok: Any, reason: str, code: str
) -> None:
    ids = tok.encode("hello world")
    pipeline = ChoicePipeline(0, tok, ChoiceParams(limit=100))
    delta = pipeline.feed(_text_then_failure(ids, reason))
    assert delta is not None
    assert delta.text == "hello world"
    assert pipeline.failure is not None
    assert pipeline.failure.code == code
    alone = ChoicePipeline(0, tok, ChoiceParams(limit=100))
    with pytest.raises(EngineRequestFailed):
        alone.feed([EngineOutput("r", [], reason), EngineOutput("r", ids)])  # type: ignore[arg-type]


def test_outputs_taken_together_stop_at_the_finish(tok: Any) -> None:
    """Outputs after the one that finished the choice are ignored."""
    ids = tok.encode("one two three four")
    outputs = [EngineOutput("r", [t], "stop" if k == 1 else None) for k, t in enumerate(ids)]  # type: ignore[arg-type]
    pipeline = ChoicePipeline(0, tok, ChoiceParams(limit=100))
    delta = pipeline.feed(outputs)
    assert pipeline.done
    assert delta is not None
    assert delta.finish_reason == "stop"
    assert pipeline.completion_tokens == 2
