"""generation_config.json's sampling defaults, read as vLLM's ``get_diff_sampling_param``."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from smg_trio.tokenizer.generation_config import sampling_defaults
from smg_trio.tokenizer.modeldir import ModelDir


def _dir(tmp_path: Path, doc: object) -> ModelDir:
    (tmp_path / "generation_config.json").write_text(json.dumps(doc))
    return ModelDir(tmp_path)


def test_qwen3_style_defaults_are_read(tmp_path: Path) -> None:
    doc = {"do_sample": True, "eos_token_id": [1, 2], "temperature": 0.6, "top_k": 20,
           "top_p": 0.95, "min_p": 0, "repetition_penalty": 1.05}  # fmt: skip
    got = sampling_defaults(_dir(tmp_path, doc))
    assert got == {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "min_p": 0.0,
                   "repetition_penalty": 1.05}  # fmt: skip
    assert isinstance(got["top_k"], int)


def test_transformers_defaults_are_not_defaults(tmp_path: Path) -> None:
    """vLLM reads the file through transformers' GenerationConfig.to_diff_dict: a value equal
    to transformers' own default (top_k 50, temperature 1.0, ...) is dropped."""
    doc = {"temperature": 1.0, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.0}
    assert sampling_defaults(_dir(tmp_path, doc)) == {}


def test_no_file_no_defaults(tmp_path: Path) -> None:
    assert sampling_defaults(ModelDir(tmp_path)) == {}


@pytest.mark.parametrize(
    "doc",
    [
        {"temperature": -1},
        {"top_p": 0},
        {"top_k": 2.5},
        {"temperature": "hot"},
        {"temperature": True},
        {"presence_penalty": 3},
    ],
)
def test_bad_values_are_ignored_and_logged(
    tmp_path: Path, doc: dict[str, object], caplog: pytest.LogCaptureFixture
) -> None:
    """A value vLLM would reject in a request is not made every request's default."""
    with caplog.at_level(logging.WARNING):
        assert sampling_defaults(_dir(tmp_path, {**doc, "min_p": 0.1})) == {"min_p": 0.1}
    assert "ignoring" in caplog.text
