"""The supervisor's run directory (``--api-server-count`` above 1: control socket, the
frontends' config with the API keys, the load table) is made only under a socket directory
that passed the socket-directory checks. It was made with ``os.makedirs`` and ``mkdtemp``
before any check: under ``launch`` (whose worker URLs may live elsewhere, so nothing checks
the default ``/tmp/smg-zmq-<uid>``) a local user who pre-created that directory could swap the
run directory before the frontends start and hand them their own config and control socket."""

from __future__ import annotations

import os
import socket
import sqlite3
import stat
from pathlib import Path

import pytest

from smg_trio.errors import SocketDirError
from smg_trio.serve.config import GatewayConfig
from smg_trio.serve.control import RESPONSES_STORE
from smg_trio.serve.supervisor import FrontendGroup, run_directory


def test_a_world_writable_parent_is_refused_and_nothing_is_made(tmp_path: Path) -> None:
    parent = tmp_path / "shared"
    parent.mkdir()
    parent.chmod(0o777)  # no sticky bit: anyone could rename what we make here
    with pytest.raises(SocketDirError), run_directory(str(parent / "sock")):
        pass
    assert list(parent.iterdir()) == []


def test_a_symlinked_socket_dir_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(SocketDirError), run_directory(str(link)):
        pass
    assert list(real.iterdir()) == []


def test_a_private_socket_dir_gets_a_private_run_dir_removed_at_exit(tmp_path: Path) -> None:
    sock = tmp_path / "sock"
    with run_directory(str(sock)) as run_dir:
        assert os.path.dirname(run_dir) == str(sock)
        assert stat.S_IMODE(os.lstat(sock).st_mode) == 0o700
        assert stat.S_IMODE(os.lstat(run_dir).st_mode) == 0o700
    assert not os.path.exists(run_dir)


def test_the_supervisor_makes_the_shared_store_before_the_frontends_start(
    tmp_path: Path,
) -> None:
    """The Responses store is in the run directory, in WAL, once the frontend group is
    made (before any frontend starts): two frontends opening a new file at once could fail
    to switch it to WAL, and that frontend exited ("database is locked")."""
    with socket.socket() as listen:
        FrontendGroup(GatewayConfig(), 2, str(tmp_path), listen)
    db = sqlite3.connect(tmp_path / RESPONSES_STORE)
    try:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("SELECT COUNT(*) FROM responses").fetchone()[0] == 0
    finally:
        db.close()
