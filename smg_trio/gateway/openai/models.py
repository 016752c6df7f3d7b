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


def _cards(backend: GatewayBackend) -> list[ModelCard]:
    """The listed models, each followed by its LoRA adapters (``root`` the adapter's path,
    ``parent`` the base model, as vLLM lists them)."""
    cards = []
    for m in backend.list_models():
        cards.append(model_card(m))
        cards += [
            ModelCard(
                id=a.name,
                created=m.created,
                owned_by=m.owned_by,
                root=a.path,
                parent=m.model_id,
                max_model_len=m.max_model_len,
            )
            for a in backend.loras.for_base(m.model_id)
        ]
    return cards


def model_list(backend: GatewayBackend) -> bytes:
    """The JSON list of the models with a ready worker (a model whose workers are all still
    registering, or all gone, is not listed, although requests for it wait for one), and
    their LoRA adapters."""
    return msgspec.json.encode(ModelList(data=_cards(backend)))


def model_detail(backend: GatewayBackend, model_id: str) -> bytes:
    """One listed model's JSON card. Raises ``ApiError`` 404 ``model_not_found`` for a model
    :func:`model_list` does not list."""
    card = next((c for c in _cards(backend) if c.id == model_id), None)
    if card is None:
        raise model_not_found(model_id)
    return msgspec.json.encode(card)
