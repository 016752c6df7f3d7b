"""Structured outputs checked before the engine, with llguidance as vLLM's guidance backend
checks them (``v1/structured_output/backend_guidance.py``)."""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from typing import Final

import llguidance

from smg_trio.errors import ValidationError
from smg_trio.protocol.types import StructuredOutputs

__all__ = ["check_grammar"]

#: Validation results kept, by the grammar's digest: clients repeat their schemas, and
#: llguidance's validation of a large one costs seconds of CPU (10 000 properties: ~2 s).
_CACHE_SIZE: Final = 256
_validated: OrderedDict[bytes, str] = OrderedDict()
_lock: Final = threading.Lock()  # the checks run in the tokenizer's worker threads


def _validate(grammar: str) -> str:
    """llguidance's error for ``grammar`` (empty when valid), from the cache when seen."""
    key = hashlib.blake2b(grammar.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    with _lock:
        error = _validated.get(key)
        if error is not None:
            _validated.move_to_end(key)
            return error
    error = str(llguidance.LLMatcher.validate_grammar(grammar) or "")
    with _lock:
        _validated[key] = error
        _validated.move_to_end(key)
        while len(_validated) > _CACHE_SIZE:
            _validated.popitem(last=False)
    return error


def _grammar(so: StructuredOutputs, kind: str) -> str:
    """The llguidance grammar of one constraint, serialized as vLLM serializes it."""
    if kind in ("json", "json_object"):
        spec = so.json if kind == "json" else {"type": "object"}
        text = spec if isinstance(spec, str) else json.dumps(spec)
        grammar: str = llguidance.LLMatcher.grammar_from_json_schema(
            text, defaults={"whitespace_flexible": True}
        )
        return grammar
    if kind == "choice":
        return str(llguidance.grammar_from("choice", json.dumps(so.choice)))
    if kind == "regex":
        return str(llguidance.grammar_from("regex", so.regex or ""))
    return str(llguidance.grammar_from("grammar", so.grammar or ""))


def check_grammar(so: StructuredOutputs | None, param: str | None) -> None:
    """A 400 naming ``param`` (the client's field) for a constraint llguidance cannot compile:
    an invalid regex, JSON schema, grammar or choice list, as vLLM answers before any engine
    work. ``structural_tag`` (compiled by the engine's xgrammar) and the gateway's own
    ``tool_choice`` schemas are not checked. CPU work: the drafts call it where the prompt
    is tokenized, which leaves the event loop for large bodies."""
    if so is None or param is None:
        return
    kind = so.kinds()[0]
    if kind == "structural_tag":
        return
    try:
        grammar = _grammar(so, kind)
    except (ValueError, KeyError, TypeError) as exc:
        raise ValidationError(
            f"Invalid grammar specification: {exc}", param=param, code="invalid_grammar"
        ) from None
    error = _validate(grammar)
    if error:
        raise ValidationError(f"Grammar error: {error}", param=param, code="invalid_grammar")
