"""A cross-encoder's pair encoding (``Tokenizer.encode_pair``): as transformers'
``tokenizer(text=..., text_pair=...)`` gives it, and the second text's token-type start for the
tokenizers that give token types (what vLLM sends as ``compressed_token_type_ids``)."""

from __future__ import annotations

from tokenizers import Tokenizer as HfTokenizer
from tokenizers import models, pre_tokenizers, processors

from smg_trio.tokenizer import Tokenizer

# transformers 5.19 (the vLLM peer venv): AutoTokenizer of the tiny model,
# tokenizer(text="what is up", text_pair="the cat sat")["input_ids"]; no token_type_ids.
TINY_PAIR = [89, 74, 283, 581, 300, 82, 528, 71, 264, 283, 260, 283]


def test_tiny_model_pair_equals_transformers(tok: Tokenizer) -> None:
    assert tok.encode_pair("what is up", "the cat sat") == (TINY_PAIR, None)


def _bert_like(config: dict[str, object]) -> Tokenizer:
    vocab = {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "a": 3, "b": 4, "c": 5}
    hf = HfTokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    hf.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 1), ("[SEP]", 2)],
    )
    return Tokenizer(hf, config)


def test_bert_pair_gives_the_second_texts_type_start() -> None:
    tok = _bert_like({"tokenizer_class": "BertTokenizer"})
    assert tok.encode_pair("a b", "c") == ([1, 3, 4, 2, 5, 2], 4)
    named = _bert_like({"model_input_names": ["input_ids", "token_type_ids"]})
    assert named.encode_pair("a", "c") == ([1, 3, 2, 5, 2], 3)
    # A tokenizer whose transformers class returns no token types sends none (vLLM's too).
    assert _bert_like({}).encode_pair("a", "c")[1] is None


def test_add_bos_token_heads_each_text(byte_fallback_tok: Tokenizer) -> None:
    # transformers 5.19 LlamaTokenizerFast(add_bos_token=True): text="hi", text_pair="hi"
    # gives [<s>, ▁hi, <s>, ▁hi].
    ids, start = byte_fallback_tok.encode_pair("hi", "hi")
    one = byte_fallback_tok.encode("hi", add_special_tokens=True)
    assert one[0] == byte_fallback_tok.token_to_id("<s>")
    assert ids == one + one
    assert start is None
