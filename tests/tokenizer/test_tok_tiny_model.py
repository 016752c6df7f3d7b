"""The tiny model builder: file layout, config, weights, determinism, cache dir."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from smg_trio.mock import tiny_model
from smg_trio.mock.tiny_model import (
    ENV_TINY_MODEL_DIR,
    TINY_MODEL_FILES,
    build_tiny_model,
    default_tiny_model_dir,
)
from smg_trio.tokenizer import Tokenizer


def _load(path: Path) -> dict[str, object]:
    return dict(json.loads(path.read_text()))


def _digests(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def test_files_and_config(tiny_model_dir: Path, tok: Tokenizer) -> None:
    assert sorted(p.name for p in tiny_model_dir.iterdir()) == sorted(TINY_MODEL_FILES)
    cfg = _load(tiny_model_dir / "config.json")
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["model_type"] == "llama"
    assert (cfg["hidden_size"], cfg["num_hidden_layers"]) == (128, 2)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (2, 1)
    assert (cfg["intermediate_size"], cfg["max_position_embeddings"]) == (256, 1024)
    assert cfg["torch_dtype"] == "float32"
    assert cfg["vocab_size"] == tok.vocab_size == 1024
    im_end, eot = tok.added_tokens["<|im_end|>"], tok.added_tokens["<|endoftext|>"]
    assert cfg["eos_token_id"] == im_end
    assert cfg["bos_token_id"] == eot
    gen = _load(tiny_model_dir / "generation_config.json")
    assert gen["eos_token_id"] == [im_end, eot]


def test_tokenizer_config(tiny_model_dir: Path, tok: Tokenizer) -> None:
    tc = _load(tiny_model_dir / "tokenizer_config.json")
    assert tc["eos_token"] == "<|im_end|>"
    assert tc["bos_token"] == tc["pad_token"] == "<|endoftext|>"
    assert tc["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert set(tok.added_tokens) == {
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<think>",
        "</think>",
    }
    # <think> tags are plain added tokens: one id each, kept when specials are skipped.
    ids = tok.encode("<think>x</think>")
    assert ids[0] == tok.added_tokens["<think>"]
    assert ids[-1] == tok.added_tokens["</think>"]
    assert tok.decode(ids, skip_special_tokens=True) == "<think>x</think>"
    assert tok.special_ids == {
        tok.added_tokens[t] for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
    }


def test_weights(tiny_model_dir: Path) -> None:
    w = load_file(str(tiny_model_dir / "model.safetensors"))
    expected = {
        "model.embed_tokens.weight": (1024, 128),
        "model.norm.weight": (128,),
        "lm_head.weight": (1024, 128),
    }
    for i in range(2):
        p = f"model.layers.{i}"
        expected |= {
            f"{p}.self_attn.q_proj.weight": (128, 128),
            f"{p}.self_attn.k_proj.weight": (64, 128),
            f"{p}.self_attn.v_proj.weight": (64, 128),
            f"{p}.self_attn.o_proj.weight": (128, 128),
            f"{p}.mlp.gate_proj.weight": (256, 128),
            f"{p}.mlp.up_proj.weight": (256, 128),
            f"{p}.mlp.down_proj.weight": (128, 256),
            f"{p}.input_layernorm.weight": (128,),
            f"{p}.post_attention_layernorm.weight": (128,),
        }
    assert {k: v.shape for k, v in w.items()} == expected
    assert all(v.dtype == np.float32 for v in w.values())
    assert np.all(np.isfinite(w["lm_head.weight"]))
    assert float(np.std(w["lm_head.weight"])) > 0.0


def test_deterministic_and_fast(tmp_path: Path, tiny_model_dir: Path) -> None:
    t0 = time.perf_counter()
    build_tiny_model(tmp_path / "a")
    elapsed = time.perf_counter() - t0
    assert elapsed < 3.0
    assert _digests(tmp_path / "a") == _digests(tiny_model_dir)
    build_tiny_model(tmp_path / "b", seed=1)
    a, b = _digests(tmp_path / "a"), _digests(tmp_path / "b")
    assert a["model.safetensors"] != b["model.safetensors"]
    assert a["tokenizer.json"] == b["tokenizer.json"]  # the tokenizer does not depend on seed


def test_vocab_size_parameter(tmp_path: Path) -> None:
    d = build_tiny_model(tmp_path / "small", vocab_size=512)
    assert Tokenizer.from_dir(d).vocab_size == 512
    assert _load(d / "config.json")["vocab_size"] == 512
    with pytest.raises(ValueError, match="vocab_size"):
        build_tiny_model(tmp_path / "tiny", vocab_size=100)


def test_chat_template_thinking_toggle(tok: Tokenizer) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    on = tok.apply_chat_template(msgs, add_generation_prompt=True)
    off = tok.apply_chat_template(
        msgs, add_generation_prompt=True, chat_template_kwargs={"enable_thinking": False}
    )
    assert on == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert off == on + "<think>\n\n</think>\n\n"
    assert tok.apply_chat_template(msgs) == "<|im_start|>user\nhi<|im_end|>\n"


def test_default_dir_builds_once_atomically(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "cache" / "tiny"
    monkeypatch.setenv(ENV_TINY_MODEL_DIR, str(target))
    calls: list[Path] = []
    real_build = tiny_model.build_tiny_model

    def counting_build(directory: Path, **kw: int) -> Path:
        calls.append(directory)
        assert directory != target  # built elsewhere, then renamed into place
        return real_build(directory, **kw)

    monkeypatch.setattr(tiny_model, "build_tiny_model", counting_build)
    assert default_tiny_model_dir() == target
    assert default_tiny_model_dir() == target
    assert len(calls) == 1
    assert _digests(target) == _digests(tiny_model_dir)
    assert [p.name for p in target.parent.iterdir()] == ["tiny"]  # no temp dir left behind


def test_default_dir_xdg_and_junk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_TINY_MODEL_DIR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    d = default_tiny_model_dir()
    assert d == tmp_path / "xdg" / "smg_trio" / "tiny-model-v1"
    assert (d / "model.safetensors").is_file()
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("not a model")
    monkeypatch.setenv(ENV_TINY_MODEL_DIR, str(junk))
    with pytest.raises(FileExistsError):
        default_tiny_model_dir()
