"""A local user's claim on a gateway's tcp input socket, run by the tests as another uid: a
DEALER with an engine's routing id dials the socket, reports how its connection ended up, and
counts the messages (prompts) it receives until told to stop; or, first, introduces itself at
the handshake socket as that engine (HELLO, READY) and sends an engine's registration.

:func:`claimant` forks a child that drops to the uid and runs :func:`claim` (the
interpreter may live where that uid cannot read, so the child does not exec). The child
reports ``uid N`` (and ``introduced`` after INIT), then ``attempt EVENT`` once its connection's ZMTP handshake succeeded or
failed or it was closed; a line on its control pipe makes it report ``received N`` and exit.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import attrs
import trio
import zmq
from zmq.utils.monitor import parse_monitor_message

from smg_trio.protocol.handshake import decode_init, encode_status

_OUTCOMES = {
    zmq.EVENT_HANDSHAKE_SUCCEEDED: "handshake-succeeded",
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "handshake-failed-auth",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "handshake-failed-protocol",
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "handshake-failed",
    zmq.EVENT_DISCONNECTED: "disconnected",
}


def _drain(sock: zmq.Socket[bytes]) -> int:
    n = 0
    while True:
        try:
            sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return n
        n += 1


def _introduce(
    ctx: zmq.Context[zmq.Socket[bytes]], handshake: str, identity: bytes
) -> tuple[zmq.Socket[bytes], str]:
    """Say HELLO at ``handshake`` as ``identity``, wait for INIT, say READY: the input
    address INIT names (and the handshake socket, to close later)."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.ROUTING_ID, identity)
    sock.connect(handshake)
    sock.send(encode_status("HELLO", local=False, headless=True))
    init = decode_init(sock.recv())
    sock.send(encode_status("READY", local=False, headless=True))
    return sock, init.addresses.inputs[0]


def claim(
    address: str,
    identity: bytes,
    control_fd: int,
    report: Callable[[str], None],
    registration: bytes | None = None,
    socket_type: int = zmq.DEALER,
) -> None:
    """Dial ``address`` with routing id ``identity`` (a DEALER, or ``socket_type``: a PUB
    for a KV event subscriber); report as the module says. With
    ``registration``, ``address`` is the handshake's: HELLO, INIT, READY first, then the
    input address INIT named is dialed and sent ``registration``, as an engine does."""
    report(f"uid {os.getuid()}")
    ctx = zmq.Context()
    if registration is not None:
        handshake, address = _introduce(ctx, address, identity)
        handshake.close(linger=1000)  # READY still goes out (the child exits without term)
        report("introduced")
    sock = ctx.socket(socket_type)
    sock.setsockopt(zmq.LINGER, 0)
    if socket_type != zmq.PUB:
        sock.setsockopt(zmq.ROUTING_ID, identity)
    sock.monitor("inproc://claimant-monitor", zmq.EVENT_ALL)
    monitor = ctx.socket(zmq.PAIR)
    monitor.connect("inproc://claimant-monitor")
    sock.connect(address)
    if registration is not None:
        sock.send(registration)
    poller = zmq.Poller()
    if socket_type != zmq.PUB:
        poller.register(sock, zmq.POLLIN)
    poller.register(monitor, zmq.POLLIN)
    poller.register(control_fd, zmq.POLLIN)
    received = 0
    reported = False
    while True:
        for item, _ in poller.poll():
            if item is sock:
                received += _drain(sock)
            elif item is monitor:
                event = parse_monitor_message(monitor.recv_multipart())["event"]
                outcome = _OUTCOMES.get(int(event))
                if outcome is not None and not reported:
                    reported = True
                    report(f"attempt {outcome}")
            else:
                if socket_type != zmq.PUB:
                    received += _drain(sock)
                report(f"received {received}")
                return


@attrs.define
class Claimant:
    """The parent's end: the child's reports, line by line, and its control pipe."""

    pid: int
    reports: trio.lowlevel.FdStream
    control: trio.lowlevel.FdStream
    buf: bytes = b""

    async def next(self) -> str:
        while b"\n" not in self.buf:
            chunk = await self.reports.receive_some()
            if not chunk:
                raise EOFError(f"the claimant exited ({self.buf!r} unread)")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode()

    async def stop(self) -> str:
        """Tell it to stop; its last report (``received N``)."""
        await self.control.send_all(b"stop\n")
        return await self.next()


@asynccontextmanager
async def claimant(
    address: str,
    identity: bytes,
    uid: int,
    registration: bytes | None = None,
    socket_type: int = zmq.DEALER,
) -> AsyncIterator[Claimant]:
    """A forked child running :func:`claim` as ``uid`` (and gid ``uid``, no groups)."""
    report_r, report_w = os.pipe()
    control_r, control_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no trio, no imports, no return
        status = 1
        try:
            os.close(report_r)
            os.close(control_w)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            claim(
                address,
                identity,
                control_r,
                lambda line: _write_line(report_w, line),
                registration,
                socket_type,
            )
            status = 0
        finally:
            os._exit(status)
    os.close(report_w)
    os.close(control_r)
    child = Claimant(pid, trio.lowlevel.FdStream(report_r), trio.lowlevel.FdStream(control_w))
    try:
        yield child
    finally:
        with trio.CancelScope(shield=True):
            os.kill(pid, 9)
            await trio.to_thread.run_sync(os.waitpid, pid, 0)
            await child.reports.aclose()
            await child.control.aclose()


def _write_line(fd: int, line: str) -> None:
    os.write(fd, line.encode() + b"\n")
