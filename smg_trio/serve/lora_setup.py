"""Static LoRA adapters of ``serve`` (``--lora-modules``): the engine flags that go with them
(``--enable-lora``, ``--max-loras``, ``--max-lora-rank``) and their checks and registration."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import trio

from smg_trio.errors import SmgError, ValidationError
from smg_trio.gateway.openai.errors import ApiError
from smg_trio.lora import (
    AdapterFacts,
    LoraAdapter,
    LoraModule,
    base_model_matches,
    lora_int_id,
    read_adapter,
)
from smg_trio.serve.engine_control import CONTROL_CALL_TIMEOUT_S, call_engines
from smg_trio.worker.confine import WorkerConfinement
from smg_trio.worker.manager import WorkerManager

__all__ = [
    "MAX_LORA_RANKS",
    "LoraSetupError",
    "check_static_adapters",
    "engine_lora_args",
    "register_static_adapters",
]

log = logging.getLogger(__name__)

#: vLLM 0.32's allowed ``--max-lora-rank`` values (``vllm/config/lora.py``: ``MaxLoRARanks``).
MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
#: vLLM's defaults.
DEFAULT_MAX_LORA_RANK = 16
DEFAULT_MAX_LORAS = 1


class LoraSetupError(SmgError):
    """A ``--lora-modules`` adapter cannot be served (serve stops with this message)."""


def _given(flag: str, engine_args: Sequence[str]) -> str | None:
    """The value of ``flag`` in the engine arguments after '--' (``""`` for a bare flag)."""
    for i, arg in enumerate(engine_args):
        if arg == flag:
            nxt = engine_args[i + 1] if i + 1 < len(engine_args) else ""
            return "" if nxt.startswith("--") else nxt
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def engine_lora_args(
    *,
    enable: bool,
    max_loras: int | None,
    max_lora_rank: int | None,
    adapters: int,
    engine_args: Sequence[str],
) -> tuple[list[str], int | None]:
    """The LoRA flags for a vLLM engine that ``serve`` launches, and the rank limit the
    gateway then checks loads against. With adapters configured (or ``enable``): vLLM's
    ``--enable-lora``, ``--max-loras`` (given, else at least the static adapters' count) and
    ``--max-lora-rank`` (given, else vLLM's 16); each one the user set after '--' is left as
    given (and its rank read back). Nothing without adapters or ``enable``."""
    if not (enable or adapters or max_loras or max_lora_rank):
        return [], None
    out = [] if _given("--enable-lora", engine_args) is not None else ["--enable-lora"]
    if _given("--max-loras", engine_args) is None:
        out += ["--max-loras", str(max_loras or max(DEFAULT_MAX_LORAS, adapters))]
    theirs = _given("--max-lora-rank", engine_args)
    if theirs is not None:
        return out, int(theirs) if theirs.isdigit() else None
    rank = max_lora_rank or DEFAULT_MAX_LORA_RANK
    return [*out, "--max-lora-rank", str(rank)], rank


async def _read(module: LoraModule, confinement: WorkerConfinement) -> AdapterFacts:
    try:
        confinement.check_model_path(module.path)
        roots = confinement.model_dirs
        return await trio.to_thread.run_sync(read_adapter, module.path, roots)
    except ValidationError as exc:
        raise LoraSetupError(
            f"--lora-modules {module.name}={module.path}: "
            + exc.message.replace("model_path", "the path")
        ) from exc


async def check_static_adapters(
    modules: Sequence[LoraModule], confinement: WorkerConfinement
) -> None:
    """Every ``--lora-modules`` folder is an adapter inside the allow-list, and no name comes
    twice (before any engine is launched). Raises :class:`LoraSetupError`."""
    names = [m.name for m in modules]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise LoraSetupError(f"--lora-modules names {', '.join(map(repr, twice))} twice")
    for module in modules:
        await _read(module, confinement)


async def _adapter(
    module: LoraModule,
    manager: WorkerManager,
    max_lora_rank: int | None,
) -> LoraAdapter:
    """Check one ``--lora-modules`` entry against the allow-list, its folder and the served
    models. Raises :class:`LoraSetupError` naming it."""
    what = f"--lora-modules {module.name}={module.path}"
    served = list(manager.models)
    base = module.base_model_name or (served[0] if len(served) == 1 else None)
    if base is None or base not in manager.models:
        raise LoraSetupError(
            f"{what}: base model {module.base_model_name!r} is not served"
            if module.base_model_name
            else f"{what}: name its base model ('base_model_name' of the JSON form)"
        )
    if module.name in manager.models:
        raise LoraSetupError(f"{what}: the name is a served base model's")
    facts = await _read(module, manager.confinement)
    paths = [w.spec.model_path or "" for w in manager.workers if w.model_id == base]
    if not base_model_matches(facts.base_model, [base, *paths]):
        raise LoraSetupError(f"{what}: the adapter is for {facts.base_model!r}, not {base!r}")
    if max_lora_rank is not None and facts.rank > max_lora_rank:
        raise LoraSetupError(
            f"{what}: LoRA rank {facts.rank} is greater than --max-lora-rank {max_lora_rank}"
        )
    return LoraAdapter(module.name, base, facts.path, lora_int_id(module.name), facts.rank, True)


async def register_static_adapters(
    manager: WorkerManager, modules: Sequence[LoraModule], max_lora_rank: int | None
) -> None:
    """Check every ``--lora-modules`` adapter (its folder read in a worker thread), preload it
    on every engine of its base model (``add_lora``, as vLLM's server loads its static
    adapters), and register them all, or none: raises :class:`LoraSetupError` for the first
    that cannot be served (an engine's refusal included). A relaunched engine loads them again
    on first use (each request carries the path)."""
    adapters: list[LoraAdapter] = []
    for module in modules:
        adapter = await _adapter(module, manager, max_lora_rank)
        if any(a.name == adapter.name for a in adapters):
            raise LoraSetupError(f"--lora-modules names {adapter.name!r} twice")
        adapters.append(adapter)
    for adapter in adapters:
        workers = [w for w in manager.workers if w.model_id == adapter.base_model]
        try:
            answers = await call_engines(
                workers, "add_lora", (adapter.request,), CONTROL_CALL_TIMEOUT_S
            )
        except ApiError as exc:
            raise LoraSetupError(f"--lora-modules {adapter.name}: {exc.detail.message}") from exc
        for answer in answers:
            if answer.error is not None:
                raise LoraSetupError(
                    f"--lora-modules {adapter.name}: {answer.error.detail.message}"
                )
            manager.lora_affinity.record(answer.worker, adapter.name)
    for adapter in adapters:
        try:
            manager.loras.add(adapter)
        except ValidationError as exc:
            raise LoraSetupError(f"--lora-modules {adapter.name}: {exc.message}") from exc
        log.info("LoRA adapter %r for %r from %s", adapter.name, adapter.base_model, adapter.path)
