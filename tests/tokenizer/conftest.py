"""Shared fixtures: one tiny model per session, plus hand-built SentencePiece-style tokenizers."""

# ruff: noqa: RUF001  (the sample texts are deliberately non-ASCII)

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer as HfTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from smg_trio.mock.tiny_model import build_tiny_model
from smg_trio.tokenizer import Tokenizer

UNICODE_TEXTS = [
    "Hello, world!",
    "Café naïve résumé — crème brûlée, jalapeño, Straße.",
    "中文文本测试：你好，世界！",
    "日本語のテキスト、こんにちは。",
    "Emoji 😀🎉🚀 and family 👨‍👩‍👧‍👦 and flags 🇫🇷🇯🇵.",
    "Mixed: a😀b中c é\u0301 ∑∫√ ₹€ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 end",
    "  leading and trailing spaces  \n\nnew lines\ttabs ",
    "<think>reasoning</think> then <|im_end|> specials",
]


@pytest.fixture(params=UNICODE_TEXTS, ids=range(len(UNICODE_TEXTS)))
def unicode_text(request: pytest.FixtureRequest) -> str:
    """Each sample text in turn: ASCII, accented, CJK, emoji (incl. ZWJ), specials."""
    return str(request.param)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def tok(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(tiny_model_dir)


@pytest.fixture(scope="session")
def metaspace_tok() -> Tokenizer:
    """A SentencePiece-like (Metaspace) BPE: the decoder strips the first token's space."""
    hf = HfTokenizer(models.BPE(unk_token="<unk>"))
    hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    hf.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False
    )
    text = ["the quick brown fox jumps over the lazy dog", "hello world how are you"] * 20
    hf.train_from_iterator(text, trainer=trainer)
    return Tokenizer(hf, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"})


@pytest.fixture(scope="session")
def byte_fallback_tok() -> Tokenizer:
    """A Llama-style vocabulary: ``<0xNN>`` byte tokens, ``▁`` spaces, Strip decoder."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece in ["▁", "a", "b", "c", "h", "i", "▁h", "▁hi", "é", "中"]:
        vocab[piece] = len(vocab)
    merges = [("▁", "h"), ("▁h", "i")]
    hf = HfTokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>"))
    hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    hf.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(content=" ", left=1, right=0),
        ]
    )
    hf.add_special_tokens(["<unk>", "<s>", "</s>"])
    return Tokenizer(
        hf, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True}
    )
