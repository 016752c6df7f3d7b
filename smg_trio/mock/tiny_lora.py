"""A tiny LoRA adapter for the tiny model (PEFT's layout: ``adapter_config.json`` and
``adapter_model.safetensors``), with random nonzero weights, for tests and demos of adapters."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from smg_trio.mock.tiny_model import _HEAD_DIM, _HEADS, _HIDDEN, _KV_HEADS, _LAYERS

__all__ = ["build_tiny_lora"]

#: The projections the adapter targets, with their (in, out) features.
_TARGETS = {
    "q_proj": (_HIDDEN, _HEADS * _HEAD_DIM),
    "v_proj": (_HIDDEN, _KV_HEADS * _HEAD_DIM),
    "o_proj": (_HEADS * _HEAD_DIM, _HIDDEN),
}


def build_tiny_lora(
    directory: Path,
    *,
    base_model: str,
    rank: int = 8,
    seed: int = 1,
    scale: float = 0.5,
) -> Path:
    """Write a LoRA adapter of ``rank`` for the tiny model into ``directory`` (created if
    missing): ``lora_A``/``lora_B`` of ``q_proj``, ``v_proj`` and ``o_proj`` in every layer,
    random nonzero (``B`` is not zero as a fresh PEFT adapter's is, so the adapter changes the
    answers), ``base_model_name_or_path`` = ``base_model``. Same arguments, same bytes."""
    from safetensors.numpy import save_file

    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray[Any, Any]] = {}
    for i in range(_LAYERS):
        for name, (fan_in, fan_out) in _TARGETS.items():
            key = f"base_model.model.model.layers.{i}.self_attn.{name}"
            a = rng.standard_normal((rank, fan_in), dtype=np.float32) * scale
            b = rng.standard_normal((fan_out, rank), dtype=np.float32) * scale
            tensors[f"{key}.lora_A.weight"] = a.astype(np.float32)
            tensors[f"{key}.lora_B.weight"] = b.astype(np.float32)
    save_file(tensors, str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {
        "base_model_name_or_path": base_model,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "lora_alpha": rank * 2,
        "lora_dropout": 0.0,
        "modules_to_save": None,
        "peft_type": "LORA",
        "r": rank,
        "target_modules": sorted(_TARGETS),
        "task_type": "CAUSAL_LM",
        "use_dora": False,
        "use_rslora": False,
    }
    (directory / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return directory
