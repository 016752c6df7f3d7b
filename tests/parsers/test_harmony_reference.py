"""gpt-oss harmony against openai-harmony, the format's maintained library, on real o200k
token ids: what the openai reasoning and tool-call parsers make of the ids (decoded one at a
time, special tokens kept, as the gateway's detokenizer gives them) equals the library's own
parse of the same ids. The library reads its vocabulary from TIKTOKEN_ENCODINGS_BASE; the
o200k ranks come from the quicktok-v1 package, checked against the library's sha256."""

from __future__ import annotations

import base64
import codecs
import hashlib
import struct
from pathlib import Path
from typing import Any

import pytest

from smg_trio.parsers.reasoning import get_reasoning_format
from smg_trio.parsers.tools import ToolSpec, get_tool_parser

harmony = pytest.importorskip("openai_harmony")
quicktok = pytest.importorskip("quicktok")

#: o200k_base.tiktoken's sha256, as openai-harmony (and tiktoken) check it.
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"

TEXTS = [
    "<|channel|>analysis<|message|>User asks 2+2 😀. Easy.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4 — café ✓.<|return|>",
    "<|channel|>analysis<|message|>Need the weather.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Zürich 🇨🇭"}<|call|>',
    "<|channel|>analysis<|message|>Plan.<|end|>"
    "<|start|>assistant<|channel|>commentary<|message|>Checking now.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json"
    '<|message|>{"tz": "UTC"}<|call|>',
    # two analysis messages, then a preamble and the final answer: a newline between each
    # kind's messages, as vLLM joins them
    "<|channel|>analysis<|message|>First, read it.<|end|>"
    "<|start|>assistant<|channel|>analysis<|message|>Then, answer.<|end|>"
    "<|start|>assistant<|channel|>commentary<|message|>One moment.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Done.<|return|>",
]


@pytest.fixture(scope="module")
def encoding(tmp_path_factory: pytest.TempPathFactory) -> Any:
    data = Path(quicktok.__file__).parent / "data" / "o200k.vocab"
    raw = data.read_bytes()
    (n,) = struct.unpack_from("<I", raw, 0)
    off, ranks = 4, []
    for _ in range(n):  # u16 length, the token's bytes, u32 rank
        (size,) = struct.unpack_from("<H", raw, off)
        token = raw[off + 2 : off + 2 + size]
        (rank,) = struct.unpack_from("<I", raw, off + 2 + size)
        off += 6 + size
        ranks.append((rank, token))
    text = b"".join(base64.b64encode(t) + b" %d\n" % r for r, t in sorted(ranks))
    if hashlib.sha256(text).hexdigest() != O200K_SHA256:
        pytest.skip("quicktok's o200k ranks are not o200k_base")
    base = tmp_path_factory.mktemp("tiktoken")
    (base / "o200k_base.tiktoken").write_bytes(text)
    mp = pytest.MonkeyPatch()
    mp.setenv("TIKTOKEN_ENCODINGS_BASE", str(base))
    try:
        return harmony.load_harmony_encoding(harmony.HarmonyEncodingName.HARMONY_GPT_OSS)
    finally:
        mp.undo()


def _reference(enc: Any, ids: list[int]) -> tuple[str, str, list[tuple[str, str]]]:
    """The library's messages, each kind's bodies joined by a newline as vLLM's
    ``parse_chat_output`` joins them (the calls are the tool parser's)."""
    reasoning: list[str] = []
    content: list[str] = []
    calls = []
    for m in enc.parse_messages_from_completion_tokens(ids, harmony.Role.ASSISTANT):
        body = "".join(c.text for c in m.content)
        if m.recipient is not None and m.recipient.startswith("functions."):
            calls.append((m.recipient.removeprefix("functions."), body))
        elif m.channel == "analysis":
            reasoning.append(body)
        else:
            content.append(body)
    return "\n".join(reasoning), "\n".join(content), calls


def _ours(enc: Any, ids: list[int]) -> tuple[str, str, list[tuple[str, str]]]:
    factory = get_reasoning_format("openai").start("", None)
    assert factory is not None
    rp = factory()
    tp = get_tool_parser("openai")([ToolSpec("get_weather"), ToolSpec("get_time")])
    utf8 = codecs.getincrementaldecoder("utf-8")()
    reasoning, content, calls = "", "", {}
    # one token's bytes (a character may span tokens), as the detokenizer would hold them
    raw = [
        enc.decode([i], errors="surrogateescape").encode("utf-8", "surrogateescape") for i in ids
    ]
    pieces = [utf8.decode(b) for b in raw]
    for piece, last in [(p, False) for p in pieces] + [(utf8.decode(b"", final=True), True)]:
        r, c = rp.push(piece)
        if last:
            r2, c2 = rp.flush()
            r, c = r + r2, c + c2
        reasoning += r
        text, deltas = tp.push(c)
        if last:
            t2, d2 = tp.finish()
            text, deltas = text + t2, deltas + d2
        content += text
        for d in deltas:
            name, args = calls.get(d.index, ("", ""))
            calls[d.index] = (d.name or name, args + d.arguments)
    return reasoning, content, [calls[i] for i in sorted(calls)]


@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_parsers_agree_with_openai_harmony(encoding: Any, text: str) -> None:
    ids = encoding.encode(text, allowed_special="all")
    stops = set(encoding.stop_tokens_for_assistant_actions())
    assert ids[-1] in stops  # <|call|> / <|return|>: EOS ids, hidden before the parsers
    ids = ids[:-1]
    ref = _reference(encoding, ids)
    assert ref[0]  # the reference found reasoning: the vocabulary and format are real
    assert _ours(encoding, ids) == ref
