"""Fixtures for the conformance runner self-tests: a fake OpenAI server per test."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import trio
from fake_openai_server import start_fake

StartFake = Callable[..., Awaitable[str]]


@pytest.fixture
def fake(nursery: trio.Nursery) -> StartFake:
    """``await fake(faults)`` serves a fake in the test's nursery and returns its base URL."""

    async def start(faults: frozenset[str] = frozenset()) -> str:
        return await start_fake(nursery, faults)

    return start
