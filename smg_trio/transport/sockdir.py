"""Safety rules for ipc socket files: a private socket directory, stale sockets, path length."""

from __future__ import annotations

import logging
import os
import socket
import stat
from typing import Final

from smg_trio.errors import SocketDirError
from smg_trio.protocol.addresses import ipc_path

__all__ = [
    "SUN_PATH_MAX",
    "check_ipc_path",
    "ensure_ipc_socket_dir",
    "unlink_stale_socket",
]

logger = logging.getLogger(__name__)

#: The longest ipc path, in bytes, that fits Linux's ``sockaddr_un.sun_path`` (108 bytes
#: including the terminating NUL). libzmq refuses longer paths with a bare ``ENAMETOOLONG``.
SUN_PATH_MAX: Final = 107

_DIR_MODE: Final = 0o700


def ensure_ipc_socket_dir(directory: str | os.PathLike[str]) -> None:
    """Make sure ``directory`` is a private directory for ipc sockets.

    A missing directory is created, with any missing parents, with mode ``0700`` at ``mkdir``
    time (no window in which it is world-accessible). An existing one is never ``chmod``-ed; it
    is checked with ``lstat`` (symlinks are not followed) and must be a real directory owned by
    the effective uid.

    Raises:
        SocketDirError: the path exists but is not a directory (a symlink counts as not a
            directory), it is owned by another uid, or it cannot be created or inspected.
    """
    path = os.fspath(directory)
    try:
        _mkdirs_private(path)
        st = os.lstat(path)
    except OSError as exc:
        raise SocketDirError(f"cannot prepare ipc socket directory {path!r}: {exc}") from exc
    if stat.S_ISLNK(st.st_mode):
        raise SocketDirError(
            f"ipc socket directory {path!r} exists but is not a directory (it is a symlink)"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise SocketDirError(f"ipc socket directory {path!r} exists but is not a directory")
    euid = os.geteuid()
    if st.st_uid != euid:
        raise SocketDirError(
            f"ipc socket directory {path!r} is owned by uid {st.st_uid} (expected {euid})"
        )


def _mkdirs_private(path: str) -> None:
    """``mkdir -p`` with mode 0700 on every directory it creates (``os.makedirs`` applies the
    mode to the leaf only)."""
    missing: list[str] = []
    current = os.path.abspath(path)
    while not os.path.lexists(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, _DIR_MODE)
        except FileExistsError:
            pass  # created concurrently; the lstat checks decide whether it is acceptable


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
