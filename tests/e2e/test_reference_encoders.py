"""Round trips against the engines' OWN codecs: vLLM 0.32.0 and TokenSpeed 0.1.1.

smg_trio's venv does not carry vLLM or TokenSpeed. ``conformance/reference_roundtrip.py`` (the
script ``python -m smg_trio conformance wire --reference-python`` also runs) runs under the
peers' interpreter (``.peers/vllm/bin/python``, installed by ``scripts/setup_peers.sh``) with
this checkout on ``PYTHONPATH``, encodes with each engine's encoder and decodes with ours, and
the other way round, and prints what every side decoded as JSON. This file asserts it.

Skipped, with the reason and the install command, when the peers are not installed.
"""

from __future__ import annotations

import json
import subprocess
import zlib
from pathlib import Path
from typing import Any

import pytest

from conformance import reference_roundtrip
from conformance.vectors import REFERENCE_BATCH_FIELDS
from conformance.wire_context import REFERENCE_TIMEOUT_S
from peers.tools import (
    peer_paths,
    repo_root,
    tokenspeed_missing_reason,
    tokenspeed_peer_env,
    vllm_engine_env,
    vllm_missing_reason,
    write_tokenspeed_stubs,
)
from smg_trio.codec import encoder
from smg_trio.protocol.tokenspeed import TOP_K_DISABLED, BatchTokenIDOutSlim

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SCRIPT = Path(reference_roundtrip.__file__)
TIMEOUT_S = REFERENCE_TIMEOUT_S


def run_reference(mode: str, env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run(
        [str(peer_paths().vllm_python), "-m", reference_roundtrip.__name__, mode],
        env=env,
        cwd=repo_root(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, f"{SCRIPT.name} {mode} failed:\n{proc.stderr[-6000:]}"
    lines = proc.stdout.strip().splitlines()
    assert lines, f"{SCRIPT.name} {mode} printed nothing:\n{proc.stderr[-6000:]}"
    result: dict[str, Any] = json.loads(lines[-1])
    return result


@pytest.fixture(scope="module")
def vllm_result() -> dict[str, Any]:
    reason = vllm_missing_reason()
    if reason:
        pytest.skip(f"real vLLM peer unavailable: {reason}")
    env = vllm_engine_env()
    env["PYTHONPATH"] = str(repo_root())
    return run_reference("vllm", env)


@pytest.fixture(scope="module")
def tokenspeed_result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    reason = tokenspeed_missing_reason()
    if reason:
        pytest.skip(f"TokenSpeed wire modules unavailable: {reason}")
    stubs = write_tokenspeed_stubs(tmp_path_factory.mktemp("tokenspeed-stubs"))
    return run_reference("tokenspeed", tokenspeed_peer_env(stubs))


# --------------------------------------------------------------------------- vLLM


def test_vllm_version(vllm_result: dict[str, Any]) -> None:
    assert vllm_result["version"].startswith("0.32.0")


def test_vllm_request_type_bytes_match(vllm_result: dict[str, Any]) -> None:
    for name, (theirs, ours) in vllm_result["request_types"].items():
        assert theirs == ours, name


def test_vllm_decodes_our_abort_and_start_wave(vllm_result: dict[str, Any]) -> None:
    assert vllm_result["abort_decoded_by_vllm"] == ["a", "b"]
    assert vllm_result["start_wave_decoded_by_vllm"] == [9, None]


def test_vllm_request_decodes_with_ours(vllm_result: dict[str, Any]) -> None:
    case = vllm_result["vllm_request_to_ours"]
    assert case["frames"] == 1
    assert case["elements"] == 22  # vLLM 0.32 emits the full array
    r = case["decoded"]
    assert r["request_id"] == "ref-1"
    assert r["prompt_token_ids"] == [1, 2, 3]
    assert r["arrival_time"] == 123.5
    assert r["data_parallel_rank"] == 1
    assert r["client_index"] == 0
    sp = r["sampling_params"]
    assert sp["temperature"] == 0.7
    assert sp["top_p"] == 0.9
    assert sp["top_k"] == 40
    assert sp["seed"] == 42
    assert sp["max_tokens"] == 8
    assert sp["min_tokens"] == 1
    assert sp["logprobs"] == 2
    assert sp["prompt_logprobs"] == 1
    assert sp["stop_token_ids"] == [7, 9]
    assert sp["_eos_token_id"] == 5
    assert sorted(sp["_all_stop_token_ids"]) == [5, 7, 9]
    assert sp["logit_bias"] == {"5": 1.5}
    assert sp["structured_outputs"]["regex"] == "[a-z]+"
    # vLLM omits default-valued keys: the engine fills them in on its side.
    assert "repetition_penalty" not in sp
    assert "min_p" not in sp


def test_vllm_decodes_our_full_request(vllm_result: dict[str, Any]) -> None:
    case = vllm_result["ours_to_vllm"]["full"]
    assert case["type_byte"] == "00"
    assert case["elements"] == 22
    assert case["request_id"] == "ours-1"
    assert case["prompt_token_ids"] == [1, 2, 3, 4]
    assert case["arrival_time"] == 1234.5
    assert case["data_parallel_rank"] == 1
    assert case["client_index"] == 0
    assert case["external_req_id"] is None
    assert case["prompt_embeds_is_none"] is True
    assert case["mm_features"] is None
    assert case["sampling"] == {
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 40,
        "min_p": 0.05,
        "seed": 42,
        "max_tokens": 8,
        "min_tokens": 1,
        "frequency_penalty": 0.5,
        "presence_penalty": -0.5,
        "repetition_penalty": 1.2,
        "logprobs": 2,
        "prompt_logprobs": 1,
        "stop_token_ids": [7, 9, 11],
        "eos_token_id": 5,
        "all_stop_token_ids": [5, 7, 9, 11],
        "ignore_eos": False,
        "logit_bias": {"5": 1.5, "6": -2.0},
        "n": 1,
        "structured_outputs": None,
    }


def test_vllm_decodes_our_ignore_eos_request(vllm_result: dict[str, Any]) -> None:
    s = vllm_result["ours_to_vllm"]["ignore_eos"]["sampling"]
    assert s["eos_token_id"] is None
    assert s["stop_token_ids"] == [9]
    assert s["all_stop_token_ids"] == [5, 7, 9]


def test_vllm_decodes_our_greedy_defaults(vllm_result: dict[str, Any]) -> None:
    s = vllm_result["ours_to_vllm"]["greedy_defaults"]["sampling"]
    assert s["temperature"] == 0.0
    assert (s["top_p"], s["top_k"], s["min_p"]) == (1.0, 0, 0.0)
    assert s["max_tokens"] == 2
    assert s["seed"] is None
    assert s["logprobs"] is None
    assert s["stop_token_ids"] == []
    assert s["all_stop_token_ids"] == []


@pytest.mark.parametrize(
    ("kind", "value", "backend"),
    [
        ("json", {"type": "object"}, "guidance"),
        ("regex", "[0-9]+", "guidance"),
        ("choice", ["yes", "no"], "guidance"),
        ("grammar", 'root ::= "a"', "guidance"),
        ("json_object", True, "guidance"),
        ("structural_tag", '{"type": "structural_tag"}', "xgrammar"),
    ],
)
def test_vllm_decodes_our_structured_outputs(
    vllm_result: dict[str, Any], kind: str, value: Any, backend: str
) -> None:
    so = vllm_result["ours_to_vllm"][f"structured_{kind}"]["sampling"]["structured_outputs"]
    assert so[kind] == value
    assert so["_backend"] == backend
    others = {"json", "regex", "choice", "grammar", "json_object", "structural_tag"} - {kind}
    assert all(so[o] is None for o in others)


def test_vllm_outputs_use_inline_and_aux_tensors(vllm_result: dict[str, Any]) -> None:
    case = vllm_result["vllm_outputs_to_ours"]
    # primary + big ids + big logprobs + prompt ids + prompt logprobs
    assert case["frames"] == 5
    assert case["envelope_elements"] == 9  # 0.32 appends weight_version
    assert case["output_elements"] == [18] * 5  # 0.32 outputs are 18 long
    kinds = case["tensor_data_kinds"]
    assert kinds["small_ids"] == "ext3"
    assert kinds["small_dtype"] == "<i4"
    assert kinds["big_ranks"] == "ext3"
    assert isinstance(kinds["big_ids"], int)
    assert kinds["big_ids"] >= 1
    assert kinds["prompt_dtype"] == "int64"  # torch tensors carry torch dtype names
    assert isinstance(kinds["prompt_ids"], int)


def test_vllm_outputs_decode_with_ours(vllm_result: dict[str, Any]) -> None:
    case = vllm_result["vllm_outputs_to_ours"]
    batch, expected = case["decoded"], case["expected"]
    assert batch["engine_index"] == 1
    assert batch["load"] == {"num_running": 3, "num_waiting": 2, "kv_cache_usage": 0.25}
    assert sorted(batch["finished_request_ids"]) == ["b", "c", "d", "e"]
    a, b, c, d, e = batch["outputs"]

    assert a["request_id"] == "a"
    assert a["new_token_ids"] == [7]
    assert a["finish_reason"] is None
    assert (a["prompt_tokens"], a["cached_tokens"]) == (18, 16)
    assert a["logprobs"] == expected["a"]
    assert a["logprobs"]["ranks"] == [2]
    assert a["prompt_logprobs"] is None

    assert b["new_token_ids"] == list(range(8))
    assert b["finish_reason"] == "length"
    assert b["logprobs"] == expected["b"]
    assert b["prompt_logprobs"] == expected["b_prompt"]
    assert len(b["logprobs"]["top_token_ids"][0]) == 20  # k=20 -> 21 columns

    assert (c["finish_reason"], c["stop_reason"]) == ("stop", "</s>")
    assert (d["new_token_ids"], d["finish_reason"]) == ([], "error")
    assert (e["finish_reason"], e["stop_reason"]) == ("stop", 151643)


def test_vllm_control_envelopes_decode_with_ours(vllm_result: dict[str, Any]) -> None:
    ctl = vllm_result["vllm_control_to_ours"]
    assert ctl["wave_complete"]["engine_index"] == 2
    assert ctl["wave_complete"]["wave_complete"] == 3
    assert ctl["wave_complete"]["start_wave"] is None
    assert ctl["start_wave"]["start_wave"] == 7
    for name in ("utility", "empty"):
        assert ctl[name]["outputs"] == [], name
        assert ctl[name]["wave_complete"] is None, name
        assert ctl[name]["start_wave"] is None, name
        assert ctl[name]["load"] is None, name


# --------------------------------------------------------------------------- TokenSpeed


def test_tokenspeed_version(tokenspeed_result: dict[str, Any]) -> None:
    assert tokenspeed_result["version"] == "0.1.1"


def test_tokenspeed_struct_layouts_match(tokenspeed_result: dict[str, Any]) -> None:
    f = tokenspeed_result["fields"]
    theirs_sp, ours_sp = f["sampling_params"]
    assert ours_sp == theirs_sp
    assert len(ours_sp) == 29
    theirs_req, ours_req, ours_prefix = f["request"]
    # 0.1.1 appends data_parallel_rank after validation_error; append-only, so a prefix.
    assert ours_req == theirs_req[: len(ours_req)]
    assert ours_prefix == theirs_req[:10]
    assert ours_prefix[-1] == "stream"
    theirs_out, ours_out = f["output"]
    assert ours_out == theirs_out
    assert len(ours_out) == 13  # + the tag = the 14-element batch


def test_tokenspeed_request_type_bytes_match(tokenspeed_result: dict[str, Any]) -> None:
    for name, (theirs, ours) in tokenspeed_result["request_types"].items():
        assert theirs == ours, name


def test_tokenspeed_request_decodes_with_ours(tokenspeed_result: dict[str, Any]) -> None:
    case = tokenspeed_result["tokenspeed_request_to_ours"]
    assert case["frames"] == 1
    assert case["elements"] == 25
    r = case["decoded"]
    assert r["rid"] == "vec-1"
    assert r["input_ids"] == [1, 2, 3]
    assert r["return_logprob"] is True
    assert r["stream"] is True
    assert r["sampling_params"] == case["theirs_sampling"]
    assert r["sampling_params"]["top_k"] == TOP_K_DISABLED
    assert r["sampling_params"]["is_normalized"] is True
    # Their first 11 elements re-packed are exactly what our prefix struct encodes.
    assert case["prefix_of_theirs_equals_ours"] is True


def test_tokenspeed_accepts_our_requests(tokenspeed_result: dict[str, Any]) -> None:
    cases = tokenspeed_result["ours_to_tokenspeed"]
    for name, c in cases.items():
        assert c["type"] == "TokenizedGenerateReqInput", name
        assert c["validation_error"] is None, name
        assert c["verify_error"] is None, name
        assert c["sampling"]["is_normalized"] is True, name
        assert c["sampling"]["stop_strs"] == [], name
        assert c["sampling"]["n"] == 1, name
        assert c["logprob_start_len"] == -1, name

    vec1 = cases["vec1"]
    assert vec1["rid"] == "vec-1"
    assert vec1["input_ids"] == [1, 2, 3]
    assert (vec1["return_logprob"], vec1["stream"]) == (True, True)
    s = vec1["sampling"]
    assert (s["temperature"], s["top_p"], s["top_k"]) == (0.5, 0.9, TOP_K_DISABLED)
    assert (s["max_new_tokens"], s["stop_token_ids"], s["seed"]) == (8, [2], 42)

    greedy = cases["greedy_no_seed"]
    assert greedy["stream"] is False
    assert greedy["return_logprob"] is False
    g = greedy["sampling"]
    assert (g["temperature"], g["top_k"]) == (1.0, 1)
    assert g["seed"] == 0  # greedy pins the seed, as TokenSpeed's own normalization does

    sampled = cases["sampled_no_seed"]["sampling"]
    assert sampled["top_k"] == 20
    assert sampled["temperature"] == 0.8
    # No seed sent: the engine derives it from the rid.
    assert sampled["seed"] == zlib.crc32(b"s-1") & 0xFFFFFFFF

    p = cases["penalties_bias_json"]["sampling"]
    assert p["json_schema"] == '{"type": "object"}'
    assert p["logit_bias"] == {"5": 1.5, "12": -100.0}
    assert (p["min_new_tokens"], p["max_new_tokens"], p["min_p"]) == (2, 5, 0.1)
    assert (p["frequency_penalty"], p["presence_penalty"]) == (0.5, -0.5)
    assert p["repetition_penalty"] == 1.2
    assert (p["ignore_eos"], p["skip_special_tokens"]) == (True, False)


def test_tokenspeed_decodes_our_abort(tokenspeed_result: dict[str, Any]) -> None:
    assert tokenspeed_result["abort_decoded_by_tokenspeed"] == [
        ["AbortReq", "x"],
        ["AbortReq", "y"],
    ]


def test_tokenspeed_output_decodes_with_ours(tokenspeed_result: dict[str, Any]) -> None:
    case = tokenspeed_result["tokenspeed_output_to_ours"]
    assert case["frames"] == 1
    assert case["elements"] == 14
    b = case["decoded"]
    assert b["engine_index"] == 1
    assert b["load"] == {"num_running": 2, "num_waiting": 5, "kv_cache_usage": 0.25}
    assert b["finished_request_ids"] == ["vec-1", "r3"]
    first, second, third = b["outputs"]
    assert first["new_token_ids"] == [10, 11]
    assert first["finish_reason"] == "length"
    assert first["logprobs"]["token_ids"] == [10, 11]
    assert first["logprobs"]["logprobs"] == [-0.5, -0.25]
    assert (first["prompt_tokens"], first["completion_tokens"], first["cached_tokens"]) == (
        3,
        2,
        1,
    )
    assert (second["finish_reason"], second["logprobs"]) == (None, None)
    assert (third["new_token_ids"], third["finish_reason"]) == ([], "abort")


def test_tokenspeed_output_bytes_equal_our_encoding(tokenspeed_result: dict[str, Any]) -> None:
    ours = BatchTokenIDOutSlim(**REFERENCE_BATCH_FIELDS)  # type: ignore[arg-type]
    assert encoder.encode(ours).hex() == tokenspeed_result["tokenspeed_output_to_ours"]["hex"]


def test_tokenspeed_decodes_our_output_struct(tokenspeed_result: dict[str, Any]) -> None:
    back = tokenspeed_result["ours_output_to_tokenspeed"]
    assert back["rids"] == ["m"]
    assert back["output_ids"] == [[1, 2]]
    assert back["finished_reasons"] == ["stop"]
    assert back["prompt_tokens"] == [7]
    assert back["engine_index"] == 3
    assert back["kv_total_pages"] == 0
