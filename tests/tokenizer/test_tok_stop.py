"""Stop strings: hold back only possible stop prefixes, report the match, single-token ids."""

from __future__ import annotations

import random

import pytest

from smg_trio.tokenizer import StopMatcher, Tokenizer, single_token_stop_ids


def _feed(m: StopMatcher, deltas: list[str]) -> tuple[list[str], str | None]:
    out: list[str] = []
    matched: str | None = None
    for d in deltas:
        text, stop = m.push(d)
        out.append(text)
        if stop is not None:
            assert matched is None  # reported exactly once
            matched = stop
    out.append(m.flush())
    return out, matched


def test_holds_only_the_prefix() -> None:
    m = StopMatcher(["STOP"])
    assert m.push("abc ST") == ("abc ", None)
    assert m.held == "ST"
    assert m.push("A") == ("STA", None)  # "STA" is no prefix of "STOP": released at once
    assert m.held == ""
    assert m.push("xS") == ("x", None)
    assert m.push("TO") == ("", None)
    assert m.push("P and more") == ("", "STOP")
    assert m.matched == "STOP"
    assert m.push("later") == ("", None)  # nothing after a match
    assert m.flush() == ""


def test_include_stop_str() -> None:
    out, matched = _feed(StopMatcher(["\n\n"], include_stop_str_in_output=True), ["a", "\n", "\nb"])
    assert "".join(out) == "a\n\n"
    assert matched == "\n\n"
    out, matched = _feed(StopMatcher(["\n\n"]), ["a", "\n", "\nb"])
    assert "".join(out) == "a"


def test_no_match_flushes_held() -> None:
    out, matched = _feed(StopMatcher(["</end>"]), ["x </e", "n"])
    assert matched is None
    assert out == ["x ", "", "</en"]


def test_earliest_match_wins_ties_to_first_listed() -> None:
    assert StopMatcher(["world", "lo"]).push("hello world") == ("hel", "lo")
    assert StopMatcher(["ab", "abc"]).push("xabc") == ("x", "ab")
    # a shorter stop can start inside a held prefix of a longer one
    m = StopMatcher(["abc", "bd"])
    assert m.push("ab") == ("", None)
    assert m.push("d") == ("a", "bd")


def test_empty_and_no_stops() -> None:
    m = StopMatcher(["", ""])
    assert m.push("anything") == ("anything", None)
    assert m.flush() == ""


def test_random_chunking_never_leaks_a_prefix() -> None:
    rng = random.Random(5)
    stops = ["STOP", "<|x|>", "ab"]
    alphabet = "aSTOPb<|x>c "
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randint(0, 5))))
        deltas = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        m = StopMatcher(stops)
        out, matched = _feed(m, deltas)
        hits = [(text.find(s), i, s) for i, s in enumerate(stops) if s in text]
        if hits:
            idx, _, stop = min(hits)
            assert matched == stop
            assert "".join(out) == text[:idx]
        else:
            assert matched is None
            assert "".join(out) == text
        # no emitted chunk ever ends with a stop prefix that later completed the stop
        emitted = "".join(out[:-1])
        assert all(s not in emitted for s in stops)


@pytest.mark.parametrize("include", [True, False])
def test_stop_inside_a_single_delta(include: bool) -> None:
    m = StopMatcher(["STOP"], include_stop_str_in_output=include)
    assert m.push("abSTOPcd") == ("abSTOP" if include else "ab", "STOP")


def test_single_token_stop_ids(tok: Tokenizer) -> None:
    (comma,) = tok.encode(",")
    im_end = tok.added_tokens["<|im_end|>"]
    assert len(tok.encode("a much longer stop string")) > 1
    stops = [",", "<|im_end|>", "a much longer stop string", "", ","]
    assert single_token_stop_ids(tok, stops) == [comma, im_end]
    assert single_token_stop_ids(tok, []) == []
