"""n>1 fan-out: sub-request ids and seeds, and driving sub-requests inside one nursery.

Every sub-request is its own ``async with client.generate(...)`` block, so leaving the block
early (a gateway-side stop, an error elsewhere, a client disconnect cancelling the nursery)
sends ABORT for exactly that sub-request.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
import trio

from smg_trio.connector.client import EngineClient
from smg_trio.connector.stream import RequestStream
from smg_trio.errors import RequestStreamClosed
from smg_trio.exc_groups import first_failure
from smg_trio.gateway.openai.errors import EngineRequestFailed
from smg_trio.gateway.openai.schemas import PromptTokensDetails, Usage
from smg_trio.gateway.openai.textgen import ChoicePipeline, TextDelta
from smg_trio.protocol.types import EngineOutput, GenerateRequest

__all__ = [
    "cached_tokens_of",
    "usage_of",
    "take_outputs",
    "SEED_MODULUS",
    "SubRequest",
    "derive_seed",
    "drive",
    "run_all",
    "sub_request_id",
]

#: Seeds are accepted below ``SEED_MODULUS`` (from 0 for TokenSpeed's u64, from ``-2**63``
#: for vLLM's int64) and derived so that they never overflow: valid for both.
SEED_MODULUS = 2**63


def derive_seed(seed: int | None, i: int) -> int | None:
    """Sub ``i``'s seed: ``seed + i`` (vLLM's rule), wrapped modulo ``2**63`` past the top of
    the range (a negative seed, vLLM's, stays ``seed + i``: it cannot overflow); ``None``
    stays ``None`` (each sub is seeded by the engine)."""
    if seed is None:
        return None
    derived = seed + i
    return derived % SEED_MODULUS if derived >= SEED_MODULUS else derived


def sub_request_id(base: str, index: int, total: int) -> str:
    """``base`` for a single choice, else ``f"{base}-{index}"``."""
    return base if total == 1 else f"{base}-{index}"


@attrs.define(eq=False)
class SubRequest:
    """One choice: the engine request and its text pipeline."""

    request: GenerateRequest
    pipeline: ChoicePipeline


#: Called with each sub-request's deltas, in order, from the engine output loop (must not
#: block).
OnDelta = Callable[[SubRequest, TextDelta], None]
#: Called once per engine batch before the batch is processed (TTFT bookkeeping).
OnBatch = Callable[[], None]


def take_outputs(stream: RequestStream) -> list[EngineOutput]:
    """Every output pending on ``stream`` (possibly none); not a checkpoint. Raises
    :class:`EngineRequestFailed` when the stream ended without a terminal output (a 499
    ``client_disconnected`` when it was retired because its client went away), and the
    stream's own error (``EngineDeadError``...) when it failed."""
    try:
        return stream.receive_nowait()
    except RequestStreamClosed:
        if stream.aborted:  # retired because its client is gone: the request ends as a 499
            raise EngineRequestFailed(
                "the client went away", "client_disconnected", status=499
            ) from None
        raise EngineRequestFailed(
            "the engine ended the request without finishing it", "engine_aborted"
        ) from None


class _Driver:
    """Feeds one sub-request's outputs to its pipeline from the engine output loop (the
    stream's waker), and wakes the driving task only when the choice has ended: a whole
    response costs one wake-up of its task, not one per engine batch."""

    __slots__ = ("ended", "error", "on_batch", "on_delta", "stream", "sub")

    def __init__(
        self, stream: RequestStream, sub: SubRequest, on_delta: OnDelta, on_batch: OnBatch
    ) -> None:
        self.stream = stream
        self.sub = sub
        self.on_delta = on_delta
        self.on_batch = on_batch
        self.ended = trio.Event()
        self.error: Exception | None = None

    def on_ready(self) -> None:
        """Run by the output loop: never blocks or raises (a failure is kept for the task)."""
        if self.ended.is_set():
            return
        pipeline = self.sub.pipeline
        try:
            outputs = take_outputs(self.stream)
            if not outputs:
                if self.stream.finished:  # the terminal output was consumed, not finished
                    raise EngineRequestFailed(
                        "the engine stream ended without a finish", "engine_aborted"
                    )
                return
            self.on_batch()
            # the steps taken together are one delta, as vLLM's output collector merges a
            # stream's outputs when its consumer fell behind the engine
            delta = pipeline.feed(outputs)
            if delta is not None:
                self.on_delta(self.sub, delta)
            if pipeline.failure is not None:
                raise pipeline.failure
        except Exception as exc:
            self.error = exc
            self.ended.set()
            return
        if pipeline.done:
            self.ended.set()
        elif self.stream.ended:  # it ended out of band after these outputs: no wake-up follows
            self.on_ready()


async def drive(
    client: EngineClient, sub: SubRequest, on_delta: OnDelta, on_batch: OnBatch
) -> None:
    """Run one sub-request to its finish. A stop string ends the block at once, so the
    connector ABORTs the engine request; so does any exception or cancellation.

    ``on_batch`` and ``on_delta`` run in the engine output loop (:class:`_Driver`), so they
    must not block. Raises :class:`EngineRequestFailed` (engine error/abort finish or an
    out-of-band end), ``EngineDeadError``, and whatever ``client.generate`` raises before
    sending.
    """
    async with client.generate(sub.request) as stream:
        driver = _Driver(stream, sub, on_delta, on_batch)
        stream.set_waker(driver.on_ready)
        try:
            driver.on_ready()  # what arrived before the waker was set
            await driver.ended.wait()
        finally:
            stream.set_waker(None)
        if driver.error is not None:
            raise driver.error


async def run_all(
    client: EngineClient, subs: Sequence[SubRequest], on_delta: OnDelta, on_batch: OnBatch
) -> None:
    """Drive every sub-request to its finish: inline for one, else one nursery with a task
    per sub. The first failure cancels (and so ABORTs) the others and is re-raised as
    itself, not as an exception group."""
    if len(subs) == 1:
        await drive(client, subs[0], on_delta, on_batch)
        return
    try:
        async with trio.open_nursery() as nursery:
            for sub in subs:
                nursery.start_soon(drive, client, sub, on_delta, on_batch)
    except BaseExceptionGroup as group:
        raise first_failure(group) from None


def cached_tokens_of(subs: Sequence[SubRequest], per_prompt: int = 1) -> int:
    """The prompt tokens the engines found cached, once per prompt (the first of each
    prompt's ``per_prompt`` choices, as the prompt itself is counted once); 0 where an engine
    reported none."""
    return sum(s.pipeline.cached_tokens or 0 for s in subs[::per_prompt])


def usage_of(
    prompt_tokens: int,
    subs: Sequence[SubRequest],
    *,
    details: bool = False,
    per_prompt: int = 1,
) -> Usage:
    """OpenAI ``usage``: the prompt counted once, completion tokens summed over the choices;
    with ``details`` (``--enable-prompt-tokens-details``, as vLLM's server),
    ``prompt_tokens_details.cached_tokens`` too."""
    completion = sum(s.pipeline.completion_tokens for s in subs)
    usage = Usage(prompt_tokens, completion, prompt_tokens + completion)
    if details:
        usage.prompt_tokens_details = PromptTokensDetails(cached_tokens_of(subs, per_prompt))
    return usage
