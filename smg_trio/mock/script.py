"""The mock engine's script: rules that answer matching prompts with scripted tokens (docs/mock.md)."""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import attrs
import msgspec

from smg_trio.tokenizer import Tokenizer

__all__ = ["FINISH_REASONS", "MockScript", "MockScriptError", "ScriptedReply", "load_script"]

#: The finish reasons a rule may give; both wires carry all four.
FINISH_REASONS = ("stop", "length", "abort", "error")

_REPLY_KEYS = ("text", "token_ids", "steps")


class MockScriptError(ValueError):
    """A script that cannot be used (unreadable, malformed, or a bad rule); the message names
    the file and the rule."""


class _Rule(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One rule as written in the file (validated further by :func:`_compile`)."""

    name: str | None = None
    contains: str | None = None
    regex: str | None = None
    text: str | None = None
    token_ids: list[Annotated[int, msgspec.Meta(ge=0)]] | None = None
    steps: list[str | list[Annotated[int, msgspec.Meta(ge=0)]]] | None = None
    tokens_per_step: Annotated[int, msgspec.Meta(ge=1)] | None = None
    add_special_tokens: bool = False
    finish_reason: Literal["stop", "length", "abort", "error"] = "stop"
    stop_reason: int | str | None = None


class _Script(msgspec.Struct, forbid_unknown_fields=True):
    rules: list[dict[str, Any]]


@attrs.frozen
class ScriptedReply:
    """What the mock emits for a matching prompt: ``steps`` (token ids per engine step), then
    ``finish_reason`` (and ``stop_reason``) on the last step."""

    rule: str
    steps: tuple[tuple[int, ...], ...]
    finish_reason: str = "stop"
    stop_reason: int | str | None = None


@attrs.frozen
class _CompiledRule:
    label: str
    contains: str | None
    regex: re.Pattern[str] | None
    reply: ScriptedReply

    def matches(self, prompt: str) -> bool:
        if self.contains is not None and self.contains not in prompt:
            return False
        return self.regex is None or self.regex.search(prompt) is not None


@attrs.frozen
class MockScript:
    """Compiled rules, tried in order against the decoded prompt (special tokens kept); the
    first match answers. ``source`` is the file it came from."""

    source: str
    rules: tuple[_CompiledRule, ...]
    tokenizer: Tokenizer = attrs.field(repr=False)

    def reply_for(self, prompt_token_ids: Sequence[int]) -> ScriptedReply | None:
        """The first matching rule's reply, or ``None`` (the mock's random tokens)."""
        if not self.rules:
            return None
        ids = [i for i in prompt_token_ids if i >= 0]
        prompt = self.tokenizer.decode(ids, skip_special_tokens=False)
        for rule in self.rules:
            if rule.matches(prompt):
                return rule.reply
        return None


def _read(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise MockScriptError(f"mock script {path}: cannot read it: {exc}") from None
    try:
        if path.suffix.lower() == ".toml":
            return tomllib.loads(text)
        return json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        kind = "TOML" if path.suffix.lower() == ".toml" else "JSON"
        raise MockScriptError(f"mock script {path}: not valid {kind}: {exc}") from None


def _why(exc: msgspec.ValidationError) -> str:
    """msgspec's message in the script's words: ``unknown key `x```, ``... (at `$.key`)``."""
    msg = str(exc).replace("Object contains unknown field", "unknown key")
    head, sep, at = msg.rpartition(" - at ")
    return f"{head} (at `{at.strip('`')}`)" if sep else msg


def _label(index: int, raw: dict[str, Any]) -> str:
    name = raw.get("name")
    return f"rule {index + 1} ({name!r})" if isinstance(name, str) else f"rule {index + 1}"


def _chunks(ids: list[int], size: int) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(ids[i : i + size]) for i in range(0, len(ids), size))


def _compile(where: str, label: str, raw: dict[str, Any], tok: Tokenizer) -> _CompiledRule:
    def bad(msg: str) -> MockScriptError:
        return MockScriptError(f"{where}: {label}: {msg}")

    try:
        rule = msgspec.convert(raw, _Rule)
    except msgspec.ValidationError as exc:
        raise bad(_why(exc)) from None
    given = [k for k in _REPLY_KEYS if getattr(rule, k) is not None]
    if not given:
        raise bad("needs a reply: one of 'text', 'token_ids' or 'steps'")
    if len(given) > 1:
        raise bad(f"gives both {given[0]!r} and {given[1]!r}; give one reply")
    if rule.steps is not None and rule.tokens_per_step is not None:
        raise bad("'tokens_per_step' applies to 'text' and 'token_ids', not to 'steps'")
    if rule.stop_reason is not None and rule.finish_reason != "stop":
        raise bad("'stop_reason' needs finish_reason 'stop'")
    pattern = None
    if rule.regex is not None:
        try:
            pattern = re.compile(rule.regex)
        except re.error as exc:
            raise bad(f"bad regex {rule.regex!r}: {exc}") from None
    per_step = rule.tokens_per_step or 1
    if rule.text is not None:
        steps = _chunks(tok.encode(rule.text, add_special_tokens=rule.add_special_tokens), per_step)
    elif rule.token_ids is not None:
        steps = _chunks(list(rule.token_ids), per_step)
    else:
        assert rule.steps is not None
        steps = tuple(
            tuple(
                tok.encode(s, add_special_tokens=rule.add_special_tokens)
                if isinstance(s, str)
                else s
            )
            for s in rule.steps
        )
    vocab = tok.vocab_size
    for step in steps:
        for tid in step:
            if tid >= vocab:
                raise bad(f"token id {tid} is outside the vocabulary (size {vocab})")
    reply = ScriptedReply(
        rule=rule.name or label,
        steps=steps,
        finish_reason=rule.finish_reason,
        stop_reason=rule.stop_reason,
    )
    return _CompiledRule(label, rule.contains, pattern, reply)


def load_script(path: str | Path, tokenizer: Tokenizer) -> MockScript:
    """Read, validate and compile a JSON or TOML (``.toml``) script; ``tokenizer`` encodes the
    replies' text and decodes prompts. Raises :class:`MockScriptError` naming the file and the
    rule for an unreadable file, an unknown key, a wrong type, a bad regex, a rule without a
    reply, a token id outside the vocabulary, or a rule after a catch-all."""
    p = Path(path)
    where = f"mock script {p}"
    data = _read(p)
    try:
        script = msgspec.convert(data, _Script)
    except msgspec.ValidationError as exc:
        raise MockScriptError(
            f"{where}: {_why(exc)} (a script is an object with a 'rules' list)"
        ) from None
    rules: list[_CompiledRule] = []
    catch_all: str | None = None
    for i, raw in enumerate(script.rules):
        label = _label(i, raw)
        if catch_all is not None:
            raise MockScriptError(
                f"{where}: {label} is never reached: {catch_all} has no 'contains' or 'regex' "
                "and matches every prompt (put the catch-all last)"
            )
        rule = _compile(where, label, raw, tokenizer)
        if rule.contains is None and rule.regex is None:
            catch_all = label
        rules.append(rule)
    return MockScript(str(p), tuple(rules), tokenizer)
