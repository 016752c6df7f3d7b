"""Incremental scanners shared by the formats: marker hold-back and one JSON call object."""

from __future__ import annotations

import json
from collections.abc import Collection

__all__ = ["JsonCallScanner", "JsonValueScanner", "partial_suffix_len", "split_at_marker"]

_WS = " \t\r\n"


def partial_suffix_len(buf: str, markers: Collection[str]) -> int:
    """Length of the longest suffix of ``buf`` that is a proper prefix of a marker (the text
    to hold back: a marker may be split across pieces)."""
    best = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(buf)), best, -1):
            if buf.endswith(marker[:n]):
                best = n
                break
    return best


def split_at_marker(buf: str, markers: Collection[str]) -> tuple[str, str | None, str, str]:
    """``(before, marker, after, held)``: the text before the earliest complete marker, that
    marker and what follows it; without one, ``(safe text, None, "", held-back suffix)``."""
    best, found = -1, None
    for marker in markers:
        i = buf.find(marker)
        if i >= 0 and (found is None or i < best):
            best, found = i, marker
    if found is not None:
        return buf[:best], found, buf[best + len(found) :], ""
    hold = partial_suffix_len(buf, markers)
    cut = len(buf) - hold
    return buf[:cut], None, "", buf[cut:]


class JsonValueScanner:
    """Finds where one JSON value ends, a character at a time (strings, escapes, nesting).

    :meth:`push` returns how many characters of ``text`` belong to the value, or ``-1``
    when all of them do and the value goes on. A scalar (number, ``true``...) ends before
    the first delimiter, so it is only known to be complete when one follows. Leading
    whitespace belongs to the caller (feed from the value's first character)."""

    __slots__ = ("_depth", "_esc", "_in_str", "_kind", "done", "error")

    def __init__(self) -> None:
        self._kind = ""  # "c" container, "s" string, "v" scalar
        self._depth = 0
        self._in_str = False
        self._esc = False
        self.done = False
        self.error = False

    def push(self, text: str) -> int:
        for i, ch in enumerate(text):
            if not self._kind:
                if ch in "{[":
                    self._kind, self._depth = "c", 1
                elif ch == '"':
                    self._kind, self._in_str = "s", True
                elif ch in "}],:" or ch in _WS:
                    self.error = self.done = True
                    return i
                else:
                    self._kind = "v"
                continue
            if self._in_str:
                if self._esc:
                    self._esc = False
                elif ch == "\\":
                    self._esc = True
                elif ch == '"':
                    self._in_str = False
                    if self._kind == "s":
                        self.done = True
                        return i + 1
                continue
            if self._kind == "v":
                if ch in ",}]" or ch in _WS:
                    self.done = True
                    return i
                continue
            if ch == '"':
                self._in_str = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self.done = True
                    return i + 1
        return -1

    def finish_scalar(self) -> bool:
        """At the end of the text: whether a scalar was being read (it ends here)."""
        if self._kind == "v" and not self.done:
            self.done = True
            return True
        return False


_OBJ, _KEY, _IN_KEY, _COLON, _VALUE, _IN_VALUE, _AFTER, _DONE = range(8)


class JsonCallScanner:
    """Scans one call object ``{"name": "f", "arguments": {...}}`` as it streams in.

    ``name`` is set once its string is complete. The arguments value's text is the model's
    own, queued in :meth:`take_args` as it arrives (a JSON *string* holding the arguments is
    decoded first, so it is released when complete). Other keys are skipped. After the
    object's ``}``, ``done`` is set (``"{}"`` is queued when no arguments key was seen);
    ``error`` is set on text that is not such an object (then ``done`` too).
    """

    __slots__ = (
        "_arg_keys",
        "_args",
        "_args_seen",
        "_buf",
        "_key",
        "_raw_container",
        "_state",
        "_target",
        "_value",
        "done",
        "error",
        "name",
    )

    def __init__(self, arg_keys: tuple[str, ...] = ("arguments", "parameters")) -> None:
        self._arg_keys = arg_keys
        self._state = _OBJ
        self._buf = ""
        self._key = ""
        self._target = ""  # "name", "args" or "skip" for the value being read
        self._value = JsonValueScanner()
        self._args: list[str] = []
        self._args_seen = False
        self._raw_container = False
        self.name: str | None = None
        self.done = False
        self.error = False

    def take_args(self) -> str:
        """The arguments text scanned since the last call."""
        out = "".join(self._args)
        self._args.clear()
        return out

    def _fail(self) -> None:
        self.error = self.done = True
        self._state = _DONE

    def push(self, text: str) -> int:
        """Scan ``text``; return how many characters belong to the object (all of them
        unless it ended or failed inside ``text``)."""
        i, n = 0, len(text)
        while i < n and not self.done:
            st = self._state
            ch = text[i]
            if st in (_OBJ, _KEY, _COLON, _VALUE, _AFTER) and ch in _WS:
                i += 1
            elif st == _OBJ:
                if ch != "{":
                    self._fail()
                    return i
                self._state = _KEY
                i += 1
            elif st == _KEY:
                if ch == "}" and not self._key:
                    self._close()
                    return i + 1
                if ch != '"':
                    self._fail()
                    return i
                self._state, self._value, self._buf = _IN_KEY, JsonValueScanner(), ""
            elif st == _IN_KEY:
                used = self._value.push(text[i:])
                end = n if used < 0 else i + used
                self._buf += text[i:end]
                i = end
                if used >= 0:
                    self._key = json.loads(self._buf)
                    self._state = _COLON
            elif st == _COLON:
                if ch != ":":
                    self._fail()
                    return i
                self._state = _VALUE
                i += 1
            elif st == _VALUE:
                key = self._key
                if key == "name" and self.name is None:
                    self._target = "name"
                elif key in self._arg_keys and not self._args_seen:
                    self._target = "args"
                    self._args_seen = True
                else:
                    self._target = "skip"
                self._state, self._value, self._buf = _IN_VALUE, JsonValueScanner(), ""
                self._raw_container = ch in "{["
            elif st == _IN_VALUE:
                used = self._value.push(text[i:])
                if self._value.error:
                    self._fail()
                    return i
                end = n if used < 0 else i + used
                self._take(text[i:end])
                i = end
                if used >= 0:
                    self._end_value()
            elif st == _AFTER:
                if ch == ",":
                    self._state = _KEY
                    self._key = ""
                    i += 1
                elif ch == "}":
                    self._close()
                    return i + 1
                else:
                    self._fail()
                    return i
        return n if not self.done else i

    def _take(self, piece: str) -> None:
        if self._target == "args" and self._raw_container:
            self._args.append(piece)
        elif self._target != "skip":
            self._buf += piece

    def _end_value(self) -> None:
        target, buf = self._target, self._buf
        if target == "name":
            try:
                name = json.loads(buf)
            except ValueError:
                name = None
            if not isinstance(name, str) or not name:
                self._fail()
                return
            self.name = name
        elif target == "args" and not self._raw_container:
            try:
                value = json.loads(buf)
            except ValueError:
                value = None
            if isinstance(value, str):  # arguments sent as a JSON string of JSON
                self._args.append(value)
            elif value is None:
                self._args.append("{}")
            else:
                self._args.append(buf)
        self._state = _AFTER

    def _close(self) -> None:
        if self.name is None:
            self._fail()
            return
        if not self._args_seen:
            self._args.append("{}")
        self.done = True
        self._state = _DONE

    def finish(self) -> None:
        """The text ended: a scalar value being read ends here (the object does not)."""
        if self._state == _IN_VALUE and self._value.finish_scalar():
            self._end_value()
