"""Per-choice text pipeline: engine token ticks in, text/reasoning/logprob deltas and usage out.

Order per token: length guard, detokenize, the reasoning split, stop strings on the content
only (held back, never leaked; a stop inside the reasoning does not end the answer), then the
tool-call parser on the content. Streaming and non-streaming use the same pipeline, so the
concatenated deltas always equal the non-streamed text and tool calls.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol

import attrs

from smg_trio.gateway.openai.errors import EngineRequestFailed, engine_failure
from smg_trio.parsers.reasoning import ReasoningFactory
from smg_trio.parsers.tools import ToolCallDelta, ToolParser
from smg_trio.protocol.types import EngineOutput, TokenLogprobs
from smg_trio.tokenizer import IncrementalDetokenizer, StopMatcher, Tokenizer

__all__ = ["ChoiceCollector", "ChoiceParams", "ChoicePipeline", "LogprobRun", "TextDelta"]

#: Prompt ids handed to the detokenizer as decode context (it uses at most 24).
_PROMPT_CONTEXT = 24


@attrs.frozen(kw_only=True)
class ChoiceParams:
    """What one choice's pipeline needs.

    ``limit``: most completion tokens accepted (the request's ``max_tokens``, else the
    remaining context); extra tokens from the engine are dropped and finish as ``length``.
    ``hidden_stop_ids``: ids whose text is not shown when the engine stops on them (EOS and
    stop token ids, vLLM's rule) unless ``include_stop_str_in_output``. ``stops`` are matched
    only after ``min_tokens`` tokens. ``reasoning`` makes the choice's reasoning parser
    (``None``: no split); a parser whose markers are special tokens keeps them in the text.
    ``logprobs``: whether to collect per-token logprobs. ``tool_parser``: makes
    the choice's tool-call parser (``None``: no tool-call parsing); ``max_tool_calls``: calls
    kept (``parallel_tool_calls: false`` keeps one; later ones are dropped).
    """

    limit: int
    stops: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    hidden_stop_ids: frozenset[int] = frozenset()
    min_tokens: int = 0
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    reasoning: ReasoningFactory | None = None
    logprobs: bool = False
    tool_parser: Callable[[], ToolParser] | None = None
    max_tool_calls: int | None = None
    #: vLLM's ``return_token_ids``: keep the generated ids (:attr:`ChoicePipeline.token_ids`).
    token_ids: bool = False


#: A whole choice's ids are decoded in runs of at most this many (a 30k-token answer is not
#: decoded in one call on the event loop).
WHOLE_DECODE_IDS: Final = 512


def new_call_id() -> str:
    """A tool call id as OpenAI writes them: ``call_`` and 24 random characters."""
    return "call_" + secrets.token_hex(12)


class LogprobRun:
    """Logprobs of consecutive generated positions: ``token_ids``/``logprobs`` are
    ``[positions]``, ``top_ids``/``top_logprobs`` ``[positions][k]`` ranked candidates."""

    __slots__ = ("logprobs", "token_ids", "top_ids", "top_logprobs")

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        self.logprobs: list[float | None] = []
        self.top_ids: list[list[int]] = []
        self.top_logprobs: list[list[float]] = []

    def __len__(self) -> int:
        return len(self.token_ids)

    def extend(self, lp: TokenLogprobs | None, token_ids: Sequence[int], count: int) -> None:
        """Append the first ``count`` positions of ``lp`` (``None`` logprobs when the engine
        sent none for ``token_ids``)."""
        if lp is None or len(lp.token_ids) < count:
            self.token_ids.extend(token_ids[:count])
            self.logprobs.extend([None] * count)
            self.top_ids.extend([] for _ in range(count))
            self.top_logprobs.extend([] for _ in range(count))
            return
        self.token_ids.extend(lp.token_ids[:count])
        self.logprobs.extend(lp.logprobs[:count])
        if lp.top_token_ids is not None and lp.top_logprobs is not None:
            self.top_ids.extend(lp.top_token_ids[:count])
            self.top_logprobs.extend(lp.top_logprobs[:count])
        else:
            self.top_ids.extend([] for _ in range(count))
            self.top_logprobs.extend([] for _ in range(count))


class TextDelta:
    """What one feed produced for a choice: ``text`` (content), ``reasoning``, the
    ``tool_calls`` deltas (with a tool-call parser), the ``logprobs`` of the tokens this text
    covers, and ``finish_reason``/``stop_reason`` on the last delta."""

    __slots__ = ("finish_reason", "logprobs", "reasoning", "stop_reason", "text", "tool_calls")

    def __init__(
        self,
        text: str,
        reasoning: str,
        logprobs: LogprobRun | None,
        finish_reason: str | None,
        stop_reason: int | str | None,
        tool_calls: list[ToolCallDelta] | None = None,
    ) -> None:
        self.tool_calls: list[ToolCallDelta] = [] if tool_calls is None else tool_calls
        self.text = text
        self.reasoning = reasoning
        self.logprobs = logprobs
        self.finish_reason = finish_reason
        self.stop_reason = stop_reason


class ChoicePipeline:
    """One choice's state. Call :meth:`feed` with each batch of engine outputs (as
    ``RequestStream.receive_some`` returns them) until :attr:`done`.

    ``completion_tokens`` counts tokens up to and including the one that completed a stop
    string (never past it, never above ``limit``). ``prompt_logprobs`` collects the engine's
    prompt logprob runs. Raises :class:`EngineRequestFailed` for an ``error`` or ``abort``
    finish.
    """

    __slots__ = (
        "_detok",
        "_include",
        "_lp",
        "_matcher",
        "_params",
        "_pending",
        "_reasoning",
        "_tools",
        "cached_tokens",
        "completion_tokens",
        "failure",
        "finish_reason",
        "gateway_stopped",
        "index",
        "kv_transfer_params",
        "prompt_logprobs",
        "stop_reason",
        "token_ids",
        "tool_calls_made",
    )

    def __init__(
        self,
        index: int,
        tokenizer: Tokenizer,
        params: ChoiceParams,
        prompt_ids: Sequence[int] = (),
        *,
        whole: bool = False,
    ) -> None:
        self.index = index
        self._params = params
        self._reasoning = None if params.reasoning is None else params.reasoning()
        keep_special = self._reasoning is not None and self._reasoning.needs_special_tokens
        self._detok = IncrementalDetokenizer(
            tokenizer,
            skip_special_tokens=params.skip_special_tokens and not keep_special,
            spaces_between_special_tokens=params.spaces_between_special_tokens,
            prompt_ids=prompt_ids[-_PROMPT_CONTEXT:],
        )
        self._include = params.include_stop_str_in_output
        self._matcher = (
            StopMatcher(params.stops, include_stop_str_in_output=self._include)
            if params.stops
            else None
        )
        self._tools: ToolParser | None = (
            None if params.tool_parser is None else params.tool_parser()
        )
        # A choice answered whole (not streamed) whose text nothing reads before the end (no
        # stop string, reasoning or tool parser): its ids are decoded once, at the finish.
        # The detokenizer's text does not depend on how the ids are split into pushes.
        self._pending: list[int] | None = (
            []
            if whole and self._matcher is None and self._reasoning is None and self._tools is None
            else None
        )
        #: Tool calls started so far (their first delta was emitted).
        self.tool_calls_made = 0
        self._lp: LogprobRun | None = LogprobRun() if params.logprobs else None
        self.completion_tokens = 0
        #: The prompt tokens the engine found in its prefix cache, once it reported them.
        self.cached_tokens: int | None = None
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.gateway_stopped = False
        #: An engine failure that arrived after text in the same :meth:`feed` call.
        self.failure: EngineRequestFailed | None = None
        self.prompt_logprobs: list[TokenLogprobs] = []
        #: What the engine's KV connector returned (vLLM's ``kv_transfer_params``), if any.
        self.kv_transfer_params: Any = None
        #: The generated ids (with ``return_token_ids``; else ``None``).
        self.token_ids: list[int] | None = [] if params.token_ids else None

    @property
    def done(self) -> bool:
        """True once the choice has its finish reason (from the engine or a stop string)."""
        return self.finish_reason is not None

    def feed(self, outputs: Sequence[EngineOutput]) -> TextDelta | None:
        """Process engine outputs; return the delta to emit, or ``None`` when everything is
        held back (a partial stop string or UTF-8 character). Outputs after the finish are
        ignored.

        Raises :class:`EngineRequestFailed` for an engine error or abort finish. When text
        arrived before it in the same call, that text is returned first and the error is
        left in :attr:`failure`: the caller sends the delta, then raises it."""
        if self.failure is not None:
            raise self.failure
        parts: list[str] = []
        thoughts: list[str] = []
        for out in outputs:
            # `done`, not `finish_reason is not None`: that would narrow the attribute to None
            # below, where `_consume` may set it (mypyc-compiled code checks the narrowing).
            if self.done:
                break
            if out.cached_tokens is not None:
                self.cached_tokens = out.cached_tokens
            reason = out.finish_reason
            if reason == "error" or reason == "abort":
                failure = (
                    engine_failure(out.error)
                    if reason == "error"
                    else EngineRequestFailed("the engine aborted the request", "engine_aborted")
                )
                if not parts and not thoughts:
                    raise failure
                self.failure = failure  # the text before it goes out first
                break
            if out.prompt_logprobs is not None:
                self.prompt_logprobs.append(out.prompt_logprobs)
            if out.kv_transfer_params is not None:
                self.kv_transfer_params = out.kv_transfer_params
            if out.new_token_ids:
                self._consume(out, parts, thoughts)
            if self.finish_reason is None and reason is not None:
                self.finish_reason = reason
                self.stop_reason = out.stop_reason
        return self._emit(parts, thoughts)

    def _consume(self, out: EngineOutput, parts: list[str], thoughts: list[str]) -> None:
        toks = out.new_token_ids
        room = self._params.limit - self.completion_tokens
        forced = len(toks) > room
        if forced:
            toks = toks[:room]
        hide = (
            not forced
            and out.finish_reason == "stop"
            and bool(toks)
            and not self._include
            and toks[-1] in self._params.hidden_stop_ids
        )
        visible = toks[:-1] if hide else toks
        if self.token_ids is not None:
            self.token_ids.extend(toks)
        matcher = self._matcher
        detok = self._detok
        reasoning = self._reasoning
        consumed = len(toks)
        pending = self._pending
        if pending is not None:
            pending.extend(visible)
            if len(pending) >= WHOLE_DECODE_IDS:  # bounded: no long decode on the loop
                parts.append(detok.push(pending))
                pending.clear()
        elif matcher is None:
            text = detok.push(visible)
            if reasoning is not None and text:
                thought, text = reasoning.push(text)
                thoughts.append(thought)
            parts.append(text)
        else:
            base = self.completion_tokens
            min_tokens = self._params.min_tokens
            for j, tok in enumerate(visible):
                piece = detok.push((tok,))
                if reasoning is not None and piece:
                    thought, piece = reasoning.push(piece)
                    thoughts.append(thought)
                if base + j + 1 <= min_tokens:
                    parts.append(piece)
                    continue
                emitted, matched = matcher.push(piece)
                parts.append(emitted)
                if matched is not None:
                    consumed = j + 1
                    self.finish_reason = "stop"
                    self.stop_reason = matched
                    self.gateway_stopped = True
                    break
        self.completion_tokens += consumed
        if self._lp is not None and consumed:
            self._lp.extend(out.logprobs, toks, consumed)
        if forced and self.finish_reason is None:
            self.finish_reason = "length"

    def _emit(self, parts: list[str], thoughts: list[str]) -> TextDelta | None:
        if self.finish_reason is not None and not self.gateway_stopped:
            if self._pending:
                parts.append(self._detok.push(self._pending))
                self._pending.clear()
            tail = self._detok.flush()
            if self._reasoning is not None:
                thought, tail = self._reasoning.push(tail) if tail else ("", "")
                r2, c2 = self._reasoning.flush()
                thoughts += (thought, r2)
                tail += c2
            if self._matcher is not None:
                emitted, matched = self._matcher.push(tail)
                parts.append(emitted)
                if matched is not None:
                    self.finish_reason = "stop"
                    self.stop_reason = matched
                    self.gateway_stopped = True
                else:
                    parts.append(self._matcher.flush())
            else:
                parts.append(tail)
        text = "".join(parts)
        reasoning = "".join(thoughts)
        calls: list[ToolCallDelta] = []
        if self._tools is not None:
            text, calls = self._push_tools(text)
        finish = self.finish_reason
        if not text and not reasoning and not calls and finish is None:
            return None
        lp = self._lp
        if lp is not None:
            self._lp = LogprobRun()
        return TextDelta(text, reasoning, lp, finish, self.stop_reason if finish else None, calls)

    def _push_tools(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        """Content through the tool-call parser: ids assigned, deltas of one call merged,
        calls past ``max_tool_calls`` dropped; a stop with calls finishes ``tool_calls``."""
        parser = self._tools
        assert parser is not None
        text, raw = parser.push(text) if text else ("", [])
        if self.finish_reason is not None:
            tail, more = parser.finish()
            text += tail
            raw = raw + more
        limit = self._params.max_tool_calls
        calls: list[ToolCallDelta] = []
        for d in raw:
            if limit is not None and d.index >= limit:
                continue
            if d.name is not None:
                self.tool_calls_made += 1
                calls.append(ToolCallDelta(d.index, d.name, d.arguments, d.id or new_call_id()))
            elif calls and calls[-1].index == d.index:
                last = calls[-1]
                calls[-1] = ToolCallDelta(
                    last.index, last.name, last.arguments + d.arguments, last.id
                )
            elif d.arguments:
                calls.append(ToolCallDelta(d.index, None, d.arguments))
        if self.finish_reason == "stop" and self.tool_calls_made:
            self.finish_reason = "tool_calls"
        return text, calls


class ChoiceCollector:
    """Accumulates the deltas of ``n`` choices (non-streaming); ``on_delta`` is the
    ``fanout`` callback, choices are addressed by their pipeline ``index``. ``tool_calls[i]``
    holds choice ``i``'s call deltas in order (``calls.merge_calls`` joins them)."""

    __slots__ = ("logprobs", "reasoning", "text", "tool_calls")

    def __init__(self, n: int) -> None:
        self.text: list[list[str]] = [[] for _ in range(n)]
        self.tool_calls: list[list[ToolCallDelta]] = [[] for _ in range(n)]
        self.reasoning: list[list[str]] = [[] for _ in range(n)]
        self.logprobs: list[list[LogprobRun]] = [[] for _ in range(n)]

    def on_delta(self, sub: _HasPipeline, delta: TextDelta) -> None:
        i = sub.pipeline.index
        if delta.text:
            self.text[i].append(delta.text)
        if delta.reasoning:
            self.reasoning[i].append(delta.reasoning)
        if delta.tool_calls:
            self.tool_calls[i].extend(delta.tool_calls)
        if delta.logprobs is not None and len(delta.logprobs):
            self.logprobs[i].append(delta.logprobs)


class _HasPipeline(Protocol):
    @property
    def pipeline(self) -> ChoicePipeline: ...
