"""Result reporting: a stdout table, a JSON summary, and JUnit XML."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from conformance.case import CaseResult, Result

__all__ = [
    "SUITE_HTTP",
    "SUITE_WIRE",
    "summary_counts",
    "table_header",
    "table_row",
    "summary_line",
    "to_json",
    "to_junit",
    "write_json",
    "write_junit",
]

SUITE_HTTP = "conformance.http"
SUITE_WIRE = "conformance.wire"
NAME_WIDTH = 38
TABLE_MESSAGE_LIMIT = 400
_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def table_header() -> str:
    """The header line of the stdout table."""
    head = f"{'case':<{NAME_WIDTH}} {'result':<6} {'ms':>7}  message"
    return f"{head}\n{'-' * len(head)}"


def table_row(res: CaseResult) -> str:
    """One table line for ``res`` (the message is shortened; --json keeps it whole)."""
    message = " ".join(res.message.split())
    if len(message) > TABLE_MESSAGE_LIMIT:
        message = message[: TABLE_MESSAGE_LIMIT - 3] + "..."
    ms = f"{res.duration_s * 1000:.0f}"
    return f"{res.name:<{NAME_WIDTH}} {res.result.value.upper():<6} {ms:>7}  {message}"


def summary_counts(results: Sequence[CaseResult]) -> dict[str, int]:
    """Counts of passed / failed / skipped / total."""
    counts = Counter(r.result for r in results)
    return {
        "passed": counts[Result.PASS],
        "failed": counts[Result.FAIL],
        "skipped": counts[Result.SKIP],
        "total": len(results),
    }


def summary_line(results: Sequence[CaseResult]) -> str:
    """A one-line summary, e.g. ``24 passed, 1 failed, 0 skipped (25 cases)``."""
    c = summary_counts(results)
    return (
        f"{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped ({c['total']} cases)"
    )


def to_json(
    results: Sequence[CaseResult], target: Mapping[str, Any], *, suite: str = SUITE_HTTP
) -> dict[str, Any]:
    """The JSON summary: target, counts, and every case with its behaviour, why and verdict."""
    return {
        "suite": suite,
        "target": dict(target),
        "summary": summary_counts(results),
        "cases": [
            {
                "name": r.name,
                "behaviour": r.behaviour,
                "why": r.why,
                "result": r.result.value,
                "message": r.message,
                "duration_s": round(r.duration_s, 4),
            }
            for r in results
        ],
    }


def _xml_text(text: str) -> str:
    return _XML_BAD.sub("\ufffd", text)


def to_junit(
    results: Sequence[CaseResult], target: Mapping[str, Any], *, suite: str = SUITE_HTTP
) -> str:
    """JUnit XML: one ``testcase`` per case, ``failure`` / ``skipped`` elements with messages."""
    counts = summary_counts(results)
    suites = ET.Element("testsuites")
    suite_el = ET.SubElement(
        suites,
        "testsuite",
        {
            "name": suite,
            "tests": str(counts["total"]),
            "failures": str(counts["failed"]),
            "errors": "0",
            "skipped": str(counts["skipped"]),
            "time": f"{sum(r.duration_s for r in results):.3f}",
        },
    )
    props = ET.SubElement(suite_el, "properties")
    for key, value in target.items():
        ET.SubElement(props, "property", {"name": str(key), "value": _xml_text(str(value))})
    for r in results:
        case = ET.SubElement(
            suite_el,
            "testcase",
            {"classname": suite, "name": r.name, "time": f"{r.duration_s:.3f}"},
        )
        detail = _xml_text(f"{r.behaviour}\nwhy: {r.why}\n\n{r.message}")
        if r.result is Result.FAIL:
            el = ET.SubElement(case, "failure", {"message": _xml_text(r.message), "type": "fail"})
            el.text = detail
        elif r.result is Result.SKIP:
            ET.SubElement(case, "skipped", {"message": _xml_text(r.message)})
        else:
            out = ET.SubElement(case, "system-out")
            out.text = _xml_text(r.message)
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def write_json(
    path: str | Path,
    results: Sequence[CaseResult],
    target: Mapping[str, Any],
    *,
    suite: str = SUITE_HTTP,
) -> None:
    """Write the JSON summary to ``path``."""
    data = to_json(results, target, suite=suite)
    Path(path).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def write_junit(
    path: str | Path,
    results: Sequence[CaseResult],
    target: Mapping[str, Any],
    *,
    suite: str = SUITE_HTTP,
) -> None:
    """Write JUnit XML to ``path``."""
    Path(path).write_text(to_junit(results, target, suite=suite), encoding="utf-8")
