"""smg_trio's HTTP gateway in front of a REAL vLLM 0.32.0 engine, then the differential test.

* ``trio_gateway``: engine A (headless vLLM dialing the handshake derived from the worker URL)
  behind ``python -m smg_trio launch``. Chat, streaming chat, n=2, logprobs, a loud rejection,
  and the conformance runner.
* ``smg_gateway``: a NEW engine B behind the Rust smg 1.13.0 (``smg launch``), started only
  when the differential tests need it. The same prompts at temperature 0 go to both gateways;
  token strings (from logprobs), text, finish reasons and usage are compared. The conformance
  runner runs against smg too, so its results sit beside ours.

Set ``SMG_TRIO_E2E_OUT=<dir>`` to keep the conformance JSON summaries and the differential
record there (``docs/conformance.md`` and ``docs/differential.md`` are written from them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from peers.tools import (
    repo_root,
    smg_launch_command,
    smg_missing_reason,
    vllm_engine_command,
    vllm_missing_reason,
)
from tests.helpers.e2e import (
    ENGINE_STARTUP_S,
    assert_alive,
    gateway_with_vllm,
    handshake_port,
    ipc_worker,
    launched_with_vllm,
    require_e2e,
    wait_http,
)
from tests.helpers.ports import free_port
from tests.helpers.sse import sse_chunks as parse_chunks

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MODEL = "tiny"
CONFORMANCE_TIMEOUT_S = 300

#: Prompts for the differential test (temperature 0, so both sides must agree token for token).
DIFF_PROMPTS = [
    "Hello there",
    "Tell me a story about a dragon.",
    "1, 2, 3, 4,",
    "Écris une phrase en français, s'il te plaît.",
    "What is the capital of France?",
]
DIFF_MAX_TOKENS = 16


@dataclass
class Gateway:
    name: str
    base_url: str
    model: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=60.0)


def out_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    env = os.environ.get("SMG_TRIO_E2E_OUT")
    if env:
        path = Path(env)
        path.mkdir(parents=True, exist_ok=True)
        return path
    return tmp_path_factory.mktemp("e2e-out")


@pytest.fixture(scope="module")
def results_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return out_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def trio_gateway(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    require_e2e(vllm_missing_reason())
    logs = tmp_path_factory.mktemp("trio-gateway")
    port = free_port()
    with launched_with_vllm(
        tiny_model, MODEL, port=port, logs=logs, log_level="warning", engine_what="vLLM engine A"
    ) as (base, gw, _eng):
        yield Gateway("smg_trio", base, MODEL, gw, logs / "smg_trio.log")
        assert_alive(gw, logs / "smg_trio.log", "smg_trio gateway")


@pytest.fixture(scope="module")
def smg_gateway(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    require_e2e(vllm_missing_reason(), smg_missing_reason())
    logs = tmp_path_factory.mktemp("smg-gateway")
    port = free_port()
    with ipc_worker() as addresses:
        engine_cmd = vllm_engine_command(tiny_model, handshake_port(addresses))
        gateway_cmd = smg_launch_command(
            addresses.url, tiny_model, backend="vllm", port=port, prometheus_port=free_port()
        )
        with gateway_with_vllm(
            gateway_cmd,
            engine_cmd,
            port=port,
            logs=logs,
            gateway="smg",
            ready_path="/v1/models",
            ready=lambda r: r.status_code == 200 and bool(r.json().get("data")),
            engine_what="vLLM engine B",
        ) as (base, gw, eng):
            # smg lists the model before the engine registers: wait for a real answer
            wait_http(
                f"{base}/v1/models",
                gw,
                logs / "smg.log",
                timeout=ENGINE_STARTUP_S,
                what="smg worker",
                ok=lambda r: _smg_serves(base, r),
                also=lambda: assert_alive(eng, logs / "vllm.log", "vLLM engine B"),
            )
            model = httpx.get(f"{base}/v1/models").json()["data"][0]["id"]
            yield Gateway("smg", base, model, gw, logs / "smg.log")
            assert_alive(gw, logs / "smg.log", "smg gateway")


def _smg_serves(base: str, models: httpx.Response) -> bool:
    if models.status_code != 200 or not models.json().get("data"):
        return False
    model = models.json()["data"][0]["id"]
    try:
        r = httpx.post(
            f"{base}/v1/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
            timeout=10.0,
        )
    except httpx.HTTPError:
        return False
    return r.status_code == 200


def chat_body(content: str = "Hello there", **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


def sse_chunks(client: httpx.Client, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with client.stream("POST", path, json=body) as resp:
        assert resp.status_code == 200, resp.read().decode(errors="replace")
        return parse_chunks(resp.read())


# --------------------------------------------------------------------------- smg_trio


def test_chat(trio_gateway: Gateway) -> None:
    with trio_gateway.client() as c:
        r = c.post("/v1/chat/completions", json=chat_body(max_tokens=8, temperature=0))
    assert r.status_code == 200, r.text
    body = r.json()
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"]
    assert choice["finish_reason"] in ("length", "stop")
    usage = body["usage"]
    assert usage["prompt_tokens"] > 0
    assert 1 <= usage["completion_tokens"] <= 8
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_streaming_chat_matches_non_streaming(trio_gateway: Gateway) -> None:
    body = chat_body("Tell me a story", max_tokens=12, temperature=0)
    with trio_gateway.client() as c:
        whole = c.post("/v1/chat/completions", json=body).json()
        chunks = sse_chunks(
            c,
            "/v1/chat/completions",
            {**body, "stream": True, "stream_options": {"include_usage": True}},
        )
    text = "".join(
        ch["choices"][0]["delta"].get("content") or "" for ch in chunks if ch.get("choices")
    )
    finishes = [
        ch["choices"][0]["finish_reason"]
        for ch in chunks
        if ch.get("choices") and ch["choices"][0].get("finish_reason")
    ]
    assert text == whole["choices"][0]["message"]["content"]
    assert finishes == [whole["choices"][0]["finish_reason"]]
    usage = [ch["usage"] for ch in chunks if ch.get("usage")]
    assert usage
    assert usage[-1]["completion_tokens"] == whole["usage"]["completion_tokens"]


def test_n2(trio_gateway: Gateway) -> None:
    with trio_gateway.client() as c:
        r = c.post(
            "/v1/chat/completions", json=chat_body(max_tokens=6, temperature=0.9, seed=7, n=2)
        )
        one = c.post("/v1/chat/completions", json=chat_body(max_tokens=6, temperature=0.9))
    assert r.status_code == 200, r.text
    body = r.json()
    assert [ch["index"] for ch in body["choices"]] == [0, 1]
    assert all(ch["message"]["content"] for ch in body["choices"])
    assert body["usage"]["prompt_tokens"] == one.json()["usage"]["prompt_tokens"]
    assert body["usage"]["completion_tokens"] <= 12


def test_logprobs(trio_gateway: Gateway) -> None:
    with trio_gateway.client() as c:
        r = c.post(
            "/v1/chat/completions",
            json=chat_body(max_tokens=5, temperature=0, logprobs=True, top_logprobs=2),
        )
    assert r.status_code == 200, r.text
    body = r.json()
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == body["usage"]["completion_tokens"]
    for entry in content:
        assert entry["logprob"] <= 0.0
        assert len(entry["top_logprobs"]) == 2
        # greedy: the sampled token is the most likely candidate
        assert entry["top_logprobs"][0]["logprob"] == pytest.approx(entry["logprob"], abs=1e-4)
        assert isinstance(entry["bytes"], list)


def test_top_logprobs_21_is_a_loud_400(trio_gateway: Gateway) -> None:
    with trio_gateway.client() as c:
        r = c.post(
            "/v1/chat/completions",
            json=chat_body(max_tokens=4, logprobs=True, top_logprobs=21),
        )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert "top_logprobs" in (err.get("param") or "") + err["message"]


def run_conformance(gateway: Gateway, out: Path) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "conformance",
            "http",
            "--base-url",
            gateway.base_url,
            "--model",
            gateway.model,
            "--json",
            str(out),
        ],
        cwd=repo_root(),
        capture_output=True,
        text=True,
        timeout=CONFORMANCE_TIMEOUT_S,
        check=False,
    )
    summary = json.loads(out.read_text()) if out.is_file() else {}
    return proc.returncode, summary, proc.stdout + proc.stderr


def test_conformance_smg_trio(trio_gateway: Gateway, results_dir: Path) -> None:
    rc, summary, output = run_conformance(trio_gateway, results_dir / "conformance-smg_trio.json")
    print(output)
    assert rc == 0, output[-6000:]
    assert summary, output[-2000:]


# --------------------------------------------------------------------------- differential

_DIFF: dict[str, list[dict[str, Any]]] = {}


def diff_answers(gateway: Gateway) -> list[dict[str, Any]]:
    answers = []
    with gateway.client() as c:
        for prompt in DIFF_PROMPTS:
            body = {
                "model": gateway.model,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": DIFF_MAX_TOKENS,
                "temperature": 0,
                "logprobs": True,
                "top_logprobs": 1,
            }
            r = c.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, f"{gateway.name}: {r.status_code} {r.text}"
            data = r.json()
            choice = data["choices"][0]
            logprobs = (choice.get("logprobs") or {}).get("content") or []
            chunks = sse_chunks(
                c,
                "/v1/chat/completions",
                {**body, "stream": True, "stream_options": {"include_usage": True}},
            )
            stream_text = "".join(
                ch["choices"][0]["delta"].get("content") or "" for ch in chunks if ch.get("choices")
            )
            stream_finish = [
                ch["choices"][0]["finish_reason"]
                for ch in chunks
                if ch.get("choices") and ch["choices"][0].get("finish_reason")
            ]
            stream_usage = [ch["usage"] for ch in chunks if ch.get("usage")]
            comp = c.post(
                "/v1/completions",
                json={
                    "model": gateway.model,
                    "prompt": prompt,
                    "max_tokens": DIFF_MAX_TOKENS,
                    "temperature": 0,
                },
            )
            answers.append(
                {
                    "prompt": prompt,
                    "text": choice["message"]["content"],
                    "finish_reason": choice["finish_reason"],
                    "usage": data.get("usage"),
                    "tokens": [e["token"] for e in logprobs],
                    "logprobs": [round(e["logprob"], 3) for e in logprobs],
                    "stream_text": stream_text,
                    "stream_finish": stream_finish,
                    "stream_usage": stream_usage[-1] if stream_usage else None,
                    "completions_status": comp.status_code,
                    "completions_text": comp.json()["choices"][0]["text"]
                    if comp.status_code == 200
                    else comp.text[:300],
                    "completions_finish": comp.json()["choices"][0]["finish_reason"]
                    if comp.status_code == 200
                    else None,
                }
            )
    return answers


def test_differential_collect_smg_trio(trio_gateway: Gateway, results_dir: Path) -> None:
    answers = diff_answers(trio_gateway)
    _DIFF["smg_trio"] = answers
    (results_dir / "differential-smg_trio.json").write_text(json.dumps(answers, indent=2))
    for a in answers:
        assert a["text"] == a["stream_text"], a
        assert a["stream_finish"] == [a["finish_reason"]], a
        assert len(a["tokens"]) == a["usage"]["completion_tokens"], a


def test_differential_against_smg(smg_gateway: Gateway, results_dir: Path) -> None:
    if "smg_trio" not in _DIFF:
        pytest.skip("smg_trio's answers were not collected (its test failed or was deselected)")
    ours = _DIFF["smg_trio"]
    theirs = diff_answers(smg_gateway)
    (results_dir / "differential-smg.json").write_text(json.dumps(theirs, indent=2))
    mismatches = []
    for a, b in zip(ours, theirs, strict=True):
        for key in ("text", "finish_reason", "tokens", "completions_text", "completions_finish"):
            if a[key] != b[key]:
                mismatches.append((a["prompt"], key, a[key], b[key]))
        for key in ("completion_tokens", "prompt_tokens"):
            if (a["usage"] or {}).get(key) != (b["usage"] or {}).get(key):
                mismatches.append((a["prompt"], f"usage.{key}", a["usage"], b["usage"]))
    (results_dir / "differential-mismatches.json").write_text(
        json.dumps(mismatches, indent=2, ensure_ascii=False)
    )
    # Same model, same engine, temperature 0: the generations must agree token for token.
    # Known smg 1.13.0 bug (docs/differential.md, D1): when a request finishes while its
    # detokenizer holds back an incomplete UTF-8 tail, smg drops that tail from the text AND
    # drops the held-back tokens' logprob entries (content has fewer entries than
    # usage.completion_tokens). smg_trio flushes the tail (as U+FFFD, like vLLM's own
    # detokenizer) and reports one entry per token. Allow exactly that, nothing else.
    for a, b in zip(ours, theirs, strict=True):
        assert a["finish_reason"] == b["finish_reason"], (a, b)
        assert a["completions_finish"] == b["completions_finish"], (a, b)
        assert a["usage"]["completion_tokens"] == b["usage"]["completion_tokens"], (a, b)
        assert len(a["tokens"]) == a["usage"]["completion_tokens"], a
        assert a["tokens"][: len(b["tokens"])] == b["tokens"], (a, b)
        for key in ("text", "completions_text"):
            ours_text, smg_text = a[key], b[key]
            assert ours_text.startswith(smg_text), (key, a, b)
            assert set(ours_text[len(smg_text) :]) <= set("".join(a["tokens"])) | {"\ufffd"}
        if len(b["tokens"]) < len(a["tokens"]):
            assert "\ufffd" in "".join(a["tokens"][len(b["tokens"]) :]), (a, b)


def test_conformance_smg(smg_gateway: Gateway, results_dir: Path) -> None:
    """Recorded, not asserted: smg is the reference, and its failures are documented in
    docs/conformance.md."""
    rc, summary, output = run_conformance(smg_gateway, results_dir / "conformance-smg.json")
    print(output)
    assert summary, output[-2000:]
    assert rc in (0, 1), output[-4000:]
