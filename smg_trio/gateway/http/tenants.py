"""Tenants: named API keys, each with its own concurrency and token-rate limits
(``--api-keys-file``, ``--tenant-api-key NAME:KEY``), the ledger that enforces them (in this
process, or shared by every frontend of ``--api-server-count`` through a file in the run
directory), and their Prometheus series."""

from __future__ import annotations

import hashlib
import hmac
import json
import mmap
import os
import re
import stat
import time
import tomllib
from collections.abc import Iterator, Sequence
from typing import Any, Final

import attrs
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from smg_trio.gateway.openai.errors import ApiError

__all__ = [
    "MAX_TENANTS",
    "OTHER",
    "WINDOW_S",
    "SharedLedger",
    "Tenant",
    "TenantCollector",
    "TenantGate",
    "TenantTable",
    "TenantsError",
    "create_ledger_file",
    "load_tenants",
    "parse_tenant_flag",
    "parse_tenants",
]

#: The metrics label of requests that no tenant key authenticated (the shared ``--api-key``,
#: or no key at all), so that the label's values are the configured tenants and this one.
OTHER: Final = "other"
#: Most tenants one gateway configures (each is a label value and a row of the ledger).
MAX_TENANTS: Final = 1024
#: The token-rate window: tokens per minute, counted in one-second buckets.
WINDOW_S: Final = 60
#: The keys file's largest accepted size.
MAX_FILE_BYTES: Final = 1024 * 1024
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_MIN_KEY = 8
_LIMIT_KEYS = ("max_concurrent_requests", "tokens_per_minute")
_CELL = 8
#: Cells per (tenant, frontend): requests in flight, then the window's second stamps, then
#: its token counts.
_ROW = 1 + 2 * WINDOW_S


class TenantsError(ValueError):
    """A keys file or ``--tenant-api-key`` that cannot be used (never quotes a key)."""


@attrs.frozen
class Tenant:
    """One tenant: its name (a metrics label), key (never in a repr or a log) and limits
    (``None``: unlimited)."""

    name: str
    key: bytes = attrs.field(repr=False)
    max_concurrent_requests: int | None = None
    tokens_per_minute: int | None = None
    #: Its row in the ledger.
    index: int = 0


@attrs.frozen
class TenantTable:
    """The configured tenants, looked up by the SHA-256 of the presented key (so the lookup
    reveals nothing of the keys' bytes), then compared in constant time."""

    tenants: tuple[Tenant, ...]
    _by_digest: dict[bytes, Tenant] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        table = {hashlib.sha256(t.key).digest(): t for t in self.tenants}
        object.__setattr__(self, "_by_digest", table)

    def lookup(self, presented: bytes) -> Tenant | None:
        """The tenant whose key is ``presented``, or ``None``."""
        tenant = self._by_digest.get(hashlib.sha256(presented).digest())
        if tenant is not None and hmac.compare_digest(tenant.key, presented):
            return tenant
        return None

    @property
    def names(self) -> tuple[str, ...]:
        """The tenants' names, in ledger order."""
        return tuple(t.name for t in self.tenants)


def _limit(entry: dict[str, Any], key: str, where: str) -> int | None:
    value = entry.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TenantsError(f"{where}: {key} must be a positive integer")
    return value


def _check_key(key: Any, where: str) -> bytes:
    if not isinstance(key, str) or not key:
        raise TenantsError(f"{where}: 'key' must be a non-empty string")
    if len(key) < _MIN_KEY or not key.isascii() or not key.isprintable() or " " in key:
        raise TenantsError(
            f"{where}: the key must be at least {_MIN_KEY} printable ASCII characters "
            "without spaces"
        )
    return key.encode()


def _check_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise TenantsError(
            f"{where}: 'name' must be 1-64 characters of letters, digits, '_', '.' and '-'"
        )
    if name == OTHER:
        raise TenantsError(f"{where}: the name {OTHER!r} is reserved (requests of no tenant)")
    return name


def parse_tenants(data: bytes, *, toml: bool, source: str = "the keys file") -> list[Tenant]:
    """The tenants of a keys file (JSON, or TOML): ``tenants``, a list of tables with
    ``name``, ``key`` and optional limits; ``defaults``, optional limits of the tenants that
    set none. Raises :class:`TenantsError`."""
    try:
        doc = tomllib.loads(data.decode()) if toml else json.loads(data)
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        # the parsers' messages may quote the line (a key): say only where
        line = getattr(exc, "lineno", None)
        raise TenantsError(
            f"{source} is not valid {'TOML' if toml else 'JSON'}"
            + (f" (line {line})" if line else "")
        ) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("tenants"), list):
        raise TenantsError(f"{source} must be a table with a 'tenants' list")
    unknown = set(doc) - {"tenants", "defaults"}
    if unknown:
        raise TenantsError(f"{source}: unknown top-level key(s) {sorted(unknown)}")
    defaults = doc.get("defaults") or {}
    if not isinstance(defaults, dict) or set(defaults) - set(_LIMIT_KEYS):
        raise TenantsError(f"{source}: 'defaults' may set only {list(_LIMIT_KEYS)}")
    base = {k: _limit(defaults, k, f"{source}: defaults") for k in _LIMIT_KEYS}
    out: list[Tenant] = []
    for i, entry in enumerate(doc["tenants"]):
        where = f"{source}: tenants[{i}]"
        if not isinstance(entry, dict):
            raise TenantsError(f"{where} must be a table")
        extra = set(entry) - {"name", "key", *_LIMIT_KEYS}
        if extra:
            raise TenantsError(f"{where}: unknown field(s) {sorted(extra)}")
        name = _check_name(entry.get("name"), where)
        key = _check_key(entry.get("key"), f"{where} ({name})")
        concurrency = _limit(entry, "max_concurrent_requests", where)
        tpm = _limit(entry, "tokens_per_minute", where)
        out.append(
            Tenant(
                name,
                key,
                max_concurrent_requests=(
                    base["max_concurrent_requests"] if concurrency is None else concurrency
                ),
                tokens_per_minute=base["tokens_per_minute"] if tpm is None else tpm,
            )
        )
    return out


def parse_tenant_flag(text: str) -> Tenant:
    """``--tenant-api-key NAME:KEY`` (smg's ``tenant:key`` spelling; no limits)."""
    name, sep, key = text.partition(":")
    if not sep:
        raise TenantsError("--tenant-api-key takes NAME:KEY")
    name = _check_name(name, "--tenant-api-key")
    return Tenant(name, _check_key(key, f"--tenant-api-key ({name})"))


def _read_keys_file(path: str) -> bytes:
    """The keys file's bytes: a regular file (a symlink to one is followed, as Kubernetes
    mounts secrets) of at most :data:`MAX_FILE_BYTES`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise TenantsError(f"--api-keys-file {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise TenantsError(f"--api-keys-file {path}: not a regular file")
        if st.st_size > MAX_FILE_BYTES:
            raise TenantsError(f"--api-keys-file {path}: larger than {MAX_FILE_BYTES} bytes")
        data = os.read(fd, MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise TenantsError(f"--api-keys-file {path}: larger than {MAX_FILE_BYTES} bytes")
    return data


def load_tenants(path: str | None, flags: Sequence[str] = ()) -> TenantTable | None:
    """The tenants of ``--api-keys-file`` and ``--tenant-api-key`` (``None`` when neither
    names one). Names and keys are unique; at most :data:`MAX_TENANTS`. Raises
    :class:`TenantsError`."""
    tenants: list[Tenant] = []
    if path is not None:
        data = _read_keys_file(path)
        tenants += parse_tenants(data, toml=path.lower().endswith(".toml"), source=path)
    tenants += [parse_tenant_flag(f) for f in flags]
    if not tenants:
        return None
    if len(tenants) > MAX_TENANTS:
        raise TenantsError(f"at most {MAX_TENANTS} tenants, got {len(tenants)}")
    names = [t.name for t in tenants]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise TenantsError(f"tenant name(s) given twice: {dup}")
    if len({t.key for t in tenants}) != len(tenants):
        raise TenantsError("two tenants have the same key")
    return TenantTable(tuple(attrs.evolve(t, index=i) for i, t in enumerate(tenants)))


def create_ledger_file(path: str, tenants: int, frontends: int) -> None:
    """Create (or reset) the zeroed shared ledger at ``path``, owner-only."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.ftruncate(fd, max(1, tenants * frontends * _ROW) * _CELL)
    finally:
        os.close(fd)


@attrs.frozen
class SharedLedger:
    """Where a frontend's :class:`TenantGate` keeps its counts: the file made by
    :func:`create_ledger_file` for ``frontends`` processes, this one's ``index``."""

    path: str
    frontends: int
    index: int


class _Ledger:
    """Per (tenant, frontend) cells of int64: each written by its own frontend only, summed
    by all (a single aligned store per update: a reader sees the old or the new count)."""

    def __init__(self, tenants: int, shared: SharedLedger | None) -> None:
        self._map: mmap.mmap | None = None
        size = max(1, tenants * (shared.frontends if shared else 1) * _ROW) * _CELL
        if shared is None:
            self.cells = memoryview(bytearray(size)).cast("q")
            self.frontends, self.index = 1, 0
        else:
            fd = os.open(shared.path, os.O_RDWR | os.O_NOFOLLOW)
            try:
                if os.fstat(fd).st_size != size:
                    raise TenantsError(
                        "the tenants changed since the supervisor read them: restart serve"
                    )
                self._map = mmap.mmap(fd, size)
            finally:
                os.close(fd)
            self.cells = memoryview(self._map).cast("q")
            self.frontends, self.index = shared.frontends, shared.index
            for t in range(tenants):  # a restarted frontend's old counts are gone
                base = self._row(t, self.index)
                self.cells[base : base + _ROW] = memoryview(bytearray(_ROW * _CELL)).cast("q")

    def _row(self, tenant: int, frontend: int) -> int:
        return (tenant * self.frontends + frontend) * _ROW

    def inflight(self, tenant: int) -> int:
        cells = self.cells
        return sum(cells[self._row(tenant, f)] for f in range(self.frontends))

    def own_inflight(self, tenant: int) -> int:
        return self.cells[self._row(tenant, self.index)]

    def add_inflight(self, tenant: int, delta: int) -> None:
        self.cells[self._row(tenant, self.index)] += delta

    def buckets(self, tenant: int, now: int, frontends: Sequence[int]) -> Iterator[tuple[int, int]]:
        """``(second, tokens)`` of the window's live buckets."""
        cells = self.cells
        for f in frontends:
            base = self._row(tenant, f) + 1
            for b in range(WINDOW_S):
                second, tokens = cells[base + b], cells[base + WINDOW_S + b]
                if tokens and now - WINDOW_S < second <= now:
                    yield second, tokens

    def used(self, tenant: int, now: int) -> int:
        return sum(tokens for _, tokens in self.buckets(tenant, now, range(self.frontends)))

    def own_used(self, tenant: int, now: int) -> int:
        return sum(tokens for _, tokens in self.buckets(tenant, now, (self.index,)))

    def charge(self, tenant: int, tokens: int, now: int) -> None:
        base = self._row(tenant, self.index) + 1
        b = now % WINDOW_S
        cells = self.cells
        if cells[base + b] != now:
            cells[base + b] = now
            cells[base + WINDOW_S + b] = 0
        cells[base + WINDOW_S + b] += tokens

    def close(self) -> None:
        self.cells.release()
        if self._map is not None:
            self._map.close()


def _over(message: str, retry_after: int) -> ApiError:
    return ApiError(
        429,
        message,
        code="rate_limit_exceeded",
        error_type="rate_limit_error",
        retry_after=retry_after,
    )


class TenantGate:
    """Admission by tenant: a request holds one of its tenant's concurrency slots from
    :meth:`enter` to :meth:`leave`, and is admitted only while the tenant's last
    :data:`WINDOW_S` seconds used fewer tokens than its ``tokens_per_minute``; it is charged
    its usage (prompt + completion tokens) when it ends. Over either limit: 429 with
    ``Retry-After``. With a :class:`SharedLedger` the limits hold for every frontend together
    (a request is checked against every frontend's counts; two frontends admitting at the
    same instant can each take the last slot, so the limit can be passed by at most one
    request per other frontend)."""

    def __init__(self, table: TenantTable, shared: SharedLedger | None = None) -> None:
        self.table = table
        self._ledger = _Ledger(len(table.tenants), shared)
        n = len(table.tenants)
        self.rejected_concurrency = [0] * n
        self.rejected_tokens = [0] * n

    def enter(self, tenant: Tenant) -> None:
        """Take a slot for a request of ``tenant`` (raises the 429 ``ApiError``)."""
        ledger, i = self._ledger, tenant.index
        limit = tenant.max_concurrent_requests
        if limit is not None and ledger.inflight(i) >= limit:
            self.rejected_concurrency[i] += 1
            raise _over(
                f"tenant {tenant.name!r} is at its limit of {limit} concurrent requests; "
                "retry later",
                1,
            )
        tpm = tenant.tokens_per_minute
        if tpm is not None:
            now = int(time.time())
            used = ledger.used(i, now)
            if used >= tpm:
                self.rejected_tokens[i] += 1
                raise _over(
                    f"tenant {tenant.name!r} used {used} of its {tpm} tokens per minute; "
                    "retry later",
                    self._retry_after(tenant, used, now),
                )
        ledger.add_inflight(i, 1)

    def _retry_after(self, tenant: Tenant, used: int, now: int) -> int:
        """Seconds until enough of the window's buckets expire to bring it under the limit."""
        tpm = tenant.tokens_per_minute
        assert tpm is not None
        ledger = self._ledger
        for second, tokens in sorted(ledger.buckets(tenant.index, now, range(ledger.frontends))):
            used -= tokens
            if used < tpm:
                return max(1, second + WINDOW_S - now)
        return WINDOW_S

    def leave(self, tenant: Tenant, tokens: int) -> None:
        """Release the slot and charge ``tokens``."""
        ledger, i = self._ledger, tenant.index
        ledger.add_inflight(i, -1)
        if tokens > 0 and tenant.tokens_per_minute is not None:
            ledger.charge(i, tokens, int(time.time()))

    def inflight(self, tenant: Tenant) -> int:
        """The tenant's requests in flight, every frontend's."""
        return self._ledger.inflight(tenant.index)

    def used(self, tenant: Tenant) -> int:
        """Tokens the tenant used in the window, every frontend's."""
        return self._ledger.used(tenant.index, int(time.time()))

    def own(self, tenant: Tenant) -> tuple[int, int]:
        """This process's ``(requests in flight, tokens in the window)`` for ``tenant``."""
        now = int(time.time())
        return self._ledger.own_inflight(tenant.index), self._ledger.own_used(tenant.index, now)


class TenantCollector(Collector):
    """The tenants' series (label ``tenant``: the configured names and :data:`OTHER`):
    ``smg_tenant_requests_total{tenant,status}``, ``smg_tenant_tokens_total{tenant,kind}``,
    ``smg_tenant_requests_rejected_total{tenant,reason}``, and this process's
    ``smg_tenant_requests_active`` and ``smg_tenant_window_tokens`` (summed over frontends by
    the merged ``/metrics``)."""

    def __init__(self, gate: TenantGate | None, names: Sequence[str]) -> None:
        self._gate = gate
        self.labels = (*names, OTHER)
        #: ``(tenant label, status) -> count``; ``(tenant label, kind) -> tokens``.
        self.requests: dict[tuple[str, str], int] = {}
        self.tokens: dict[tuple[str, str], int] = {}

    def finished(self, tenant: str, status: int, prompt: int, completion: int) -> None:
        """Count one finished request of ``tenant`` (a name or :data:`OTHER`)."""
        key = (tenant, str(status))
        self.requests[key] = self.requests.get(key, 0) + 1
        for kind, n in (("prompt", prompt), ("completion", completion)):
            if n:
                self.tokens[(tenant, kind)] = self.tokens.get((tenant, kind), 0) + n

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "smg_tenant_requests", "Finished requests per tenant", labels=["tenant", "status"]
        )
        for (tenant, status), n in sorted(self.requests.items()):
            requests.add_metric([tenant, status], n)
        tokens = CounterMetricFamily(
            "smg_tenant_tokens", "Tokens used per tenant (prompt, completion)",
            labels=["tenant", "kind"],
        )  # fmt: skip
        for (tenant, kind), n in sorted(self.tokens.items()):
            tokens.add_metric([tenant, kind], n)
        rejected = CounterMetricFamily(
            "smg_tenant_requests_rejected", "Requests refused with 429 at a tenant's limit",
            labels=["tenant", "reason"],
        )  # fmt: skip
        active = GaugeMetricFamily(
            "smg_tenant_requests_active", "A tenant's requests in flight (this process)",
            labels=["tenant"],
        )  # fmt: skip
        window = GaugeMetricFamily(
            "smg_tenant_window_tokens",
            f"Tokens a tenant used in the last {WINDOW_S} s (this process)",
            labels=["tenant"],
        )
        gate = self._gate
        if gate is not None:
            for t in gate.table.tenants:
                rejected.add_metric([t.name, "concurrency"], gate.rejected_concurrency[t.index])
                rejected.add_metric([t.name, "tokens"], gate.rejected_tokens[t.index])
                flight, used = gate.own(t)
                active.add_metric([t.name], flight)
                window.add_metric([t.name], used)
        yield from (requests, tokens, rejected, active, window)
