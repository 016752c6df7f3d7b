"""The ``conformance wire`` context: where the engines' own codecs come from (in-process import,
a reference interpreter, or nowhere), with each engine's reference round trip run at most once."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import smg_trio
from conformance import reference_roundtrip
from conformance.case import CaseFailed, CaseSkipped

__all__ = [
    "REFERENCE_PYTHON_ENV",
    "REFERENCE_TIMEOUT_S",
    "Engine",
    "WireContext",
    "engine_importable",
    "reference_env",
]

Engine = Literal["vllm", "tokenspeed"]

#: Environment variable naming the reference interpreter (same as ``--reference-python``).
REFERENCE_PYTHON_ENV = "SMG_TRIO_REFERENCE_PYTHON"
#: Limit for one reference subprocess; importing vLLM alone takes several seconds on 2 cores.
REFERENCE_TIMEOUT_S = 300.0
#: The module each engine's round trip needs, and what its package is called on PyPI.
_ENGINE_MODULE: dict[Engine, str] = {
    "vllm": "vllm.v1.engine",
    "tokenspeed": "tokenspeed.runtime.engine",
}
_STDERR_TAIL = 3000


def engine_importable(engine: Engine) -> bool:
    """Whether ``engine``'s own package can be imported by this interpreter."""
    top = _ENGINE_MODULE[engine].split(".", 1)[0]
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False


def reference_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for the reference subprocess: smg_trio and conformance on ``PYTHONPATH``
    (wherever they are installed), no inherited venv, no network or usage reporting."""
    env = dict(os.environ if base is None else base)
    for key in ("PYTHONHOME", "VIRTUAL_ENV"):
        env.pop(key, None)
    roots = [
        str(Path(smg_trio.__file__).resolve().parents[1]),
        str(Path(reference_roundtrip.__file__).resolve().parents[1]),
    ]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(roots))
    env.update(
        {
            "PYTHONUNBUFFERED": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_DO_NOT_TRACK": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
    )
    return env


def _run_reference_python(python: str, engine: Engine, timeout_s: float) -> dict[str, Any]:
    cmd = [python, "-m", reference_roundtrip.__name__, engine]
    try:
        proc = subprocess.run(
            cmd,
            env=reference_env(),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise CaseFailed(f"reference {engine} run timed out after {timeout_s:.0f}s") from exc
    except OSError as exc:
        raise CaseFailed(f"cannot run reference python {python!r}: {exc}") from exc
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise CaseFailed(
            f"reference {engine} run ({' '.join(cmd)}) exited {proc.returncode}: "
            f"{proc.stderr[-_STDERR_TAIL:]}"
        )
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _run_in_process(engine: Engine) -> dict[str, Any]:
    fn = (
        reference_roundtrip.vllm_cases if engine == "vllm" else reference_roundtrip.tokenspeed_cases
    )
    # JSON round trip: the same builtins a subprocess would hand back.
    result: dict[str, Any] = json.loads(json.dumps(fn(), sort_keys=True))
    return result


@dataclass
class WireContext:
    """What the wire cases share: the reference interpreter (if any) and cached reference runs."""

    reference_python: str | None = None
    timeout_s: float = REFERENCE_TIMEOUT_S
    #: Overrides :func:`engine_importable` (tests).
    importable: Callable[[Engine], bool] | None = None
    _results: dict[Engine, dict[str, Any] | BaseException] = field(default_factory=dict)

    def reference_source(self, engine: Engine) -> str | None:
        """``"in-process"``, the reference interpreter's path, or None (cases then skip)."""
        importable = self.importable or engine_importable
        if importable(engine):
            return "in-process"
        return self.reference_python

    def reference(self, engine: Engine) -> dict[str, Any]:
        """``engine``'s reference round-trip result (run once, then cached, failures too).

        Raises CaseSkipped when there is no way to run it, CaseFailed when the run failed.
        """
        if engine not in self._results:
            source = self.reference_source(engine)
            if source is None:
                raise CaseSkipped(
                    f"{engine} not importable here; pass --reference-python PATH "
                    f"(or set {REFERENCE_PYTHON_ENV}) to an interpreter that has it"
                )
            try:
                if source == "in-process":
                    self._results[engine] = _run_in_process(engine)
                else:
                    self._results[engine] = _run_reference_python(source, engine, self.timeout_s)
            except CaseFailed as exc:
                self._results[engine] = exc
            except Exception as exc:
                self._results[engine] = CaseFailed(
                    f"reference {engine} run failed: {type(exc).__name__}: {exc}"
                )
        got = self._results[engine]
        if isinstance(got, BaseException):
            raise CaseFailed(str(got))
        return got
