"""What a worker spec may touch: its ipc socket directory, its handshake host, its model root."""

from __future__ import annotations

import ipaddress
import logging
import os
from collections.abc import Iterable

import attrs

from smg_trio.errors import ModelPathError, ValidationError
from smg_trio.tokenizer.hub import hf_hub_cache
from smg_trio.tokenizer.modeldir import inside
from smg_trio.transport.sockdir import default_socket_dir

__all__ = ["WorkerConfinement", "escape", "hf_hub_cache", "is_loopback_host", "require_printable"]

log = logging.getLogger(__name__)


def escape(text: str) -> str:
    """``text`` made safe for one log line: newlines, escape sequences and other
    non-printable characters are written as Python escapes."""
    return text if text.isprintable() else repr(text)[1:-1]


def require_printable(value: str, param: str) -> None:
    """Refuse a field with control characters (a newline could forge a log line)."""
    if not value.isprintable():
        raise ValidationError(
            f"{param} must not contain control characters, got {escape(value)!r}", param=param
        )


def is_loopback_host(host: str) -> bool:
    """``localhost``, or an address in ``127.0.0.0/8`` or ``::1`` (brackets allowed)."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if bare.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(bare).is_loopback
    except ValueError:
        return False


def _norm(path: str) -> str:
    return os.path.normpath(os.path.abspath(os.path.expanduser(path)))


def _norm_all(paths: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(_norm(p) for p in paths))


def _hf_repo_root(path: str) -> str:
    """A model dir inside a hub cache (``.../models--x/snapshots/<rev>``) widens to the repo
    (``.../models--x``), so its snapshot-to-blob links stay inside the root."""
    parent = os.path.dirname(path)
    repo = os.path.dirname(parent)
    if os.path.basename(parent) == "snapshots" and os.path.basename(repo).startswith("models--"):
        return repo
    return path


def _model_roots(dirs: Iterable[str]) -> tuple[str, ...]:
    return _norm_all(_hf_repo_root(_norm(d)) for d in dirs)


def _lower_all(hosts: Iterable[str]) -> tuple[str, ...]:
    return tuple(h.lower() for h in hosts)


@attrs.frozen(kw_only=True)
class WorkerConfinement:
    """Allow-lists for worker specs (``POST /workers`` and the startup workers).

    - ``socket_dirs``: ipc worker URLs must be absolute paths below one of these (no ``..``,
      no abstract ``@`` names, no relative paths).
    - ``engine_hosts``: besides loopback (``127.0.0.0/8``, ``::1``, ``localhost``), hosts a
      ``zmq_handshake_address`` or a ``tcp://`` worker URL may bind, and the addresses a
      ``tcp://`` worker's engines may connect from (their peer address, as an IP).
    - ``model_dirs``: ``model_path`` and every file read from it must resolve inside one of
      these (a model dir in a hub cache counts as its whole repo, see ``_hf_repo_root``).

    The checks here are lexical and synchronous; the symlink-resolving half is
    :class:`~smg_trio.tokenizer.modeldir.ModelDir` (model files) and
    :func:`~smg_trio.transport.sockdir.ensure_ipc_socket_dir` (no symlinked components).
    """

    socket_dirs: tuple[str, ...] = attrs.field(converter=_norm_all)
    model_dirs: tuple[str, ...] = attrs.field(converter=_model_roots)
    engine_hosts: tuple[str, ...] = attrs.field(default=(), converter=_lower_all)

    @classmethod
    def default(cls) -> WorkerConfinement:
        """The socket directory (``$SMG_ZMQ_SOCKET_DIR`` or ``/tmp/smg-zmq-<uid>``), the HF
        hub cache, loopback handshakes only."""
        return cls(socket_dirs=(default_socket_dir(),), model_dirs=(hf_hub_cache(),))

    def check_url(self, url: str) -> None:
        """Raise ``ValidationError`` (param ``url``) unless ``url`` is an allowed ipc URL, or
        a ``tcp://HOST:PORT`` one whose host is loopback or allowed (:meth:`check_handshake`)."""
        require_printable(url, "url")
        if url.startswith("tcp://"):
            self._check_tcp(url, "url", "a tcp:// worker URL")
            return
        if not url.startswith("ipc://") or len(url) == len("ipc://"):
            raise ValidationError(
                f"url must be ipc://<absolute path> or tcp://HOST:PORT, got {url!r}", param="url"
            )
        path = url[len("ipc://") :]
        if path.startswith("@"):
            raise ValidationError(
                f"url {url!r} is an abstract socket, which has no file permissions; use a path "
                "under the socket directory",
                param="url",
            )
        if not path.startswith("/"):
            raise ValidationError(f"url {url!r} must be an absolute ipc:// path", param="url")
        if {".", ".."} & set(path.split("/")):
            raise ValidationError(f"url {url!r} must not contain . or .. components", param="url")
        if os.path.normpath(path) != path:  # "//", a trailing "/": one spelling per socket
            raise ValidationError(
                f"url {url!r} is not a normalized path (no repeated or trailing /)", param="url"
            )
        directory = os.path.dirname(os.path.normpath(path))
        if not any(inside(directory, d) for d in self.socket_dirs):
            # the allowed directories go to the log, not to the client (issue 28, item 8)
            log.warning(
                "refused worker url %r: its directory is outside the allowed socket directories %s",
                url,
                ", ".join(escape(d) for d in self.socket_dirs),
            )
            raise ValidationError(
                f"url {url!r} is outside the allowed socket directories (the gateway's log "
                "names them); use --socket-dir or --allowed-socket-dirs",
                param="url",
            )

    def check_handshake(self, address: str) -> None:
        """Raise ``ValidationError`` (param ``zmq_handshake_address``) unless ``address`` is
        ``tcp://HOST:PORT`` with a loopback or allowed host and a port (or ``*``)."""
        param = "zmq_handshake_address"
        require_printable(address, param)
        if not address.startswith("tcp://"):
            raise ValidationError(
                f"zmq_handshake_address must be a tcp:// address, got {address!r}", param=param
            )
        self._check_tcp(address, param, param, any_port=True)

    def _check_tcp(self, address: str, param: str, what: str, *, any_port: bool = False) -> None:
        host, sep, port = address[len("tcp://") :].rpartition(":")
        valid_port = (any_port and port == "*") or (
            port.isascii() and port.isdigit() and 0 < int(port) < 65536
        )
        if not sep or not host or not valid_port:
            raise ValidationError(f"{what} must be tcp://HOST:PORT, got {address!r}", param=param)
        if not self.host_allowed(host):
            raise ValidationError(
                f"{what} host {host!r} is not a loopback address, so the "
                "port would be reachable from other hosts; name the host in "
                "--allowed-engine-hosts to allow it",
                param=param,
            )

    def host_allowed(self, host: str) -> bool:
        """``host`` (a bind host, or an engine's peer address) is loopback or allowed."""
        bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        return is_loopback_host(host) or bare.lower() in self.engine_hosts

    def check_model_path(self, path: str) -> None:
        """Raise ``ModelPathError`` unless ``path`` lies lexically inside a model root (the
        same message whether it exists or not; symlinks are resolved when it is read)."""
        require_printable(path, "model_path")
        if not any(inside(_norm(path), d) for d in self.model_dirs):
            raise ModelPathError(
                "model_path is outside the allowed model directories; name its directory in "
                "--allowed-model-dirs"
            )
