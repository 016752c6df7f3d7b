"""The mock engine's utility methods: vLLM EngineCore's names, arguments and answers."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from smg_trio.mock.lora import MockLoras

__all__ = ["NEVER_ANSWERS", "MockUtility", "UtilityAnswer"]

log = logging.getLogger(__name__)

#: A method the mock takes and never answers (an engine wedged inside a utility call), for
#: tests of the callers' bounds. Others can be made silent with ``MockUtility.silent``.
NEVER_ANSWERS = "mock_never_answer"

#: ``(failure_message, result)``, as vLLM's ``UtilityOutput`` carries them.
UtilityAnswer = tuple[str | None, Any]

_PAUSE_MODES = ("abort", "wait", "keep")


@attrs.define
class MockUtility:
    """Engine state the utility calls read and change, and the calls seen.

    ``sleep_mode=False`` refuses ``sleep`` as an engine started without
    ``--enable-sleep-mode`` does. ``on_pause`` is called with the pause mode when the
    scheduler pauses (the engine aborts its requests for ``abort``)."""

    sleep_mode: bool = True
    sleeping_tags: set[str] = attrs.field(factory=set)
    paused: bool = False
    prefix_cache_resets: int = 0
    supported_tasks: tuple[str, ...] = ("generate",)
    #: Methods taken and never answered.
    silent: set[str] = attrs.field(factory=lambda: {NEVER_ANSWERS})
    #: ``(method, args)`` of every call, in arrival order.
    calls: list[tuple[str, list[Any]]] = attrs.field(factory=list)
    on_pause: Callable[[str], None] | None = None
    #: The LoRA adapters (add_lora, remove_lora, list_loras, pin_lora).
    loras: MockLoras = attrs.field(factory=MockLoras)
    #: Called when the prefix cache is dropped (``reset_prefix_cache``, a pause that clears it).
    on_reset_cache: Callable[[], None] | None = None

    @property
    def holding(self) -> bool:
        """Whether the scheduler is held (paused or asleep): requests queue, nothing steps."""
        return self.paused or bool(self.sleeping_tags)

    def call(self, method: str, args: Sequence[Any]) -> UtilityAnswer | None:
        """Run ``method``; ``None`` when it never answers. A failure is vLLM's message."""
        self.calls.append((method, list(args)))
        if method in self.silent:
            log.debug("mock: utility %s taken, never answered", method)
            return None
        fn = getattr(self, f"_u_{method}", None)
        if fn is None:
            return (
                f"Call to {method} method failed: 'EngineCoreProc' object has no attribute "
                f"'{method}'",
                None,
            )
        try:
            return None, fn(*args)
        except (TypeError, ValueError, OSError) as exc:
            return f"Call to {method} method failed: {exc}", None

    # -- vLLM 0.32 EngineCore utility methods ------------------------------------------------

    def _u_reset_prefix_cache(
        self, reset_running_requests: bool = False, reset_connector: bool = False
    ) -> bool:
        self._reset_cache()
        return True

    def _reset_cache(self) -> None:
        self.prefix_cache_resets += 1
        if self.on_reset_cache is not None:
            self.on_reset_cache()

    def _u_get_supported_tasks(self) -> tuple[str, ...]:
        return self.supported_tasks

    def _u_pause_scheduler(self, mode: str = "abort", clear_cache: bool = True) -> None:
        if mode not in _PAUSE_MODES:
            raise ValueError(f"Invalid pause mode: {mode}")
        self.paused = True
        if self.on_pause is not None:
            self.on_pause(mode)
        if clear_cache and mode != "keep":
            self._reset_cache()

    def _u_resume_scheduler(self) -> None:
        self.paused = False

    def _u_is_scheduler_paused(self) -> bool:
        return self.paused

    def _u_sleep(self, level: int = 1, mode: str = "abort") -> None:
        # vLLM pauses the scheduler first: an executor that then refuses leaves it paused
        self._u_pause_scheduler(mode, clear_cache=level >= 1)
        if not self.sleep_mode:
            raise ValueError("Sleep mode is not enabled")
        if level >= 1:
            self.sleeping_tags |= {"weights", "kv_cache"}

    def _u_wake_up(self, tags: list[str] | None = None) -> bool:
        if tags is not None:
            tags = [t for t in tags if t != "scheduling"]
        if tags is None:
            self.sleeping_tags.clear()
        else:
            self.sleeping_tags -= set(tags)
        fully_awake = not self.sleeping_tags
        if fully_awake:
            self.paused = False
        return fully_awake

    def _u_is_sleeping(self) -> bool:
        return self.holding

    def _u_add_lora(self, lora_request: Sequence[Any]) -> bool:
        if self.loras.max_loras < 1:
            raise ValueError("LoRA is not enabled (start the engine with --enable-lora)")
        return self.loras.add_lora(lora_request)

    def _u_remove_lora(self, lora_id: int) -> bool:
        return self.loras.remove_lora(lora_id)

    def _u_list_loras(self) -> list[int]:
        return self.loras.list_loras()

    def _u_pin_lora(self, lora_id: int) -> bool:
        return self.loras.pin_lora(lora_id)
