"""EOS resolution from config.json, generation_config.json and the tokenizer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from smg_trio.tokenizer import Tokenizer, resolve_eos


def _model(tmp_path: Path, config: Any = None, generation: Any = None) -> Path:
    if config is not None:
        (tmp_path / "config.json").write_text(json.dumps(config))
    if generation is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    return tmp_path


def test_pinned(tmp_path: Path, tok: Tokenizer) -> None:
    d = _model(tmp_path, {"eos_token_id": 5}, {"eos_token_id": [5, 7, 9]})
    assert resolve_eos(d, tok) == (5, [7, 9])


@pytest.mark.parametrize(
    ("config", "generation", "expected"),
    [
        ({"eos_token_id": [3, 4]}, {"eos_token_id": [4, 8]}, (3, [4, 8])),
        ({}, {"eos_token_id": [6, 1, 6]}, (6, [1])),
        ({"eos_token_id": None}, {"eos_token_id": 2}, (2, [])),
        ({"text_config": {"eos_token_id": 11}}, None, (11, [])),
        (None, {"eos_token_id": [9, 5]}, (9, [5])),
    ],
)
def test_sources(tmp_path: Path, config: Any, generation: Any, expected: Any) -> None:
    assert resolve_eos(_model(tmp_path, config, generation)) == expected


def test_tokenizer_fallback(tmp_path: Path, tok: Tokenizer) -> None:
    d = _model(tmp_path, {"vocab_size": 10}, {})
    assert resolve_eos(d, tok) == (tok.eos_token_id, [])
    assert resolve_eos(d) == (None, [])


@pytest.mark.parametrize("bad", ["2", [1, "x"], True, -1, {"a": 1}])
def test_malformed(tmp_path: Path, bad: Any) -> None:
    with pytest.raises(ValueError, match="eos_token_id"):
        resolve_eos(_model(tmp_path, {"eos_token_id": bad}))


def test_invalid_json(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text("{")
    with pytest.raises(ValueError, match="invalid JSON"):
        resolve_eos(tmp_path)


def test_tiny_model(tiny_model_dir: Path, tok: Tokenizer) -> None:
    im_end, eot = tok.added_tokens["<|im_end|>"], tok.added_tokens["<|endoftext|>"]
    assert resolve_eos(tiny_model_dir, tok) == (im_end, [eot])
