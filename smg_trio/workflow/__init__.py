"""A DAG workflow engine on trio (smg's ``wfaas``): one nursery per run, completion-driven."""

from __future__ import annotations

from smg_trio.workflow.context import ContextKey, WorkflowContext
from smg_trio.workflow.definition import (
    OnFailure,
    RetryPolicy,
    RunIf,
    StepDefinition,
    StepFn,
    WorkflowDefinition,
)
from smg_trio.workflow.engine import (
    FINALIZE_TIMEOUT_S,
    WorkflowEngine,
    WorkflowHandle,
    WorkflowResult,
)
from smg_trio.workflow.errors import (
    SkipStep,
    StateStoreError,
    StepResultUnavailable,
    StepTimeoutError,
    WorkflowCancelled,
    WorkflowDefinitionError,
    WorkflowError,
    WorkflowFailed,
)
from smg_trio.workflow.events import EventBus, EventKind, WorkflowEvent
from smg_trio.workflow.state import (
    InMemoryStateStore,
    StateStore,
    StepState,
    StepStatus,
    WorkflowState,
    WorkflowStatus,
)

__all__ = [
    "FINALIZE_TIMEOUT_S",
    "ContextKey",
    "EventBus",
    "EventKind",
    "InMemoryStateStore",
    "OnFailure",
    "RetryPolicy",
    "RunIf",
    "SkipStep",
    "StateStore",
    "StateStoreError",
    "StepDefinition",
    "StepFn",
    "StepResultUnavailable",
    "StepState",
    "StepStatus",
    "StepTimeoutError",
    "WorkflowCancelled",
    "WorkflowContext",
    "WorkflowDefinition",
    "WorkflowDefinitionError",
    "WorkflowEngine",
    "WorkflowError",
    "WorkflowEvent",
    "WorkflowFailed",
    "WorkflowHandle",
    "WorkflowResult",
    "WorkflowState",
    "WorkflowStatus",
]
