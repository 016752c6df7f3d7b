"""The model's sampling defaults from ``generation_config.json``, as vLLM applies them."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any, Final

from smg_trio.tokenizer.core import load_model_json
from smg_trio.tokenizer.modeldir import ModelDir

__all__ = ["SAMPLING_DEFAULT_FIELDS", "sampling_defaults"]

log = logging.getLogger(__name__)

#: The fields vLLM 0.32 takes from the generation config (``ModelConfig.
#: get_diff_sampling_param``) and fills into a chat or completions request that leaves them
#: unset, with the range each must be in here (a value outside it is ignored, logged).
SAMPLING_DEFAULT_FIELDS: Final[dict[str, Callable[[float], bool]]] = {
    "temperature": lambda v: v >= 0.0,
    "top_p": lambda v: 0.0 < v <= 1.0,
    "top_k": lambda v: v == int(v) and v >= -1,
    "min_p": lambda v: 0.0 <= v <= 1.0,
    "repetition_penalty": lambda v: v > 0.0,
    "presence_penalty": lambda v: -2.0 <= v <= 2.0,
    "frequency_penalty": lambda v: -2.0 <= v <= 2.0,
}

# transformers' ``GenerationConfig`` defaults: vLLM reads the file through it and keeps only
# the values that differ from these (``to_diff_dict``), so a file's ``"top_k": 50`` is not a
# default of vLLM's.
_HF_DEFAULTS: Final[dict[str, float]] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 50,
    "repetition_penalty": 1.0,
}


def sampling_defaults(model_dir: ModelDir) -> dict[str, float]:
    """The sampling fields of ``generation_config.json`` that vLLM would use as the defaults
    of requests to this model (``{}`` without the file). ``top_k`` is an ``int``. Raises
    ``ValueError`` for malformed JSON, as the EOS ids do."""
    raw: dict[str, Any] = load_model_json(model_dir, "generation_config.json")
    out: dict[str, float] = {}
    for name, in_range in SAMPLING_DEFAULT_FIELDS.items():
        value = raw.get(name)
        if value is None:
            continue
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok or not math.isfinite(value) or not in_range(value):
            log.warning("generation_config.json: ignoring %s=%r (not a valid default)", name, value)
        elif value != _HF_DEFAULTS.get(name):
            out[name] = int(value) if name == "top_k" else float(value)
    if out:
        log.info(
            "%s: the defaults of requests that leave them unset (as vLLM's "
            "--generation-config auto): %s",
            model_dir.path / "generation_config.json",
            out,
        )
    return out
