"""The Responses API's store: a bounded, least-recently-used map from response id to the
response object and its conversation (for ``previous_response_id``), bounded in entries and
in bytes. In memory, per process. Entries are held encoded (JSON bytes) and decoded on read,
so the byte budget counts what is held: decoded, a JSON schema takes 10-20 times its text."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Protocol

import attrs
import msgspec

from smg_trio.gateway.config import DEFAULT_RESPONSES_STORE_MAX_BYTES

__all__ = ["ResponseStore", "ResponseStoreLike", "StoredResponse"]


@attrs.frozen
class StoredResponse:
    """One stored response, as JSON bytes: ``response_json`` (the object ``GET`` returns) and
    ``history_json`` (the chat turns it ends: earlier turns, its input, its output; no
    instructions, as OpenAI does not carry ``instructions`` over ``previous_response_id``).
    Held encoded: :attr:`nbytes` is what the entry holds, and :meth:`history` decodes on
    read (a copy per reader)."""

    response_json: bytes
    history_json: bytes

    @classmethod
    def encode(cls, response: Any, history: list[dict[str, Any]]) -> StoredResponse:
        """The entry of ``response`` (a ``msgspec`` struct or JSON value) and ``history``."""
        return cls(msgspec.json.encode(response), msgspec.json.encode(history))

    @property
    def nbytes(self) -> int:
        """The bytes this entry holds (its two JSON texts), which the store's budget counts."""
        return len(self.response_json) + len(self.history_json)

    def response(self) -> dict[str, Any]:
        """The response object, decoded."""
        value: dict[str, Any] = msgspec.json.decode(self.response_json)
        return value

    def history(self) -> list[dict[str, Any]]:
        """The conversation, decoded."""
        value: list[dict[str, Any]] = msgspec.json.decode(self.history_json)
        return value


class ResponseStoreLike(Protocol):
    """What the Responses API needs of a store: a shared store (several frontends) would
    implement this too."""

    def put(self, response_id: str, entry: StoredResponse) -> None: ...

    def get(self, response_id: str) -> StoredResponse | None: ...

    def delete(self, response_id: str) -> bool: ...


class ResponseStore:
    """At most ``size`` responses (0: none are kept) of at most ``max_bytes`` together (an
    entry larger than that is not kept); the least recently stored or read is evicted first.
    Safe to call from a worker thread (a large response is built in one)."""

    def __init__(self, size: int, max_bytes: int = DEFAULT_RESPONSES_STORE_MAX_BYTES) -> None:
        if size < 0:
            raise ValueError(f"the responses store size must be >= 0, got {size}")
        self.size = size
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, response_id: str, entry: StoredResponse) -> None:
        if self.size == 0 or entry.nbytes > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop(response_id, None)
            if old is not None:
                self.nbytes -= old.nbytes
            self._items[response_id] = entry
            self.nbytes += entry.nbytes
            while len(self._items) > self.size or self.nbytes > self.max_bytes:
                self.nbytes -= self._items.popitem(last=False)[1].nbytes

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            entry = self._items.get(response_id)
            if entry is not None:
                self._items.move_to_end(response_id)
            return entry

    def delete(self, response_id: str) -> bool:
        with self._lock:
            entry = self._items.pop(response_id, None)
            if entry is None:
                return False
            self.nbytes -= entry.nbytes
            return True
