"""``GatewayConfig``: every knob of ``serve``/``launch``, in seconds and tokens, with env fallbacks."""

from __future__ import annotations

from typing import Any

import attrs

from smg_trio.connector.client import ENGINE_SILENCE_DEATH_TIMEOUT_S
from smg_trio.gateway.config import (
    DEFAULT_HOST,
    DEFAULT_MAX_CONCURRENT_REQUESTS,
    DEFAULT_MAX_N,
    DEFAULT_MAX_SEQUENCES_PER_REQUEST,
    DEFAULT_PORT,
    DEFAULT_QUEUE_SIZE,
    DEFAULT_QUEUE_TIMEOUT_S,
    DEFAULT_RESPONSES_STORE_SIZE,
    DEFAULT_WRITE_TIMEOUT_S,
)
from smg_trio.lora import LoraModule
from smg_trio.routing.cache_aware import CacheAwareConfig
from smg_trio.transport.handshake import READY_TIMEOUT_S
from smg_trio.transport.tcp import DEFAULT_HEARTBEAT_IVL_S, DEFAULT_HEARTBEAT_TIMEOUT_S
from smg_trio.worker.jobs import DEFAULT_JOB_TTL_S, DEFAULT_MAX_FINISHED_JOBS
from smg_trio.worker.manager import WORKER_WAIT_TIMEOUT_S
from smg_trio.worker.policies import DEFAULT_POLICY

__all__ = [
    "DEFAULT_SHUTDOWN_GRACE_PERIOD_S",
    "DEFAULT_WORKER_BASE_PORT",
    "EngineLaunchConfig",
    "GatewayConfig",
    "cache_aware_config",
]

# The defaults below and those imported above are the CLI's too (smg_trio/cli/ reads them).
#: On SIGINT/SIGTERM, how long in-flight requests may finish (``--shutdown-grace-period-secs``).
DEFAULT_SHUTDOWN_GRACE_PERIOD_S = 30.0
#: A frontend whose event loop has not run for this long is killed and restarted
#: (``--frontend-stall-timeout-secs``; 0 turns the check off).
DEFAULT_FRONTEND_STALL_TIMEOUT_S = 30.0
#: The first port of the workers ``serve`` launches (``--worker-base-port``).
DEFAULT_WORKER_BASE_PORT = 31000


@attrs.frozen
class EngineLaunchConfig:
    """Engines ``serve`` launches as child processes: ``dp_size`` independent workers of
    ``backend`` on ports from ``worker_base_port``; ``engine_args`` pass through verbatim.
    ``mock_script`` (``backend="mock"`` only) is the mock's script file (docs/mock.md)."""

    backend: str = "mock"
    model: str | None = None
    dp_size: int = 1
    worker_base_port: int = DEFAULT_WORKER_BASE_PORT
    engine_args: tuple[str, ...] = ()
    socket_dir: str | None = None
    python: str | None = None
    mock_script: str | None = None
    #: The engines' log lines below this level are not forwarded (``--engine-log-level``).
    engine_log_level: str = "info"


def _lora_modules(items: Any) -> tuple[LoraModule, ...]:
    """``LoraModule`` entries, or their dicts (the config a frontend reads back)."""
    return tuple(m if isinstance(m, LoraModule) else LoraModule(**m) for m in items)


@attrs.frozen
class GatewayConfig:
    """The gateway. ``worker_urls`` are engines started elsewhere (``launch``); ``engines``
    makes ``serve`` start them itself. Durations are seconds.

    Admin API and worker confinement (safe by default):

    - ``allow_insecure_admin``: with neither ``admin_api_key`` nor ``api_key``, ``POST`` and
      ``DELETE /workers`` get 403 unless this is set (single-user development only).
    - ``allowed_socket_dirs``: besides the socket directory (``engines.socket_dir``, else
      ``$SMG_ZMQ_SOCKET_DIR`` or ``/tmp/smg-zmq-<uid>``) and the directories of
      ``worker_urls``, where worker ipc URLs may live.
    - ``allowed_engine_hosts``: besides loopback and the host of ``zmq_handshake_address``
      (or of a ``tcp://`` worker URL), hosts a worker's handshake address or tcp URL may bind,
      and the addresses a ``tcp://`` worker's engines may connect from.
    - ``allowed_engine_uids``: the uids a ``tcp://`` worker's engines on this host may connect
      as (``None``: root and the gateway's own).
    - ``zmq_advertise_host``, ``zmq_heartbeat_interval_s``, ``zmq_heartbeat_timeout_s``: a
      ``tcp://`` worker's advertised host and ZMTP heartbeats
      (:class:`~smg_trio.transport.tcp.TcpOptions`).
    - ``allowed_model_dirs``: model roots besides the startup model directories; ``None``
      means the Hugging Face hub cache.

    Workers may also come later: over ``POST /workers``, or from ``discovery_file`` (see
    :mod:`smg_trio.serve.discovery`). A request for a known model with no ready worker waits
    up to ``worker_wait_timeout_s`` for one, then gets a 503 with ``Retry-After``.

    The request limits mean what :class:`~smg_trio.gateway.config.GatewayHttpConfig` says.
    ``max_finished_jobs`` and ``job_ttl_s`` bound the registration jobs table: a finished job
    expires once that many newer ones finished, or that many seconds after it finished.
    """

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    worker_urls: tuple[str, ...] = ()
    backend: str = "vllm"
    model_path: str | None = None
    served_model_name: str | None = None
    zmq_engine_count: int = 1
    zmq_handshake_address: str | None = None
    policy: str = DEFAULT_POLICY
    #: ``cache_aware``'s knobs (smg's flags and defaults; see docs/routing.md).
    cache_threshold: float = 0.3
    balance_abs_threshold: float = 64.0
    balance_rel_threshold: float = 1.5
    block_size: int = 16
    max_tree_size: int = 1 << 26
    eviction_interval_s: float = 120.0
    api_key: str | None = None
    admin_api_key: str | None = None
    #: Tenants (docs/security.md#tenants): ``--api-keys-file`` and ``--tenant-api-key``.
    api_keys_file: str | None = None
    tenant_api_keys: tuple[str, ...] = attrs.field(default=(), repr=False)
    #: ``--otlp-traces-endpoint``: export request spans there (docs/observability.md).
    otlp_traces_endpoint: str | None = None
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False
    enable_prompt_tokens_details: bool = False
    #: vLLM's ``--chat-template`` (the Jinja source, read by the CLI) and
    #: ``--chat-template-content-format``: every worker's tokenizer renders with them.
    chat_template: str | None = None
    chat_template_content_format: str = "auto"
    trust_request_chat_template: bool = False
    #: vLLM's ``--default-chat-template-kwargs`` and ``--response-role``.
    default_chat_template_kwargs: dict[str, Any] | None = None
    response_role: str = "assistant"
    #: vLLM's ``--enable-log-requests`` and ``--max-log-len``.
    enable_log_requests: bool = False
    max_log_len: int | None = None
    #: vLLM's CORS flags (see :class:`~smg_trio.gateway.config.GatewayHttpConfig`).
    allowed_origins: tuple[str, ...] = ()
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)
    allow_credentials: bool = False
    #: The engines' structured-output backend (``--structured-outputs-config.backend`` among
    #: the launched engines' arguments, else ``auto``).
    structured_outputs_backend: str = "auto"
    max_n: int = DEFAULT_MAX_N
    responses_store_size: int = DEFAULT_RESPONSES_STORE_SIZE
    max_sequences_per_request: int = DEFAULT_MAX_SEQUENCES_PER_REQUEST
    max_tokens_per_request: int | None = None
    max_concurrent_requests: int = DEFAULT_MAX_CONCURRENT_REQUESTS
    queue_size: int = DEFAULT_QUEUE_SIZE
    queue_timeout_s: float = DEFAULT_QUEUE_TIMEOUT_S
    write_timeout_s: float = DEFAULT_WRITE_TIMEOUT_S
    enable_http2: bool = False
    fast_http1: bool = True
    worker_startup_timeout_s: float = READY_TIMEOUT_S
    engine_silence_timeout_s: float = ENGINE_SILENCE_DEATH_TIMEOUT_S
    max_finished_jobs: int = DEFAULT_MAX_FINISHED_JOBS
    job_ttl_s: float = DEFAULT_JOB_TTL_S
    worker_wait_timeout_s: float = WORKER_WAIT_TIMEOUT_S
    discovery_file: str | None = None
    shutdown_grace_period_s: float = DEFAULT_SHUTDOWN_GRACE_PERIOD_S
    frontend_stall_timeout_s: float = DEFAULT_FRONTEND_STALL_TIMEOUT_S
    engines: EngineLaunchConfig | None = None
    allow_insecure_admin: bool = False
    allowed_socket_dirs: tuple[str, ...] = ()
    allowed_engine_hosts: tuple[str, ...] = ()
    allowed_engine_uids: tuple[int, ...] | None = None
    zmq_advertise_host: str | None = None
    zmq_heartbeat_interval_s: float = DEFAULT_HEARTBEAT_IVL_S
    zmq_heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S
    allowed_model_dirs: tuple[str, ...] | None = None
    #: ``--lora-modules``: static LoRA adapters (docs/lora.md), and the engines' adapter rank
    #: limit when the gateway knows it (it launched them with ``--max-lora-rank``).
    lora_modules: tuple[LoraModule, ...] = attrs.field(default=(), converter=_lora_modules)
    max_lora_rank: int | None = None
    #: While startup workers register, the longest gap between progress lines.
    startup_progress_interval_s: float = 5.0
    #: ``--api-server-count``: HTTP frontend processes; above 1, ``serve`` is their supervisor
    #: (docs/multi-frontend.md).
    api_server_count: int = 1


def cache_aware_config(config: GatewayConfig) -> CacheAwareConfig:
    """``cache_aware``'s knobs from the gateway config."""
    return CacheAwareConfig(
        cache_threshold=config.cache_threshold,
        balance_abs_threshold=config.balance_abs_threshold,
        balance_rel_threshold=config.balance_rel_threshold,
        block_size=config.block_size,
        max_tree_size=config.max_tree_size,
        eviction_interval_secs=config.eviction_interval_s,
    )
