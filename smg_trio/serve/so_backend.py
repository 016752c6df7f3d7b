"""The structured-output backend a launched vLLM engine is configured with (its own flag)."""

from __future__ import annotations

import json
from collections.abc import Sequence

__all__ = ["BACKENDS", "engine_structured_backend"]

#: vLLM 0.32's ``StructuredOutputsConfig.backend`` values.
BACKENDS = ("auto", "xgrammar", "guidance", "outlines", "lm-format-enforcer")
_FLAG = "--structured-outputs-config"


def engine_structured_backend(engine_args: Sequence[str]) -> str | None:
    """The backend named by vLLM's ``--structured-outputs-config.backend X`` (or ``=X``) or
    ``--structured-outputs-config '{"backend": "X"}'`` among ``engine_args``; ``None`` when
    none is (vLLM's default, ``auto``). Raises ``ValueError`` for a value vLLM refuses."""
    found: str | None = None
    args = list(engine_args)
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name not in (_FLAG, _FLAG + ".backend"):
            continue
        if not eq:
            value = args[i + 1] if i + 1 < len(args) else ""
        if name == _FLAG:
            try:
                parsed = json.loads(value)
            except ValueError:
                raise ValueError(f"{_FLAG}: not JSON: {value!r}") from None
            if not isinstance(parsed, dict) or "backend" not in parsed:
                continue
            value = str(parsed["backend"])
        if value not in BACKENDS:
            raise ValueError(f"{_FLAG}.backend: {value!r} is not one of {', '.join(BACKENDS)}")
        found = value
    return found
