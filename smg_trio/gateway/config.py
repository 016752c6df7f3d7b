"""``GatewayHttpConfig``: the HTTP front's limits, auth and request-id settings."""

from __future__ import annotations

import attrs

__all__ = ["DEFAULT_REQUEST_ID_HEADERS", "GatewayHttpConfig"]

#: smg's default ``--request-id-headers``: the first one present names the request.
DEFAULT_REQUEST_ID_HEADERS = ("x-request-id", "x-correlation-id", "x-trace-id", "request-id")


def _lower(headers: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    return tuple(h.lower() for h in headers)


def _positive(_: object, attr: attrs.Attribute[int], value: int) -> None:
    if value < 1:
        raise ValueError(f"{attr.name} must be >= 1, got {value}")


@attrs.frozen(kw_only=True)
class GatewayHttpConfig:
    """Settings of :func:`~smg_trio.gateway.app.create_app`. All limits are inclusive.

    - ``max_n``: the largest ``n`` accepted (default 10, as smg; OpenAI allows 128). Larger
      ``n`` is a 400 naming ``n``.
    - ``max_top_logprobs``: cap on chat ``top_logprobs`` and completions ``logprobs``
      (default 20, OpenAI's chat limit); the engine's own cap applies on top of it.
    - ``max_prompts``: most prompts in one batched ``/v1/completions`` request.
    - ``max_body_bytes``: largest request body (413 above it).
    - ``api_key``: when set, ``/v1/*`` needs ``Authorization: Bearer <api_key>`` (401).
    - ``request_id_headers``: lower-case header names tried in order for the request id,
      which is echoed in ``x-request-id``; when none is present one is generated.
    - ``reasoning_parser``: parser name used for models whose ``ServedModel`` names none
      (``None``: no reasoning split).
    - ``body_timeout_s``: seconds to receive a request body (408 past it).
    """

    max_n: int = attrs.field(default=10, validator=_positive)
    max_top_logprobs: int = attrs.field(default=20)
    max_prompts: int = attrs.field(default=128, validator=_positive)
    max_body_bytes: int = attrs.field(default=32 * 1024 * 1024, validator=_positive)
    api_key: str | None = None
    request_id_headers: tuple[str, ...] = attrs.field(
        default=DEFAULT_REQUEST_ID_HEADERS, converter=_lower
    )
    reasoning_parser: str | None = None
    body_timeout_s: float = 60.0

    @max_top_logprobs.validator
    def _check_top(self, _: attrs.Attribute[int], value: int) -> None:
        if value < 0:
            raise ValueError(f"max_top_logprobs must be >= 0, got {value}")
