"""Issue 18, item 4: no request can stall others or exhaust memory.

Large prompts are rendered and tokenized in a worker thread; a prompt that cannot fit the
context is refused before it is encoded; per-request sequence and token budgets; the global
concurrency cap (429 with ``Retry-After``); the write timeout for a client that stops reading;
the listen backlog from ``somaxconn``.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from smg_trio.gateway.config import REQUEST_TOKENS_CONTEXTS, GatewayHttpConfig
from smg_trio.gateway.http import app as gateway_app
from smg_trio.gateway.http.app import gateway_of
from smg_trio.gateway.http.call import (
    BODY_RESERVE_STEP,
    RENDER_OFFLOAD_TOKENS,
    TOKENIZE_OFFLOAD_BYTES,
)
from smg_trio.tokenizer import Tokenizer
from smg_trio.tokenizer.bound import min_tokens
from smg_trio.tokenizer.prefix import prefix_chars
from tests.gateway.test_gateway_direct import WriteSpy
from tests.helpers.gateway import DEADLINE_S, HarnessFactory
from tests.helpers.raw_sse import RawSSE

MAIN = threading.main_thread().ident
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


class EncodeSpy:
    """Records the thread of every encode and chat-template render of ``tok``."""

    def __init__(self, tok: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
        self.encodes: list[int] = []  # thread idents
        self.renders: list[int] = []
        real_encode = tok._encode_batch
        real_render = tok.apply_chat_template

        def encode(texts: Any, **kw: Any) -> Any:
            self.encodes.append(threading.get_ident())
            return real_encode(texts, **kw)

        def render(*args: Any, **kw: Any) -> str:
            self.renders.append(threading.get_ident())
            return real_render(*args, **kw)

        monkeypatch.setattr(tok, "_encode_batch", encode)
        monkeypatch.setattr(tok, "apply_chat_template", render)


def _err(resp: Any) -> dict[str, Any]:
    err: dict[str, Any] = resp.json()["error"]
    return err


async def _refused_for_context(h: Any, path: str, text: str) -> dict[str, Any]:
    """Send ``text`` as the chat message or the completions prompt; assert the 400
    ``context_length_exceeded`` naming the prompt's field; return the error."""
    if path == CHAT:
        resp = await h.chat(messages=[{"role": "user", "content": text}])
    else:
        resp = await h.complete(prompt=text)
    assert resp.status_code == 400, resp.text
    err = _err(resp)
    assert err["code"] == "context_length_exceeded"
    assert err["param"] == ("messages" if path == CHAT else "prompt")
    return err


# -- tokenization off the event loop ------------------------------------------------------


async def test_large_chat_prompt_is_rendered_and_encoded_in_a_thread(
    harness: HarnessFactory, tok: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prompt above the offload size is rendered and tokenized in a worker thread, so the
    event loop (and every other request) keeps running; a small one stays inline."""
    spy = EncodeSpy(tok, monkeypatch)
    big = "lighthouse keeper " * (2 * TOKENIZE_OFFLOAD_BYTES // 18)
    with trio.fail_after(DEADLINE_S):
        async with harness(max_model_len=65536) as h:
            small = await h.chat(max_tokens=2)
            assert small.status_code == 200
            assert spy.encodes == [MAIN]
            assert spy.renders == [MAIN]
            resp = await h.chat(messages=[{"role": "user", "content": big}], max_tokens=2)
            assert resp.status_code == 200, resp.text
            assert resp.json()["usage"]["prompt_tokens"] > 1000
    assert len(spy.encodes) == len(spy.renders) == 2
    assert spy.encodes[1] is not MAIN
    assert spy.renders[1] is not MAIN


async def test_a_large_whole_response_is_built_off_the_event_loop(
    harness: HarnessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A non-streamed response of many completion tokens (n choices with top_logprobs: the
    breaker's 93 MB answer froze /health for 5 s) is built and encoded in a worker thread; a
    small one stays inline."""
    from smg_trio.gateway.openai.chat import ChatJob

    threads: list[int | None] = []
    result = ChatJob.result

    def spy(self: ChatJob, collected: Any) -> Any:
        threads.append(threading.get_ident())
        return result(self, collected)

    monkeypatch.setattr(ChatJob, "result", spy)
    n = 4
    per_choice = RENDER_OFFLOAD_TOKENS // n + 1
    with trio.fail_after(DEADLINE_S):
        async with harness(max_model_len=65536) as h:
            assert (await h.chat(max_tokens=2)).status_code == 200
            resp = await h.chat(
                max_tokens=per_choice, n=n, logprobs=True, top_logprobs=5, ignore_eos=True
            )
            assert resp.status_code == 200, resp.text
            assert resp.json()["usage"]["completion_tokens"] >= RENDER_OFFLOAD_TOKENS
    assert threads[0] == MAIN
    assert threads[1] != MAIN


async def test_large_completion_prompts_are_encoded_in_a_thread(
    harness: HarnessFactory, tok: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = EncodeSpy(tok, monkeypatch)
    big = "lighthouse keeper " * (TOKENIZE_OFFLOAD_BYTES // 18)
    with trio.fail_after(DEADLINE_S):
        async with harness(max_model_len=65536) as h:
            resp = await h.complete(prompt=[big, big], max_tokens=2)
            assert resp.status_code == 200, resp.text
    assert len(spy.encodes) == 2
    assert all(t is not MAIN for t in spy.encodes)


# -- early refusal ----------------------------------------------------------------------------


def _too_long(tok: Tokenizer, ctx: int) -> str:
    bound = tok.max_token_chars
    assert bound is not None  # byte-level BPE: a bound exists
    return "a" * (bound * ctx + 1)


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
async def test_prompt_that_cannot_fit_is_refused_before_encoding(
    harness: HarnessFactory, tok: Tokenizer, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """More characters than ``max_token_chars * max_model_len``: the prompt has more tokens
    than the context for sure; the 400 comes without encoding it."""
    spy = EncodeSpy(tok, monkeypatch)
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            text = _too_long(tok, h.served.max_model_len)
            err = await _refused_for_context(h, path, text)
            assert "maximum context length is" in err["message"]
            assert h.engine.requests == []
    assert spy.encodes == []


async def test_max_tokens_above_the_context_is_refused_before_encoding(
    harness: HarnessFactory, tok: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM 0.32's renderer check (``build_tok_params``): a ``max_tokens`` (or chat's
    ``max_completion_tokens``) above ``max_model_len`` is a 400 naming it, in vLLM's words,
    before the prompt is encoded."""
    spy = EncodeSpy(tok, monkeypatch)
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            ctx = h.served.max_model_len
            resp = await h.complete(prompt="a" * 1000, max_tokens=ctx + 1)
            assert resp.status_code == 400, resp.text
            assert _err(resp)["param"] == "max_tokens"
            assert f"cannot be greater than max_model_len={ctx}" in _err(resp)["message"]
            resp = await h.chat(max_completion_tokens=ctx + 1)
            assert _err(resp)["param"] == "max_completion_tokens"
            body = {"model": "M", "input": "hi", "max_output_tokens": ctx + 1}
            resp = await h.http.post("/v1/responses", json=body)
            assert _err(resp)["param"] == "max_output_tokens"
            assert h.engine.requests == []
    assert spy.encodes == []


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
async def test_max_tokens_above_the_context_left_is_clamped(
    harness: HarnessFactory, path: str
) -> None:
    """vLLM 0.32's ``get_max_tokens``: ``max_tokens`` above what the prompt leaves of the
    context is clamped to it, not refused (chat and completions, as Messages)."""
    with trio.fail_after(DEADLINE_S):
        async with harness(eos_after=2) as h:
            ctx = h.served.max_model_len
            text = "hello " * 10
            if path == CHAT:
                resp = await h.chat(messages=[{"role": "user", "content": text}], max_tokens=ctx)
            else:
                resp = await h.complete(prompt=text, max_tokens=ctx)
            assert resp.status_code == 200, resp.text
            sent = h.engine.requests[-1]
            assert sent.max_tokens == ctx - len(sent.prompt_token_ids)


async def test_token_id_prompt_longer_than_the_context_is_refused_directly(
    harness: HarnessFactory,
) -> None:
    """A token-id prompt is measured before its ids are checked one by one (the bad id at
    the end is never looked at)."""
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            ctx = h.served.max_model_len
            ids = [5] * ctx + [h.tok.vocab_size + 7]
            resp = await h.complete(prompt=ids)
            assert resp.status_code == 400, resp.text
            assert _err(resp)["code"] == "context_length_exceeded"
            assert _err(resp)["param"] == "prompt"


class LengthSpy:
    """Records the length of every text ``tok`` encodes whole and every prefix it encodes
    for the prefix bound (:meth:`Tokenizer.min_tokens`)."""

    def __init__(self, tok: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
        self.whole: list[int] = []
        self.prefixes: list[int] = []
        real_whole, real_prefix = tok._encode_batch, tok._encode_words

        def whole(texts: Any, **kw: Any) -> Any:
            self.whole.append(len(texts[0]))
            return real_whole(texts, **kw)

        def prefix(texts: Any, **kw: Any) -> Any:
            self.prefixes.append(len(texts[0]))
            return real_prefix(texts, **kw)

        monkeypatch.setattr(tok, "_encode_batch", whole)
        monkeypatch.setattr(tok, "_encode_words", prefix)


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
async def test_prompt_whose_prefix_overflows_is_refused_without_a_full_encode(
    harness: HarnessFactory, tok: Tokenizer, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """Fewer characters than ``max_token_chars * max_model_len`` (the character bound lets it
    by) but a prefix of it already has more tokens than the context: refused with the same
    400, and the prompt is never encoded whole (memory: issue 18, item 4)."""
    spy = LengthSpy(tok, monkeypatch)
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            ctx = h.served.max_model_len
            text = ("lighthouse keeper " * ctx)[: 10 * ctx]
            assert min_tokens(len(text), tok.max_token_chars) < ctx
            err = await _refused_for_context(h, path, text)
            assert "the prompt has at least" in err["message"]
            assert h.engine.requests == []
    assert spy.whole == []
    assert spy.prefixes
    assert max(spy.prefixes) <= prefix_chars(ctx) < len(text)


async def test_sparse_prompt_past_the_prefix_that_fits_is_served(
    harness: HarnessFactory, tok: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prompt longer than the judged prefix whose tokens are long enough to fit: the
    prefix proves nothing, so it is encoded whole and served (nothing that fits is refused)."""
    spy = LengthSpy(tok, monkeypatch)
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            ctx = h.served.max_model_len
            count = ctx - 200
            text = " assistant" * count  # one 10-character token each
            assert len(text) > prefix_chars(ctx)
            resp = await h.complete(prompt=text, max_tokens=2)
            assert resp.status_code == 200, resp.text
            assert resp.json()["usage"]["prompt_tokens"] >= count
    assert spy.prefixes
    assert spy.whole == [len(text)]


def test_max_token_chars_bounds_every_token(tok: Tokenizer) -> None:
    """The bound is the longest token in characters (byte-level: one char per byte)."""
    vocab = tok.hf.get_vocab(with_added_tokens=True)
    assert tok.max_token_chars == max(len(t) for t in vocab)


# -- per-request limits -----------------------------------------------------------------------


async def test_too_many_sequences_is_a_400_naming_n(harness: HarnessFactory) -> None:
    config = GatewayHttpConfig(max_sequences_per_request=10)
    with trio.fail_after(DEADLINE_S):
        async with harness(config=config) as h:
            resp = await h.complete(prompt=["a", "b", "c", "d"], n=3, max_tokens=2)
            assert resp.status_code == 400, resp.text
            assert _err(resp)["param"] == "n"
            assert "4 prompts x n=3" in _err(resp)["message"]
            ok = await h.complete(prompt=["a", "b", "c", "d", "e"], n=2, max_tokens=2)
            assert ok.status_code == 200, ok.text
            assert len(h.engine.requests) == 10


async def test_default_sequence_limit_refuses_the_fan_out_of_the_report(
    harness: HarnessFactory,
) -> None:
    """128 prompts x n=16 (2048 sequences) was accepted; the default limit refuses it."""
    config = GatewayHttpConfig(max_n=16)
    with trio.fail_after(DEADLINE_S):
        async with harness(config=config) as h:
            resp = await h.complete(prompt=["x"] * 128, n=16)
            assert resp.status_code == 400, resp.text
            assert _err(resp)["param"] == "n"
            assert h.engine.requests == []


async def test_token_budget_is_a_400_naming_max_tokens(harness: HarnessFactory) -> None:
    config = GatewayHttpConfig(max_tokens_per_request=100)
    with trio.fail_after(DEADLINE_S):
        async with harness(config=config) as h:
            resp = await h.chat(n=2, max_tokens=60)
            assert resp.status_code == 400, resp.text
            assert _err(resp)["param"] == "max_tokens"
            resp = await h.chat(n=2, max_completion_tokens=60)
            assert _err(resp)["param"] == "max_completion_tokens"
            ok = await h.chat(n=2, max_tokens=50)
            assert ok.status_code == 200, ok.text


async def test_unset_max_tokens_counts_the_rest_of_the_context(harness: HarnessFactory) -> None:
    """Without max_tokens each sequence may use the rest of the context (vLLM), and that is
    what counts toward the default budget of 16 contexts per request."""
    with trio.fail_after(DEADLINE_S):
        async with harness(eos_after=2) as h:  # the accepted one ends early, on EOS
            prompts = ["hello"] * (REQUEST_TOKENS_CONTEXTS + 1)
            resp = await h.complete(prompt=prompts)
            assert resp.status_code == 400, resp.text
            assert _err(resp)["param"] == "max_tokens"
            assert h.engine.requests == []
            ok = await h.complete(prompt=prompts[:REQUEST_TOKENS_CONTEXTS])
            assert ok.status_code == 200, ok.text


# -- the concurrency cap ----------------------------------------------------------------------


def _stream_body(max_tokens: int = 3000) -> dict[str, Any]:
    return {"model": "M", "prompt": "hello", "max_tokens": max_tokens, "stream": True}


async def test_concurrency_cap_with_no_queue_is_429_with_retry_after(
    harness: HarnessFactory,
) -> None:
    config = GatewayHttpConfig(max_concurrent_requests=1, queue_size=0)
    with trio.fail_after(DEADLINE_S):
        async with harness(config=config, step_s=0.01, max_model_len=8192) as h:
            held = await RawSSE.post(h.base_url, COMPLETIONS, _stream_body())
            await held.until(lambda evs: len(evs) >= 1)  # in flight, holding the only slot
            resp = await h.complete(max_tokens=2)
            assert resp.status_code == 429, resp.text
            assert resp.headers["retry-after"] == "1"
            err = _err(resp)
            assert err["type"] == "rate_limit_error"
            assert err["code"] == "too_many_requests"
            assert len(h.engine.requests) == 1
            metrics = (await h.http.get("/metrics")).text
            assert "smg_router_requests_rejected_total 1.0" in metrics
            await held.aclose()


async def test_a_slot_is_taken_before_the_body_is_read(harness: HarnessFactory) -> None:
    """Bodies in memory are bounded by the admission limits (the breaker held 60 bodies of
    32 MiB, 2 GB, with --max-concurrent-requests 8): an upload that has not finished holds its
    slot, so another request gets its 429 before a byte of its body is read."""
    config = GatewayHttpConfig(max_concurrent_requests=1, queue_size=0)
    with trio.fail_after(DEADLINE_S):
        async with harness(config=config) as h:
            gate = gateway_app.gateway_of(h.app).admission
            host, port = h.base_url.removeprefix("http://").rsplit(":", 1)
            async with await trio.open_tcp_stream(host, int(port)) as upload:
                size = 1 << 20
                await upload.send_all(
                    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                    b"Content-Type: application/json\r\n"
                    + f"Content-Length: {size}\r\n\r\n".encode()
                    + b'{"model": "M", "prompt": "'
                )
                while gate.active < 1:  # the unfinished upload holds the only slot
                    await trio.lowlevel.checkpoint()
                resp = await h.complete(max_tokens=2)
                assert resp.status_code == 429, resp.text
            assert len(h.engine.requests) == 0


async def test_queued_request_gets_429_when_no_slot_frees(harness: HarnessFactory) -> None:
    config = GatewayHttpConfig(max_concurrent_requests=1, queue_size=4, queue_timeout_s=0.05)
    with trio.fail_after(DEADLINE_S):
        async with harness(config=config, step_s=0.01, max_model_len=8192) as h:
            held = await RawSSE.post(h.base_url, COMPLETIONS, _stream_body())
            await held.until(lambda evs: len(evs) >= 1)
            resp = await h.chat(max_tokens=2)
            assert resp.status_code == 429, resp.text
            assert resp.headers["retry-after"] == "1"
            assert "no slot freed" in _err(resp)["message"]
            await held.aclose()


async def test_queued_request_is_served_once_a_slot_frees(harness: HarnessFactory) -> None:
    config = GatewayHttpConfig(max_concurrent_requests=1, queue_timeout_s=DEADLINE_S)
    with trio.fail_after(DEADLINE_S):
        async with harness(config=config, step_s=0.01, max_model_len=8192) as h:
            gate = h.app.extensions["smg_trio.gateway"].admission
            held = await RawSSE.post(h.base_url, COMPLETIONS, _stream_body())
            await held.until(lambda evs: len(evs) >= 1)
            result: list[int] = []

            async def queued() -> None:
                result.append((await h.complete(max_tokens=2)).status_code)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(queued)
                while gate.waiting == 0:  # noqa: ASYNC110 (a counter; no event to wait on)
                    await trio.sleep(0.01)
                assert "smg_router_queue_depth 1.0" in (await h.http.get("/metrics")).text
                await held.aclose()
            assert result == [200]


# -- the write timeout ------------------------------------------------------------------------


async def test_client_that_stops_reading_is_dropped_and_its_request_aborted(
    harness_both: HarnessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A streaming client that never reads (small receive buffer, small server send buffer):
    the blocked write is dropped after the write timeout, the engine gets ABORT and the
    registry empties, long before the engine would have finished."""
    spy = WriteSpy(monkeypatch, sndbuf=4096)
    config = GatewayHttpConfig(write_timeout_s=0.3)
    with trio.fail_after(4 * DEADLINE_S):
        async with harness_both(config=config, step_s=0.0005, max_model_len=65536) as h:
            sse = await RawSSE.post(
                h.base_url,
                CHAT,
                {
                    "model": "M",
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 60000,
                    "stream": True,
                },
                rcvbuf=4096,
            )
            try:
                await spy.fell_back.wait()  # the socket is full; the writer task now blocks
                while not h.engine.aborts:
                    await h.engine.abort_event.wait()
                assert len(h.engine.requests) == 1
                # the ABORT, and perhaps a re-ABORT for outputs the engine sent before it
                # read the first (the connector re-ABORTs an id whose outputs still arrive)
                assert set(h.engine.aborts) == {h.engine.requests[0].request_id}
                assert h.client.inflight_count == 0  # retired before the ABORT was sent
            finally:
                await sse.aclose()


# -- listen backlog ---------------------------------------------------------------------------


def test_listen_backlog_is_somaxconn(tmp_path: Path) -> None:
    path = tmp_path / "somaxconn"
    path.write_text("8191\n")
    assert gateway_app.listen_backlog(str(path)) == 8191
    assert gateway_app.listen_backlog(str(tmp_path / "missing")) == gateway_app.DEFAULT_BACKLOG
    real = Path(gateway_app.SOMAXCONN_PATH)
    expected = int(real.read_text()) if real.exists() else gateway_app.DEFAULT_BACKLOG
    assert gateway_app.hyper_config("127.0.0.1", 0, 1.0).backlog == expected


async def test_the_body_budget_refuses_what_cannot_fit(harness: HarnessFactory) -> None:
    """``max_body_bytes_in_flight`` (docs/security.md, "Memory"): a body whose decoded form
    alone is over the budget is a 413; one that finds the budget held by a request in flight
    is a 429 with ``Retry-After`` (no wait with ``queue_timeout_s=0``); once that request
    ends, its bytes are back and the same body is served."""
    config = GatewayHttpConfig(max_body_bytes_in_flight=12_000, queue_timeout_s=0.0)
    with trio.fail_after(DEADLINE_S):
        async with harness(config=config) as h:
            gw = gateway_of(h.app)
            ok = await h.post("/v1/tokenize", {"model": "M", "prompt": "hi"})
            assert ok.status_code == 200, ok.text
            assert gw.body_budget.held == 0
            big = await h.post("/v1/tokenize", {"model": "M", "messages": [{}] * 100})
            assert big.status_code == 413, big.text
            assert big.json()["error"]["code"] == "request_too_large"
            h.engine.stall()  # the stream below holds its reservation until it ends
            held = {
                "model": "M",
                "stream": True,
                "messages": [{"role": "user", "content": "x" * 3000}],
            }
            async with h.http.stream("POST", "/v1/chat/completions", json=held) as stream:
                assert stream.status_code == 200
                assert gw.body_budget.held > 6000  # the body, and its decoded form
                busy = await h.post("/v1/tokenize", {"model": "M", "prompt": "y" * 2000})
                assert busy.status_code == 429, busy.text
                assert busy.headers["retry-after"] == "1"
                assert busy.json()["error"]["code"] == "too_many_requests"
            h.engine.resume()
            await trio.testing.wait_all_tasks_blocked()  # the client went: the call closed
            assert gw.body_budget.held == 0
            again = await h.post("/v1/tokenize", {"model": "M", "prompt": "y" * 2000})
            assert again.status_code == 200, again.text


async def test_a_body_of_no_declared_length_holds_only_what_it_needs(
    harness: HarnessFactory,
) -> None:
    """A chunked body (no ``Content-Length``) reserves ``max_body_bytes`` while it is read,
    then keeps only what it and its decoded form need: a stream in flight holds kilobytes of
    the budget, not 32 MiB (which would let 32 such requests hold all of the default 1 GiB)."""
    body = b'{"model": "M", "stream": true, "messages": [{"role": "user", "content": "hi"}]}'

    async def chunks() -> Any:
        yield body[:10]
        yield body[10:]

    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            gw = gateway_of(h.app)
            h.engine.stall()
            headers = {"content-type": "application/json"}
            async with h.http.stream(
                "POST", "/v1/chat/completions", content=chunks(), headers=headers
            ) as stream:
                assert stream.status_code == 200
                assert 0 < gw.body_budget.held < 16 * 1024
            h.engine.resume()


async def test_slow_uploads_hold_what_they_sent_not_what_they_declared(
    harness: HarnessFactory,
) -> None:
    """A slowloris upload (a large ``Content-Length``, then a trickle) holds at most
    ``BODY_RESERVE_STEP`` of the body budget beyond the bytes it has sent: a few slow clients
    declaring the largest body each held all of it (32 of them the default 1 GiB for the whole
    ``body_timeout_s``), and every other request got 429."""
    config = GatewayHttpConfig(
        max_body_bytes=100_000, max_body_bytes_in_flight=200_000, queue_timeout_s=0.0
    )
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100000\r\n\r\n" + b'{"model": "M", "prompt": "'
    )
    with trio.fail_after(DEADLINE_S):
        async with harness(config=config) as h:
            budget = gateway_app.gateway_of(h.app).body_budget
            host, port = h.base_url.removeprefix("http://").rsplit(":", 1)
            async with (
                await trio.open_tcp_stream(host, int(port)) as slow1,
                await trio.open_tcp_stream(host, int(port)) as slow2,
            ):
                for slow in (slow1, slow2):
                    held = budget.held
                    await slow.send_all(head)
                    while budget.held == held:  # its reservation is made
                        await trio.lowlevel.checkpoint()
                assert budget.held <= 2 * BODY_RESERVE_STEP
                resp = await h.post("/v1/tokenize", {"model": "M", "prompt": "hi"})
                assert resp.status_code == 200, resp.text
            while budget.held:  # the uploads went: their bytes are back
                await trio.lowlevel.checkpoint()
