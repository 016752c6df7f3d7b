"""Parity with HF transformers (from the vLLM peer venv) on the tiny model: templates, ids, EOS.

transformers is not in smg_trio's venv. A subprocess under ``.peers/vllm/bin/python`` renders
and tokenizes the same inputs with ``AutoTokenizer`` and prints JSON; this file compares it
with smg_trio's results. Skipped, with the reason, when the peers are not installed.
"""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest

from peers.tools import peer_paths, vllm_engine_env, vllm_missing_reason
from smg_trio.tokenizer import Tokenizer, resolve_eos

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SCRIPT = """
import json, sys
from transformers import AutoConfig, AutoTokenizer, GenerationConfig
job = json.load(sys.stdin)
d = job["model_dir"]
tok = AutoTokenizer.from_pretrained(d)
out = {
    "templates": [
        tok.apply_chat_template(c["messages"], tools=c.get("tools"), tokenize=False,
                                **c.get("options", {}), **c.get("kwargs", {}))
        for c in job["chats"]
    ],
    "encode": [tok.encode(t, add_special_tokens=True) for t in job["texts"]],
    "decode": [[tok.decode(ids, skip_special_tokens=s) for s in (True, False)]
               for ids in job["ids"]],
    "config_eos": AutoConfig.from_pretrained(d).eos_token_id,
    "generation_eos": GenerationConfig.from_pretrained(d).eos_token_id,
}
print(json.dumps(out))
"""

CHATS: list[dict[str, Any]] = [
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
        ],
        "options": {"add_generation_prompt": True},
    },
    {
        "messages": [{"role": "user", "content": "Hi"}],
        "options": {"add_generation_prompt": True},
        "kwargs": {"enable_thinking": False},
    },
    {
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello the  "},
        ],
        "options": {"continue_final_message": True},
    },
    {
        "messages": [
            {"role": "user", "content": "Weather in Zürich?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"type": "function", "function": {"name": "f", "arguments": {"city": "Zü"}}}
                ],
            },
            {"role": "tool", "content": "sunny"},
        ],
        "tools": [
            {"type": "function", "function": {"name": "f", "description": "é", "parameters": {}}}
        ],
        "options": {"add_generation_prompt": True},
    },
]

TEXTS = ["Hello 😀 中文 <think>x</think><|im_end|>", " spaced  text\n", "Café naïve"]


def test_matches_transformers(tiny_model_dir: Path, tok: Tokenizer) -> None:
    reason = vllm_missing_reason()
    if reason:
        pytest.skip(reason)
    rng = random.Random(0)
    ids = [[rng.randrange(tok.vocab_size) for _ in range(rng.randint(0, 20))] for _ in range(200)]
    job = {"model_dir": str(tiny_model_dir), "chats": CHATS, "texts": TEXTS, "ids": ids}
    proc = subprocess.run(
        [str(peer_paths().vllm_python), "-c", SCRIPT],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=300,
        env=vllm_engine_env(),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref = json.loads(proc.stdout.strip().splitlines()[-1])

    for chat, expected in zip(CHATS, ref["templates"], strict=True):
        got = tok.apply_chat_template(
            chat["messages"],
            tools=chat.get("tools"),
            chat_template_kwargs=chat.get("kwargs"),
            **chat.get("options", {}),
        )
        assert got == expected
    assert [tok.encode(t, add_special_tokens=True) for t in TEXTS] == ref["encode"]
    for seq, (skipped, kept) in zip(ids, ref["decode"], strict=True):
        assert tok.decode(seq, skip_special_tokens=True) == skipped
        assert tok.decode(seq, skip_special_tokens=False) == kept
    gen = ref["generation_eos"]
    assert resolve_eos(tiny_model_dir, tok) == (
        ref["config_eos"],
        [i for i in gen if i != ref["config_eos"]],
    )
