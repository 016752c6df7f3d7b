"""The server-sent-event response body that drives the engine stream and writes its chunks.

The body is a Quart ``ResponseBody`` (an async context manager), so the n>1 fan-out nursery is
opened in ``__aenter__`` and closed in ``__aexit__`` by the task that writes the response: a
client disconnect cancels that task, which cancels every sub-request (each sends ABORT).
For n=1 the engine output loop renders each batch as it arrives, and on a plain HTTP/1.1
connection, once the response head is out, writes the chunk itself
(:mod:`smg_trio.gateway.server.direct`): no task wake-up per chunk. The writer task only wakes for the
end of the stream, an error, or what could not be written at once (TLS, HTTP/2, HTTP/1.0, a
full socket); it sends that through ASGI, coalesced, with the usual backpressure. For n>1 each
sub-request's deltas are rendered into the outbox the same way and the writer sends them.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from types import TracebackType

import trio
from quart import Response
from quart.wrappers.response import ResponseBody

from smg_trio.connector.client import EngineClient
from smg_trio.connector.stream import RequestStream
from smg_trio.gateway.http.call import SSE_HEADERS, RequestCall
from smg_trio.gateway.openai.errors import to_api_error
from smg_trio.gateway.openai.fanout import SubRequest, drive, take_outputs
from smg_trio.gateway.openai.framing import StreamRenderer, stream_done, stream_error
from smg_trio.gateway.openai.textgen import TextDelta
from smg_trio.gateway.server.direct import DirectWriter

__all__ = ["StreamBody", "sse_response", "sse_whole"]

_START, _RUN, _DONE = 0, 1, 2


class StreamBody(ResponseBody):
    """The SSE body of one request: drives ``subs`` on ``client`` and yields frames.

    The call is closed (lease released, metrics recorded) when the body exits, or by
    :meth:`release` if Quart never entered it.
    """

    def __init__(
        self,
        call: RequestCall,
        client: EngineClient,
        subs: Sequence[SubRequest],
        renderer: StreamRenderer,
    ) -> None:
        self._call = call
        self._client = client
        self._subs = subs
        self._renderer = renderer
        self._done = stream_done(renderer)
        self._state = _START
        self._error: BaseException | None = None
        # n == 1: the writer owns the generate block.
        self._gen: AbstractAsyncContextManager[RequestStream] | None = None
        self._stream: RequestStream | None = None
        # n > 1: sub tasks render into the outbox and wake the writer.
        self._nursery_cm: AbstractAsyncContextManager[trio.Nursery] | None = None
        self._scopes = [trio.CancelScope() for _ in subs] if len(subs) > 1 else []
        self._outbox: list[bytes] = []
        self._remaining = len(subs)
        self._lot = trio.lowlevel.ParkingLot()
        # n == 1: the output loop renders (and, when ``_direct_on``, writes) each batch.
        self._waker_on = False
        self._direct: DirectWriter | None = None
        self._direct_on = False
        self._raw_tail = b""  # the unwritten tail of a partially written chunk
        self._ended = False  # the choice finished; its last frames are written or queued

    def attach(self, direct: DirectWriter | None) -> None:
        """Offer the connection's :class:`~smg_trio.gateway.server.direct.DirectWriter` (``None``: ASGI sends only)."""
        self._direct = direct if len(self._subs) == 1 else None

    # -- lifecycle -----------------------------------------------------------------------

    async def __aenter__(self) -> StreamBody:
        if len(self._subs) > 1:
            cm = trio.open_nursery()
            nursery = await cm.__aenter__()
            self._nursery_cm = cm
            for sub, scope in zip(self._subs, self._scopes, strict=True):
                nursery.start_soon(self._run_sub, sub, scope)
        else:
            await self.submit()
        return self

    async def submit(self) -> None:
        """n == 1: send the engine request now, before the response head is written, so the
        engine starts while the gateway writes (the handler calls this; entering the body
        does it otherwise). Idempotent; a failure is reported in the stream."""
        if len(self._subs) > 1 or self._gen is not None or self._error is not None:
            return
        try:
            self._gen = gen = self._client.generate(self._subs[0].request)
            self._stream = await gen.__aenter__()
        except Exception as exc:
            self._gen = None
            self._error = exc

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self._close_generate()
            cm, self._nursery_cm = self._nursery_cm, None
            if cm is not None:
                for scope in self._scopes:
                    scope.cancel()
                # The nursery's own scope is never cancelled, so it never swallows ``exc``.
                await cm.__aexit__(exc_type, exc, tb)
        finally:
            self._finish(exc)

    async def release(self) -> None:
        """Close the call if the body was never run (the client vanished before it started):
        an engine request already submitted is retired and ABORTed."""
        if self._state == _START:
            self._state = _DONE
            await self._close_generate()
            self._call.close(499, "client_disconnected")

    def _finish(self, exc: BaseException | None) -> None:
        self._state = _DONE
        if exc is not None:
            self._call.close_from_exit(exc)
        elif self._error is not None:
            err = to_api_error(self._error)
            # the head went out as a 200; a client that went away is still a 499
            status = 499 if err.status == 499 else 200
            self._call.close(status, err.detail.code, self._error)
            _forget_tracebacks(self._error)
        else:
            self._call.close(200)

    # -- iteration -----------------------------------------------------------------------

    def __aiter__(self) -> StreamBody:
        return self

    async def __anext__(self) -> bytes:
        if self._state == _DONE:
            raise StopAsyncIteration
        if self._state == _START:
            self._state = _RUN
            if self._error is not None:  # the submit failed: no role chunk, just the error
                self._state = _DONE
                return stream_error(self._renderer, self._error) + self._done
            head = self._renderer.start()
            if head:
                return head
        try:
            if self._nursery_cm is None:
                return await self._next_single()
            return await self._next_multi()
        except Exception as exc:
            self._state = _DONE
            self._error = exc
            await self._close_generate()
            for scope in self._scopes:
                scope.cancel()
            pending = b"".join(self._outbox)
            self._outbox.clear()
            return pending + stream_error(self._renderer, exc) + self._done

    async def _next_single(self) -> bytes:
        """n == 1: the engine output loop renders every batch (:meth:`_on_ready`) and, once
        the response head is out on a plain HTTP/1.1 connection, writes it too. This task only
        wakes for what the output loop hands it: a partial chunk's tail, data that could not be
        written directly, the end of the choice, or an error."""
        stream = self._stream
        assert stream is not None
        if not self._waker_on:
            self._waker_on = True
            self._go_direct()
            stream.set_waker(self._on_ready)
            self._on_ready()  # what arrived before the waker was set
        while True:
            if self._raw_tail:
                tail, self._raw_tail = self._raw_tail, b""
                assert self._direct is not None
                await self._direct.send_raw(tail)
                continue
            if self._error is not None:
                raise self._error
            if self._ended:
                await self._close_generate()  # a gateway-side stop ABORTs the engine here
                self._state = _DONE
                data = b"".join(self._outbox)
                self._outbox.clear()
                return data
            if self._outbox:
                data = b"".join(self._outbox)
                self._outbox.clear()
                return data
            self._go_direct()
            await self._lot.park()

    def _go_direct(self) -> None:
        """Start direct writes once the connection allows them (the head is out, chunked)."""
        if not self._direct_on and self._direct is not None and self._direct.chunked():
            self._direct_on = True

    def _on_ready(self) -> None:
        """Run by the engine output loop when this stream has outputs (or ended): render
        them and write the chunk to the socket now if that cannot block; else hand it to the
        writer task. Never raises: a failure is stored for the writer task to report."""
        if self._ended or self._error is not None:
            return
        stream = self._stream
        assert stream is not None
        sub = self._subs[0]
        pipeline = sub.pipeline
        try:
            outputs = take_outputs(stream)
            if not outputs:
                return
            self._call.on_batch()
            # Several steps taken together (this stream fell behind the engine) are one
            # event, as vLLM's output collector merges a consumer's pending deltas.
            delta = pipeline.feed(outputs)
            data = b"" if delta is None else self._renderer.delta(sub, delta)
            if pipeline.done:
                # The last frames go out now too, with the body's end where the server can;
                # the writer task only ends the response (and ABORTs the engine after a
                # gateway-side stop).
                self._write_or_queue(data + self._renderer.end() + self._done, last=True)
                self._ended = True
                self._lot.unpark_all()
                return
            if pipeline.failure is not None:  # its text goes out before the error
                self._outbox.append(data)
                raise pipeline.failure
        except Exception as exc:
            self._error = exc
            self._lot.unpark_all()
            return
        if data:
            self._write_or_queue(data)
        # It ended out of band after these outputs: no other wake-up follows, so look once
        # more. (A stream retired here, its client gone, is ended by the writer task.)
        if stream.ended and not stream.aborted:
            self._on_ready()

    def _write_or_queue(self, data: bytes, *, last: bool = False) -> None:
        """Write ``data`` to the socket now if direct writes are on, nothing is queued before
        it and that cannot block (``last``: the body's last data, with its end where the
        server can); else queue it (or its unwritten tail) and wake the writer."""
        if self._direct_on and not self._outbox and not self._raw_tail:
            assert self._direct is not None
            direct = self._direct
            tail = direct.try_write_last(data) if last else direct.try_write(data)
            if tail is not None:
                if tail:
                    self._raw_tail = tail
                    self._lot.unpark_all()
                return
            if direct.broken:
                self._client_gone()
        self._outbox.append(data)
        self._lot.unpark_all()

    def _client_gone(self) -> None:
        """A direct write found the client gone: ABORT the engine request now, from the output
        loop (coalesced with the batch's other ABORTs), rather than after this request's task
        has been woken, failed its write and unwound. The writer still ends the response."""
        stream = self._stream
        assert stream is not None
        stream.set_waker(None)
        self._direct_on = False
        self._client.abort_nowait([stream.request_id])

    async def _next_multi(self) -> bytes:
        while True:
            if self._error is not None:
                raise self._error
            if self._outbox:
                data = b"".join(self._outbox)
                self._outbox.clear()
                if self._remaining == 0:
                    self._state = _DONE
                    data += self._renderer.end() + self._done
                return data
            if self._remaining == 0:
                self._state = _DONE
                return self._renderer.end() + self._done
            await self._lot.park()

    async def _run_sub(self, sub: SubRequest, scope: trio.CancelScope) -> None:
        try:
            with scope:
                await drive(self._client, sub, self._on_delta, self._call.on_batch)
        except Exception as exc:
            if self._error is None:
                self._error = exc
            for other in self._scopes:
                other.cancel()
        finally:
            self._remaining -= 1
            self._lot.unpark_all()

    def _on_delta(self, sub: SubRequest, delta: TextDelta) -> None:
        self._outbox.append(self._renderer.delta(sub, delta))
        self._lot.unpark_all()

    async def _close_generate(self) -> None:
        gen, self._gen = self._gen, None
        if self._stream is not None:
            self._stream.set_waker(None)
        if gen is not None:
            await gen.__aexit__(None, None, None)


def _event_stream(body: bytes | StreamBody, request_id: str) -> Response:
    return Response(
        body,
        status=200,
        content_type="text/event-stream; charset=utf-8",
        headers={**SSE_HEADERS, "x-request-id": request_id},
    )


async def sse_response(
    call: RequestCall, client: EngineClient, subs: Sequence[SubRequest], renderer: StreamRenderer
) -> Response:
    """The 200 ``text/event-stream`` response whose body drives ``subs`` through ``renderer``.
    A single choice is submitted to the engine here, before the response is sent."""
    body = StreamBody(call, client, subs, renderer)
    await body.submit()
    return _event_stream(body, call.request_id)


def sse_whole(call: RequestCall, data: bytes) -> Response:
    """The 200 ``text/event-stream`` response of a stream known in full before it is sent
    (closes the call)."""
    call.close(200)
    return _event_stream(data, call.request_id)


def _forget_tracebacks(exc: BaseException) -> None:
    """Drop the tracebacks of ``exc`` and of the exceptions it chains, once it is reported.

    A stored error's traceback holds the frames it crossed (the output loop's ``_on_ready``,
    the abort path that woke it), whose ``self`` holds the error again: a reference cycle
    that kept each failed stream's whole request (about 120 objects) alive until a full
    collection. After a disconnect storm that collection took hundreds of milliseconds
    (every ABORT of the round waited for it) and RSS grew with every storm
    (``bench/abort_storm.py --gc-log``)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = None
        todo += (e.__context__, e.__cause__)
        if isinstance(e, BaseExceptionGroup):
            todo += e.exceptions
