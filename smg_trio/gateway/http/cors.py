"""CORS as vLLM 0.32 configures Starlette's ``CORSMiddleware`` (``--allowed-origins`` etc.)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from smg_trio.gateway.server.direct import SERVER_SEND_KEY

__all__ = ["ALL_METHODS", "Cors"]

Scope = dict[str, Any]
#: What ``--allowed-methods '*'`` stands for (Starlette's expansion, 1.x's with ``QUERY``).
ALL_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "QUERY")
#: A preflight's ``Vary``: every request header it reads (Starlette 1.x).
_PREFLIGHT_VARY = (
    b"Origin, Access-Control-Request-Method, Access-Control-Request-Headers, "
    b"Access-Control-Request-Private-Network"
)
_MAX_AGE = b"600"


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value)
    return None


class Cors:
    """Wrap an ASGI ``app``. A preflight (``OPTIONS`` with ``Origin`` and
    ``Access-Control-Request-Method``) is answered here: 200 for an allowed origin, else 400
    naming what is not allowed (the origin, the method, a header, private network access),
    as Starlette's ``CORSMiddleware`` that vLLM always installs (no origin allowed by
    default). Any
    other request from an allowed origin gets ``Access-Control-Allow-Origin`` (``*``, or the
    origin itself with credentials or a list), ``Vary: Origin`` and, with credentials,
    ``Access-Control-Allow-Credentials`` (such a response is written through ASGI ``send``,
    not directly to the socket). Requests without an ``Origin`` header (API clients) are
    untouched, so they keep the gateway's direct writes."""

    def __init__(
        self,
        app: Any,
        origins: Sequence[str] = (),
        methods: Sequence[str] = ("*",),
        headers: Sequence[str] = ("*",),
        credentials: bool = False,
    ) -> None:
        self.app = app
        self.any_origin = "*" in origins
        self.origins = frozenset(origins)
        self.methods = ALL_METHODS if "*" in methods else tuple(m.upper() for m in methods)
        self.any_header = "*" in headers
        self.headers = frozenset(h.lower() for h in headers)
        self.credentials = credentials

    def _allowed(self, origin: str) -> bool:
        return self.any_origin or origin in self.origins

    def _origin_value(self, origin: bytes) -> bytes:
        return b"*" if self.any_origin and not self.credentials else origin

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        raw = _header(scope, b"origin") if scope.get("type") == "http" else None
        if raw is None:
            await self.app(scope, receive, send)
            return
        allowed = self._allowed(raw.decode("latin-1"))
        if scope.get("method") == "OPTIONS":
            asked = _header(scope, b"access-control-request-method")
            if asked is not None:  # a preflight, allowed or not (Starlette's order)
                await self._preflight(raw, allowed, asked, scope, send)
                return
        if not allowed:
            await self.app(scope, receive, send)
            return
        extra = [(b"access-control-allow-origin", self._origin_value(raw))]
        if not (self.any_origin and not self.credentials):
            extra.append((b"vary", b"Origin"))
        if self.credentials:
            extra.append((b"access-control-allow-credentials", b"true"))

        async def cors_send(message: dict[str, Any]) -> None:
            if message.get("type") == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        # The head must pass through cors_send: no direct socket writes for this response.
        ext = {k: v for k, v in (scope.get("extensions") or {}).items() if k != SERVER_SEND_KEY}
        await self.app({**scope, "extensions": ext}, receive, cors_send)

    async def _preflight(
        self, origin: bytes, allowed: bool, asked: bytes, scope: Scope, send: Any
    ) -> None:
        wanted = _header(scope, b"access-control-request-headers") or b""
        names = [h.strip().lower() for h in wanted.decode("latin-1").split(",") if h.strip()]
        failures = [] if allowed else ["origin"]
        if asked.decode("latin-1").upper() not in self.methods:
            failures.append("method")
        if not self.any_header and any(h not in self.headers for h in names):
            failures.append("headers")
        if _header(scope, b"access-control-request-private-network") is not None:
            # Private Network Access: vLLM leaves Starlette's allow_private_network off
            failures.append("private-network")
        allow_headers = wanted if self.any_header else ", ".join(sorted(self.headers)).encode()
        headers = [
            (b"access-control-allow-methods", ", ".join(self.methods).encode()),
            (b"access-control-max-age", _MAX_AGE),
            (b"vary", _PREFLIGHT_VARY),
            (b"content-type", b"text/plain; charset=utf-8"),
        ]
        if allowed:
            value = origin if self.credentials or not self.any_origin else b"*"
            headers.insert(0, (b"access-control-allow-origin", value))
        if allow_headers:
            headers.append((b"access-control-allow-headers", allow_headers))
        if self.credentials:
            headers.append((b"access-control-allow-credentials", b"true"))
        body = f"Disallowed CORS {', '.join(failures)}".encode() if failures else b"OK"
        headers.append((b"content-length", str(len(body)).encode()))
        await send(
            {"type": "http.response.start", "status": 400 if failures else 200, "headers": headers}
        )
        await send({"type": "http.response.body", "body": body})
