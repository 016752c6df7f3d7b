"""HTTP plumbing for cases: the run context, bounded request/reply reads, and JSON helpers."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

from conformance.case import CaseFailed

__all__ = ["Context", "Reply", "json_bytes", "normalise_base_url"]

JsonObj = dict[str, Any]


def json_bytes(value: object) -> bytes:
    """Serialise ``value`` to compact UTF-8 JSON."""
    return json.dumps(value, separators=(",", ":")).encode()


def normalise_base_url(base_url: str) -> str:
    """Strip a trailing slash and a trailing ``/v1`` (OpenAI SDKs use the ``/v1`` form)."""
    url = base_url.rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return url


@dataclass(frozen=True, slots=True)
class Reply:
    """A fully read HTTP response."""

    status: int
    headers: httpx.Headers
    body: bytes
    elapsed_s: float

    @property
    def content_type(self) -> str:
        """The ``Content-Type`` header, lower-cased ("" when absent)."""
        return str(self.headers.get("content-type", "")).lower()

    def snippet(self, limit: int = 200) -> str:
        """The start of the body as text, for failure messages."""
        text = self.body[:limit].decode("utf-8", errors="replace")
        return text + ("..." if len(self.body) > limit else "")

    def json(self) -> Any:
        """The body parsed as JSON; a :class:`CaseFailed` when it is not JSON."""
        try:
            return json.loads(self.body)
        except ValueError:
            raise CaseFailed(
                f"HTTP {self.status} body is not JSON (content-type {self.content_type!r}): "
                f"{self.snippet()!r}"
            ) from None

    def json_object(self) -> JsonObj:
        """The body parsed as a JSON object; a :class:`CaseFailed` otherwise."""
        value = self.json()
        if not isinstance(value, dict):
            raise CaseFailed(
                f"HTTP {self.status} body is JSON but not an object: {self.snippet()!r}"
            )
        return value


@dataclass
class Context:
    """Where and how to talk to the gateway under test, shared by all cases of one run."""

    base_url: str
    model: str
    api_key: str | None = None
    timeout_s: float = 60.0
    abandon_after_s: float = 0.3
    _client: httpx.Client | None = field(default=None, repr=False)
    _memo: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.base_url = normalise_base_url(self.base_url)

    # -- lifecycle ---------------------------------------------------------------------------

    def auth_headers(self) -> dict[str, str]:
        """The Authorization header, when an API key was given."""
        return {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def new_client(self, timeout_s: float | None = None) -> httpx.Client:
        """A fresh client with this run's base URL, auth and timeout (caller closes it)."""
        return httpx.Client(
            base_url=self.base_url,
            headers=self.auth_headers(),
            timeout=httpx.Timeout(self.timeout_s if timeout_s is None else timeout_s),
            follow_redirects=False,
        )

    @property
    def client(self) -> httpx.Client:
        """The shared keep-alive client, created on first use."""
        if self._client is None:
            self._client = self.new_client()
        return self._client

    def close(self) -> None:
        """Close the shared client."""
        if self._client is not None:
            self._client.close()
            self._client = None

    def memo(self, key: str) -> Any:
        """A value cached by an earlier case of this run, or None."""
        return self._memo.get(key)

    def remember(self, key: str, value: Any) -> None:
        """Cache ``value`` for later cases of this run."""
        self._memo[key] = value

    # -- requests ----------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        client: httpx.Client | None = None,
    ) -> Reply:
        """Send a request and read the whole body, failing if it takes longer than the timeout.

        httpx's timeouts bound each network operation; the extra deadline here bounds the total,
        so a server that trickles bytes forever cannot hang the run.
        """
        limit = self.timeout_s if timeout_s is None else timeout_s
        started = time.monotonic()
        deadline = started + limit
        http = client or self.client
        with http.stream(
            method, path, content=content, headers=dict(headers or {}), timeout=limit
        ) as resp:
            parts: list[bytes] = []
            for chunk in resp.iter_bytes():
                parts.append(chunk)
                if time.monotonic() > deadline:
                    raise CaseFailed(
                        f"{method} {path}: body still incomplete after {limit:g}s "
                        f"(HTTP {resp.status_code}, {sum(map(len, parts))} bytes so far)"
                    )
            return Reply(
                status=resp.status_code,
                headers=resp.headers,
                body=b"".join(parts),
                elapsed_s=time.monotonic() - started,
            )

    def post_json(
        self,
        path: str,
        body: object,
        *,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        client: httpx.Client | None = None,
    ) -> Reply:
        """POST ``body`` as ``application/json``."""
        merged = {"content-type": "application/json", **dict(headers or {})}
        return self.request(
            "POST",
            path,
            content=json_bytes(body),
            headers=merged,
            timeout_s=timeout_s,
            client=client,
        )

    @contextmanager
    def open_stream(
        self, path: str, body: object, *, client: httpx.Client
    ) -> Iterator[httpx.Response]:
        """POST ``body`` and yield the response unread, for cases that abandon it midway."""
        with client.stream(
            "POST",
            path,
            content=json_bytes(body),
            headers={"content-type": "application/json"},
        ) as resp:
            yield resp

    # -- request bodies ----------------------------------------------------------------------

    def chat_body(self, **extra: Any) -> JsonObj:
        """A small deterministic chat request for the model under test, plus ``extra``."""
        body: JsonObj = {
            "model": self.model,
            "messages": [{"role": "user", "content": "Count from one to twenty in words."}],
            "temperature": 0,
            "max_tokens": 12,
        }
        body.update(extra)
        return body

    def completion_body(self, **extra: Any) -> JsonObj:
        """A small deterministic completions request for the model under test, plus ``extra``."""
        body: JsonObj = {
            "model": self.model,
            "prompt": "The first ten prime numbers are",
            "temperature": 0,
            "max_tokens": 12,
        }
        body.update(extra)
        return body
