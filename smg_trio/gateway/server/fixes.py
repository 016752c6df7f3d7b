"""What each hypercorn/h11 fix relies on, checked at startup: a missing target fails loudly.

Every fix in this package reaches into names that hypercorn and h11 do not promise to keep
(private methods, instance attributes). Each declares a :class:`Fix`: the releases it was
verified against and the names it needs. :meth:`Fix.check` runs before smg_trio's server
starts: a name that is gone raises :class:`FixTargetMissing` (naming the fix, the release it
was written against, the installed one and the missing name), so an upgrade can never quietly
drop a fix for a server crash. A different release whose names are all there only logs a
warning: the pins in ``pyproject.toml`` are the verified ones.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import PackageNotFoundError, version

import attrs
from hypercorn.config import Config

__all__ = ["Fix", "FixTargetMissing", "missing_attrs", "unset_attrs"]

log = logging.getLogger(__name__)


class FixTargetMissing(RuntimeError):
    """A hypercorn/h11 fix cannot be applied: what it patches is gone from the installed
    release."""


def _series(text: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in text.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def _resolve(target: str) -> bool:
    """Whether ``"package.module:Qual.name"`` exists."""
    module_name, _, qualname = target.partition(":")
    try:
        obj: object = importlib.import_module(module_name)
    except ImportError:
        return False
    for attr in filter(None, qualname.split(".")):
        if not hasattr(obj, attr):
            return False
        obj = getattr(obj, attr)
    return True


@attrs.frozen(eq=False)
class Fix:
    """One workaround: ``verified`` maps each distribution to the ``major.minor`` release it
    was written against; ``targets`` are the ``module:Qual.name`` names it needs; ``probe``
    builds the objects it reaches into and returns the instance attributes they lack."""

    name: str
    verified: Mapping[str, str]
    targets: tuple[str, ...]
    probe: Callable[[], Iterable[str]] | None = None

    def _expected(self) -> str:
        return ", ".join(f"{dist} {series}.x" for dist, series in self.verified.items())

    def _installed(self) -> str:
        found = []
        for dist in self.verified:
            try:
                found.append(f"{dist} {version(dist)}")
            except PackageNotFoundError:
                found.append(f"{dist} (not installed)")
        return ", ".join(found)

    def _fail(self, missing: str) -> FixTargetMissing:
        return FixTargetMissing(
            f"smg_trio's fix {self.name!r} was written against {self._expected()}; the "
            f"installed {self._installed()} has no {missing}. Install the pinned versions "
            "(see pyproject.toml) or port the fix."
        )

    def check(self) -> None:
        """Raise :class:`FixTargetMissing` if a target is gone; warn on another release."""
        for target in self.targets:
            if not _resolve(target):
                raise self._fail(target)
        if self.probe is not None:
            try:
                missing = list(self.probe())
            except Exception as exc:  # a constructor that changed shape
                raise self._fail(f"the construction it relies on ({exc!r})") from exc
            if missing:
                raise self._fail(", ".join(missing))
        for dist, series in self.verified.items():
            try:
                installed = version(dist)
            except PackageNotFoundError as exc:
                raise self._fail(f"distribution {dist}") from exc
            if _series(installed) != _series(series):
                log.warning(
                    "smg_trio's fix %r was verified against %s %s.x, not %s; its targets are "
                    "present, so it is applied",
                    self.name,
                    dist,
                    series,
                    installed,
                )


def probe_config() -> Config:
    """A hypercorn ``Config`` for a probe, logging nowhere: a default one's ``log`` gives
    the shared ``hypercorn.error`` logger a stderr handler of its own, so that every line
    after it (the gateway's "Running on" among them) was printed raw besides the gateway's
    own log (twice in text, once not JSON under ``--log-format json``)."""
    config = Config()
    config.errorlog = None
    return config


def missing_attrs(obj: object, names: Iterable[str]) -> list[str]:
    """The ``names`` that ``obj`` lacks, spelled ``Type().name``."""
    return [f"{type(obj).__name__}().{name}" for name in names if not hasattr(obj, name)]


def unset_attrs(cls: type, names: Iterable[str]) -> list[str]:
    """The ``names`` that ``cls.__init__`` never assigns (``self.name = ...``), spelled
    ``Type().name``: for instance attributes of classes too costly to build in a probe."""
    code = getattr(vars(cls).get("__init__"), "__code__", None)
    assigned = set(code.co_names) if code is not None else set()
    return [f"{cls.__name__}().{name}" for name in names if name not in assigned]
