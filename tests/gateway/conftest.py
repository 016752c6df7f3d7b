"""Gateway test fixtures: the tiny model, its tokenizer, and the harness factory
(:mod:`tests.helpers.gateway`)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

from smg_trio.mock.tiny_model import build_tiny_model
from smg_trio.tokenizer import Tokenizer
from tests.helpers.gateway import HarnessFactory, open_harness


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("gw-tiny") / "model")


@pytest.fixture(scope="session")
def tok(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(tiny_model_dir)


@pytest.fixture
def harness(tok: Tokenizer, tiny_model_dir: Path) -> HarnessFactory:
    """``async with harness(plan=..., protocol=..., config=...) as h:``"""
    return partial(open_harness, tok, tiny_model_dir)


@pytest.fixture(params=["fast_http1", "hypercorn"])
def harness_both(
    request: pytest.FixtureRequest, tok: Tokenizer, tiny_model_dir: Path
) -> HarnessFactory:
    """The harness on the HTTP/1.1 fast path, then with every connection on hypercorn's
    (``GatewayHttpConfig.fast_http1`` off)."""
    return partial(open_harness, tok, tiny_model_dir, fast_http1=request.param == "fast_http1")
