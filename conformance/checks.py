"""Shape checks shared by cases: usage, OpenAI error envelopes, and streamed chunk sequences."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeGuard

from conformance.client import Reply

__all__ = [
    "FINISH_OK",
    "StreamSummary",
    "dedupe",
    "error_problems",
    "is_int",
    "names_field",
    "stream_problems",
    "usage_problems",
]

FINISH_OK = frozenset({"stop", "length"})
"""Finish reasons a plain text request (no tools, no stop strings hit) may end with."""


def is_int(value: object) -> TypeGuard[int]:
    """True for a JSON integer (bool excluded)."""
    return isinstance(value, int) and not isinstance(value, bool)


def dedupe(problems: Iterable[str]) -> list[str]:
    """Collapse repeated problems into one entry with a count, keeping first-seen order."""
    counts = Counter(problems)
    return [p if counts[p] == 1 else f"{p} (x{counts[p]})" for p in dict.fromkeys(counts)]


def usage_problems(
    usage: object, *, where: str = "usage", max_completion: int | None = None
) -> list[str]:
    """Problems with a ``usage`` object: int counts, prompt > 0, total = prompt + completion."""
    if not isinstance(usage, dict):
        return [f"{where} is missing or not an object: {usage!r}"]
    out: list[str] = []
    prompt, completion, total = (
        usage.get("prompt_tokens"),
        usage.get("completion_tokens"),
        usage.get("total_tokens"),
    )
    for name, value in (
        ("prompt_tokens", prompt),
        ("completion_tokens", completion),
        ("total_tokens", total),
    ):
        if not is_int(value) or value < 0:
            out.append(f"{where}.{name} is not a non-negative integer: {value!r}")
    if out:
        return out
    assert isinstance(prompt, int)
    assert isinstance(completion, int)
    assert isinstance(total, int)
    if prompt == 0:
        out.append(f"{where}.prompt_tokens is 0 for a non-empty prompt")
    if total != prompt + completion:
        out.append(
            f"{where}.total_tokens {total} != prompt_tokens {prompt} + completion_tokens {completion}"
        )
    if max_completion is not None and completion > max_completion:
        out.append(f"{where}.completion_tokens {completion} exceeds the limit {max_completion}")
    return out


def names_field(error: dict[str, Any], field_name: str) -> bool:
    """True when an error object names ``field_name`` in ``param`` or as a word of ``message``."""
    if error.get("param") == field_name:
        return True
    message = error.get("message")
    if not isinstance(message, str):
        return False
    pattern = rf"(?<![A-Za-z0-9_]){re.escape(field_name)}(?![A-Za-z0-9_])"
    return re.search(pattern, message) is not None


def error_problems(
    reply: Reply,
    statuses: Collection[int],
    *,
    field_name: str | None = None,
    require_named: bool = False,
    require_param: bool = False,
) -> tuple[list[str], str]:
    """Check an error reply: status, JSON content type, and the OpenAI ``{"error": {...}}`` envelope.

    Returns (problems, note). With ``field_name``, the error must name it when ``require_named``
    (in ``param`` or the message), or carry it in ``param`` when ``require_param``; otherwise a
    missing name only produces a note.
    """
    problems: list[str] = []
    note = ""
    wanted = "/".join(str(s) for s in sorted(statuses))
    if reply.status not in statuses:
        problems.append(f"expected HTTP {wanted}, got {reply.status}: {reply.snippet()!r}")
        if reply.status < 400:
            return problems, note
    if not reply.content_type.startswith("application/json"):
        problems.append(f"error Content-Type is {reply.content_type!r}, not application/json")
    try:
        body = json.loads(reply.body)
    except ValueError:
        problems.append(f"error body is not JSON: {reply.snippet()!r}")
        return problems, note
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        problems.append(
            f"error body lacks the OpenAI envelope {{'error': {{...}}}}: {reply.snippet()!r}"
        )
        return problems, note
    if not isinstance(error.get("message"), str) or not error["message"]:
        problems.append(f"error.message is missing or not a string: {error.get('message')!r}")
    if not isinstance(error.get("type"), str) or not error["type"]:
        problems.append(f"error.type is missing or not a string: {error.get('type')!r}")
    if field_name is not None:
        if require_param and error.get("param") != field_name:
            problems.append(
                f"error.param is {error.get('param')!r}, expected {field_name!r} "
                f"(message {error.get('message')!r})"
            )
        elif not names_field(error, field_name):
            text = f"the error does not name {field_name!r}: {error.get('message')!r}"
            if require_named:
                problems.append(text)
            else:
                note = text
    return problems, note


@dataclass
class StreamSummary:
    """What a chunk sequence said, grouped by choice index."""

    texts: dict[int, str] = field(default_factory=dict)
    finish: dict[int, list[str]] = field(default_factory=dict)
    usage_chunks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def usage(self) -> dict[str, Any] | None:
        """The usage object of the last usage chunk, if any."""
        if not self.usage_chunks:
            return None
        usage = self.usage_chunks[-1].get("usage")
        return usage if isinstance(usage, dict) else None


def stream_problems(
    events: list[dict[str, Any]],
    *,
    kind: Literal["chat", "completion"],
    n: int = 1,
    include_usage: bool = False,
) -> tuple[list[str], StreamSummary]:
    """Check the chunk sequence of a chat or completions stream and summarise it.

    Checks: ``object``; one ``id`` and ``created`` for all chunks; indexes within ``0..n-1`` and
    all present; for chat, a first delta with ``role: assistant`` per index; exactly one
    ``finish_reason`` per index and nothing for that index after it; the usage chunk
    (``choices: []``) exactly once, after every choice chunk, only when ``include_usage``.
    """
    summary = StreamSummary()
    problems: list[str] = []
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    if not events:
        return ["the stream carried no chunks"], summary
    first = events[0]
    for pos, ev in enumerate(events):
        if ev.get("object") != obj:
            problems.append(f"chunk object is {ev.get('object')!r}, expected {obj!r}")
        if not isinstance(ev.get("id"), str) or not ev.get("id"):
            problems.append(f"chunk {pos} has no string id")
        elif ev.get("id") != first.get("id"):
            problems.append(f"chunk ids differ: {first.get('id')!r} vs {ev.get('id')!r}")
        if not is_int(ev.get("created")):
            problems.append(f"chunk {pos} has no integer created")
        elif ev.get("created") != first.get("created"):
            problems.append("chunk created timestamps differ")
        if not isinstance(ev.get("model"), str):
            problems.append(f"chunk {pos} has no string model")
        choices = ev.get("choices")
        if not isinstance(choices, list):
            problems.append(f"chunk {pos} choices is not a list: {choices!r}")
            continue
        if not choices:
            if isinstance(ev.get("usage"), dict):
                summary.usage_chunks.append(ev)
            else:
                problems.append(f"chunk {pos} has empty choices and no usage")
            continue
        if summary.usage_chunks:
            problems.append("a choice chunk arrives after the usage chunk")
        for choice in choices:
            problems.extend(_choice_problems(choice, kind=kind, n=n, summary=summary))
    for index in range(n):
        if index not in summary.texts:
            problems.append(f"choice index {index} never appears")
        elif len(summary.finish.get(index, [])) != 1:
            got = summary.finish.get(index, [])
            problems.append(
                f"choice {index} got {len(got)} finish_reason values {got}, expected exactly 1"
            )
    if include_usage:
        if len(summary.usage_chunks) != 1:
            problems.append(
                f"expected exactly one usage chunk (choices: []), got {len(summary.usage_chunks)}"
            )
        else:
            problems.extend(usage_problems(summary.usage, where="stream usage"))
    elif summary.usage_chunks:
        problems.append("a usage chunk (choices: []) was sent without stream_options.include_usage")
    return dedupe(problems), summary


def _choice_problems(
    choice: object, *, kind: Literal["chat", "completion"], n: int, summary: StreamSummary
) -> list[str]:
    if not isinstance(choice, dict):
        return [f"choice is not an object: {choice!r}"]
    index = choice.get("index")
    if not is_int(index) or not 0 <= index < n:
        return [f"choice index {index!r} is outside 0..{n - 1}"]
    assert isinstance(index, int)
    out: list[str] = []
    first_for_index = index not in summary.texts
    finished = bool(summary.finish.get(index))
    if kind == "chat":
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return [f"choice {index} delta is not an object: {delta!r}"]
        role = delta.get("role")
        if first_for_index and role != "assistant":
            out.append(f"first chunk of choice {index} has role {role!r}, expected 'assistant'")
        elif role is not None and role != "assistant":
            out.append(f"choice {index} delta role {role!r}")
        piece = delta.get("content")
    else:
        piece = choice.get("text")
    if piece is not None and not isinstance(piece, str):
        out.append(f"choice {index} content is not a string: {piece!r}")
        piece = None
    if finished and piece:
        out.append(f"choice {index} has content after its finish_reason")
    summary.texts[index] = summary.texts.get(index, "") + (piece or "")
    reason = choice.get("finish_reason")
    if reason is not None:
        summary.finish.setdefault(index, []).append(reason)
        if reason not in FINISH_OK:
            out.append(f"choice {index} finish_reason {reason!r} not in {sorted(FINISH_OK)}")
    return out
