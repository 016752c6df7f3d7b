"""``conformance wire``: pinned cases pass, reports are written, a corrupted vector fails the run,
and reference cases skip (with the reason) or, in the e2e lane, pass against the real engines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from conformance import vectors
from conformance import wire_context as wc
from conformance.cli import main as conformance_main
from conformance.wire import main, wire_cases
from peers.tools import (
    peer_paths,
    repo_root,
    tokenspeed_missing_reason,
    vllm_missing_reason,
)

REFERENCE = [c.name for c in wire_cases() if c.name.startswith("reference_")]
PINNED = [c.name for c in wire_cases() if not c.name.startswith("reference_")]
E2E_ENV = "SMG_TRIO_E2E"
E2E_TIMEOUT_S = 600


@pytest.fixture(autouse=True)
def no_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever this machine has, the in-process tests see no engine packages."""
    monkeypatch.delenv(wc.REFERENCE_PYTHON_ENV, raising=False)
    monkeypatch.setattr(wc, "engine_importable", lambda engine: False)


def run(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "wire.json"
    rc = main([*args, "--json", str(out)])
    return rc, json.loads(out.read_text())


def by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in report["cases"]}


def test_case_names_and_citations() -> None:
    assert len(PINNED) >= 15
    assert len(REFERENCE) == 6
    for case in wire_cases():
        assert case.behaviour, case.name
        assert any(s in case.why for s in ("vllm/", "tokenspeed/", "smg", "wire-spec")), case.name


def test_every_pinned_case_passes_and_reports_are_written(tmp_path: Path) -> None:
    junit = tmp_path / "wire.xml"
    rc, report = run(tmp_path, "--junit", str(junit))
    assert rc == 0
    assert report["suite"] == "conformance.wire"
    cases = by_name(report)
    for name in PINNED:
        assert cases[name]["result"] == "pass", (name, cases[name]["message"])
    assert report["summary"] == {
        "passed": len(PINNED),
        "failed": 0,
        "skipped": len(REFERENCE),
        "total": len(PINNED) + len(REFERENCE),
    }
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None
    assert suite.get("name") == "conformance.wire"
    assert suite.get("failures") == "0"
    assert suite.get("skipped") == str(len(REFERENCE))


def test_reference_cases_skip_with_the_reason(tmp_path: Path) -> None:
    rc, report = run(tmp_path, "--only", ",".join(REFERENCE))
    assert rc == 0
    for case in report["cases"]:
        assert case["result"] == "skip"
        assert "not importable" in case["message"]
        assert "--reference-python" in case["message"]


def test_a_broken_reference_python_fails_the_reference_cases(tmp_path: Path) -> None:
    rc, report = run(
        tmp_path, "--only", "reference_vllm_control", "--reference-python", str(tmp_path / "nope")
    )
    assert rc == 1
    [case] = report["cases"]
    assert case["result"] == "fail"
    assert "cannot run reference python" in case["message"]


@pytest.mark.parametrize(
    ("vector", "case"),
    [
        ("PYTHON_OUTPUT_VECTOR", "tokenspeed_output_vector"),
        ("PYTHON_REQUEST_VECTOR", "tokenspeed_request_vector"),
        ("PREFIX_VECTOR", "tokenspeed_request_prefix_vector"),
    ],
)
def test_a_corrupted_vector_fails_its_case(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, vector: str, case: str
) -> None:
    good: bytes = getattr(vectors, vector)
    bad = bytearray(good)
    bad[-1] ^= 0x01  # the last element's value changes; the array still decodes
    monkeypatch.setattr(vectors, vector, bytes(bad))
    rc, report = run(tmp_path, "--only", case)
    assert rc == 1
    [result] = report["cases"]
    assert result["result"] == "fail", result


def test_a_corrupted_handshake_vector_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = vectors.INIT_HEX.replace("772d696e", "772d696f")  # "w-in" -> "w-io"
    assert bad != vectors.INIT_HEX
    monkeypatch.setattr(vectors, "INIT_HEX", bad)
    rc, report = run(tmp_path, "--only", "handshake_init_map,fnv_handshake_port_pinned")
    assert rc == 1
    cases = by_name(report)
    assert cases["handshake_init_map"]["result"] == "fail"
    assert "INIT bytes" in cases["handshake_init_map"]["message"]
    assert cases["fnv_handshake_port_pinned"]["result"] == "pass"


def test_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--list"]) == 0
    assert "tokenspeed_wrong_tag_fails" in capsys.readouterr().out
    assert main(["--only", "no_such_case"]) == 2
    assert "no_such_case" in capsys.readouterr().err
    assert conformance_main(["wire", "--help"]) == 0
    assert "--reference-python" in capsys.readouterr().out
    assert conformance_main(["wire", "--bogus"]) == 2


def test_packaged_capture_is_the_tests_data_capture() -> None:
    packaged = Path(vectors.__file__).with_name("data") / vectors.VLLM_CAPTURE_FILE
    assert packaged.read_bytes() == (repo_root() / "tests" / "data" / packaged.name).read_bytes()


@pytest.mark.e2e
@pytest.mark.slow
def test_reference_cases_pass_against_the_real_engines(tmp_path: Path) -> None:
    if os.environ.get(E2E_ENV) != "1":
        pytest.skip(f"real-peer lane is off: set {E2E_ENV}=1 (bash scripts/setup_peers.sh)")
    reason = vllm_missing_reason() or tokenspeed_missing_reason()
    if reason:
        pytest.skip(f"real peer missing: {reason}")
    out = tmp_path / "wire.json"
    proc = subprocess.run(
        [sys.executable, "-m", "smg_trio", "conformance", "wire",
         "--reference-python", str(peer_paths().vllm_python), "--json", str(out)],
        cwd=repo_root(),
        capture_output=True,
        text=True,
        timeout=E2E_TIMEOUT_S,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cases = by_name(json.loads(out.read_text()))
    for name in REFERENCE:
        assert cases[name]["result"] == "pass", (name, cases[name]["message"])
