"""LoRA adapters: the served adapters (name, stable engine id, path, base model), the registry
every frontend mirrors, vLLM's ``--lora-modules`` forms, and the checks of an adapter folder."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

from smg_trio.errors import ConflictError, ModelPathError, ValidationError
from smg_trio.protocol.types import LoraRequest
from smg_trio.tokenizer.modeldir import ModelDir

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "AdapterFacts",
    "LoraAdapter",
    "LoraAdapterError",
    "LoraModule",
    "LoraRegistry",
    "base_model_matches",
    "lora_int_id",
    "parse_lora_module",
    "read_adapter",
]

#: PEFT's adapter files: the config every adapter has, and its weights (either name).
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
#: The largest ``lora_int_id``: ids stay positive signed 32-bit integers on every wire.
_MAX_ID = 2**31 - 1


def lora_int_id(name: str) -> int:
    """The adapter's engine id, derived from its name alone (BLAKE2b, in ``[1, 2**31 - 1]``), so
    that the gateway, every frontend and every restart send the same id for one adapter
    without agreeing on a counter. Two names whose ids collide cannot both be served (the
    second is a 409, :meth:`LoraRegistry.add`)."""
    digest = hashlib.blake2b(name.encode(), digest_size=8, person=b"smg-lora").digest()
    return int.from_bytes(digest, "big") % _MAX_ID + 1


class LoraAdapterError(ValidationError):
    """A LoRA adapter was refused (not an adapter, too large a rank, another base model...)."""

    def __init__(self, message: str, *, param: str = "lora_path", code: str = "invalid_value"):
        super().__init__(message, param=param, code=code)


@attrs.frozen
class LoraModule:
    """One ``--lora-modules`` entry, as vLLM's ``LoRAModulePath``."""

    name: str
    path: str
    base_model_name: str | None = None


def parse_lora_module(item: str) -> LoraModule:
    """vLLM's two forms: ``name=path`` (an ``=`` and no ``,``), else a JSON object
    ``{"name": ..., "path": ..., "base_model_name": ...}``. Raises ``ValueError`` naming what
    is wrong."""
    if "=" in item and "," not in item:
        name, path = item.split("=", 1)
        doc: Any = {"name": name, "path": path}
    else:
        try:
            doc = json.loads(item)
        except json.JSONDecodeError as exc:
            raise ValueError(f"invalid JSON format for --lora-modules: {item}") from exc
        if not isinstance(doc, dict):
            raise ValueError(f"--lora-modules {item}: expected a JSON object")
        extra = set(doc) - {"name", "path", "base_model_name", "is_3d_lora_weight"}
        if extra:
            raise ValueError(f"invalid fields for --lora-modules: {item}: {sorted(extra)}")
    name, path, base = doc.get("name"), doc.get("path"), doc.get("base_model_name")
    if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
        raise ValueError(f"--lora-modules {item}: needs a non-empty name and path")
    if base is not None and not isinstance(base, str):
        raise ValueError(f"--lora-modules {item}: base_model_name must be a string")
    return LoraModule(name, path, base)


@attrs.frozen
class AdapterFacts:
    """What the gateway reads from an adapter folder: its resolved path (what the engines
    load), its LoRA rank and the base model its config names (``base_model_name_or_path``;
    ``None`` when absent)."""

    path: str
    rank: int
    base_model: str | None


def read_adapter(path: str, roots: Sequence[str] | None) -> AdapterFacts:
    """Check that ``path`` is a PEFT LoRA adapter folder inside ``roots`` (symlinks resolved,
    as model directories are) and read its facts. Raises ``ModelPathError`` (outside the
    allow-list, or a file that resolves out of it) or :class:`LoraAdapterError` (no readable
    ``adapter_config.json``, not a LoRA, no weights, a bad rank). Blocking I/O: call it from
    a worker thread on a server."""
    try:
        folder = ModelDir(path, roots)
    except ModelPathError as exc:
        raise ModelPathError(
            "lora_path is outside the allowed model directories; name its directory in "
            "--allowed-model-dirs"
        ) from exc
    if not os.path.isdir(folder.path):
        raise LoraAdapterError(f"lora_path {path!r} is not a directory")
    try:
        text = folder.read_text(ADAPTER_CONFIG)
    except UnicodeDecodeError as exc:
        raise LoraAdapterError(f"{ADAPTER_CONFIG} in {path!r} is not UTF-8 text") from exc
    if text is None:
        raise LoraAdapterError(f"{path!r} is not a LoRA adapter: it has no {ADAPTER_CONFIG}")
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LoraAdapterError(f"{ADAPTER_CONFIG} in {path!r} is not JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise LoraAdapterError(f"{ADAPTER_CONFIG} in {path!r} is not a JSON object")
    peft_type = config.get("peft_type", "LORA")
    if not isinstance(peft_type, str) or peft_type.upper() != "LORA":
        raise LoraAdapterError(f"{path!r} is a {peft_type!r} adapter, not a LoRA")
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise LoraAdapterError(f"{ADAPTER_CONFIG} in {path!r}: 'r' must be a positive integer")
    if not any(folder.file(name) is not None for name in ADAPTER_WEIGHTS):
        raise LoraAdapterError(f"{path!r} has no adapter weights ({' or '.join(ADAPTER_WEIGHTS)})")
    base = config.get("base_model_name_or_path")
    # the engines get the resolved folder: a link swapped after this check moves nothing
    real = os.path.realpath(folder.path)
    return AdapterFacts(real, rank, base if isinstance(base, str) and base else None)


def _names(ref: str) -> set[str]:
    ref = ref.rstrip("/")
    out = {ref, os.path.basename(ref)}
    if os.path.isabs(ref):
        out.add(os.path.realpath(ref))
        parts = ref.split("/")
        # a hub snapshot (.../models--org--name/snapshots/<rev>) is also the id org/name
        for i, part in enumerate(parts):
            if part.startswith("models--") and i + 1 < len(parts) and parts[i + 1] == "snapshots":
                repo = part[len("models--") :].replace("--", "/")
                out |= {repo, repo.rsplit("/", 1)[-1]}
    return out


def base_model_matches(adapter_base: str | None, served: Iterable[str]) -> bool:
    """Whether the base model an adapter names (an id or a path) is one of ``served`` (the
    served model's id and its model path): equal, or the same last path component, or the
    same hub repository. An adapter that names no base model matches."""
    if adapter_base is None:
        return True
    theirs = _names(adapter_base)
    return any(theirs & _names(ours) for ours in served if ours)


@attrs.frozen
class LoraAdapter:
    """One served adapter: its name (what ``model`` names), base model id, path, engine id and
    rank; ``static`` when it came from ``--lora-modules`` (never unloaded)."""

    name: str
    base_model: str
    path: str
    int_id: int
    rank: int | None = None
    static: bool = False

    @property
    def request(self) -> LoraRequest:
        """The ``lora_request`` the engines get."""
        return LoraRequest(self.name, self.int_id, self.path)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "base_model": self.base_model,
            "path": self.path,
            "int_id": self.int_id,
            "rank": self.rank,
            "static": self.static,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> LoraAdapter:
        return cls(
            name=str(doc["name"]),
            base_model=str(doc["base_model"]),
            path=str(doc["path"]),
            int_id=int(doc["int_id"]),
            rank=doc.get("rank"),
            static=bool(doc.get("static")),
        )


def _dec(counts: dict[str, int], name: str) -> None:
    left = counts.get(name, 0) - 1
    if left > 0:
        counts[name] = left
    else:
        counts.pop(name, None)


class LoraRegistry:
    """The served adapters by name, and how many requests each has in flight here.

    ``on_change`` is called after every add and remove (the worker manager wakes its table
    long-poll with it, so the frontends see a change at once). Names are unique, and so are
    engine ids (a colliding name is refused)."""

    def __init__(self, on_change: Callable[[], None] | None = None) -> None:
        self._adapters: dict[str, LoraAdapter] = {}
        self._waiting: dict[str, int] = {}
        self._running: dict[str, int] = {}
        self.on_change = on_change

    def __len__(self) -> int:
        return len(self._adapters)

    def get(self, name: str) -> LoraAdapter | None:
        return self._adapters.get(name)

    def all(self) -> list[LoraAdapter]:
        return list(self._adapters.values())

    def for_base(self, base_model: str) -> list[LoraAdapter]:
        return [a for a in self._adapters.values() if a.base_model == base_model]

    def check_new(self, name: str) -> int:
        """The engine id ``name`` would get; raises ``ConflictError`` (409) when the name is
        taken or its id collides with another adapter's."""
        if name in self._adapters:
            raise ConflictError(
                f"The lora adapter '{name}' has already been loaded.",
                param="lora_name",
                code="lora_adapter_exists",
            )
        int_id = lora_int_id(name)
        clash = next((a for a in self._adapters.values() if a.int_id == int_id), None)
        if clash is not None:
            raise ConflictError(
                f"lora adapter name {name!r} has the engine id of {clash.name!r}; choose "
                "another name",
                param="lora_name",
                code="lora_adapter_exists",
            )
        return int_id

    def add(self, adapter: LoraAdapter) -> None:
        """Register ``adapter`` (see :meth:`check_new` for the refusals)."""
        self.check_new(adapter.name)
        self._adapters[adapter.name] = adapter
        self._changed()

    def remove(self, name: str) -> LoraAdapter | None:
        adapter = self._adapters.pop(name, None)
        if adapter is not None:
            self._changed()
        return adapter

    def inflight(self, name: str) -> int:
        """Requests for ``name`` in flight in this process."""
        return self._waiting.get(name, 0) + self._running.get(name, 0)

    def acquire(self, name: str) -> None:
        """A request for ``name`` starts (waiting for its first output)."""
        self._waiting[name] = self._waiting.get(name, 0) + 1

    def start(self, name: str) -> None:
        """A request for ``name`` got its first output: it is running."""
        _dec(self._waiting, name)
        self._running[name] = self._running.get(name, 0) + 1

    def release(self, name: str, *, started: bool) -> None:
        """A request for ``name`` ended (``started``: after :meth:`start`)."""
        _dec(self._running if started else self._waiting, name)

    def running(self) -> list[str]:
        """Adapters with requests running (vLLM's ``running_lora_adapters``)."""
        return list(self._running)

    def waiting(self) -> list[str]:
        """Adapters with requests waiting for their first output (``waiting_lora_adapters``)."""
        return list(self._waiting)

    def to_json(self) -> list[dict[str, Any]]:
        return [a.to_json() for a in self._adapters.values()]

    def replace(self, docs: Sequence[dict[str, Any]]) -> None:
        """Take a published list (a frontend mirroring the supervisor's registry)."""
        adapters = {}
        for doc in docs:
            adapter = LoraAdapter.from_json(doc)
            adapters[adapter.name] = adapter
        if adapters != self._adapters:
            self._adapters = adapters
            self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()
