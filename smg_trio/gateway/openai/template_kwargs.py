"""The chat template's variables as vLLM 0.32 merges them: ``--default-chat-template-kwargs``, the request's ``chat_template_kwargs``, its ``reasoning_effort``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["merge_template_kwargs"]


def _merge(defaults: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's ``merge_kwargs``: an override of ``None`` or ``"auto"`` leaves the default."""
    return {**defaults, **{k: v for k, v in overrides.items() if not _unset(v)}}


def _unset(value: object) -> bool:
    return value is None or (isinstance(value, str) and value == "auto")


def merge_template_kwargs(
    request: Mapping[str, Any] | None,
    *,
    reasoning_effort: str | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> dict[str, Any] | None:
    """The kwargs the template renders with (``None``: none), as vLLM 0.32's
    ``build_chat_params`` and ``ChatParams.with_defaults`` make them: ``reasoning_effort``
    (when set) overrides the request's ``chat_template_kwargs`` and, unless those name
    ``enable_thinking``, sets it to ``reasoning_effort != "none"``; the server's defaults
    come under the request's (a request value of ``None`` or ``"auto"`` keeps the default)."""
    user = dict(request or {})
    extras: dict[str, Any] = {"reasoning_effort": reasoning_effort}
    if reasoning_effort is not None and "enable_thinking" not in user:
        extras["enable_thinking"] = reasoning_effort != "none"
    merged = _merge(user, extras)
    if defaults:
        merged = _merge(defaults, merged)
    return merged if merged or request is not None else None
