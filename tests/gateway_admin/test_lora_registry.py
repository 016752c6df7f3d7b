"""The LoRA registry (smg_trio/lora.py): stable ids, waiting and running counts, the mirror a
frontend takes, the base-model match."""

from __future__ import annotations

import pytest

from smg_trio.errors import ConflictError
from smg_trio.lora import LoraAdapter, LoraRegistry, base_model_matches, lora_int_id


def test_ids_are_stable_positive_and_distinct() -> None:
    assert (
        lora_int_id("sql") == lora_int_id("sql") == 1_467_860_316
    )  # pinned: every process, every version
    ids = {lora_int_id(f"adapter-{i}") for i in range(2000)}
    assert len(ids) == 2000
    assert all(1 <= i < 2**31 for i in ids)


def test_waiting_then_running_then_gone() -> None:
    changes: list[int] = []
    reg = LoraRegistry(on_change=lambda: changes.append(1))
    reg.add(LoraAdapter("a", "m", "/p", lora_int_id("a")))
    with pytest.raises(ConflictError):
        reg.add(LoraAdapter("a", "m", "/q", lora_int_id("a")))
    reg.acquire("a")
    reg.acquire("a")
    assert (reg.waiting(), reg.running(), reg.inflight("a")) == (["a"], [], 2)
    reg.start("a")
    assert (reg.waiting(), reg.running()) == (["a"], ["a"])
    reg.release("a", started=True)
    reg.release("a", started=False)
    assert (reg.waiting(), reg.running(), reg.inflight("a")) == ([], [], 0)
    mirror = LoraRegistry()
    mirror.replace(reg.to_json())
    assert mirror.all() == reg.all()
    assert reg.remove("a") is not None
    assert len(changes) == 2


@pytest.mark.parametrize(
    ("theirs", "ours", "match"),
    [
        (None, ["m"], True),
        ("m", ["m"], True),
        ("/models/tiny", ["tiny"], True),
        ("Qwen/Qwen3-0.6B", ["q", "/hf/models--Qwen--Qwen3-0.6B/snapshots/abc"], True),
        ("org/other", ["m", "/models/tiny"], False),
    ],
)
def test_base_model_match(theirs: str | None, ours: list[str], match: bool) -> None:
    assert base_model_matches(theirs, ours) is match
