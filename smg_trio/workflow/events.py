"""Workflow lifecycle events and their fan-out to bounded memory-channel subscribers."""

from __future__ import annotations

import enum
import logging

import attrs
import trio

__all__ = ["EventBus", "EventKind", "WorkflowEvent"]

logger = logging.getLogger(__name__)

#: Default per-subscriber buffer, in events. A registration run emits about 30, so this holds
#: the full history of dozens of concurrent runs before a subscriber that stopped reading loses any.
DEFAULT_SUBSCRIBER_BUFFER = 1024


class EventKind(enum.StrEnum):
    """What happened (smg ``WorkflowEvent`` variants)."""

    WORKFLOW_STARTED = "workflow_started"
    WORKFLOW_COMPLETED = "workflow_completed"
    WORKFLOW_FAILED = "workflow_failed"
    WORKFLOW_CANCELLED = "workflow_cancelled"
    STEP_STARTED = "step_started"
    STEP_SUCCEEDED = "step_succeeded"
    STEP_FAILED = "step_failed"
    STEP_SKIPPED = "step_skipped"
    STEP_RETRYING = "step_retrying"
    STEP_CANCELLED = "step_cancelled"


@attrs.frozen
class WorkflowEvent:
    """One lifecycle event.

    Attributes:
        kind: What happened.
        workflow_id: The definition's id.
        instance_id: The run's id.
        time: ``trio.current_time()`` when it happened, in seconds.
        step_id: The step, for ``STEP_*`` kinds.
        attempt: ``STEP_STARTED``: the attempt starting (1-based). ``STEP_RETRYING``: the
            attempt that just failed. Terminal step kinds: attempts made.
        delay_s: ``STEP_RETRYING``: seconds until the next attempt.
        error: ``"ExceptionType: message"`` for failures and retries; the reason for skips.
    """

    kind: EventKind
    workflow_id: str
    instance_id: str
    time: float
    step_id: str | None = None
    attempt: int | None = None
    delay_s: float | None = None
    error: str | None = None


class EventBus:
    """Fans events out to subscribers without ever blocking the publisher.

    Delivery uses ``send_nowait``. A subscriber whose buffer is full *loses the new event*:
    the drop is counted (``dropped``) and logged as a warning on the first drop and every
    1000th after, per subscriber. The engine therefore never waits on a slow subscriber
    (smg isolates subscribers with a task and a 30 s timeout per event instead). A subscriber
    that closes its receive channel is unsubscribed at the next publish.
    """

    def __init__(self) -> None:
        self._subscribers: list[_Subscriber] = []
        self._closed = False
        self.dropped = 0
        """Events dropped across all subscribers since creation."""

    def subscribe(
        self, max_buffer: int = DEFAULT_SUBSCRIBER_BUFFER
    ) -> trio.MemoryReceiveChannel[WorkflowEvent]:
        """A new channel receiving every event published from now on.

        Args:
            max_buffer: Events buffered for this subscriber before new ones are dropped (>= 1).

        Raises:
            ValueError: ``max_buffer < 1``.
            trio.ClosedResourceError: the bus was closed.
        """
        if max_buffer < 1:
            raise ValueError(f"max_buffer must be >= 1, got {max_buffer}")
        if self._closed:
            raise trio.ClosedResourceError("the workflow event bus is closed")
        send, receive = trio.open_memory_channel[WorkflowEvent](max_buffer)
        self._subscribers.append(_Subscriber(send))
        return receive

    def publish(self, event: WorkflowEvent) -> None:
        """Deliver ``event`` to every subscriber that has room. Never blocks, never raises."""
        if self._closed:
            return
        gone: list[_Subscriber] = []
        for sub in self._subscribers:
            try:
                sub.send.send_nowait(event)
            except trio.WouldBlock:
                sub.dropped += 1
                self.dropped += 1
                if sub.dropped % 1000 == 1:
                    logger.warning(
                        "workflow event subscriber is not keeping up; dropped %d event(s) so far "
                        "(latest: %s)",
                        sub.dropped,
                        event.kind,
                    )
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                gone.append(sub)
        for sub in gone:
            self._subscribers.remove(sub)

    def close(self) -> None:
        """End every subscription (their ``async for`` loops finish). Idempotent."""
        self._closed = True
        for sub in self._subscribers:
            sub.send.close()
        self._subscribers.clear()

    @property
    def subscriber_count(self) -> int:
        """Subscribers currently attached."""
        return len(self._subscribers)


@attrs.define(eq=False)
class _Subscriber:
    send: trio.MemorySendChannel[WorkflowEvent]
    dropped: int = 0
