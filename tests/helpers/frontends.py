"""The frontend count the serve-level tests run ``serve`` with: ``SMG_TRIO_TEST_API_SERVER_COUNT``
(default 1). ``SMG_TRIO_TEST_API_SERVER_COUNT=2 pytest tests/serve ...`` is the second pass of
those suites against two frontend processes (docs/multi-frontend.md); a test that inherently
needs one process is marked :data:`single_frontend` and skips, with its reason, under N > 1."""

from __future__ import annotations

import os

import attrs
import pytest

from smg_trio.serve.config import GatewayConfig

__all__ = [
    "API_SERVER_COUNT",
    "ENV",
    "multi_frontend",
    "serve_args",
    "single_frontend",
    "with_api_server_count",
]

ENV = "SMG_TRIO_TEST_API_SERVER_COUNT"
#: The ``--api-server-count`` of every ``serve`` the shared tests start.
API_SERVER_COUNT = int(os.environ.get(ENV, "1") or "1")
#: True in the second pass (two or more frontends).
multi_frontend = API_SERVER_COUNT > 1


def serve_args() -> list[str]:
    """The CLI flags to add to a ``serve``/``launch`` command line (none at N=1)."""
    return ["--api-server-count", str(API_SERVER_COUNT)] if multi_frontend else []


def with_api_server_count(config: GatewayConfig) -> GatewayConfig:
    """``config`` for the embedding API, with this pass's frontend count."""
    return attrs.evolve(config, api_server_count=API_SERVER_COUNT)


def single_frontend(reason: str) -> pytest.MarkDecorator:
    """Skip under N > 1: the test needs the gateway in one process (``reason`` says why)."""
    return pytest.mark.skipif(
        multi_frontend, reason=f"{ENV}={API_SERVER_COUNT}: needs one frontend ({reason})"
    )
