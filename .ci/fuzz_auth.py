"""The keyed pass of .ci/fuzz.sh: every operation that /openapi.json marks as secured refuses a
missing or wrong key with a 401 OpenAI envelope and accepts the right one; public ones stay
open; plus two bad-input probes (a non-UTF-8 body on every POST, a WebSocket upgrade).

Usage: python .ci/fuzz_auth.py BASE_URL KEY. Prints one line per failure; exit 1 if any.
"""

from __future__ import annotations

import base64
import sys
from typing import Any

import httpx
from fuzz_checks import api_envelope_problem

#: Authorization headers that must all be refused (None: no header at all).
WRONG = {
    "no key": None,
    "wrong key": "Bearer wrong-{key}",
    "key with a suffix": "Bearer {key}x",
    "no scheme": "{key}",
    "basic scheme": "Basic {b64}",
    "bare scheme": "Bearer",
}


def _operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    out = []
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            url = path
            for param in op.get("parameters", ()):
                if param["in"] == "path":
                    url = url.replace("{" + param["name"] + "}", "fuzz-missing")
            out.append((method.upper(), url, op))
    return out


def _send(
    client: httpx.Client, method: str, url: str, op: dict[str, Any], auth: str | None, body: bytes
) -> httpx.Response:
    headers = {"content-type": "application/json"}
    if auth is not None:
        headers["authorization"] = auth
    content = body if "requestBody" in op else None
    return client.request(method, url, headers=headers, content=content)


def check(base: str, key: str) -> list[str]:
    """Every failure, as a line."""
    failures: list[str] = []
    b64 = base64.b64encode(f"user:{key}".encode()).decode()
    with httpx.Client(base_url=base, timeout=10.0) as client:
        doc_resp = client.get("/openapi.json")
        if doc_resp.status_code != 200:
            return [f"GET /openapi.json without a key: {doc_resp.status_code} (must be public)"]
        ops = _operations(doc_resp.json())
        good = f"Bearer {key}"
        for method, url, op in ops:
            label = f"{method} {url}"
            if not op.get("security"):
                resp = _send(client, method, url, op, None, b"{}")
                if resp.status_code in (401, 403) or resp.status_code >= 500:
                    failures.append(f"{label} (public) without a key: {resp.status_code}")
                continue
            for what, template in WRONG.items():
                auth = None if template is None else template.format(key=key, b64=b64)
                resp = _send(client, method, url, op, auth, b"{}")
                if resp.status_code != 401:
                    failures.append(f"{label} with {what}: {resp.status_code}, not 401")
                elif problem := api_envelope_problem(url, resp.status_code, resp.content):
                    failures.append(f"{label} with {what}: {problem}")
            resp = _send(client, method, url, op, good, b"{}")
            if resp.status_code in (401, 403):
                failures.append(f"{label} with the right key: {resp.status_code}")
        # bad-input probes with the right key: a 4xx envelope, never a 5xx (a non-UTF-8 body
        # on the routes that read one; /ping and the engine control routes take none, as vLLM's)
        probes: list[tuple[str, str, dict[str, Any], dict[str, str], bytes]] = [
            (m, u, op, {}, b'{"model": "\xff\xfe"}')
            for m, u, op in ops
            if m == "POST" and op.get("requestBody")
        ]
        upgrade = {"connection": "Upgrade", "upgrade": "websocket", "sec-websocket-version": "13",
                   "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ=="}  # fmt: skip
        probes.append(("GET", "/v1/models", {}, upgrade, b""))
        for method, url, _op, extra, body in probes:
            what = "a WebSocket upgrade" if extra else "a non-UTF-8 body"
            headers = {"authorization": good, "content-type": "application/json", **extra}
            try:
                resp = client.request(method, url, headers=headers, content=body or None)
            except httpx.HTTPError as exc:
                failures.append(f"{method} {url} with {what}: {type(exc).__name__}: {exc}")
                continue
            if not 400 <= resp.status_code < 500:
                failures.append(f"{method} {url} with {what}: {resp.status_code}, not a 4xx")
            elif problem := api_envelope_problem(url, resp.status_code, resp.content):
                failures.append(f"{method} {url} with {what}: {problem}")
        print(f"keyed pass: {len(ops)} operations, {len(probes)} bad-input probes")
    return failures


def main(argv: list[str]) -> int:
    base, key = argv
    failures = check(base, key)
    for line in failures:
        print(f"FAIL {line}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
