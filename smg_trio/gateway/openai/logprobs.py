"""Logprob rendering: OpenAI chat shape, legacy completions shape, and vLLM prompt logprobs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from smg_trio.gateway.openai.schemas import (
    ChatLogprobEntry,
    ChatLogprobs,
    CompletionLogprobs,
    TopLogprob,
)
from smg_trio.gateway.openai.textgen import LogprobRun
from smg_trio.protocol.types import TokenLogprobs
from smg_trio.tokenizer import Tokenizer

__all__ = ["chat_logprobs", "completion_logprobs", "merge_runs", "prompt_logprobs"]


def chat_logprobs(tok: Tokenizer, run: LogprobRun, k: int) -> ChatLogprobs:
    """One entry per position: the sampled token's text, logprob and UTF-8 bytes, with its
    ``top_logprobs`` = the engine's ``k`` best candidates in rank order (OpenAI semantics:
    they may or may not include the sampled token)."""
    text = tok.token_text
    raw = tok.token_bytes
    entries: list[ChatLogprobEntry] = []
    for j, tid in enumerate(run.token_ids):
        top = [
            TopLogprob(text(c), lp, raw(c))
            for c, lp in zip(run.top_ids[j][:k], run.top_logprobs[j][:k], strict=False)
        ]
        lp = run.logprobs[j]
        entries.append(ChatLogprobEntry(text(tid), -9999.0 if lp is None else lp, raw(tid), top))
    return ChatLogprobs(entries)


def completion_logprobs(
    tok: Tokenizer, run: LogprobRun, k: int, offset: int
) -> tuple[CompletionLogprobs, int]:
    """Legacy shape for ``run``: ``top_logprobs[j]`` maps the sampled token's text and the
    ``k`` best candidates' texts to their logprobs (vLLM semantics, so ``logprobs: 0`` gives
    just the sampled token). ``text_offset`` counts characters of token texts from
    ``offset``. Returns the logprobs and the offset after the last token."""
    text = tok.token_text
    tokens: list[str] = []
    offsets: list[int] = []
    tops: list[dict[str, float] | None] = []
    for j, tid in enumerate(run.token_ids):
        t = text(tid)
        tokens.append(t)
        offsets.append(offset)
        offset += len(t)
        lp = run.logprobs[j]
        top: dict[str, float] = {} if lp is None else {t: lp}
        for c, clp in zip(run.top_ids[j][:k], run.top_logprobs[j][:k], strict=False):
            top.setdefault(text(c), clp)
        tops.append(top)
    return CompletionLogprobs(tokens, list(run.logprobs), tops, offsets), offset


def merge_runs(runs: Sequence[LogprobRun]) -> LogprobRun:
    """Concatenate runs in order."""
    out = LogprobRun()
    for r in runs:
        out.token_ids += r.token_ids
        out.logprobs += r.logprobs
        out.top_ids += r.top_ids
        out.top_logprobs += r.top_logprobs
    return out


def _prompt_rows(runs: Sequence[TokenLogprobs], prompt_ids: Sequence[int]) -> LogprobRun:
    """The engine's prompt logprob runs as one run over every prompt position: the first
    position has none (vLLM reports positions 1..n-1); missing positions get ``None``."""
    rows = LogprobRun()
    for r in runs:
        rows.extend(r, r.token_ids, len(r))
    if len(rows) == len(prompt_ids) - 1:
        rows.token_ids.insert(0, prompt_ids[0])
        rows.logprobs.insert(0, None)
        rows.top_ids.insert(0, [])
        rows.top_logprobs.insert(0, [])
    n = len(prompt_ids)
    while len(rows) < n:
        rows.token_ids.append(prompt_ids[len(rows)])
        rows.logprobs.append(None)
        rows.top_ids.append([])
        rows.top_logprobs.append([])
    if rows.logprobs:
        rows.logprobs[0] = None
    return rows


def prompt_logprobs(
    tok: Tokenizer, runs: Sequence[TokenLogprobs], prompt_ids: Sequence[int], k: int
) -> list[Any]:
    """vLLM's ``prompt_logprobs``: ``None`` for the first prompt token, then per position a
    map ``str(token_id) -> {"logprob", "rank", "decoded_token"}`` holding the actual token
    and the ``k`` best candidates."""
    rows = _prompt_rows(runs, prompt_ids)
    out: list[Any] = []
    for j, tid in enumerate(rows.token_ids):
        lp = rows.logprobs[j]
        if j == 0 or lp is None:
            out.append(None)
            continue
        entry: dict[str, Any] = {}
        for rank, (c, clp) in enumerate(
            zip(rows.top_ids[j][:k], rows.top_logprobs[j][:k], strict=False), start=1
        ):
            entry[str(c)] = {"logprob": clp, "rank": rank, "decoded_token": tok.token_text(c)}
        entry.setdefault(
            str(tid), {"logprob": lp, "rank": None, "decoded_token": tok.token_text(tid)}
        )
        out.append(entry)
    return out


def echo_logprobs(
    tok: Tokenizer, runs: Sequence[TokenLogprobs], prompt_ids: Sequence[int], k: int
) -> tuple[CompletionLogprobs, int]:
    """Legacy-shape logprobs of the echoed prompt (first token: ``None`` logprob and
    ``None`` top map). Returns them and the character offset after the prompt."""
    rows = _prompt_rows(runs, prompt_ids)
    lps, offset = completion_logprobs(tok, rows, k, 0)
    if lps.top_logprobs:
        lps.top_logprobs[0] = None
    return lps, offset
