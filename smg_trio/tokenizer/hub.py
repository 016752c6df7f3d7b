"""Hugging Face model ids (``org/name``): resolve one to its snapshot in the local hub cache."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable

import attrs

__all__ = [
    "HUB_FILES",
    "HubModel",
    "HubModelError",
    "hf_hub_cache",
    "hub_offline",
    "is_hub_id",
    "is_revision",
    "resolve_hub_model",
]

#: What the gateway fetches of a repo: the tokenizer and config files it reads (the weights
#: are the engine's), plus ``tokenizer.model`` so that a SentencePiece-only repo is recognised.
HUB_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "config.json",
    "generation_config.json",
    "tokenizer.model",
)

_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9_-])?"
_HUB_ID = re.compile(rf"{_PART}/{_PART}")


class HubModelError(ValueError):
    """A hub id that cannot be resolved; the message says what to do. ``public`` is the
    same without the gateway's paths (the hub cache's), for an answer to an API client."""

    def __init__(self, message: str, public: str | None = None) -> None:
        super().__init__(message)
        self.public = message if public is None else public


def hf_hub_cache() -> str:
    """The Hugging Face hub cache, as ``huggingface_hub`` finds it: ``$HF_HUB_CACHE``, else
    ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub`` (``~/.cache`` by default).
    Read at each call (``huggingface_hub`` reads it once, at import)."""
    env = os.environ
    cache = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    if cache:
        return os.path.expanduser(cache)
    home = env.get("HF_HOME") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "huggingface",
    )
    return os.path.join(os.path.expanduser(home), "hub")


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` is set to a true value (read at each call)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def is_hub_id(text: str) -> bool:
    """Whether ``text`` is spelled like a hub repo id (``org/name``, no ``--`` or ``..``). As
    in vLLM, a local directory of that name wins: callers check ``os.path.isdir`` first."""
    return bool(_HUB_ID.fullmatch(text)) and "--" not in text and ".." not in text


#: A branch, tag, ``refs/pr/N`` or commit: huggingface_hub joins a revision onto its cache
#: path (``refs/<revision>``), so one from a request is held to this before it is used.
_REVISION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*(?:/[A-Za-z0-9_][A-Za-z0-9._-]*)*")


def is_revision(text: str) -> bool:
    """Whether ``text`` is spelled like a hub revision: path-safe segments (no ``..``, no
    leading ``/`` or ``.``), at most 256 characters."""
    return len(text) <= 256 and bool(_REVISION.fullmatch(text)) and ".." not in text


@attrs.frozen
class HubModel:
    """A resolved hub id: its snapshot directory in the cache and the commit it holds."""

    repo_id: str
    path: str
    commit: str


def _fetch_hint(repo_id: str, revision: str | None) -> str:
    rev = f" --revision {revision}" if revision else ""
    return f"hf download {repo_id}{rev}"


def resolve_hub_model(
    repo_id: str,
    revision: str | None = None,
    *,
    allow_download: bool = True,
    progress: Callable[[str], None] | None = None,
) -> HubModel:
    """The snapshot of ``repo_id`` at ``revision`` (a branch, tag or commit; default
    ``main``) in :func:`hf_hub_cache`. When the cache lacks it, ``allow_download`` is set and
    ``HF_HUB_OFFLINE`` is not, only :data:`HUB_FILES` are fetched, with a line to ``progress``
    before and after. Raises :class:`HubModelError` naming the id and how to fetch it.
    Blocking I/O (and network): call it from a worker thread on a server."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    cache = hf_hub_cache()
    at = f" at revision {revision!r}" if revision else ""
    try:
        path = snapshot_download(repo_id, revision=revision, cache_dir=cache, local_files_only=True)
    except (LocalEntryNotFoundError, IsADirectoryError, NotADirectoryError):
        # (a revision that names a folder of refs/, as "refs" does when refs/pr/1 is cached:
        # huggingface_hub opens refs/<revision> as its ref file)
        path = None
    except OSError as exc:
        raise HubModelError(
            f"model {repo_id!r}{at}: its entry in the Hugging Face cache ({cache}) could not "
            f"be read ({exc.strerror or exc})",
            f"model {repo_id!r}{at}: its entry in the Hugging Face cache could not be read",
        ) from exc
    if path is None:
        if hub_offline() or not allow_download:
            why = "HF_HUB_OFFLINE is set" if hub_offline() else "it is not fetched from here"
            hint = (
                f"fetch it first: `{_fetch_hint(repo_id, revision)}` (with HF_HOME set as "
                "here), or pass a local model directory"
            )
            raise HubModelError(
                f"model {repo_id!r}{at} is not in the Hugging Face cache ({cache}) and {why}; "
                + hint,
                f"model {repo_id!r}{at} is not in the Hugging Face cache and {why}; " + hint,
            )
        if progress is not None:
            progress(
                f"fetching the tokenizer and config files of {repo_id}{at} from the Hugging "
                f"Face Hub into {cache} (the engine fetches the weights)"
            )
        t0 = time.monotonic()
        try:
            path = snapshot_download(
                repo_id, revision=revision, cache_dir=cache, allow_patterns=list(HUB_FILES)
            )
        except RepositoryNotFoundError as exc:
            raise HubModelError(
                f"model {repo_id!r} is not on the Hugging Face Hub, or is gated or private "
                "(set HF_TOKEN to a token that may read it)"
            ) from exc
        except RevisionNotFoundError as exc:
            raise HubModelError(f"model {repo_id!r} has no revision {revision!r}") from exc
        except OSError as exc:  # no network, a proxy, a full disk
            raise HubModelError(
                f"model {repo_id!r}{at}: fetching it failed ({exc}); fetch it with "
                f"`{_fetch_hint(repo_id, revision)}`, or set HF_HUB_OFFLINE=1 and pass a local "
                "model directory"
            ) from exc
        if progress is not None:
            progress(f"fetched {repo_id} in {time.monotonic() - t0:.1f} s")
    assert isinstance(path, str)
    return HubModel(repo_id, path, os.path.basename(os.path.normpath(path)))
