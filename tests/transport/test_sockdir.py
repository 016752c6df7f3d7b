"""Socket-directory and socket-file safety rules (wire spec §2.3)."""

from __future__ import annotations

import os
import socket
import stat

import pytest
import zmq

from smg_trio.errors import SocketDirError, WorkerAddressError
from smg_trio.transport.sockdir import (
    SUN_PATH_MAX,
    check_ipc_path,
    ensure_ipc_socket_dir,
    unlink_stale_socket,
)
from tests.helpers.ipc import IpcNamespace


def _mode(path: str) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _make_socket_file(path: str) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(path)
    finally:
        s.close()  # the file stays behind, like a crashed gateway's


def test_creates_missing_dirs_with_mode_0700(ipc: IpcNamespace) -> None:
    target = os.path.join(ipc.directory, "a", "b")
    old = os.umask(0o022)
    try:
        ensure_ipc_socket_dir(target)
    finally:
        os.umask(old)
    assert os.path.isdir(target)
    assert _mode(target) == 0o700
    assert _mode(os.path.dirname(target)) == 0o700  # parents too, unlike os.makedirs


@pytest.mark.parametrize("mode", [0o755, 0o750, 0o705, 0o711], ids=oct)
def test_makes_an_existing_owned_dir_that_others_can_reach_private(
    ipc: IpcNamespace, caplog: pytest.LogCaptureFixture, mode: int
) -> None:
    # Others who can search the directory can connect to a socket in it that the umask left
    # world-writable: ours, so it is fixed (0700), with a warning.
    target = os.path.join(ipc.directory, "shared")
    os.mkdir(target)
    os.chmod(target, mode)
    ensure_ipc_socket_dir(target)
    assert _mode(target) == 0o700
    assert f"had mode {mode:04o}" in caplog.text


def test_leaves_an_existing_private_dir_untouched(ipc: IpcNamespace) -> None:
    target = os.path.join(ipc.directory, "mine")
    os.mkdir(target)
    os.chmod(target, 0o500)  # narrower than 0700 is the owner's business
    try:
        ensure_ipc_socket_dir(target)
        assert _mode(target) == 0o500
    finally:
        os.chmod(target, 0o700)


@pytest.mark.parametrize("umask", [0o000, 0o777], ids=oct)
def test_creates_dirs_0700_whatever_the_umask(ipc: IpcNamespace, umask: int) -> None:
    target = os.path.join(ipc.directory, "a", "b")
    old = os.umask(umask)
    try:
        ensure_ipc_socket_dir(target)
    finally:
        os.umask(old)
    assert _mode(target) == 0o700
    assert _mode(os.path.dirname(target)) == 0o700


def test_rejects_a_file_in_place_of_the_dir(ipc: IpcNamespace) -> None:
    target = os.path.join(ipc.directory, "file")
    with open(target, "w"):
        pass
    with pytest.raises(SocketDirError, match="exists but is not a directory"):
        ensure_ipc_socket_dir(target)


def test_rejects_a_symlinked_dir(ipc: IpcNamespace) -> None:
    real = os.path.join(ipc.directory, "real")
    os.mkdir(real, 0o700)
    link = os.path.join(ipc.directory, "link")
    os.symlink(real, link)
    with pytest.raises(SocketDirError, match="exists but is not a directory"):
        ensure_ipc_socket_dir(link)


def test_rejects_a_dir_owned_by_another_uid(
    ipc: IpcNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = os.lstat(ipc.directory).st_uid
    monkeypatch.setattr(os, "geteuid", lambda: owner + 1)
    with pytest.raises(SocketDirError, match=rf"owned by uid {owner} \(expected {owner + 1}\)"):
        ensure_ipc_socket_dir(ipc.directory)


def test_unlinks_a_stale_socket(ipc: IpcNamespace, caplog: pytest.LogCaptureFixture) -> None:
    path = os.path.join(ipc.directory, "w-in.sock")
    _make_socket_file(path)
    with caplog.at_level("INFO", logger="smg_trio.transport.sockdir"):
        assert unlink_stale_socket(path) is True
    assert not os.path.lexists(path)
    assert "Removing stale ipc socket" in caplog.text


def test_refuses_to_unlink_a_live_socket(ipc: IpcNamespace) -> None:
    """A second gateway on the same worker must not steal the first one's sockets."""
    path = os.path.join(ipc.directory, "w-in.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen(1)
        with pytest.raises(SocketDirError, match=r"in use by another process.*worker-base-port"):
            unlink_stale_socket(path)
        assert os.path.lexists(path)


def test_live_zmq_socket_is_not_unlinked_by_a_second_bind(ipc: IpcNamespace) -> None:
    path = os.path.join(ipc.directory, "w-out.sock")
    sock = zmq.Context.instance().socket(zmq.PULL)
    try:
        sock.bind(f"ipc://{path}")
        with pytest.raises(SocketDirError, match="in use by another process"):
            unlink_stale_socket(path)
        assert os.path.lexists(path)
    finally:
        sock.close(linger=0)


def test_missing_socket_is_fine(ipc: IpcNamespace) -> None:
    assert unlink_stale_socket(os.path.join(ipc.directory, "absent.sock")) is False


def test_refuses_to_unlink_a_regular_file(ipc: IpcNamespace) -> None:
    path = os.path.join(ipc.directory, "w-in.sock")
    with open(path, "w") as f:
        f.write("precious")
    with pytest.raises(SocketDirError, match="exists but is not a socket; refusing to unlink"):
        unlink_stale_socket(path)
    assert os.path.isfile(path)


def test_refuses_to_unlink_a_symlink_to_a_socket(ipc: IpcNamespace) -> None:
    target = os.path.join(ipc.directory, "real.sock")
    _make_socket_file(target)
    link = os.path.join(ipc.directory, "w-in.sock")
    os.symlink(target, link)
    with pytest.raises(SocketDirError, match="not a socket"):
        unlink_stale_socket(link)
    assert os.path.lexists(link)


def test_check_ipc_path_limits() -> None:
    ok = "/" + "p" * (SUN_PATH_MAX - 1)
    assert check_ipc_path(f"ipc://{ok}") == ok
    too_long = ok + "x"
    with pytest.raises(SocketDirError, match=rf"is {SUN_PATH_MAX + 1} bytes, over the 107-byte"):
        check_ipc_path(f"ipc://{too_long}")
    with pytest.raises(WorkerAddressError):
        check_ipc_path("tcp://127.0.0.1:5555")


# -- the whole path (issue 18, finding 6) ---------------------------------------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


def test_refuses_a_world_writable_dir(ipc: IpcNamespace) -> None:
    target = os.path.join(ipc.directory, "open")
    os.mkdir(target)
    os.chmod(target, 0o777)
    with pytest.raises(SocketDirError, match=r"group- or world-writable \(mode 0777\).*prompts"):
        ensure_ipc_socket_dir(target)


def test_refuses_a_group_writable_dir(ipc: IpcNamespace) -> None:
    target = os.path.join(ipc.directory, "group")
    os.mkdir(target)
    os.chmod(target, 0o770)
    with pytest.raises(SocketDirError, match=r"group- or world-writable \(mode 0770\)"):
        ensure_ipc_socket_dir(target)


def test_refuses_tmp_itself() -> None:
    st = os.lstat("/tmp")
    if not st.st_mode & 0o002:
        pytest.skip("/tmp is not world-writable here")
    with pytest.raises(SocketDirError, match=r"'/tmp' is group- or world-writable"):
        ensure_ipc_socket_dir("/tmp")


def test_a_sticky_root_owned_parent_is_fine(ipc: IpcNamespace) -> None:
    """/tmp (root, 1777) as a parent is what the default /tmp/smg-zmq-<uid> sits in."""
    if os.lstat("/tmp").st_uid != 0:
        pytest.skip("/tmp is not root-owned here")
    ensure_ipc_socket_dir(ipc.directory)  # mkdtemp under the temp dir
    target = os.path.join("/tmp", os.path.basename(ipc.directory) + "-x")
    try:
        ensure_ipc_socket_dir(target)
        assert _mode(target) == 0o700
    finally:
        os.rmdir(target)


def test_refuses_a_world_writable_parent_without_sticky_bit_and_creates_nothing(
    ipc: IpcNamespace,
) -> None:
    parent = os.path.join(ipc.directory, "parent")
    os.mkdir(parent)
    os.chmod(parent, 0o777)
    target = os.path.join(parent, "socks")
    with pytest.raises(SocketDirError, match=r"a parent of .* without the sticky bit"):
        ensure_ipc_socket_dir(target)
    assert not os.path.lexists(target)
    os.chmod(parent, 0o1777)  # sticky and ours: only a child's owner may rename the child
    ensure_ipc_socket_dir(target)
    assert _mode(target) == 0o700


def test_refuses_a_symlinked_parent_and_creates_nothing_through_it(ipc: IpcNamespace) -> None:
    elsewhere = os.path.join(ipc.directory, "elsewhere")
    os.mkdir(elsewhere, 0o700)
    link = os.path.join(ipc.directory, "link")
    os.symlink(elsewhere, link)
    target = os.path.join(link, "a", "b")
    with pytest.raises(SocketDirError, match=r"a parent of .* is a symlink"):
        ensure_ipc_socket_dir(target)
    assert os.listdir(elsewhere) == []  # the old mkdir -p created a/b through the link


@needs_root
def test_refuses_a_parent_owned_by_another_uid(ipc: IpcNamespace) -> None:
    parent = os.path.join(ipc.directory, "theirs")
    os.mkdir(parent, 0o755)
    os.chown(parent, 12345, 12345)
    target = os.path.join(parent, "socks")
    os.mkdir(target, 0o700)  # ours, but its parent's owner could swap it
    with pytest.raises(SocketDirError, match=r"owned by uid 12345 \(expected root or 0\)"):
        ensure_ipc_socket_dir(target)


@needs_root
def test_refuses_a_leaf_owned_by_another_uid_even_for_root(ipc: IpcNamespace) -> None:
    target = os.path.join(ipc.directory, "theirs")
    os.mkdir(target, 0o700)
    os.chown(target, 12345, 12345)
    with pytest.raises(SocketDirError, match=r"owned by uid 12345 \(expected 0\)"):
        ensure_ipc_socket_dir(target)
