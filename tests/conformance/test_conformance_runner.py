"""Self-tests of the conformance runner against well-behaved and faulty fake OpenAI servers."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import socket
import subprocess
import sys
import types
import xml.etree.ElementTree as ET
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import pytest
import trio

from conformance import cli
from conformance.case import CaseResult, Result
from conformance.client import Context, normalise_base_url
from conformance.runner import http_cases, run_cases, select_cases

StartFake = Callable[..., Awaitable[str]]
ALL = frozenset(c.name for c in http_cases())
REJECTIONS = frozenset(
    {
        "reject_top_logprobs_without_logprobs",
        "reject_top_logprobs_21",
        "reject_max_tokens_zero",
        "reject_max_tokens_negative",
        "reject_n_zero",
        "reject_temperature_negative",
        "reject_top_p_above_one",
    }
)
ERROR_CASES = REJECTIONS | {
    "logit_bias_honoured_or_rejected",
    "unknown_model",
    "unknown_model_stream",
    "malformed_json",
    "non_object_body",
    "empty_messages",
    "invalid_message",
    "content_type_rejected",
    "tokenize_detokenize",  # its out-of-vocabulary 400
    "messages_error_envelope",
}

# Each fault of the fake server, and exactly the cases that must catch it (no collateral).
EXPECTED_FAILURES: dict[str, frozenset[str]] = {
    "bad_json_500": frozenset({"malformed_json"}),
    "content_type_500": frozenset({"content_type_rejected"}),
    "double_done": frozenset({"chat_stream", "completions_stream", "chat_n2_stream_usage"}),
    "drop_last_stream_token": frozenset({"chat_stream_matches", "completions_stream_matches"}),
    "error_detail_only": ERROR_CASES,
    "index_all_zero": frozenset({"chat_n2_stream_usage"}),
    "logprobs_null": frozenset({"logprobs_chat_top", "logprobs_chat_default"}),
    "max_tokens_zero_ok": frozenset({"reject_max_tokens_zero"}),
    "n2_prompt_per_choice": frozenset({"chat_n2", "chat_n2_stream_usage"}),
    "no_request_id": frozenset({"request_id_echo"}),
    "role_missing": frozenset({"chat_stream", "chat_n2_stream_usage"}),
    "stream_unknown_model_200": frozenset({"unknown_model_stream"}),
    "usage_total_off": frozenset(
        {
            "chat_basic",
            "completions_basic",
            "chat_n2",
            "chat_n2_stream_usage",
        }
    ),
    "wedge_after_long": frozenset({"disconnect_stream", "disconnect_nonstream"}),
    "responses_seq_gap": frozenset({"responses_stream"}),
    "messages_openai_errors": frozenset({"messages_error_envelope"}),
}


async def _run(
    url: str, *, only: set[str] | None = None, timeout_s: float = 5.0
) -> list[CaseResult]:
    ctx = Context(url, "fake-model", timeout_s=timeout_s, abandon_after_s=0.1)
    cases = select_cases(http_cases(), only)
    with trio.fail_after(30):
        return await trio.to_thread.run_sync(partial(run_cases, ctx, cases), abandon_on_cancel=True)


def _failed(results: list[CaseResult]) -> dict[str, str]:
    return {r.name: r.message for r in results if r.result is Result.FAIL}


async def test_well_behaved_fake_passes_every_case(fake: StartFake) -> None:
    results = await _run(await fake())
    assert {r.name for r in results} == ALL
    bad = {r.name: (r.result, r.message) for r in results if r.result is not Result.PASS}
    assert bad == {}


@pytest.mark.parametrize("fault", sorted(EXPECTED_FAILURES))
async def test_each_fault_fails_exactly_its_cases(fake: StartFake, fault: str) -> None:
    failed = _failed(await _run(await fake(frozenset({fault}))))
    assert set(failed) == EXPECTED_FAILURES[fault], failed
    assert all(message for message in failed.values())


async def test_fault_messages_explain_the_violation(fake: StartFake) -> None:
    url = await fake(frozenset({"double_done", "bad_json_500", "stream_unknown_model_200"}))
    failed = _failed(
        await _run(url, only={"chat_stream", "malformed_json", "unknown_model_stream"})
    )
    assert "[DONE] sent 2 times" in failed["chat_stream"]
    assert "expected HTTP 400, got 500" in failed["malformed_json"]
    assert "text/event-stream" in failed["unknown_model_stream"]


async def test_http_timeout_is_a_case_failure(fake: StartFake) -> None:
    url = await fake(frozenset({"slow_models"}))
    (result,) = await _run(url, only={"models_list"}, timeout_s=0.3)
    assert result.result is Result.FAIL
    assert "timed out" in result.message


async def test_unreachable_server_fails_every_case_without_crashing() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    results = await _run(f"http://127.0.0.1:{port}", timeout_s=1.0)
    assert {r.name for r in results} == ALL
    assert all(r.result is Result.FAIL for r in results)
    assert all("cannot connect" in r.message for r in results), [r.message for r in results]


async def test_cli_writes_table_json_and_junit(
    fake: StartFake, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = await fake(frozenset({"no_request_id"}))
    json_out, junit_out = tmp_path / "out.json", tmp_path / "out.xml"
    argv = [
        "http",
        "--base-url",
        url + "/v1/",
        "--model",
        "fake-model",
        "--only",
        "models_list,request_id_echo",
        "--json",
        str(json_out),
        "--junit",
        str(junit_out),
        "--timeout-s",
        "5",
    ]
    code = await trio.to_thread.run_sync(cli.main, argv)
    assert code == 1
    out = capsys.readouterr().out
    assert "models_list" in out
    assert "FAIL" in out
    assert "1 passed, 1 failed, 0 skipped (2 cases)" in out

    summary = json.loads(json_out.read_text())
    assert summary["target"] == {"base_url": url, "model": "fake-model"}
    assert summary["summary"] == {"passed": 1, "failed": 1, "skipped": 0, "total": 2}
    case = {c["name"]: c for c in summary["cases"]}
    assert set(case["request_id_echo"]) == {
        "name",
        "behaviour",
        "why",
        "result",
        "message",
        "duration_s",
    }
    assert case["request_id_echo"]["result"] == "fail"
    assert case["models_list"]["result"] == "pass"

    suite = ET.parse(junit_out).getroot().find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures")) == ("2", "1")
    failures = {tc.get("name"): tc.find("failure") for tc in suite.iter("testcase")}
    assert failures["models_list"] is None
    failure = failures["request_id_echo"]
    assert failure is not None
    assert "x-request-id" in (failure.get("message") or "")


def test_cli_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["http", "--model", "m"]) == 2
    assert cli.main(["http", "--base-url", "http://x", "--model", "m", "--only", "nope"]) == 2
    assert "unknown case name(s): nope" in capsys.readouterr().err
    assert cli.main([]) == 2
    assert cli.main(["http", "--list"]) == 0
    assert "disconnect_nonstream" in capsys.readouterr().out


def test_wire_hook_without_module(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert cli.main(["wire", "--anything"]) == 2
    assert "not available" in capsys.readouterr().err


def test_wire_hook_delegates(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []
    module = types.ModuleType("conformance.wire")
    module.__spec__ = importlib.machinery.ModuleSpec("conformance.wire", None)

    def fake_main(args: list[str]) -> int:
        seen.append(args)
        return 7

    module.main = fake_main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "conformance.wire", module)
    assert cli.main(["wire", "--engine", "x"]) == 7
    assert seen == [["--engine", "x"]]


def test_python_dash_m_entry_point() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "conformance", "http", "--list"],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    assert "chat_stream" in proc.stdout


def test_case_registry_is_well_formed() -> None:
    cases = http_cases()
    assert len({c.name for c in cases}) == len(cases)
    assert all(c.behaviour and c.why for c in cases)
    assert [c.name for c in cases][-2:] == ["disconnect_stream", "disconnect_nonstream"]


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("http://h:1", "http://h:1"),
        ("http://h:1/", "http://h:1"),
        ("http://h:1/v1", "http://h:1"),
        ("http://h:1/v1/", "http://h:1"),
    ],
)
def test_base_url_normalisation(given: str, expected: str) -> None:
    assert normalise_base_url(given) == expected
