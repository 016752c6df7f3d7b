"""Per-token text and bytes for OpenAI logprobs rendering."""

from __future__ import annotations

from smg_trio.tokenizer import Tokenizer, token_bytes, token_text


def test_special_and_plain_tokens(tok: Tokenizer) -> None:
    im_end = tok.added_tokens["<|im_end|>"]
    assert token_text(tok, im_end) == "<|im_end|>"  # kept although special
    assert token_bytes(tok, im_end) == list(b"<|im_end|>")
    (world,) = tok.encode(" world")
    assert token_text(tok, world) == " world"
    assert token_bytes(tok, world) == [32, 119, 111, 114, 108, 100]


def test_partial_utf8_token_is_replacement_char(tok: Tokenizer) -> None:
    ids = tok.encode("😀")
    assert len(ids) > 1  # a 4-byte emoji spans several byte-level tokens here
    partial = [i for i in ids if "\ufffd" in token_text(tok, i)]
    assert partial
    assert token_bytes(tok, partial[0])[:3] == [0xEF, 0xBF, 0xBD]
    assert all(0 <= b < 256 for i in ids for b in token_bytes(tok, i))


def test_cached_and_consistent_with_decode(tok: Tokenizer) -> None:
    for i in range(0, tok.vocab_size, 7):
        text = token_text(tok, i)
        assert text == tok.decode([i], skip_special_tokens=False)
        assert token_text(tok, i) is text  # second call hits the cache
        assert bytes(token_bytes(tok, i)).decode("utf-8") == text
