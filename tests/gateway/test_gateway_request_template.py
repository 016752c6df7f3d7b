"""A request's own chat template (vLLM's ``chat_template`` and
``chat_template_kwargs.chat_template``): a 400 with vLLM's words unless the server trusts them
(``--trust-request-chat-template``), else rendered in the sandbox."""

from __future__ import annotations

from typing import Any

import trio

from smg_trio.gateway.config import GatewayHttpConfig
from tests.helpers.gateway import DEADLINE_S, HarnessFactory, steps_of

TEMPLATE = "T:{% for m in messages %}{{ m.content }}{% endfor %}"


async def test_untrusted_request_template_is_refused(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            for extra in (
                {"chat_template": TEMPLATE},
                {"chat_template_kwargs": {"chat_template": TEMPLATE}},
            ):
                resp = await h.chat(max_tokens=2, **extra)
                assert resp.status_code == 400, resp.text
                err = resp.json()["error"]
                assert "--trust-request-chat-template is not set" in err["message"]
                assert err["param"] == next(iter(extra))
            assert h.engine.requests == []


async def test_trusted_request_template_renders(harness: HarnessFactory, tok: Any) -> None:
    config = GatewayHttpConfig(trust_request_chat_template=True)
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "ok"), config=config) as h:
            for extra in (
                {"chat_template": TEMPLATE},
                {"chat_template_kwargs": {"chat_template": TEMPLATE}},
            ):
                resp = await h.chat(max_tokens=2, **extra)
                assert resp.status_code == 200, resp.text
                assert h.engine.requests[-1].prompt_token_ids == tok.encode("T:hi")
            bad = await h.chat(max_tokens=2, chat_template="{% for %}")
            assert bad.status_code == 400
            assert bad.json()["error"]["param"] == "chat_template"
            escape = await h.chat(max_tokens=2, chat_template="{{ ''.__class__.__mro__ }}")
            assert escape.status_code == 400
            assert len(h.engine.requests) == 2
