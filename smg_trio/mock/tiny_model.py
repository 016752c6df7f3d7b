"""Builds a tiny random-weight Llama model directory (tokenizer, template, weights) offline."""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "ENV_TINY_MODEL_DIR",
    "TINY_MODEL_FILES",
    "TINY_MODEL_VERSION",
    "build_tiny_model",
    "default_tiny_model_dir",
]

#: Bump when the recipe changes so cached copies are rebuilt under a new name.
TINY_MODEL_VERSION = "v1"
#: Environment variable that overrides :func:`default_tiny_model_dir`'s location.
ENV_TINY_MODEL_DIR = "SMG_TRIO_TINY_MODEL_DIR"
#: Every file a complete tiny model directory holds.
TINY_MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
)

_HIDDEN = 128
_LAYERS = 2
_HEADS = 2
_KV_HEADS = 1
_HEAD_DIM = _HIDDEN // _HEADS
_INTERMEDIATE = 256
_MAX_POSITIONS = 1024

_ENDOFTEXT = "<|endoftext|>"
_IM_START = "<|im_start|>"
_IM_END = "<|im_end|>"
_THINK = "<think>"
_END_THINK = "</think>"
_SPECIAL_TOKENS = (_ENDOFTEXT, _IM_START, _IM_END)
_PLAIN_ADDED_TOKENS = (_THINK, _END_THINK)

# A ChatML template in the style of Qwen3: tools in the system turn, <tool_call> blocks for
# assistant tool calls, and ``enable_thinking=false`` closing an empty think block.
CHAT_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages and messages[0].role == 'system' %}
{{- messages[0].content + '\\n\\n' }}
{%- endif %}
{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}
{{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
{%- for tool in tools %}
{{- '\\n' }}{{- tool | tojson }}
{%- endfor %}
{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and ' }}
{{- 'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n' }}
{{- '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages and messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' %}
{%- if not loop.first %}
{{- raise_exception('System message must be at the beginning.') }}
{%- endif %}
{%- elif message.role == 'user' %}
{{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\\n' }}
{%- if message.content %}
{{- message.content }}
{%- endif %}
{%- for tool_call in message.tool_calls or [] %}
{%- set call = tool_call.function if tool_call.function is defined else tool_call %}
{%- if message.content or not loop.first %}
{{- '\\n' }}
{%- endif %}
{{- '<tool_call>\\n{"name": "' + call.name + '", "arguments": ' }}
{%- if call.arguments is string %}
{{- call.arguments }}
{%- else %}
{{- call.arguments | tojson }}
{%- endif %}
{{- '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}
{%- else %}
{{- raise_exception('Unknown message role: ' + message.role) }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}
{{- '<think>\\n\\n</think>\\n\\n' }}
{%- endif %}
{%- endif %}
"""

# Built-in training text: plain prose, code, chat-like lines and some non-ASCII (accented,
# CJK, emoji) so the byte-level BPE learns merges for all of them.
_CORPUS_LINES = (
    "The quick brown fox jumps over the lazy dog while the cat sleeps in the sun.",
    "A gateway tokenizes the prompt, applies the chat template and streams tokens back.",
    "Engines speak token ids only; the gateway turns them into text for the client.",
    "Hello, world! How are you today? I am fine, thank you for asking.",
    "Once upon a time there was a small model that wanted to generate useful answers.",
    "The weather is nice and the river flows quietly past the old stone bridge.",
    "Please summarize the following document in three short sentences.",
    "What is the capital of France? The capital of France is Paris.",
    "Numbers like 1, 2, 3, 42, 100, 2024 and 3.14159 appear in many documents.",
    "def add(a, b):\n    return a + b\n\nprint(add(1, 2))",
    "for i in range(10):\n    if i % 2 == 0:\n        continue\n    total += i",
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
    '<tool_call>\n{"name": "search", "arguments": {"query": "trio"}}\n</tool_call>',
    "The user asked a question and the assistant answered it carefully and politely.",
    "Let me think step by step about this problem before I give the final answer.",
    "First, we read the input. Second, we check the constraints. Finally, we reply.",
    "Stop sequences end generation early when the model produces a matching string.",
    "Streaming responses send small chunks of text as soon as they are ready.",
    "Café, naïve, résumé, façade, jalapeño, Straße, smørbrød and crème brûlée.",
    "Ελληνικά γράμματα, русский язык, עברית, العربية and हिन्दी also exist.",
    "中文文本测试：你好，世界！今天天气很好。我们一起学习。",  # noqa: RUF001
    "日本語のテキスト：こんにちは、世界。ありがとうございます。",  # noqa: RUF001
    "한국어 문장도 있습니다. 안녕하세요, 반갑습니다.",
    "Emoji: 😀 😃 🎉 🚀 👍 ❤️ 🔥 🤖 and flags 🇫🇷 🇯🇵 appear in chat messages.",
    "Math symbols: ∑ ∫ √ ∞ ≈ ≠ ≤ ≥ → ← and currency € £ ¥ ₹.",
    "In the morning we walked to the market, bought bread, cheese and fresh fruit.",
    "The system prompt sets the behaviour; the user message asks for something specific.",
    "Tokens, tokenizer, tokenization, detokenization, vocabulary, merges and bytes.",
    "She said that the meeting would start at nine o'clock and end before noon.",
    "Reasoning models think inside tags and then write the final answer for the user.",
)

_WORDS = (  # noqa: SIM905
    "the a an and or but if then else when while of to in on at by for with from "
    "model token text answer question user assistant system tool call stream chunk "
    "request response engine gateway server client prompt template message content "
    "good bad new old small large fast slow first last next every some many few "
    "run make take give find think know see come go say get use try ask work call "
    "time day year way thing world life hand part place case point number group "
    "water light sound music story book word line page name city river mountain"
).split()


def _corpus(vocab_size: int) -> list[str]:
    """Deterministic training lines: the built-in text plus seeded word salad."""
    rng = random.Random(1234)
    lines = list(_CORPUS_LINES) * 4
    n_salad = max(400, vocab_size)
    for _ in range(n_salad):
        n = rng.randint(5, 14)
        words = [rng.choice(_WORDS) for _ in range(n)]
        if rng.random() < 0.5:
            words[0] = words[0].capitalize()
        lines.append(" ".join(words) + rng.choice((".", "!", "?", ",", ":", "")))
    return lines


def _train_tokenizer(vocab_size: int) -> Any:
    """Train the byte-level BPE; the result has exactly ``vocab_size`` ids when it can."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(_PLAIN_ADDED_TOKENS),
        min_frequency=1,
        show_progress=False,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in _SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(vocab_size), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in _PLAIN_ADDED_TOKENS])
    return tok


def _weights(vocab: int, seed: int) -> dict[str, np.ndarray[Any, Any]]:
    """Random float32 weights named exactly as HF ``LlamaForCausalLM`` names them."""
    rng = np.random.default_rng(seed)

    def rand(*shape: int) -> np.ndarray[Any, Any]:
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)

    def ones(n: int) -> np.ndarray[Any, Any]:
        return np.ones((n,), dtype=np.float32)

    q_out = _HEADS * _HEAD_DIM
    kv_out = _KV_HEADS * _HEAD_DIM
    tensors: dict[str, np.ndarray[Any, Any]] = {"model.embed_tokens.weight": rand(vocab, _HIDDEN)}
    for i in range(_LAYERS):
        p = f"model.layers.{i}"
        tensors[f"{p}.self_attn.q_proj.weight"] = rand(q_out, _HIDDEN)
        tensors[f"{p}.self_attn.k_proj.weight"] = rand(kv_out, _HIDDEN)
        tensors[f"{p}.self_attn.v_proj.weight"] = rand(kv_out, _HIDDEN)
        tensors[f"{p}.self_attn.o_proj.weight"] = rand(_HIDDEN, q_out)
        tensors[f"{p}.mlp.gate_proj.weight"] = rand(_INTERMEDIATE, _HIDDEN)
        tensors[f"{p}.mlp.up_proj.weight"] = rand(_INTERMEDIATE, _HIDDEN)
        tensors[f"{p}.mlp.down_proj.weight"] = rand(_HIDDEN, _INTERMEDIATE)
        tensors[f"{p}.input_layernorm.weight"] = ones(_HIDDEN)
        tensors[f"{p}.post_attention_layernorm.weight"] = ones(_HIDDEN)
    tensors["model.norm.weight"] = ones(_HIDDEN)
    tensors["lm_head.weight"] = rand(vocab, _HIDDEN)
    return tensors


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def build_tiny_model(
    directory: Path, *, vocab_size: int = 1024, seed: int = 0, max_positions: int = _MAX_POSITIONS
) -> Path:
    """Write a tiny ``LlamaForCausalLM`` model into ``directory`` (created if missing).

    The tokenizer (byte-level BPE, ``vocab_size`` ids including 3 special and 2 plain added
    tokens) depends only on ``vocab_size``; the random float32 weights depend on ``seed``;
    ``max_positions`` is its context length. Output is byte-identical for the same arguments.
    No network access. Returns ``directory``. Raises ``ValueError`` if ``vocab_size`` is below
    300 or the trained vocabulary comes out smaller than asked.
    """
    from safetensors.numpy import save_file

    if vocab_size < 300:
        raise ValueError(f"vocab_size must be >= 300 (256 bytes + specials), got {vocab_size}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)

    tok = _train_tokenizer(vocab_size)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    if vocab != vocab_size:
        raise ValueError(f"trained vocabulary has {vocab} ids, expected {vocab_size}")
    tok.save(str(directory / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in (*_SPECIAL_TOKENS, *_PLAIN_ADDED_TOKENS)}

    added_decoder = {
        str(ids[t]): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": t in _SPECIAL_TOKENS,
        }
        for t in (*_SPECIAL_TOKENS, *_PLAIN_ADDED_TOKENS)
    }
    _write_json(
        directory / "tokenizer_config.json",
        {
            "add_bos_token": False,
            "add_eos_token": False,
            "add_prefix_space": False,
            "added_tokens_decoder": added_decoder,
            "additional_special_tokens": [_IM_START, _IM_END],
            "bos_token": _ENDOFTEXT,
            "chat_template": CHAT_TEMPLATE,
            "clean_up_tokenization_spaces": False,
            "eos_token": _IM_END,
            "errors": "replace",
            "model_max_length": max_positions,
            "pad_token": _ENDOFTEXT,
            "split_special_tokens": False,
            "tokenizer_class": "PreTrainedTokenizerFast",
            "unk_token": None,
        },
    )
    _write_json(
        directory / "special_tokens_map.json",
        {
            "additional_special_tokens": [_IM_START, _IM_END],
            "bos_token": _ENDOFTEXT,
            "eos_token": _IM_END,
            "pad_token": _ENDOFTEXT,
        },
    )
    _write_json(
        directory / "config.json",
        {
            "architectures": ["LlamaForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": ids[_ENDOFTEXT],
            "eos_token_id": ids[_IM_END],
            "head_dim": _HEAD_DIM,
            "hidden_act": "silu",
            "hidden_size": _HIDDEN,
            "initializer_range": 0.02,
            "intermediate_size": _INTERMEDIATE,
            "max_position_embeddings": max_positions,
            "mlp_bias": False,
            "model_type": "llama",
            "num_attention_heads": _HEADS,
            "num_hidden_layers": _LAYERS,
            "num_key_value_heads": _KV_HEADS,
            "pad_token_id": ids[_ENDOFTEXT],
            "pretraining_tp": 1,
            "rms_norm_eps": 1e-6,
            "rope_scaling": None,
            "rope_theta": 10000.0,
            "tie_word_embeddings": False,
            "torch_dtype": "float32",
            "use_cache": True,
            "vocab_size": vocab,
        },
    )
    _write_json(
        directory / "generation_config.json",
        {
            "bos_token_id": ids[_ENDOFTEXT],
            "eos_token_id": [ids[_IM_END], ids[_ENDOFTEXT]],
            "pad_token_id": ids[_ENDOFTEXT],
        },
    )
    save_file(
        _weights(vocab, seed), str(directory / "model.safetensors"), metadata={"format": "pt"}
    )
    return directory


def _is_complete(directory: Path) -> bool:
    return all((directory / name).is_file() for name in TINY_MODEL_FILES)


def default_tiny_model_dir() -> Path:
    """Return the shared tiny model directory, building it on first use.

    The location is ``$SMG_TRIO_TINY_MODEL_DIR`` if set, else
    ``$XDG_CACHE_HOME/smg_trio/tiny-model-v1`` (``~/.cache`` by default). The model is built
    into a sibling temporary directory and renamed into place, so concurrent callers never
    see a half-written model. Raises ``FileExistsError`` if the path exists, is not empty and
    is not a complete tiny model.
    """
    override = os.environ.get(ENV_TINY_MODEL_DIR)
    if override:
        target = Path(override).expanduser()
    else:
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        target = cache / "smg_trio" / f"tiny-model-{TINY_MODEL_VERSION}"
    if _is_complete(target):
        return target
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise FileExistsError(f"{target} exists but is not a complete tiny model directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        build_tiny_model(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it 0700
        try:
            # rename(2) atomically replaces a missing or empty directory.
            tmp.rename(target)
        except OSError:
            if not _is_complete(target):  # not a lost race: a real failure
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
