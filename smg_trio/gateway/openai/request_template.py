"""A request's own chat template (vLLM's ``chat_template`` field and
``chat_template_kwargs.chat_template``): refused unless ``--trust-request-chat-template``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from smg_trio.errors import ValidationError
from smg_trio.gateway.openai.schemas import ChatCompletionRequest
from smg_trio.tokenizer import ChatTemplate, request_template

__all__ = ["check_request_template", "split_request_template"]

#: vLLM 0.32's words (renderers/online_renderer.py ``validate_chat_template``).
UNTRUSTED = (
    "Chat template is passed with request, but --trust-request-chat-template is not set. "
    "Refused request with untrusted chat template."
)


def _kwargs_template(kwargs: Mapping[str, Any] | None) -> Any:
    return kwargs.get("chat_template") if isinstance(kwargs, Mapping) else None


def check_request_template(body: ChatCompletionRequest, trusted: bool) -> None:
    """400 for a request that brings its own template when the server does not trust them
    (vLLM's rule and message), or for one that is not a string."""
    from_kwargs = _kwargs_template(body.chat_template_kwargs)
    if body.chat_template is None and from_kwargs is None:
        return
    param = "chat_template" if body.chat_template is not None else "chat_template_kwargs"
    if not trusted:
        raise ValidationError(UNTRUSTED, param=param, code="untrusted_chat_template")
    if from_kwargs is not None and not isinstance(from_kwargs, str):
        raise ValidationError(
            "chat_template_kwargs.chat_template must be a string",
            param="chat_template_kwargs.chat_template",
        )


def split_request_template(
    body: ChatCompletionRequest, content_format: str
) -> tuple[ChatTemplate | None, dict[str, Any] | None]:
    """The request's own template, compiled in the sandbox (``None``: the model's), and the
    ``chat_template_kwargs`` left for the template's variables. The ``chat_template`` field
    wins over ``chat_template_kwargs.chat_template``, as in vLLM. Checked by
    :func:`check_request_template` first."""
    kwargs = body.chat_template_kwargs
    source = body.chat_template
    if isinstance(kwargs, Mapping) and "chat_template" in kwargs:
        if source is None:
            source = kwargs["chat_template"]
        kwargs = {k: v for k, v in kwargs.items() if k != "chat_template"}
    if source is None:
        return None, kwargs
    return request_template(source, content_format), kwargs
