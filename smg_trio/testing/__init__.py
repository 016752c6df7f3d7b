"""Test helpers: the mock engine (also ``python -m smg_trio.testing.mock_engine``) and private
ipc namespaces.

The exports are resolved lazily so that ``python -m smg_trio.testing.mock_engine`` does not
import the module twice (runpy warns when the package already imported it).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from smg_trio.testing.ipc import IpcNamespace
    from smg_trio.testing.mock_engine import MockEngine, MockEngineConfig, MockRequest, Plan

__all__ = ["IpcNamespace", "MockEngine", "MockEngineConfig", "MockRequest", "Plan"]

_EXPORTS = {
    "IpcNamespace": "smg_trio.testing.ipc",
    "MockEngine": "smg_trio.testing.mock_engine",
    "MockEngineConfig": "smg_trio.testing.mock_engine",
    "MockRequest": "smg_trio.testing.mock_engine",
    "Plan": "smg_trio.testing.mock_engine",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
