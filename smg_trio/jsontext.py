"""Client JSON decoded one way, msgspec's: UTF-8 only, no lone surrogates, bounded depth.

The request body is decoded by ``msgspec.json.decode`` (:func:`smg_trio.gateway.openai.schemas.
decode_body`), which refuses invalid UTF-8 and an unpaired ``\\ud800`` escape. JSON carried
inside a string field (``guided_json``, ``tool_calls[].function.arguments``, the admin API's
body) goes through :func:`loads` here, so it meets the same rules: Python's ``json.loads``
accepts lone surrogates, and the text then fails to encode much later, as a 500.
"""

from __future__ import annotations

from typing import Any

import msgspec

from smg_trio.errors import ValidationError

__all__ = ["TOO_DEEP", "loads"]

#: The message for JSON that nests deeper than the decoder can follow.
TOO_DEEP = "the request JSON is nested too deeply"


def loads(data: bytes | str, *, param: str | None, what: str | None = None) -> Any:
    """The JSON value in ``data``. Raises :class:`~smg_trio.errors.ValidationError` (400,
    ``json_parse_error``, ``param`` set) for malformed JSON, invalid UTF-8, a lone surrogate or
    nesting too deep; the message names ``what`` (default: ``param``)."""
    name = what or param or "the request body"
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise ValidationError(
            f"{name} is not valid JSON: {exc}", param=param, code="json_parse_error"
        ) from None
    except RecursionError:
        raise ValidationError(f"{name}: {TOO_DEEP}", param=param, code="json_parse_error") from None
