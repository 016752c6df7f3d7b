"""Tenants (issue 30, item 3): named API keys with their own concurrency and token-rate
limits, 429 with ``Retry-After`` over them, the shared ``--api-key`` still working, unknown
keys a 401, the tenant in metrics labels (configured names and ``other`` only), and the
ledger shared by frontends. Keys never appear in errors."""

from __future__ import annotations

import json
import os
from functools import partial
from pathlib import Path

import pytest
import trio

from smg_trio.gateway.config import GatewayHttpConfig
from smg_trio.gateway.http.tenants import (
    OTHER,
    SharedLedger,
    Tenant,
    TenantGate,
    TenantsError,
    TenantTable,
    create_ledger_file,
    load_tenants,
    parse_tenant_flag,
    parse_tenants,
)
from smg_trio.gateway.openai.errors import ApiError
from tests.helpers.gateway import DEADLINE_S, HarnessFactory

KEY_A = "sk-tenant-a-0123456789"
KEY_B = "sk-tenant-b-0123456789"
SHARED = "sk-shared-0123456789"


def _table(*tenants: Tenant) -> TenantTable:
    return TenantTable(tuple(Tenant(t.name, t.key, t.max_concurrent_requests,
                                    t.tokens_per_minute, i) for i, t in enumerate(tenants)))  # fmt: skip


def _auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


# -- the keys file ------------------------------------------------------------------------


def test_keys_file_json_and_toml(tmp_path: Path) -> None:
    doc = {
        "defaults": {"tokens_per_minute": 1000},
        "tenants": [
            {"name": "a", "key": KEY_A, "max_concurrent_requests": 2},
            {"name": "b", "key": KEY_B, "tokens_per_minute": 50},
        ],
    }
    path = tmp_path / "keys.json"
    path.write_text(json.dumps(doc))
    table = load_tenants(str(path), ["c:sk-flag-key-0123"])
    assert table is not None
    assert table.names == ("a", "b", "c")
    a, b, c = table.tenants
    assert (a.max_concurrent_requests, a.tokens_per_minute) == (2, 1000)
    assert (b.max_concurrent_requests, b.tokens_per_minute) == (None, 50)
    assert (c.max_concurrent_requests, c.tokens_per_minute, c.index) == (None, None, 2)
    assert KEY_A not in repr(table)
    assert table.lookup(KEY_B.encode()) is b
    assert table.lookup(b"sk-tenant-b-012345678") is None
    toml = tmp_path / "keys.toml"
    toml.write_text(f'[[tenants]]\nname = "a"\nkey = "{KEY_A}"\ntokens_per_minute = 7\n')
    t = load_tenants(str(toml))
    assert t is not None
    assert t.tenants[0].tokens_per_minute == 7


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ({"tenants": [{"name": "a", "key": KEY_A, "rpm": 1}]}, "unknown field"),
        ({"tenants": [{"name": "a b", "key": KEY_A}]}, "'name'"),
        ({"tenants": [{"name": OTHER, "key": KEY_A}]}, "reserved"),
        ({"tenants": [{"name": "a", "key": "short"}]}, "at least"),
        ({"tenants": [{"name": "a", "key": KEY_A, "tokens_per_minute": 0}]}, "positive"),
        ({"tenants": [{"name": "a", "key": KEY_A, "tokens_per_minute": True}]}, "positive"),
        ({"tenants": [{"name": "a", "key": KEY_A}, {"name": "a", "key": KEY_B}]}, "twice"),
        ({"tenants": [{"name": "a", "key": KEY_A}, {"name": "b", "key": KEY_A}]}, "same key"),
        ({"tenants": {"a": KEY_A}}, "'tenants' list"),
        ({"tenants": [], "extra": 1}, "unknown top-level"),
    ],
)
def test_bad_keys_file_is_refused_without_quoting_keys(
    tmp_path: Path, doc: object, says: str
) -> None:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TenantsError, match=says) as info:
        load_tenants(str(path))
    assert KEY_A not in str(info.value)


def test_unparsable_file_does_not_quote_its_line(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(f'[[tenants]]\nname = "a"\nkey = "{KEY_A}" oops\n')
    with pytest.raises(TenantsError, match="not valid TOML") as info:
        load_tenants(str(path))
    assert KEY_A not in str(info.value)


def test_keys_file_must_be_a_small_regular_file(tmp_path: Path) -> None:
    with pytest.raises(TenantsError, match="not a regular file"):
        load_tenants(str(tmp_path))
    with pytest.raises(TenantsError, match="No such file"):
        load_tenants(str(tmp_path / "missing.json"))
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (1024 * 1024 + 1))
    with pytest.raises(TenantsError, match="larger than"):
        load_tenants(str(big))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(TenantsError, match="not a regular file"):
        load_tenants(str(fifo))


def test_tenant_flag() -> None:
    t = parse_tenant_flag("team-a:sk-key:with-colon")
    assert (t.name, t.key) == ("team-a", b"sk-key:with-colon")
    with pytest.raises(TenantsError, match="NAME:KEY"):
        parse_tenant_flag("no-colon")
    assert load_tenants(None) is None


def test_parse_limits_and_defaults() -> None:
    (t,) = parse_tenants(
        b'{"defaults": {"max_concurrent_requests": 3}, "tenants": [{"name": "x", "key": "'
        + KEY_A.encode()
        + b'"}]}',
        toml=False,
    )
    assert (t.max_concurrent_requests, t.tokens_per_minute) == (3, None)


# -- the ledger ---------------------------------------------------------------------------


def test_gate_limits_concurrency_and_tokens() -> None:
    table = _table(Tenant("a", KEY_A.encode(), 2, 100))
    gate = TenantGate(table)
    (a,) = table.tenants
    gate.enter(a)
    gate.enter(a)
    with pytest.raises(ApiError) as info:
        gate.enter(a)
    assert (info.value.status, info.value.headers) == (429, {"retry-after": "1"})
    gate.leave(a, 60)
    gate.leave(a, 50)  # 110 tokens in the window: over 100
    assert gate.inflight(a) == 0
    assert gate.used(a) == 110
    with pytest.raises(ApiError) as info:
        gate.enter(a)
    retry = int(info.value.headers["retry-after"])
    assert 1 <= retry <= 60
    assert gate.rejected_concurrency == [1]
    assert gate.rejected_tokens == [1]


def test_shared_ledger_counts_every_frontend(tmp_path: Path) -> None:
    """Two frontends' gates on one ledger file: each sees the other's requests and tokens."""
    path = str(tmp_path / "tenants")
    table = _table(Tenant("a", KEY_A.encode(), 2, 100), Tenant("b", KEY_B.encode(), 1, None))
    create_ledger_file(path, 2, 2)
    one = TenantGate(table, SharedLedger(path, 2, 0))
    two = TenantGate(table, SharedLedger(path, 2, 1))
    a, b = table.tenants
    one.enter(a)
    two.enter(a)
    with pytest.raises(ApiError):
        one.enter(a)  # the other frontend's request counts
    one.enter(b)  # tenants are apart
    with pytest.raises(ApiError):
        two.enter(b)
    one.leave(a, 90)
    two.leave(a, 20)
    assert (one.used(a), two.used(a)) == (110, 110)
    assert one.own(a) == (0, 90)
    with pytest.raises(ApiError):
        two.enter(a)  # over the tokens per minute, used on both frontends
    # a restarted frontend's old counts are gone
    again = TenantGate(table, SharedLedger(path, 2, 0))
    assert again.inflight(b) == 0
    assert again.used(a) == 20


# -- over HTTP ----------------------------------------------------------------------------


async def test_tenant_keys_and_the_shared_key(harness: HarnessFactory) -> None:
    table = _table(Tenant("a", KEY_A.encode()), Tenant("b", KEY_B.encode()))
    with trio.fail_after(DEADLINE_S):
        async with harness(
            tenants=TenantGate(table), config=GatewayHttpConfig(api_key=SHARED)
        ) as h:
            for key in (KEY_A, KEY_B, SHARED):
                r = await h.post("/v1/completions", {"model": "M", "prompt": "hi",
                                                     "max_tokens": 2}, headers=_auth(key))  # fmt: skip
                assert r.status_code == 200, r.text
            r = await h.post("/v1/completions", {"model": "M", "prompt": "hi"},
                             headers=_auth("sk-unknown-0123456789"))  # fmt: skip
            assert r.status_code == 401
            assert r.json()["error"]["code"] == "invalid_api_key"
            r = await h.post(
                "/v1/messages",
                {"model": "M", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]},
                headers={"x-api-key": KEY_B},
            )
            assert r.status_code == 200, r.text
            # a tenant's key opens the model routes too (not the admin ones)
            assert (await h.http.get("/v1/models", headers=_auth(KEY_A))).status_code == 200
            assert (await h.http.get("/v1/models")).status_code == 401
            metrics = (await h.http.get("/metrics", headers=_auth(SHARED))).text
    assert 'smg_tenant_requests_total{status="200",tenant="a"} 1.0' in metrics
    assert 'smg_tenant_requests_total{status="200",tenant="b"} 2.0' in metrics
    assert f'smg_tenant_requests_total{{status="200",tenant="{OTHER}"}} 1.0' in metrics
    assert f'smg_tenant_requests_total{{status="401",tenant="{OTHER}"}} 1.0' in metrics
    assert 'smg_tenant_tokens_total{kind="completion",tenant="a"} 2.0' in metrics
    assert KEY_A not in metrics


async def test_tenants_without_a_shared_key_need_a_tenant_key(harness: HarnessFactory) -> None:
    table = _table(Tenant("a", KEY_A.encode()))
    with trio.fail_after(DEADLINE_S):
        async with harness(tenants=TenantGate(table)) as h:
            assert (await h.complete(max_tokens=1)).status_code == 401
            r = await h.post("/v1/completions", {"model": "M", "prompt": "x", "max_tokens": 1},
                             headers=_auth(KEY_A))  # fmt: skip
            assert r.status_code == 200


async def test_over_the_concurrency_limit_is_429(harness: HarnessFactory) -> None:
    table = _table(Tenant("a", KEY_A.encode(), 1), Tenant("b", KEY_B.encode(), 1))
    gate = TenantGate(table)
    body = {"model": "M", "prompt": "hi", "max_tokens": 2}
    with trio.fail_after(DEADLINE_S):
        async with harness(tenants=gate) as h:
            h.engine.stall()
            first: list[int] = []
            async with trio.open_nursery() as nursery:

                async def one() -> None:
                    r = await h.post("/v1/completions", body, headers=_auth(KEY_A))
                    first.append(r.status_code)

                seen = h.engine.request_event
                nursery.start_soon(one)
                await seen.wait()  # a's first request is at the engine
                r = await h.post("/v1/completions", body, headers=_auth(KEY_A))
                assert r.status_code == 429
                assert r.headers["retry-after"] == "1"
                err = r.json()["error"]
                assert (err["type"], err["code"]) == ("rate_limit_error", "rate_limit_exceeded")
                assert "'a'" in err["message"]
                assert KEY_A not in r.text
                # another tenant is not held up by a's limit
                seen = h.engine.request_event
                nursery.start_soon(partial(h.post, "/v1/completions", body, headers=_auth(KEY_B)))
                await seen.wait()
                h.engine.resume()
            assert first == [200]
            assert gate.inflight(table.tenants[0]) == 0
            r = await h.post("/v1/completions", body, headers=_auth(KEY_A))
            assert r.status_code == 200


async def test_over_the_token_rate_is_429_with_retry_after(harness: HarnessFactory) -> None:
    table = _table(Tenant("a", KEY_A.encode(), None, 5))
    gate = TenantGate(table)
    with trio.fail_after(DEADLINE_S):
        async with harness(tenants=gate) as h:
            r = await h.post("/v1/completions", {"model": "M", "prompt": "hello there",
                                                 "max_tokens": 4}, headers=_auth(KEY_A))  # fmt: skip
            assert r.status_code == 200
            usage = r.json()["usage"]
            assert (
                gate.used(table.tenants[0]) == usage["prompt_tokens"] + usage["completion_tokens"]
            )
            r = await h.post("/v1/completions", {"model": "M", "prompt": "x", "max_tokens": 1},
                             headers=_auth(KEY_A))  # fmt: skip
            assert r.status_code == 429
            assert 1 <= int(r.headers["retry-after"]) <= 60
            assert "tokens per minute" in r.json()["error"]["message"]
            metrics = (await h.http.get("/metrics")).text
    assert 'smg_tenant_requests_rejected_total{reason="tokens",tenant="a"} 1.0' in metrics
    assert 'smg_tenant_requests_total{status="429",tenant="a"} 1.0' in metrics


def test_a_ledger_of_another_size_is_refused(tmp_path: Path) -> None:
    """A frontend that read more tenants than the supervisor made room for stops at once."""
    path = str(tmp_path / "tenants")
    create_ledger_file(path, 1, 2)
    table = _table(Tenant("a", KEY_A.encode()), Tenant("b", KEY_B.encode()))
    with pytest.raises(TenantsError, match="restart"):
        TenantGate(table, SharedLedger(path, 2, 0))
