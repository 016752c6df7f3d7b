"""Definition-time validation of workflow DAGs and retry policies."""

from __future__ import annotations

import random
from typing import Any

import pytest

from smg_trio.errors import SmgError
from smg_trio.workflow import (
    RetryPolicy,
    StepDefinition,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowDefinitionError,
)


async def _noop(ctx: WorkflowContext) -> None:
    return None


def _step(step_id: str, *deps: str, **kwargs: Any) -> StepDefinition:
    return StepDefinition(step_id, _noop, depends_on=deps, **kwargs)


def test_valid_workflow_indexes() -> None:
    wf = WorkflowDefinition(
        "diamond",
        [_step("a"), _step("b", "a"), _step("c", "a"), _step("d", "b", "c"), _step("e")],
    )
    assert wf.roots == ("a", "e")
    assert wf.dependents("a") == ("b", "c")
    assert wf.dependents("d") == ()
    assert wf.step("c").depends_on == ("a",)


def test_definition_error_is_smg_error() -> None:
    assert issubclass(WorkflowDefinitionError, SmgError)


def test_cycle_rejected_and_named() -> None:
    with pytest.raises(WorkflowDefinitionError, match=r"cycle b -> d -> c -> b"):
        WorkflowDefinition(
            "cyclic", [_step("a"), _step("b", "a", "d"), _step("c", "b"), _step("d", "c")]
        )


def test_self_dependency_is_a_cycle() -> None:
    with pytest.raises(WorkflowDefinitionError, match=r"cycle a -> a"):
        WorkflowDefinition("selfish", [_step("a", "a")])


def test_missing_dependency_rejected() -> None:
    with pytest.raises(WorkflowDefinitionError, match=r"step 'b' depends on unknown step 'zz'"):
        WorkflowDefinition("missing", [_step("a"), _step("b", "zz")])


def test_duplicate_step_rejected() -> None:
    with pytest.raises(WorkflowDefinitionError, match=r"duplicate step id 'a'"):
        WorkflowDefinition("dup", [_step("a"), _step("b", "a"), _step("a")])


def test_empty_workflow_rejected() -> None:
    with pytest.raises(WorkflowDefinitionError, match="no steps"):
        WorkflowDefinition("empty", [])


def test_string_dependencies_rejected() -> None:
    with pytest.raises(WorkflowDefinitionError, match="not the string"):
        StepDefinition("a", _noop, depends_on="b")


def test_bad_step_timeout_rejected() -> None:
    with pytest.raises(WorkflowDefinitionError, match="timeout_s"):
        StepDefinition("a", _noop, timeout_s=0)


def test_failure_step_cannot_reuse_an_id_or_have_dependencies() -> None:
    with pytest.raises(WorkflowDefinitionError, match="reuses step id 'a'"):
        WorkflowDefinition("dup_cleanup", [_step("a")], on_failure=_step("a"))
    with pytest.raises(WorkflowDefinitionError, match="cannot have dependencies"):
        WorkflowDefinition("dep_cleanup", [_step("a")], on_failure=_step("cleanup", "a"))
    wf = WorkflowDefinition("ok", [_step("a")], on_failure=_step("cleanup"))
    assert wf.on_failure is not None
    assert wf.roots == ("a",)  # the failure step is no node of the DAG


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"initial_s": -1.0}, "durations"),
        ({"multiplier": 0.5}, "multiplier"),
        ({"jitter_ratio": 1.5}, "jitter_ratio"),
    ],
)
def test_bad_retry_policy_rejected(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(WorkflowDefinitionError, match=match):
        RetryPolicy(**kwargs)


def test_exponential_backoff_is_capped() -> None:
    policy = RetryPolicy(max_attempts=10, initial_s=1.0, multiplier=2.0, max_s=5.0)
    assert [policy.delay_s(n) for n in range(1, 6)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert policy.delay_s(100_000) == 5.0  # no OverflowError


def test_jitter_is_deterministic_with_a_seeded_rng_and_only_shortens() -> None:
    policy = RetryPolicy(max_attempts=5, initial_s=2.0, multiplier=2.0, max_s=8.0, jitter_ratio=0.5)
    first = [policy.delay_s(n, random.Random(7)) for n in range(1, 5)]
    again = [policy.delay_s(n, random.Random(7)) for n in range(1, 5)]
    assert first == again
    for n, delay in enumerate(first, start=1):
        base = min(8.0, 2.0 * 2.0 ** (n - 1))
        assert base * 0.5 <= delay <= base
