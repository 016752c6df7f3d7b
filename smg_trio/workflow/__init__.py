"""A DAG workflow engine on trio (smg's ``wfaas``): one nursery per run, completion-driven."""

from __future__ import annotations

from smg_trio.workflow.context import ContextKey, WorkflowContext
from smg_trio.workflow.definition import (
    RetryPolicy,
    RunIf,
    StepDefinition,
    StepFn,
    WorkflowDefinition,
)
from smg_trio.workflow.engine import WorkflowEngine, WorkflowHandle, WorkflowResult
from smg_trio.workflow.errors import StepTimeoutError, WorkflowDefinitionError, WorkflowError
from smg_trio.workflow.state import StepState, StepStatus, WorkflowStatus

__all__ = [
    "ContextKey",
    "RetryPolicy",
    "RunIf",
    "StepDefinition",
    "StepFn",
    "StepState",
    "StepStatus",
    "StepTimeoutError",
    "WorkflowContext",
    "WorkflowDefinition",
    "WorkflowDefinitionError",
    "WorkflowEngine",
    "WorkflowError",
    "WorkflowHandle",
    "WorkflowResult",
    "WorkflowStatus",
]
