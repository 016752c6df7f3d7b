"""The Responses API's store: a bounded, least-recently-used map from response id to the
response object and its conversation (for ``previous_response_id``), bounded in entries and
in bytes. In memory, per process."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Protocol

import attrs

from smg_trio.gateway.config import DEFAULT_RESPONSES_STORE_MAX_BYTES

__all__ = ["ResponseStore", "ResponseStoreLike", "StoredResponse"]


@attrs.frozen
class StoredResponse:
    """One stored response: the JSON ``response`` object (as ``GET`` returns it) and the
    chat ``history`` it ends (earlier turns, its input, its output; no instructions, as
    OpenAI does not carry ``instructions`` over ``previous_response_id``). ``nbytes``: its
    size as the store counts it (the encoded response and history)."""

    response: dict[str, Any]
    history: list[dict[str, Any]]
    nbytes: int = 0


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
