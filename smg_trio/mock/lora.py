"""The mock engine's LoRA adapters: vLLM's ``add_lora``/``remove_lora``/``list_loras``/``pin_lora``
over a cache of at most ``max_loras`` adapters, and the per-adapter twist of its output."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import attrs

__all__ = ["MockLoras", "lora_of"]


def lora_of(wire: Any) -> tuple[str, int, str] | None:
    """``(lora_name, lora_int_id, lora_path)`` of a ``LoRARequest`` as decoded msgpack (an
    array), or ``None``. Raises ``ValueError`` for a malformed one (vLLM's: an id below 1)."""
    if wire is None:
        return None
    if not isinstance(wire, (list, tuple)) or len(wire) < 3:
        raise ValueError(f"malformed LoRARequest {wire!r:.80}")
    name, int_id, path = wire[0], wire[1], wire[2]
    if not isinstance(name, str) or not isinstance(int_id, int) or not isinstance(path, str):
        raise ValueError(f"malformed LoRARequest {wire!r:.80}")
    if int_id < 1:
        raise ValueError(f"id must be > 0, got {int_id}")
    if not path:
        raise ValueError("lora_path cannot be empty")
    return name, int_id, path


@attrs.define
class MockLoras:
    """Adapters the mock holds (by ``lora_int_id``), least recently used first; pinned ones are
    never evicted. ``max_lora_rank`` is checked against the adapter's ``adapter_config.json``
    when the path has one (as vLLM's worker refuses a larger rank)."""

    max_loras: int = 4
    max_lora_rank: int = 16
    loaded: dict[int, tuple[str, str]] = attrs.field(factory=dict)
    pinned: set[int] = attrs.field(factory=set)

    def _check_rank(self, path: str) -> None:
        config = os.path.join(path, "adapter_config.json")
        if not os.path.isfile(config):
            return
        with open(config, encoding="utf-8") as f:
            rank = json.load(f).get("r")
        if isinstance(rank, int) and rank > self.max_lora_rank:
            raise ValueError(
                f"LoRA rank {rank} is greater than max_lora_rank {self.max_lora_rank}."
            )

    def use(self, lora: tuple[str, int, str]) -> None:
        """Load ``lora`` if needed (evicting the least recently used unpinned one when full),
        and mark it most recently used. Raises ``ValueError`` when every slot is pinned."""
        name, int_id, path = lora
        if int_id in self.loaded:
            self.loaded[int_id] = self.loaded.pop(int_id)
            return
        self._check_rank(path)
        if len(self.loaded) >= self.max_loras:
            victim = next((i for i in self.loaded if i not in self.pinned), None)
            if victim is None:
                raise ValueError(f"all {self.max_loras} LoRA slots are pinned")
            del self.loaded[victim]
        self.loaded[int_id] = (name, path)

    # -- utility methods (vLLM EngineCore's) -----------------------------------------------

    def add_lora(self, wire: Sequence[Any]) -> bool:
        lora = lora_of(wire)
        if lora is None:
            raise ValueError("add_lora needs a LoRARequest")
        self.use(lora)
        return True

    def remove_lora(self, lora_id: int) -> bool:
        self.pinned.discard(lora_id)
        return self.loaded.pop(lora_id, None) is not None

    def list_loras(self) -> list[int]:
        return list(self.loaded)

    def pin_lora(self, lora_id: int) -> bool:
        if lora_id not in self.loaded:
            raise ValueError(f"LoRA {lora_id} is not loaded")
        self.pinned.add(lora_id)
        return True
