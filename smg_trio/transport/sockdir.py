"""Safety rules for ipc socket files: a private socket directory, stale sockets, path length."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
from typing import Final

from smg_trio.errors import SocketDirError
from smg_trio.protocol.addresses import ipc_path

__all__ = [
    "SOCKET_MODE",
    "SUN_PATH_MAX",
    "check_ipc_path",
    "default_socket_dir",
    "ensure_ipc_socket_dir",
    "restrict_socket_file",
    "unlink_stale_socket",
]

logger = logging.getLogger(__name__)

#: The longest ipc path, in bytes, that fits Linux's ``sockaddr_un.sun_path`` (108 bytes
#: including the terminating NUL). libzmq refuses longer paths with a bare ``ENAMETOOLONG``.
SUN_PATH_MAX: Final = 107

_DIR_MODE: Final = 0o700
#: The mode of a bound ipc socket file, whatever the umask (libzmq creates it ``0777 & ~umask``,
#: world-connectable under ``umask 000``).
SOCKET_MODE: Final = 0o600


def default_socket_dir() -> str:
    """``$SMG_ZMQ_SOCKET_DIR`` or the per-user ``/tmp/smg-zmq-<uid>``."""
    return os.environ.get("SMG_ZMQ_SOCKET_DIR") or f"/tmp/smg-zmq-{os.getuid()}"


def ensure_ipc_socket_dir(directory: str | os.PathLike[str]) -> None:
    """Make sure ``directory`` is a private directory for ipc sockets, along its whole path.

    Every component from ``/`` down is checked with ``lstat`` (symlinks are not followed):

    - no component is a symlink, and each is a directory;
    - each parent is owned by root or the effective uid and is not group- or world-writable,
      unless it has the sticky bit (``/tmp``): there only a child's owner can rename it;
    - the directory itself is owned by the effective uid and is not group- or world-writable
      (so ``/tmp`` itself is refused); one that is group- or world-readable or searchable
      (``0755``: others could reach its sockets) is ``chmod``-ed to ``0700``, with a warning.

    A missing component is created with mode ``0700`` at ``mkdir`` time (no window in which it
    is world-accessible) and ``chmod``-ed to exactly ``0700`` (the umask cannot narrow it into
    a directory we cannot use), only once its parent passed. An existing parent is never
    ``chmod``-ed.

    Raises:
        SocketDirError: a rule above is broken (the message says which and why), or a
            component cannot be created or inspected.
    """
    path = os.path.abspath(os.fspath(directory))
    parts = [p for p in path.split(os.sep) if p]
    current = os.sep
    try:
        _check_component(current, os.lstat(current), path, leaf=not parts)
        for i, part in enumerate(parts):
            current = os.path.join(current, part)
            try:
                st = os.lstat(current)
            except FileNotFoundError:
                created = False
                with contextlib.suppress(FileExistsError):  # created concurrently: checked below
                    os.mkdir(current, _DIR_MODE)
                    created = True
                if created:
                    os.chmod(current, _DIR_MODE)
                st = os.lstat(current)
            leaf = i == len(parts) - 1
            _check_component(current, st, path, leaf=leaf)
            if leaf:
                _make_private(current, st)
    except OSError as exc:
        raise SocketDirError(f"cannot prepare ipc socket directory {path!r}: {exc}") from exc


def _make_private(path: str, st: os.stat_result) -> None:
    """``chmod 0700`` the socket directory (ours, and checked not group- or world-writable)
    if others may read or search it: they could connect to its sockets."""
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        logger.warning(
            "ipc socket directory %r had mode %04o (others could reach its sockets); "
            "set it to 0700",
            path,
            mode,
        )
        os.chmod(path, _DIR_MODE)


def restrict_socket_file(path: str) -> None:
    """Give a socket file this process just bound mode ``0600``, whatever the umask.

    Raises:
        SocketDirError: it cannot be changed.
    """
    try:
        os.chmod(path, SOCKET_MODE)
    except OSError as exc:
        raise SocketDirError(f"cannot set the mode of ipc socket {path!r}: {exc}") from exc


def _check_component(current: str, st: os.stat_result, path: str, *, leaf: bool) -> None:
    """One component of :func:`ensure_ipc_socket_dir`'s walk; raises ``SocketDirError``."""
    what = f"ipc socket directory {path!r}" if leaf else f"{current!r}, a parent of {path!r},"
    if stat.S_ISLNK(st.st_mode):
        raise SocketDirError(
            f"{what} exists but is not a directory (it is a symlink; socket directories may "
            "not have symlinked components, which could point anywhere)"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise SocketDirError(f"{what} exists but is not a directory")
    euid = os.geteuid()
    mode = stat.S_IMODE(st.st_mode)
    writable = mode & (stat.S_IWGRP | stat.S_IWOTH)
    if leaf:
        if st.st_uid != euid:
            raise SocketDirError(f"{what} is owned by uid {st.st_uid} (expected {euid})")
        if writable:
            raise SocketDirError(
                f"{what} is group- or world-writable (mode {mode:04o}): other local users "
                "could replace its sockets and receive prompts; use a private directory such "
                "as /tmp/smg-zmq-<uid>"
            )
        return
    if st.st_uid not in (0, euid):
        raise SocketDirError(
            f"{what} is owned by uid {st.st_uid} (expected root or {euid}): that user could "
            "replace the socket directory"
        )
    if writable and not mode & stat.S_ISVTX:
        raise SocketDirError(
            f"{what} is group- or world-writable without the sticky bit (mode {mode:04o}): "
            "other local users could replace the socket directory"
        )


def unlink_stale_socket(path: str | os.PathLike[str]) -> bool:
    """Remove a leftover socket file before binding. Returns whether a file was removed.

    A missing path is fine. Only a socket is unlinked (checked with ``lstat``); anything else is
    left in place.

    Raises:
        SocketDirError: the path exists but is not a socket, or cannot be inspected or removed.
    """
    p = os.fspath(path)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise SocketDirError(f"cannot inspect ipc socket path {p!r}: {exc}") from exc
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketDirError(f"{p!r} exists but is not a socket; refusing to unlink")
    if _socket_is_live(p):
        raise SocketDirError(
            f"ipc socket {p!r} is in use by another process (another gateway serving the same "
            "worker?); pick another --worker-base-port or socket directory (SMG_ZMQ_SOCKET_DIR)"
        )
    logger.info("Removing stale ipc socket %s", p)
    try:
        os.unlink(p)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise SocketDirError(f"cannot remove stale ipc socket {p!r}: {exc}") from exc
    return True


def _socket_is_live(path: str) -> bool:
    """Whether something still listens on the unix socket at ``path`` (a non-blocking connect
    that is accepted, or refused only because the listener's backlog is full)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.setblocking(False)
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except BlockingIOError:
        return True  # EAGAIN: a listener whose accept queue is full
    except OSError:
        return False
    finally:
        probe.close()
    return True


def check_ipc_path(address: str) -> str:
    """Validate an ``ipc://<path>`` address and return its filesystem path.

    Raises:
        WorkerAddressError: ``address`` is not ``ipc://<path>``.
        SocketDirError: the path is longer than :data:`SUN_PATH_MAX` (107) bytes of UTF-8.
    """
    path = ipc_path(address)
    length = len(os.fsencode(path))
    if length > SUN_PATH_MAX:
        raise SocketDirError(
            f"ipc socket path {path!r} is {length} bytes, over the {SUN_PATH_MAX}-byte "
            "AF_UNIX sun_path limit; use a shorter socket directory"
        )
    return path
