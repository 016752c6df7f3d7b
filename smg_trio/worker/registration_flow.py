"""The registration workflow: its DAG (tokenizer, handshake, metadata, DP group,
activation), the cleanup of a failed run, and one registration job's run."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Literal

import trio

from smg_trio.backend import ServedModel
from smg_trio.errors import ValidationError
from smg_trio.worker.confine import escape
from smg_trio.worker.jobs import RegistrationJob
from smg_trio.worker.model_files import load_model
from smg_trio.worker.registration import (
    bind_retryable,
    check_dp_group,
    handshake_retryable,
    tokenizer_retryable,
)
from smg_trio.worker.spec import PROTOCOLS
from smg_trio.worker.state import WorkerState
from smg_trio.worker.supervise import supervise
from smg_trio.workflow import (
    ContextKey,
    StepDefinition,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowError,
    WorkflowStatus,
)

if TYPE_CHECKING:
    from smg_trio.worker.manager import WorkerManager

__all__ = ["registration_definition", "run_registration"]

log = logging.getLogger(__name__)


#: The registration context: the reserved worker, the handshake attempt function that the
#: ``bind_handshake`` step leaves for ``handshake``, and the context length to serve.
_WORKER: ContextKey[WorkerState] = ContextKey("worker")
_CONNECT: ContextKey[Callable[[], Awaitable[None]]] = ContextKey("connect")
_MAX_MODEL_LEN: ContextKey[int] = ContextKey("max_model_len")


def registration_definition(manager: WorkerManager) -> WorkflowDefinition:
    """The registration DAG::

        load_tokenizer -> bind_handshake -> handshake -> discover_metadata
            -> check_dp_group (run_if dp_size > 1) -> activate
        on failure: cleanup

    Nothing is bound or created before the model directory passed its checks. The
    handshake ROUTER is bound once (``bind_handshake``) and kept across handshake retries,
    so a HELLO sent between two attempts waits in its queue instead of being lost.
    """
    t = manager.timing

    async def load_tokenizer(ctx: WorkflowContext) -> None:
        worker = ctx.get(_WORKER)
        if worker.spec.model_path is None:  # joins a served model: its tokenizer is loaded
            served = manager.get_model(worker.model_id)
            if served is None:
                raise ValidationError(
                    f"model {worker.model_id!r} is no longer served; give model_path",
                    param="model_path",
                )
            manager.models.setdefault(worker.model_id, served)
            return
        # Abandoned on timeout: a wedged filesystem read cannot hold the registration.
        tok, (eos, extra), max_len, pooling, defaults = await trio.to_thread.run_sync(
            load_model,
            worker.spec.model_path,
            manager.confinement.model_dirs,
            manager.chat_template,
            manager.chat_template_content_format,
            abandon_on_cancel=True,
        )
        if worker.model_id not in manager.models:
            # Known (so requests get 503, not 404) before the engine is ready.
            manager.models[worker.model_id] = ServedModel(
                model_id=worker.model_id,
                tokenizer=tok,
                protocol=PROTOCOLS[worker.runtime](),
                max_model_len=max_len or 2048,
                eos_token_id=eos,
                extra_eos_token_ids=list(extra),
                reasoning_parser=worker.spec.reasoning_parser,
                tool_call_parser=worker.spec.tool_call_parser,
                model_path=worker.spec.model_path,
                pooling=pooling,
                sampling_defaults=defaults,
            )

    async def bind_handshake(ctx: WorkflowContext) -> None:
        worker = ctx.get(_WORKER)
        ctx.set(_CONNECT, await manager._nursery.start(supervise, manager, worker))

    async def handshake(ctx: WorkflowContext) -> None:
        await ctx.get(_CONNECT)()

    async def discover(ctx: WorkflowContext) -> None:
        worker = ctx.get(_WORKER)
        client = worker.engine_client
        assert client is not None
        ready = client.ready_responses[0]
        worker.metadata.update(
            max_model_len=ready.max_model_len,
            engine_version=ready.vllm_version,
            dtype=ready.dtype,
            data_parallel_size=ready.data_parallel_size,
            engine_count=len(client.engines),
            block_size=ready.block_size_tokens,
        )
        ctx.set(_MAX_MODEL_LEN, client.max_model_len)

    async def dp_group(ctx: WorkflowContext) -> None:
        worker = ctx.get(_WORKER)
        client = worker.engine_client
        assert client is not None
        group = check_dp_group(worker.dp_size, client.engines)
        if group.max_model_len != client.max_model_len:
            log.warning(
                "worker %r: DP ranks report different max_model_len; using the smallest, %d",
                worker.spec.url,
                group.max_model_len,
            )
        worker.metadata.update(
            dp_ranks=list(group.ranks),
            dp_mode="lockstep" if group.lockstep else "independent",
            max_model_len=group.max_model_len,
        )
        ctx.set(_MAX_MODEL_LEN, group.max_model_len)

    async def activate(ctx: WorkflowContext) -> None:
        worker = ctx.get(_WORKER)
        model = manager.models.get(worker.model_id)
        if model is not None:
            model.max_model_len = ctx.get(_MAX_MODEL_LEN)
        worker.status = "ready"
        log.info(
            "worker %r (%s, model %r) is ready",
            worker.spec.url,
            worker.runtime,
            worker.model_id,
        )

    async def cleanup(ctx: WorkflowContext) -> None:
        # Undo what the failed run did: stop the supervisor (its sockets close and the
        # ipc files it created are unlinked), then drop the reserved registry entry and
        # the model entry if this was the model's last worker.
        worker = ctx.get(_WORKER)
        worker.scope.cancel()
        await worker.stopped.wait()
        manager._forget(worker, retire=False)

    return WorkflowDefinition(
        "register_zmq_worker",
        [
            StepDefinition(
                "load_tokenizer",
                load_tokenizer,
                timeout_s=t.tokenizer_timeout_s,
                retry=t.tokenizer_retry,
                is_retryable=tokenizer_retryable,
            ),
            StepDefinition(
                "bind_handshake",
                bind_handshake,
                depends_on=("load_tokenizer",),
                timeout_s=t.bind_timeout_s,
                retry=t.bind_retry,
                is_retryable=bind_retryable,
            ),
            StepDefinition(
                "handshake",
                handshake,
                depends_on=("bind_handshake",),
                timeout_s=t.handshake_timeout_s or 3 * manager.ready_timeout_s,
                retry=t.handshake_retry,
                is_retryable=handshake_retryable,
            ),
            StepDefinition(
                "discover_metadata",
                discover,
                depends_on=("handshake",),
                timeout_s=t.step_timeout_s,
            ),
            StepDefinition(
                "check_dp_group",
                dp_group,
                depends_on=("discover_metadata",),
                run_if=lambda ctx: ctx.get(_WORKER).dp_size > 1,
                timeout_s=t.step_timeout_s,
            ),
            StepDefinition(
                "activate",
                activate,
                depends_on=("check_dp_group",),
                timeout_s=t.step_timeout_s,
            ),
        ],
        on_failure=StepDefinition("cleanup", cleanup, timeout_s=t.cleanup_timeout_s),
    )


async def run_registration(
    manager: WorkerManager, job: RegistrationJob, worker: WorkerState
) -> None:
    """Run ``worker``'s registration workflow as ``job`` and record how it ended."""
    ctx = WorkflowContext({_WORKER.name: worker}, instance_id=job.job_id)
    job.status = "running"
    with worker.registration_scope:
        async with trio.open_nursery() as nursery:
            job.run = await manager.engine.start(nursery, manager.definition, ctx)
    status: Literal["succeeded", "failed", "cancelled"]
    error: str | None = None
    try:
        result = None if job.run is None else await job.run.wait()
    except WorkflowError as exc:  # an engine fault (already logged), not a step failure
        status, error = "failed", f"{type(exc).__name__}: {exc}"
    else:
        if result is None or result.status is WorkflowStatus.CANCELLED:
            status, error = "cancelled", "worker removed during registration"
        elif result.status is WorkflowStatus.COMPLETED:
            status = "succeeded"
        else:
            where = f"step {result.failed_step}: " if result.failed_step else ""
            status, error = "failed", f"{where}{result.error}"
    if status == "failed":
        log.error("registration of %r failed: %s", worker.spec.url, escape(error or ""))
    elif status == "cancelled":  # a removal (DELETE, discovery, shutdown) asked for it
        log.info("registration of %r cancelled: %s", worker.spec.url, escape(error or ""))
    job.finish(status, error)
    manager.jobs.finished(job)
