"""Fixtures of the real-peer (e2e) lane: the tiny model it serves.

Every test here is marked ``e2e`` and skips, with the reason and the install command, unless
``SMG_TRIO_E2E=1`` and the peers it needs are installed (``bash scripts/setup_peers.sh``).
The lane's plumbing (process groups, readiness waits, chat requests) is in
:mod:`tests.helpers.e2e`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from smg_trio.mock.tiny_model import build_tiny_model
from tests.helpers.e2e import E2E_ENV, INSTALL_HINT


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random Llama (byte-level BPE, ChatML template) the lane serves."""
    if os.environ.get(E2E_ENV) != "1":
        pytest.skip(f"real-peer lane is off: set {E2E_ENV}=1 ({INSTALL_HINT})")
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))
