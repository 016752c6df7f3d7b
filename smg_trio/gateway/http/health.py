"""Probes: ``/liveness`` (the process serves), ``/health`` (a live engine exists) and
``/readiness`` (a worker and its tokenizer are ready and the gateway is not draining)."""

from __future__ import annotations

import msgspec

from smg_trio.backend import GatewayBackend

__all__ = ["health", "liveness", "readiness"]


class _Ready(msgspec.Struct):
    status: str
    healthy_workers: int
    total_workers: int


class _NotReady(msgspec.Struct):
    status: str
    reason: str
    healthy_workers: int
    total_workers: int


def liveness() -> tuple[int, bytes]:
    """Always ``200 OK`` while the process serves HTTP."""
    return 200, b"OK"


def health(backend: GatewayBackend) -> tuple[int, bytes]:
    """``200 OK`` while at least one worker's engine is alive (also while draining), or while
    no worker is registered (a gateway started empty has nothing that died); ``503`` when
    every registered worker's engine is dead or not yet connected (vLLM's ``/health``)."""
    r = backend.readiness()
    if r.healthy_workers > 0 or r.total_workers == 0:
        return 200, b"OK"
    return 503, b"no healthy engine"


def readiness(backend: GatewayBackend) -> tuple[int, bytes]:
    """``200 {"status": "ready", "healthy_workers", "total_workers"}`` or
    ``503 {"status": "not ready", "reason", ...}`` (reason e.g. ``draining``, ``no workers``,
    ``insufficient healthy workers``)."""
    r = backend.readiness()
    if r.ready:
        return 200, msgspec.json.encode(_Ready("ready", r.healthy_workers, r.total_workers))
    body = _NotReady("not ready", r.reason, r.healthy_workers, r.total_workers)
    return 503, msgspec.json.encode(body)
