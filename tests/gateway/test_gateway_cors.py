"""CORS with vLLM 0.32's flags and defaults (its Starlette ``CORSMiddleware``): no allowed
origin by default (no CORS headers), a preflight answered for an allowed origin, the allow
headers on the actual response, credentials only when asked."""

from __future__ import annotations

from typing import Any

import trio

from smg_trio.gateway.config import GatewayHttpConfig
from tests.helpers.gateway import DEADLINE_S, HarnessFactory, steps_of

SITE = "https://app.example"
PREFLIGHT = {
    "origin": SITE,
    "access-control-request-method": "POST",
    "access-control-request-headers": "authorization, content-type",
}
BODY = {"model": "M", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


async def test_no_cors_by_default(harness: HarnessFactory, tok: Any) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "x")) as h:
            res = await h.post("/v1/chat/completions", BODY, headers={"origin": SITE})
            assert res.status_code == 200
            assert "access-control-allow-origin" not in res.headers
            pre = await h.http.options("/v1/chat/completions", headers=PREFLIGHT)
            assert "access-control-allow-origin" not in pre.headers


async def test_allowed_origin_gets_preflight_and_headers(harness: HarnessFactory, tok: Any) -> None:
    config = GatewayHttpConfig(allowed_origins=(SITE,), allow_credentials=True)
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "x"), config=config) as h:
            pre = await h.http.options("/v1/chat/completions", headers=PREFLIGHT)
            assert pre.status_code == 200
            assert pre.headers["access-control-allow-origin"] == SITE
            assert "POST" in pre.headers["access-control-allow-methods"]
            assert pre.headers["access-control-allow-headers"] == "authorization, content-type"
            assert pre.headers["access-control-allow-credentials"] == "true"
            for stream in (False, True):
                res = await h.post(
                    "/v1/chat/completions", {**BODY, "stream": stream}, headers={"origin": SITE}
                )
                assert res.status_code == 200
                assert res.headers["access-control-allow-origin"] == SITE
                assert res.headers["vary"] == "Origin"
            other = await h.post(
                "/v1/chat/completions", BODY, headers={"origin": "https://evil.example"}
            )
            assert "access-control-allow-origin" not in other.headers
            bad = await h.http.options(
                "/v1/chat/completions",
                headers={**PREFLIGHT, "origin": "https://evil.example"},
            )
            assert "access-control-allow-origin" not in bad.headers


async def test_any_origin_without_credentials_is_a_star(harness: HarnessFactory, tok: Any) -> None:
    config = GatewayHttpConfig(allowed_origins=("*",), allowed_methods=("GET",))
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "x"), config=config) as h:
            res = await h.http.get("/v1/models", headers={"origin": SITE})
            assert res.headers["access-control-allow-origin"] == "*"
            assert "access-control-allow-credentials" not in res.headers
            pre = await h.http.options("/v1/chat/completions", headers=PREFLIGHT)
            assert pre.status_code == 400  # POST is not an allowed method


async def test_a_preflight_from_an_origin_not_allowed_is_refused_as_vllm_does(
    harness_both: HarnessFactory, tok: Any
) -> None:
    """vLLM 0.32 always installs Starlette's ``CORSMiddleware`` (with no origin allowed by
    default): a preflight from an origin it does not allow is a 400 ``Disallowed CORS
    origin`` in plain text, without ``Access-Control-Allow-Origin``, whether no origin is
    allowed (the default, where the gateway has no CORS layer on its request path) or
    others are. A method not allowed is named too. Requests that are not preflights are
    answered as before."""
    for origins in ((), ("https://other.example",)):
        config = GatewayHttpConfig(allowed_origins=origins, allowed_methods=("GET", "POST"))
        with trio.fail_after(DEADLINE_S):
            async with harness_both(plan=lambda r: steps_of(tok, "x"), config=config) as h:
                for path in ("/v1/chat/completions", "/health", "/v1/models"):
                    pre = await h.http.options(path, headers=PREFLIGHT)
                    assert pre.status_code == 400, (origins, path)
                    assert pre.text == "Disallowed CORS origin"
                    assert pre.headers["content-type"] == "text/plain; charset=utf-8"
                    assert "access-control-allow-origin" not in pre.headers
                    assert pre.headers["access-control-allow-methods"] == "GET, POST"
                put = await h.http.options(
                    "/v1/models", headers={**PREFLIGHT, "access-control-request-method": "PUT"}
                )
                assert put.text == "Disallowed CORS origin, method"
                res = await h.post("/v1/chat/completions", BODY, headers={"origin": SITE})
                assert res.status_code == 200
                assert "access-control-allow-origin" not in res.headers
                plain = await h.http.options("/v1/models", headers={"origin": SITE})
                assert plain.status_code != 400  # not a preflight: the app's own answer


async def test_a_private_network_preflight_is_refused_as_vllm_does(
    harness: HarnessFactory, tok: Any
) -> None:
    """Chrome's Private Network Access: a public site's preflight to a gateway on a private
    address asks ``Access-Control-Request-Private-Network``. vLLM's Starlette
    ``CORSMiddleware`` (``allow_private_network`` off, vLLM sets no flag for it) refuses it
    even from an allowed origin: 400 ``Disallowed CORS private-network``. Its preflights vary
    on every request header they read, and ``'*'`` methods include ``QUERY``."""
    config = GatewayHttpConfig(allowed_origins=(SITE,))
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "x"), config=config) as h:
            ok = await h.http.options("/v1/chat/completions", headers=PREFLIGHT)
            assert ok.status_code == 200
            assert ok.headers["vary"] == (
                "Origin, Access-Control-Request-Method, Access-Control-Request-Headers, "
                "Access-Control-Request-Private-Network"
            )
            assert ok.headers["access-control-allow-methods"] == (
                "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT, QUERY"
            )
            pna = await h.http.options(
                "/v1/chat/completions",
                headers={**PREFLIGHT, "access-control-request-private-network": "true"},
            )
            assert pna.status_code == 400
            assert pna.text == "Disallowed CORS private-network"
            assert "access-control-allow-private-network" not in pna.headers
