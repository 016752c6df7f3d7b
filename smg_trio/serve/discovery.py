"""File service discovery: watch a JSON or TOML list of worker specs and reconcile the workers.

``--discovery-file FILE`` (smg: ``--discovery-provider file --discovery-file FILE``; a
Kubernetes ConfigMap mounted as a file). The file is a list of worker specs, each an object
with the fields ``POST /workers`` takes (:func:`~smg_trio.serve.admin.parse_worker_spec`):
in JSON a top-level array or ``{"workers": [...]}``, in TOML (a ``.toml`` name) ``[[workers]]``
tables. Fields an entry leaves out take the gateway's startup values (``--model-path``,
``--served-model-name``, ``--backend``, ``--zmq-engine-count``, ``--reasoning-parser``).

The watcher reads the file every :data:`DISCOVERY_POLL_S` seconds (trio, no threads of its
own, no inotify) and acts when its content hash changes:

- an entry with a new URL is registered (the registration workflow, as ``POST /workers``);
- an entry that is gone is drained and removed; one whose spec changed is removed, then
  added again (one URL is one worker, so the two cannot overlap: requests wait for the new
  one, see ``--worker-wait-timeout-secs``; its engine must dial in again, as after a
  restart). New URLs are added before anything is removed,
  so renaming an entry (a rolling update) never leaves the model without a worker;
- an entry with an unknown key, a wrongly typed field, a URL or path outside the allow-lists,
  or the URL of an earlier entry is refused with a log line naming it; the others apply. A
  refused entry whose URL already runs keeps its worker as it was;
- a file that cannot be read or parsed is logged (once per distinct error) and the last good
  set is kept;
- the watcher only touches the workers it added: a URL already registered over the API is
  refused (409) and left alone; a worker of the file deleted over the API, or whose
  registration failed, is registered again the next time the file changes.

Confinement: entries go through the same checks as ``POST /workers``
(:class:`~smg_trio.worker.confine.WorkerConfinement`). The file's own socket directories do
NOT widen the allow-list, unlike ``--worker-urls``: the file changes while the gateway runs,
often written by something other than the operator who started it, so whoever can write it
must not gain the power to bind sockets or read models elsewhere. Name the directories with
``--socket-dir``/``--allowed-socket-dirs`` and ``--allowed-model-dirs``.
"""

from __future__ import annotations

import hashlib
import logging
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import trio

from smg_trio import jsontext
from smg_trio.errors import ValidationError
from smg_trio.serve.admin import parse_worker_spec
from smg_trio.worker.confine import escape
from smg_trio.worker.manager import WorkerManager, WorkerSpec

__all__ = ["DISCOVERY_POLL_S", "DiscoveryFileError", "DiscoveryWatcher", "parse_discovery"]

log = logging.getLogger(__name__)

#: How often the discovery file is read (seconds).
DISCOVERY_POLL_S = 1.0


class DiscoveryFileError(ValueError):
    """The discovery file as a whole is malformed (not JSON/TOML, not a list of objects)."""


def parse_discovery(data: bytes, *, toml: bool) -> list[Any]:
    """The raw entries of a discovery file: a JSON array (or ``{"workers": [...]}``), or a TOML
    document with a ``workers`` array of tables. Entries are checked one by one later.
    Raises :class:`DiscoveryFileError`."""
    doc: Any
    if toml:
        try:
            doc = tomllib.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise DiscoveryFileError(f"not valid TOML: {exc}") from None
    else:
        try:
            doc = jsontext.loads(data, param=None, what="the discovery file")
        except ValidationError as exc:
            raise DiscoveryFileError(exc.message) from None
    if isinstance(doc, dict):
        extra = sorted(str(k) for k in doc if k != "workers")
        if extra:
            raise DiscoveryFileError(f"unknown top-level key(s): {', '.join(extra)}")
        doc = doc.get("workers", [])
    if not isinstance(doc, list):
        raise DiscoveryFileError("expected a list of worker specs (or a 'workers' list)")
    return doc


def _entry_name(index: int, entry: Any) -> str:
    url = entry.get("url") if isinstance(entry, dict) else None
    return f"entry {index}" + (f" ({escape(url)})" if isinstance(url, str) else "")


@attrs.define(eq=False)
class DiscoveryWatcher:
    """Reconciles ``manager``'s workers with the discovery file at ``path``.

    Run it with ``await nursery.start(watcher.run)``: it returns once the file was read the
    first time (its workers' registrations are started, not finished). ``defaults`` are spec
    fields an entry may leave out. ``generation`` counts applied versions of the file and
    ``updated`` is set (then replaced) after each read that changed something or failed.
    """

    manager: WorkerManager
    path: Path = attrs.field(converter=Path)
    defaults: Mapping[str, Any] = attrs.field(factory=dict)
    poll_s: float = DISCOVERY_POLL_S
    #: URL -> (the spec applied, the id of the worker it registered).
    applied: dict[str, tuple[WorkerSpec, str]] = attrs.field(factory=dict)
    generation: int = 0
    #: The last problem with the file as a whole (``None`` after a good read).
    error: str | None = None
    updated: trio.Event = attrs.field(factory=trio.Event)
    _digest: bytes | None = None
    _lock: trio.Lock = attrs.field(factory=trio.Lock)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Poll the file until cancelled."""
        log.info("watching discovery file %s", self.path)
        await self.poll_once()
        task_status.started()
        while True:
            await trio.sleep(self.poll_s)
            await self.poll_once()

    async def poll_once(self) -> None:
        """Read the file once; apply it if its content changed (one apply at a time)."""
        async with self._lock:
            await self._poll()

    async def _poll(self) -> None:
        try:
            data = await trio.Path(self.path).read_bytes()
        except OSError as exc:
            self._fail(f"cannot read it: {exc.strerror or exc}")
            return
        digest = hashlib.sha256(data).digest()
        if digest == self._digest:
            return
        self._digest = digest
        try:
            entries = parse_discovery(data, toml=self.path.suffix.lower() == ".toml")
        except DiscoveryFileError as exc:
            self._fail(str(exc))
            return
        self.error = None
        desired = await self._specs(entries)
        await self._apply(desired)
        self.generation += 1
        self._notify()

    def _fail(self, message: str) -> None:
        if message != self.error:
            self.error = message
            log.error(
                "discovery file %s: %s; keeping the last good set of %d worker(s)",
                self.path,
                escape(message),
                len(self.applied),
            )
            self._notify()

    def _notify(self) -> None:
        updated, self.updated = self.updated, trio.Event()
        updated.set()

    async def _specs(self, entries: list[Any]) -> dict[str, WorkerSpec]:
        """The valid entries by URL; refused ones are logged (one whose URL runs keeps its
        applied spec)."""
        desired: dict[str, WorkerSpec] = {}
        for index, entry in enumerate(entries):
            name = _entry_name(index, entry)
            try:
                merged = {**self.defaults, **entry} if isinstance(entry, dict) else entry
                spec = parse_worker_spec(merged, what="a discovery entry")
                if spec.url in desired:
                    raise ValidationError(f"duplicate entry for url {spec.url}", param="url")
                spec = await self.manager.check_spec(spec)
            except Exception as exc:  # one entry never ends serve
                if isinstance(exc, ValidationError):
                    why = exc.message
                else:  # a fault of ours, not of the file: logged with its traceback
                    log.exception("discovery file %s: %s failed its checks", self.path, name)
                    why = f"internal error: {type(exc).__name__}"
                log.error("discovery file %s: refused %s: %s", self.path, name, escape(why))
                url = entry.get("url") if isinstance(entry, dict) else None
                if isinstance(url, str) and url in self.applied and url not in desired:
                    desired[url] = self.applied[url][0]
                continue
            desired[spec.url] = spec
        return desired

    async def _apply(self, desired: dict[str, WorkerSpec]) -> None:
        manager = self.manager
        for url, (_, worker_id) in list(self.applied.items()):
            if manager.get_worker(worker_id) is None:  # deleted over the API, or failed
                del self.applied[url]
        for url, spec in desired.items():
            if url not in self.applied:
                self._add(spec)
        gone = [url for url in self.applied if url not in desired]
        changed = [
            url
            for url, (spec, _) in self.applied.items()
            if url in desired and desired[url] != spec
        ]
        async with trio.open_nursery() as nursery:
            for url in gone:
                nursery.start_soon(self._remove, url)
            for url in changed:
                nursery.start_soon(self._replace, url, desired[url])

    def _add(self, spec: WorkerSpec) -> None:
        try:
            job = self.manager.add_worker(spec)
        except ValidationError as exc:
            log.error("discovery file %s: refused %s: %s", self.path, spec.url, escape(exc.message))
            return
        assert job.worker_id is not None
        self.applied[spec.url] = (spec, job.worker_id)
        log.info("discovery: registering worker %s (%s)", spec.url, job.worker_id)

    async def _remove(self, url: str) -> None:
        _, worker_id = self.applied.pop(url)
        log.info("discovery: removing worker %s (%s)", url, worker_id)
        await self.manager.remove_worker(worker_id)

    async def _replace(self, url: str, spec: WorkerSpec) -> None:
        await self._remove(url)
        self._add(spec)
