"""The Tokenizer wrapper: loading, encode/decode, special and added tokens, configs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from smg_trio.errors import ValidationError
from smg_trio.gateway.openai.errors import to_api_error
from smg_trio.tokenizer import Tokenizer


def test_roundtrip(tok: Tokenizer, unicode_text: str) -> None:
    text = unicode_text
    ids = tok.encode(text)
    assert ids
    assert all(isinstance(i, int) and 0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids, skip_special_tokens=False) == text


def test_special_tokens_skipped_or_kept(tok: Tokenizer) -> None:
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == tok.added_tokens["<|im_start|>"]
    assert ids[-1] == tok.eos_token_id == tok.added_tokens["<|im_end|>"]
    assert tok.decode(ids) == "user\nhi"
    assert tok.decode(ids, skip_special_tokens=False) == "<|im_start|>user\nhi<|im_end|>"
    assert tok.decode([tok.vocab_size + 10]) == ""  # out-of-vocab ids are dropped


def test_attributes(tok: Tokenizer) -> None:
    assert tok.vocab_size == 1024
    assert tok.eos_token == "<|im_end|>"
    assert tok.bos_token == tok.pad_token == "<|endoftext|>"
    assert tok.bos_token_id == tok.pad_token_id == tok.added_tokens["<|endoftext|>"]
    assert tok.token_to_id("<think>") == tok.added_tokens["<think>"]
    assert tok.token_to_id("no-such-token-xyz") is None
    assert tok.id_to_token(tok.encode(" world")[0]) == "Ġworld"
    assert tok.has_chat_template
    # ChatML: no BOS added even with add_special_tokens.
    assert tok.encode("hi", add_special_tokens=True) == tok.encode("hi")


def _copy_model(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_config(model: Path, **changes: object) -> None:
    path = model / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    path.write_text(json.dumps(cfg))


def test_config_variants(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = _copy_model(tiny_model_dir, tmp_path / "m")
    _edit_config(
        model,
        eos_token={"__type": "AddedToken", "content": "<|endoftext|>", "special": True},
        bos_token={"content": "<|im_start|>"},
        add_bos_token=True,
        chat_template=[
            {"name": "default", "template": "D{{ messages | length }}"},
            {"name": "tool_use", "template": "T{{ (tools or []) | length }}"},
        ],
    )
    t = Tokenizer.from_dir(model)
    assert t.eos_token == "<|endoftext|>"
    assert t.eos_token_id == t.added_tokens["<|endoftext|>"]
    assert t.bos_token_id == t.added_tokens["<|im_start|>"]
    assert t.encode("hi", add_special_tokens=True) == [t.bos_token_id, *t.encode("hi")]
    msgs = [{"role": "user", "content": "x"}]
    assert t.apply_chat_template(msgs) == "D1"
    assert t.apply_chat_template(msgs, tools=[{"name": "f"}, {"name": "g"}]) == "T2"
    assert t.apply_chat_template(msgs, template_name="tool_use") == "T0"
    with pytest.raises(ValueError, match="unknown chat template"):
        t.get_chat_template("nope")


def test_chat_template_file_and_override(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = _copy_model(tiny_model_dir, tmp_path / "m")
    (model / "chat_template.jinja").write_text("FILE{{ messages[0].content }}")
    msgs = [{"role": "user", "content": "x"}]
    assert Tokenizer.from_dir(model).apply_chat_template(msgs) == "FILEx"
    t = Tokenizer.from_dir(model, chat_template="ARG{{ bos_token }}")
    assert t.apply_chat_template(msgs) == "ARG<|endoftext|>"


def test_no_chat_template(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = _copy_model(tiny_model_dir, tmp_path / "m")
    _edit_config(model, chat_template=None)
    t = Tokenizer.from_dir(model)
    assert not t.has_chat_template
    with pytest.raises(ValidationError, match="no chat template") as exc:
        t.apply_chat_template([{"role": "user", "content": "x"}])
    assert to_api_error(exc.value).status == 400


def test_load_errors(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"tokenizer\.json"):
        Tokenizer.from_dir(tmp_path)
    model = _copy_model(tiny_model_dir, tmp_path / "m")
    _edit_config(model, chat_template="{% if %}")
    with pytest.raises(ValueError, match="does not compile"):
        Tokenizer.from_dir(model)
    (model / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="invalid JSON"):
        Tokenizer.from_dir(model)


def test_truncation_in_tokenizer_json_is_disabled(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = _copy_model(tiny_model_dir, tmp_path / "m")
    path = model / "tokenizer.json"
    data = json.loads(path.read_text())
    data["truncation"] = {
        "direction": "Right",
        "max_length": 2,
        "strategy": "LongestFirst",
        "stride": 0,
    }
    path.write_text(json.dumps(data))
    assert len(Tokenizer.from_dir(model).encode("hello world, how are you today?")) > 2


def test_byte_fallback_add_bos(byte_fallback_tok: Tokenizer) -> None:
    t = byte_fallback_tok
    assert t.encode("hi", add_special_tokens=True) == [t.bos_token_id, *t.encode("hi")]
    assert t.decode(t.encode("hi 中文 😀")) == "hi 中文 😀"
    assert t.special_ids == {0, 1, 2}
