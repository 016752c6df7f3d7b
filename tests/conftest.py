"""Fixtures shared by every test directory (helpers live in ``tests/helpers``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from smg_trio.mock.tiny_model import default_tiny_model_dir
from tests.helpers import deepseek_vocab
from tests.helpers.ipc import IpcNamespace


@pytest.fixture(scope="session")
def model_dir() -> Path:
    """The generated tiny model (built once per machine)."""
    return default_tiny_model_dir()


@pytest.fixture(scope="session")
def deepseek_model_dir() -> Path:
    """A model directory with DeepSeek's real vocabulary and a tool-rendering chat template
    (tests/helpers/deepseek_vocab.py, built once per machine): the mock engine and the
    gateway serve it."""
    return deepseek_vocab.deepseek_model_dir()


@pytest.fixture
def ns() -> Iterator[IpcNamespace]:
    """A private ipc namespace (socket directory and handshake ports), removed afterwards."""
    with IpcNamespace() as namespace:
        yield namespace
