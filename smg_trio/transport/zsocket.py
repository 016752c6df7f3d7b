"""The trio⇄pyzmq adapter: one owner task per socket, DONTWAIT first, cancel-atomic operations.

This module is the only place in smg_trio that moves messages through pyzmq. Everything else
(topology, handshake, connector) goes through :class:`ZmqSocket`.

Why the adapter looks the way it does (style doc §2.1-2.2, checked by experiment):

* ``ZMQ_FD`` is an *edge*-style "the socket's state may have changed" signal shared by both
  directions. It says nothing about whether a message can be sent or received: only a fresh read
  of ``EVENTS`` does. And *any* call into the socket (send, recv, ``EVENTS`` itself) drains
  libzmq's command queue and can consume the edge. So the loop is: try the operation with
  ``DONTWAIT``; on ``zmq.Again`` re-read ``EVENTS``; sleep on the fd only while that fresh read
  lacks the flag. "Wait on the fd, then recv once" stalls after a burst, so it never appears here.
* Trio's epoll backend is level-triggered + ``EPOLLONESHOT`` and allows one waiter per fd and
  direction; a second concurrent waiter gets :class:`trio.BusyResourceError`. Hence the
  single-owner rule: exactly one task awaits a given socket at a time, and a socket carries
  traffic in one direction at a time (a send from another task can consume the edge a parked
  reader is waiting for). Several writers on one socket must serialise with a
  :class:`trio.StrictFIFOLock`; that is the caller's job (the connector's).
* Every operation opens with ``checkpoint_if_cancelled()`` and closes with
  ``cancel_shielded_checkpoint()``, the shape of ``trio.MemorySendChannel.send``: it is a
  checkpoint, and it either happens completely or raises ``Cancelled`` with no side effect.
  libzmq delivers multipart messages atomically (all parts or none), so a cancelled
  :meth:`ZmqSocket.recv_multipart` never loses a message and a cancelled
  :meth:`ZmqSocket.send_multipart` never half-sends. That is what makes
  ``move_on_after``/``fail_after`` around one operation safe.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Final, TypeAlias, cast

import trio
import zmq

from smg_trio.errors import TransportError

__all__ = ["Frame", "ZmqSocket", "ZmqSocketError", "zmq_context"]

#: What :meth:`ZmqSocket.send_multipart` accepts per frame.
Frame: TypeAlias = bytes | bytearray | memoryview

# Plain ints: ``EVENTS & zmq.POLLIN`` with pyzmq's enum builds two ``PollEvent`` objects per
# check, and the output loop checks on every wake-up.
_POLLIN: Final = int(zmq.POLLIN)
_POLLOUT: Final = int(zmq.POLLOUT)
_EVENTS: Final = int(zmq.EVENTS)

_context: zmq.Context[zmq.Socket[bytes]] | None = None
_context_pid: int | None = None


class ZmqSocketError(TransportError, zmq.ZMQError):
    """A libzmq error at the transport boundary: in smg_trio's error tree
    (:class:`~smg_trio.errors.TransportError`) and still a ``zmq.ZMQError`` (same ``errno``
    and ``strerror``), so nothing above the transport needs to import ``zmq``."""

    def __init__(self, errno: int | None = None, msg: str | None = None) -> None:
        zmq.ZMQError.__init__(self, errno, msg)


def _wrapped(exc: zmq.ZMQError) -> ZmqSocketError:
    return ZmqSocketError(exc.errno, exc.strerror)


def zmq_context() -> zmq.Context[zmq.Socket[bytes]]:
    """The one process-wide ``zmq.Context`` every smg_trio socket is created from.

    Created lazily, and re-created in a forked child (a context must never cross ``fork()``).
    It is never terminated by smg_trio: ``ctx.term()`` blocks while any socket is open or
    lingering, and closing every socket with ``linger=0`` makes termination unnecessary.
    """
    global _context, _context_pid
    pid = os.getpid()
    if _context is None or _context_pid != pid:
        _context = zmq.Context()
        _context_pid = pid
    return _context


class ZmqSocket:
    """Trio adapter for one pyzmq socket; it takes ownership and closes it in :meth:`close`.

    Exactly one task may await on an instance at a time (a second waiter raises
    :class:`trio.BusyResourceError`). Errors from libzmq are raised as :class:`ZmqSocketError` (a ``zmq.ZMQError`` in smg_trio's error tree)
    (for example ``EHOSTUNREACH`` from a ``ROUTER_MANDATORY`` send to an unknown identity); the
    connector maps them to :class:`smg_trio.errors.EngineDeadError`. After :meth:`close` every
    operation raises :class:`trio.ClosedResourceError`, including one already waiting in another
    task.
    """

    __slots__ = ("_closed", "_fd", "_kind", "_sock")

    def __init__(self, sock: zmq.Socket[bytes]) -> None:
        self._sock = sock
        self._fd: int = sock.FD
        self._kind = zmq.SocketType(cast(int, sock.type)).name
        self._closed = False

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"fd={self._fd}"
        return f"<ZmqSocket {self._kind} {state}>"

    @property
    def raw(self) -> zmq.Socket[bytes]:
        """The pyzmq socket, for configuration calls that move no messages (``monitor``,
        ``disable_monitor``); never for I/O, which must go through this adapter."""
        return self._sock

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("ZMQ socket was closed")

    async def _wait(self, flag: int, *, must_sleep: bool) -> bool:
        """Sleep until a fresh ``EVENTS`` read shows ``flag``; return whether it slept.

        ``must_sleep`` forces one sleep on the fd first. It is set when the operation failed
        with ``Again`` right after ``EVENTS`` claimed it was possible: a ``ROUTER_MANDATORY``
        socket reports ``POLLOUT`` when *any* peer pipe has room, yet a send to a full pipe
        still fails. Without the forced sleep that case would spin without a checkpoint. The
        pipe draining sends libzmq an ``activate_write`` command, which signals the fd.
        """
        slept = False
        if must_sleep:
            await trio.lowlevel.wait_readable(self._fd)
            self._check_open()
            slept = True
        # The fd is edge-signalled and reading EVENTS consumes the edge, so re-read EVENTS
        # before *every* sleep.
        while not (cast(int, self._sock.get(_EVENTS)) & flag):
            await trio.lowlevel.wait_readable(self._fd)
            self._check_open()
            slept = True
        return slept

    async def send_multipart(self, frames: Sequence[Frame]) -> None:
        """Send one multipart message, waiting while the socket is at its high-water mark.

        Cancel-atomic: on ``Cancelled`` nothing was sent. Raises :class:`ZmqSocketError` from libzmq
        (``EHOSTUNREACH`` for an unroutable ``ROUTER_MANDATORY`` identity) and
        :class:`trio.ClosedResourceError` if the socket is or gets closed.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        slept = True
        while True:
            try:
                self._sock.send_multipart(frames, flags=zmq.DONTWAIT)
            except zmq.Again:
                slept = await self._wait(_POLLOUT, must_sleep=not slept)
                continue
            except zmq.ZMQError as exc:
                raise _wrapped(exc) from exc
            break
        await trio.lowlevel.cancel_shielded_checkpoint()

    def send_multipart_nowait(self, frames: Sequence[Frame]) -> bool:
        """Try to send one multipart message without blocking; not a checkpoint.

        Returns ``True`` if the whole message was queued, ``False`` (nothing sent) if the socket
        is at its high-water mark; the caller then falls back to :meth:`send_multipart`.
        Raises like :meth:`send_multipart`.
        """
        self._check_open()
        try:
            self._sock.send_multipart(frames, flags=zmq.DONTWAIT)
        except zmq.Again:
            return False
        except zmq.ZMQError as exc:
            raise _wrapped(exc) from exc
        return True

    async def recv_multipart(self) -> list[bytes]:
        """Receive one multipart message (all its frames, copied into ``bytes``).

        Waits until a message arrives. Cancel-atomic: on ``Cancelled`` no message was taken off
        the socket. Raises :class:`ZmqSocketError` from libzmq and :class:`trio.ClosedResourceError`
        if the socket is or gets closed.
        """
        frames, _ = await self._recv(with_source=False)
        return frames

    async def recv_multipart_with_source(self) -> tuple[list[bytes], int | None]:
        """Like :meth:`recv_multipart`, and also the file descriptor of the connection the
        message came in on (libzmq's ``ZMQ_SRCFD``; ``None`` where libzmq has none, as for
        inproc). Socket monitors name connections by that descriptor, which is how a
        ``DISCONNECTED`` event is tied to the peer that sent the message."""
        return await self._recv(with_source=True)

    async def _recv(self, *, with_source: bool) -> tuple[list[bytes], int | None]:
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        slept = True
        while True:
            try:
                if with_source:
                    parts = self._sock.recv_multipart(flags=zmq.DONTWAIT, copy=False)
                else:
                    frames = self._sock.recv_multipart(flags=zmq.DONTWAIT)
            except zmq.Again:
                slept = await self._wait(_POLLIN, must_sleep=not slept)
                continue
            except zmq.ZMQError as exc:
                raise _wrapped(exc) from exc
            break
        await trio.lowlevel.cancel_shielded_checkpoint()
        if not with_source:
            return frames, None
        fd = parts[-1].get(zmq.SRCFD) if parts else -1
        return [p.bytes for p in parts], (fd if fd >= 0 else None)

    def recv_multipart_with_source_nowait(self) -> tuple[list[bytes], int | None] | None:
        """Like :meth:`recv_multipart_with_source`, without waiting (``None`` when no message
        is waiting); not a checkpoint."""
        self._check_open()
        try:
            parts = self._sock.recv_multipart(flags=zmq.DONTWAIT, copy=False)
        except zmq.Again:
            return None
        except zmq.ZMQError as exc:
            raise _wrapped(exc) from exc
        fd = parts[-1].get(zmq.SRCFD) if parts else -1
        return [p.bytes for p in parts], (fd if fd >= 0 else None)

    def recv_multipart_nowait(self) -> list[bytes] | None:
        """One multipart message if one is waiting, else ``None``; not a checkpoint.

        Reads ``EVENTS`` first, so an empty socket costs no ``zmq.Again``. Raises
        ``ZmqSocketError`` from libzmq and :class:`trio.ClosedResourceError` if closed.
        """
        self._check_open()
        if not (cast(int, self._sock.get(_EVENTS)) & _POLLIN):
            return None
        try:
            return self._sock.recv_multipart(flags=zmq.DONTWAIT)
        except zmq.Again:
            return None
        except zmq.ZMQError as exc:
            raise _wrapped(exc) from exc

    async def wait_readable(self) -> None:
        """Wait until :meth:`recv_multipart_nowait` has a message; always a checkpoint.

        Raises :class:`trio.ClosedResourceError` if the socket is or gets closed.
        """
        self._check_open()
        if not await self._wait(_POLLIN, must_sleep=False):
            await trio.lowlevel.checkpoint()

    def process_commands(self) -> None:
        """Let libzmq apply the socket's pending commands now (attach a new peer's pipe and
        its routing id, retire a closed one); not a checkpoint, moves no message.

        libzmq applies them only when the owning thread calls into the socket, and a send
        applies them at most once per millisecond or so (it throttles), so a send right after
        a reconnect can still see the old pipe. Reading ``EVENTS`` applies them unthrottled.
        """
        self._check_open()
        self._sock.get(_EVENTS)

    def close(self, *, linger_ms: int = 0) -> None:
        """Close the socket; idempotent. A task blocked in an operation on it gets
        :class:`trio.ClosedResourceError`.

        ``linger_ms`` is how long libzmq keeps delivering already-queued outgoing messages in
        the background (0 = drop them; the frontend's choice). It never blocks this call. It may
        also be called outside ``trio.run`` (sync test teardown), where nobody can be waiting.
        """
        if self._closed:
            return
        self._closed = True
        if trio.lowlevel.in_trio_run():
            trio.lowlevel.notify_closing(self._fd)
        self._sock.close(linger=linger_ms)
