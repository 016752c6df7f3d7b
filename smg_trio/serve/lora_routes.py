"""vLLM's dynamic LoRA routes (``POST /v1/load_lora_adapter``, ``/v1/unload_lora_adapter``) on
the admin blueprint: checked, confined adapter folders, ``add_lora``/``remove_lora`` on every
engine of the base model, the registry every frontend mirrors."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import msgspec
import trio
from quart import Blueprint, Response, request

from smg_trio.errors import ValidationError
from smg_trio.gateway.openai.errors import ApiError
from smg_trio.lora import (
    AdapterFacts,
    LoraAdapter,
    base_model_matches,
    read_adapter,
)
from smg_trio.serve.engine_control import CONTROL_CALL_TIMEOUT_S, call_engines
from smg_trio.worker.confine import require_printable
from smg_trio.worker.manager import WorkerManager, WorkerState

__all__ = ["LORA_PATHS", "LoadLoRAAdapterRequest", "UnloadLoRAAdapterRequest", "add_lora_routes"]

log = logging.getLogger(__name__)

#: The routes (Quart rules and methods); a frontend process forwards them to the supervisor.
LORA_PATHS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("/v1/load_lora_adapter", ("POST",)),
    ("/v1/unload_lora_adapter", ("POST",)),
)


class LoadLoRAAdapterRequest(msgspec.Struct, kw_only=True):
    """vLLM's body, plus ``base_model_name`` (which served model the adapter extends, when the
    gateway serves several and the adapter's config does not say)."""

    lora_name: str
    lora_path: str
    load_inplace: bool = False
    is_3d_lora_weight: bool = False
    base_model_name: str | None = None


class UnloadLoRAAdapterRequest(msgspec.Struct, kw_only=True):
    """vLLM's body (``lora_int_id`` is accepted and must match when given)."""

    lora_name: str
    lora_int_id: int | None = None


def _error(exc: ApiError) -> Response:
    return Response(exc.body(), status=exc.status, content_type="application/json")


def _text(message: str) -> Response:
    return Response(message, status=200, content_type="text/plain; charset=utf-8")


async def _body(type_: type[msgspec.Struct]) -> msgspec.Struct:
    raw = await request.get_data(as_text=False)
    assert isinstance(raw, bytes)
    try:
        return msgspec.json.decode(raw, type=type_)
    except msgspec.ValidationError as exc:
        raise ApiError(400, f"invalid request body: {exc}", code="invalid_value") from None
    except msgspec.DecodeError:
        raise ApiError(400, "the request body is not JSON", code="invalid_json") from None


def _invalid(exc: ValidationError) -> ApiError:
    status = 404 if exc.code == "model_not_found" else 400
    return ApiError(status, exc.message, param=exc.param, code=exc.code)


class _LoraRoutes:
    """The two routes' logic over ``manager`` (its registry, confinement and workers)."""

    def __init__(
        self, manager: WorkerManager, max_lora_rank: int | None, bound_s: float | None
    ) -> None:
        self.manager = manager
        self.max_lora_rank = max_lora_rank
        self.bound_s = bound_s
        #: Names being loaded or unloaded now: a second call for one is refused (409).
        self.busy: set[str] = set()

    def bound(self) -> float:
        return CONTROL_CALL_TIMEOUT_S if self.bound_s is None else self.bound_s

    def _base_model(self, body: LoadLoRAAdapterRequest, facts: AdapterFacts) -> str:
        """The served model the adapter extends: ``base_model_name`` if given, else the one
        whose id or path the adapter's config names, else the only served model. Raises
        ``ApiError`` 400 (another base model, or no way to tell) or 404 (no such model)."""
        manager = self.manager
        served = {m: manager.models[m] for m in manager.known_models() if m in manager.models}

        def names(model_id: str) -> list[str]:
            workers = manager.registry.list(model_id)
            paths = [w.spec.model_path for w in workers if isinstance(w, WorkerState)]
            return [model_id, *(p for p in paths if p)]

        if body.base_model_name is not None:
            if body.base_model_name not in served:
                raise ApiError(
                    404,
                    f"The model '{body.base_model_name}' does not exist.",
                    param="base_model_name",
                    code="model_not_found",
                )
            candidates = [body.base_model_name]
        else:
            candidates = list(served)
        if not candidates:
            raise ApiError(503, "no base model is being served yet", code="service_unavailable")
        matching = [m for m in candidates if base_model_matches(facts.base_model, names(m))]
        if not matching:
            raise ApiError(
                400,
                f"the adapter at {body.lora_path!r} is for base model {facts.base_model!r}, "
                f"not {' or '.join(repr(c) for c in candidates)}",
                param="lora_path",
                code="base_model_mismatch",
            )
        if len(matching) > 1:
            raise ApiError(
                400,
                "several models are served: name the adapter's base model in 'base_model_name'",
                param="base_model_name",
            )
        return matching[0]

    def _check_capacity(self, base: str, workers: Sequence[WorkerState]) -> None:
        """400 unless every engine of ``base`` serves LoRA and has room for one more adapter
        (``max_loras``, from its registration)."""
        limits = []
        for w in workers:
            client = w.engine_client
            for e in client.engines if client is not None else []:
                if not e.ready.supports_lora or e.ready.max_loras < 1:
                    raise ApiError(
                        400,
                        f"worker {w.worker_id} ({w.url}) does not serve LoRA adapters (start "
                        "its engine with --enable-lora)",
                        code="lora_not_enabled",
                    )
                limits.append(e.ready.max_loras)
        loaded = len(self.manager.loras.for_base(base))
        if limits and loaded >= min(limits):
            raise ApiError(
                400,
                f"model {base!r} already has {loaded} LoRA adapters, its engines' max_loras; "
                "unload one first or start the engines with a larger --max-loras",
                param="lora_name",
                code="too_many_lora_adapters",
            )

    async def load(self, body: LoadLoRAAdapterRequest) -> str:
        manager = self.manager
        name, path = body.lora_name, body.lora_path
        if not name or not path:
            raise ApiError(400, "Both 'lora_name' and 'lora_path' must be provided.")
        try:
            require_printable(name, "lora_name")
            require_printable(path, "lora_path")
        except ValidationError as exc:
            raise _invalid(exc) from None
        if name in manager.known_models():
            raise ApiError(
                400,
                f"The lora adapter '{name}' conflicts with a served base model.",
                param="lora_name",
            )
        existing = manager.loras.get(name)
        if existing is not None and not body.load_inplace:
            raise ApiError(
                400,
                f"The lora adapter '{name}' has already been loaded. If you want to load the "
                "adapter in place, set 'load_inplace' to True.",
                param="lora_name",
                code="lora_adapter_exists",
            )
        if name in self.busy:
            raise ApiError(409, f"lora adapter {name!r} is being loaded or unloaded", code="busy")
        self.busy.add(name)
        try:
            return await self._load(body, existing)
        finally:
            self.busy.discard(name)

    async def _load(self, body: LoadLoRAAdapterRequest, existing: LoraAdapter | None) -> str:
        manager = self.manager
        name, path = body.lora_name, body.lora_path
        try:
            manager.confinement.check_model_path(path)
            roots = manager.confinement.model_dirs
            facts = await trio.to_thread.run_sync(read_adapter, path, roots)
            int_id = existing.int_id if existing else manager.loras.check_new(name)
        except ValidationError as exc:
            if exc.param == "model_path":
                exc.param = "lora_path"
            raise _invalid(exc) from None
        if self.max_lora_rank is not None and facts.rank > self.max_lora_rank:
            raise ApiError(
                400,
                f"LoRA rank {facts.rank} of {path!r} is greater than the engines' max_lora_rank "
                f"{self.max_lora_rank}",
                param="lora_path",
                code="lora_rank_too_large",
            )
        base = self._base_model(body, facts)
        workers = [w for w in manager.workers if w.model_id == base and w.engine_client]
        if existing is None:
            self._check_capacity(base, workers)
        adapter = LoraAdapter(name, base, facts.path, int_id, facts.rank)
        req = adapter.request
        if body.load_inplace or body.is_3d_lora_weight:
            req = msgspec.structs.replace(
                req, load_inplace=body.load_inplace, is_3d_lora_weight=body.is_3d_lora_weight
            )
        answers = await call_engines(workers, "add_lora", (req,), self.bound())
        refused = [a for a in answers if a.error is not None or a.result is False]
        if refused:
            # nothing half-registered: take it back out of the engines that took it
            took = [a.worker for a in answers if a.error is None and a.result is not False]
            if took and existing is None:
                with trio.move_on_after(self.bound()):
                    await call_engines(took, "remove_lora", (int_id,), self.bound())
            first = refused[0]
            raise first.error or ApiError(
                400,
                f"worker {first.worker.worker_id} ({first.worker.url}) did not load the adapter",
                code="engine_refused",
            )
        if existing is not None:
            manager.loras.remove(name)
        manager.loras.add(adapter)
        for w in {a.worker for a in answers}:
            manager.lora_affinity.record(w, name)
        log.info("Loaded LoRA adapter %r (id %d) for %r from %s", name, int_id, base, facts.path)
        return f"Success: LoRA adapter '{name}' added successfully."

    async def unload(self, body: UnloadLoRAAdapterRequest) -> str:
        manager = self.manager
        name = body.lora_name
        if not name:
            raise ApiError(400, "'lora_name' needs to be provided to unload a LoRA adapter.")
        adapter = manager.loras.get(name)
        if adapter is None or (body.lora_int_id is not None and body.lora_int_id != adapter.int_id):
            raise ApiError(
                404,
                f"The lora adapter '{name}' cannot be found.",
                param="lora_name",
                code="model_not_found",
            )
        if name in self.busy:
            raise ApiError(409, f"lora adapter {name!r} is being loaded or unloaded", code="busy")
        inflight = manager.loras.inflight(name)
        if inflight:
            raise ApiError(
                409,
                f"lora adapter {name!r} is in use by {inflight} request(s); unload it once "
                "they finish",
                param="lora_name",
                code="lora_adapter_in_use",
            )
        self.busy.add(name)
        try:
            manager.loras.remove(name)  # new requests get the unknown-model 404 from now on
            manager.lora_affinity.forget(name)
            workers = [w for w in manager.workers if w.model_id == adapter.base_model]
            live = [w for w in workers if w.engine_client is not None and w.engine_client.alive]
            try:
                answers = await call_engines(live, "remove_lora", (adapter.int_id,), self.bound())
            except ApiError as exc:  # an engine that never answers: it is unloaded here anyway
                log.warning("unloading LoRA adapter %r: %s", name, exc.detail.message)
            else:
                for a in answers:
                    if a.error is not None:
                        log.warning("unloading LoRA adapter %r: %s", name, a.error.detail.message)
        finally:
            self.busy.discard(name)
        log.info("Removed LoRA adapter %r", name)
        return f"Success: LoRA adapter '{name}' removed successfully."


def add_lora_routes(
    bp: Blueprint,
    manager: WorkerManager,
    *,
    max_lora_rank: int | None = None,
    bound_s: float | None = None,
) -> None:
    """Add vLLM's ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` to the admin
    blueprint ``bp`` (so they need the admin key). ``max_lora_rank``: the engines' limit when
    known (``serve`` launched them), else the engines' ``add_lora`` is the judge. See
    docs/lora.md."""
    routes = _LoraRoutes(manager, max_lora_rank, bound_s)

    @bp.post("/v1/load_lora_adapter")
    async def load_lora_adapter() -> Response:
        try:
            body = await _body(LoadLoRAAdapterRequest)
            assert isinstance(body, LoadLoRAAdapterRequest)
            return _text(await routes.load(body))
        except ApiError as exc:
            return _error(exc)

    @bp.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter() -> Response:
        try:
            body = await _body(UnloadLoRAAdapterRequest)
            assert isinstance(body, UnloadLoRAAdapterRequest)
            return _text(await routes.unload(body))
        except ApiError as exc:
            return _error(exc)
