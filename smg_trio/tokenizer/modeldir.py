"""``ModelDir``: read a model directory's files only where they resolve inside allowed roots."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from smg_trio.errors import ModelPathError

__all__ = ["MODEL_FILES", "ModelDir", "inside"]

#: Every file the gateway reads from a model directory.
MODEL_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "config.json",
    "generation_config.json",
)


def inside(path: str, root: str) -> bool:
    """Whether the normalised absolute ``path`` is ``root`` or lies below it."""
    return path == root or path.startswith(root.rstrip("/") + "/")


class ModelDir:
    """A local model directory. With ``roots`` (directories), the directory and every file read
    through it must resolve (``os.path.realpath``, so symlinks followed) inside one of them;
    otherwise :class:`~smg_trio.errors.ModelPathError`. Containment is decided before anything
    is looked at outside the roots, so the error is the same whether such a path exists or not.
    A Hugging Face cache's ``snapshots/<rev>/file -> ../../blobs/<hash>`` links stay inside
    the cache root and are followed. Without ``roots`` nothing is confined (library use). Does
    blocking I/O: call it from a worker thread on a server.
    """

    def __init__(self, path: str | os.PathLike[str], roots: Sequence[str] | None = None) -> None:
        self.path = Path(path)
        self._roots = None if roots is None else tuple(os.path.realpath(r) for r in roots)
        if self._roots is not None and not self._allowed(os.path.realpath(self.path)):
            raise ModelPathError(
                "model_path is outside the allowed model directories; name its directory in "
                "--allowed-model-dirs"
            )

    def _allowed(self, real: str) -> bool:
        return self._roots is None or any(inside(real, r) for r in self._roots)

    def file(self, name: str) -> Path | None:
        """The path to read for ``name`` (resolved when confined), or ``None`` if there is no
        such regular file. Raises ``ModelPathError`` if it resolves outside the roots."""
        p = self.path / name
        if self._roots is None:
            return p if p.is_file() else None
        real = os.path.realpath(p)
        if not self._allowed(real):
            raise ModelPathError(
                f"{name} in model_path resolves outside the allowed model directories (a "
                "symlink out of them?); name its target's directory in --allowed-model-dirs"
            )
        return Path(real) if os.path.isfile(real) else None

    def read_text(self, name: str) -> str | None:
        """The UTF-8 text of ``name``, or ``None`` if it is missing. Confined, the resolved
        path is opened with ``O_NOFOLLOW``: a file swapped for a symlink meanwhile is refused."""
        path = self.file(name)
        if path is None:
            return None
        if self._roots is None:
            return path.read_text(encoding="utf-8")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:  # ELOOP: replaced by a symlink after the check
            raise ModelPathError(
                f"{name} in model_path cannot be read safely: {exc.strerror}"
            ) from exc
        with os.fdopen(fd, encoding="utf-8") as f:
            return f.read()

    def check_files(self) -> None:
        """Raise ``ModelPathError`` if any of :data:`MODEL_FILES` resolves outside the roots."""
        for name in MODEL_FILES:
            self.file(name)
