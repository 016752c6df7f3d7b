"""``GET /v1/models`` and ``GET /v1/models/<id>``."""

from __future__ import annotations

import msgspec

from smg_trio.backend import GatewayBackend, ServedModel
from smg_trio.gateway.openai.errors import model_not_found
from smg_trio.gateway.openai.schemas import ModelCard, ModelList

__all__ = ["model_card", "model_detail", "model_list"]


def model_card(m: ServedModel) -> ModelCard:
    """One model's card (``max_model_len`` in tokens)."""
    return ModelCard(
        id=m.model_id,
        created=m.created,
        owned_by=m.owned_by,
        root=m.model_id,
        max_model_len=m.max_model_len,
    )


def model_list(backend: GatewayBackend) -> bytes:
    """The JSON list of the models with a ready worker (a model whose workers are all still
    registering, or all gone, is not listed, although requests for it wait for one)."""
    return msgspec.json.encode(ModelList(data=[model_card(m) for m in backend.list_models()]))


def model_detail(backend: GatewayBackend, model_id: str) -> bytes:
    """One listed model's JSON card. Raises ``ApiError`` 404 ``model_not_found`` for a model
    :func:`model_list` does not list."""
    m = next((m for m in backend.list_models() if m.model_id == model_id), None)
    if m is None:
        raise model_not_found(model_id)
    return msgspec.json.encode(model_card(m))
