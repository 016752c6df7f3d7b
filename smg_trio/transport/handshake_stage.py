"""Where each running startup handshake stands, by handshake address (for progress lines)."""

from __future__ import annotations

__all__ = ["clear_stage", "handshake_stage", "set_stage", "stage_text"]

#: One entry per handshake in progress (removed when it ends): bounded by the workers.
_STAGES: dict[str, str] = {}


def stage_text(engines: int, hello: int, ready: int, registered: int) -> str:
    """What a handshake with ``engines`` engines waits for, given how many said HELLO, READY
    and registered on the input socket. vLLM's engine says HELLO as soon as its process is
    up, and READY only once the model is loaded and the KV cache profiled (minutes)."""
    if hello < engines:
        return (
            f"waiting for the engine process to start and say HELLO "
            f"({hello} of {engines} said HELLO)"
        )
    if ready < engines:
        return (
            f"the engine said HELLO and has its addresses; waiting for READY while it loads "
            f"the model and profiles its KV cache ({ready} of {engines} READY)"
        )
    return f"waiting for the engine's input registration ({registered} of {engines} registered)"


def set_stage(address: str, text: str) -> None:
    _STAGES[address] = text


def clear_stage(address: str) -> None:
    _STAGES.pop(address, None)


def handshake_stage(address: str | None) -> str | None:
    """The stage of the handshake running on ``address``, if one is."""
    return None if address is None else _STAGES.get(address)
