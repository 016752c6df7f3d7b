"""PrefixIndex: the same answers as materialising every prefix, in linear memory."""

from __future__ import annotations

import random
import tracemalloc

from smg_trio.tokenizer._holdback import PrefixIndex


def _brute(text: str, markers: list[str]) -> int:
    prefixes = {m[:k] for m in markers for k in range(1, len(m))}
    return max((k for k in range(1, len(text) + 1) if text[-k:] in prefixes), default=0)


def test_matches_the_brute_force_on_random_inputs() -> None:
    rng = random.Random(7)
    for _ in range(3000):
        alphabet = "ab" if rng.random() < 0.5 else "abc<>/"
        markers = [
            "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 7)))
            for _ in range(rng.randint(0, 4))
        ]
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        assert PrefixIndex(markers).partial_suffix_len(text) == _brute(text, markers), (
            text,
            markers,
        )


def test_examples() -> None:
    index = PrefixIndex(["</think>", "STOP"])
    assert index.partial_suffix_len("hello </th") == 4
    assert index.partial_suffix_len("hello ST") == 2
    assert index.partial_suffix_len("hello") == 0
    assert index.partial_suffix_len("") == 0
    assert index.max_len == 7
    assert PrefixIndex([]).partial_suffix_len("abc") == 0
    assert PrefixIndex(["x"]).partial_suffix_len("x") == 0  # a 1-char marker has no proper prefix


def test_memory_is_linear_in_the_marker_length() -> None:
    """A 40k-character marker materialised as prefixes is ~800 MB; the index stays small."""
    tracemalloc.start()
    try:
        index = PrefixIndex(["a" * 40_000])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 1024 * 1024, peak
    assert index.partial_suffix_len("b" + "a" * 10) == 10
