"""``BodyBudget``: the bytes the requests in flight hold, reserved first come first served;
and ``decoded_bytes``, the estimate a body reserves before it is decoded."""

from __future__ import annotations

import json
import sys
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from smg_trio.gateway.http.budget import BodyBudget, decoded_bytes


async def test_reservations_wait_in_order_and_release_wakes_those_that_fit() -> None:
    budget = BodyBudget(100)
    a, b, c = object(), object(), object()
    await budget.reserve(a, 60)
    got: list[str] = []

    async def take(owner: object, nbytes: int, name: str) -> None:
        await budget.reserve(owner, nbytes)
        got.append(name)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(take, b, 50, "b")
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(take, c, 10, "c")  # fits, but b came first: it waits
            await trio.testing.wait_all_tasks_blocked()
            assert got == []
            assert budget.waiting == 2
            assert budget.try_resize(a, 90)  # an admitted request grows while room is left
            assert not budget.try_resize(a, 101)
            assert budget.held == 90
            assert budget.waiting == 2
            assert budget.try_resize(a, 45)  # giving back wakes b, which now fits; not c yet
            await trio.testing.wait_all_tasks_blocked()
            assert got == ["b"]
            budget.release(a)
    assert got == ["b", "c"]
    assert budget.held == 60
    assert budget.reserved(b) == 50
    budget.release(b)
    budget.release(c)
    assert budget.held == 0
    with pytest.raises(ValueError, match="more than the budget"):
        await budget.reserve(a, 101)


async def test_a_cancelled_waiter_leaves_the_queue_and_holds_nothing() -> None:
    budget = BodyBudget(100)
    a, b, c = object(), object(), object()
    await budget.reserve(a, 90)
    b_scope = trio.CancelScope()

    async def b_waits() -> None:
        with b_scope:
            await budget.reserve(b, 50)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(b_waits)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(budget.reserve, c, 10)  # fits, but waits behind b
            await trio.testing.wait_all_tasks_blocked()
            assert budget.waiting == 2
            b_scope.cancel()  # b gives up: c, now first, fits and is woken
    assert budget.reserved(b) == 0
    assert budget.reserved(c) == 10
    assert budget.held == 100
    assert budget.waiting == 0


def _size_of(value: Any, seen: set[int] | None = None) -> int:
    """Deep ``sys.getsizeof`` of a decoded JSON value, each object once (msgspec shares
    short dict keys, CPython small ints)."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return 0
    seen.add(id(value))
    size = sys.getsizeof(value)
    if isinstance(value, dict):
        size += sum(_size_of(k, seen) + _size_of(v, seen) for k, v in value.items())
    elif isinstance(value, list):
        size += sum(_size_of(v, seen) for v in value)
    return size


@pytest.mark.parametrize(
    "value",
    [
        {"messages": [{"role": "user", "content": "hello world, " * 5000}]},
        {"messages": [{}] * 5000},
        {"messages": [[]] * 5000},
        {"tokens": list(range(5000))},
        {"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(500)]},
        {"prompt": "\U0001f600" + "x" * 10000},
        {f"k{i}": i for i in range(5000)},
        {"s": ["a"] * 5000},
    ],
    ids=["prose", "objects", "lists", "ints", "tools", "astral", "keys", "strings"],
)
def test_the_estimate_is_at_least_what_decoding_takes(value: Any) -> None:
    data = json.dumps(value, separators=(",", ":")).encode()
    decoded = msgspec.json.decode(data)
    assert decoded_bytes(data) >= _size_of(decoded)
