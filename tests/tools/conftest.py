"""Fixtures for the tool-call tests: a private socket dir for the scripted-mock gateways."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator

import pytest


@pytest.fixture
def sock_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh, short ``SMG_ZMQ_SOCKET_DIR`` (AF_UNIX paths are limited to 107 bytes)."""
    directory = tempfile.mkdtemp(prefix="smg-")
    monkeypatch.setenv("SMG_ZMQ_SOCKET_DIR", directory)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)
