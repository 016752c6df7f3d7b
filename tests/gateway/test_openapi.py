"""``GET /openapi.json``: a valid OpenAPI 3.1 document that covers every route the served app
routes (the OpenAI routes, the probes and the admin API), built once per app."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import pytest
import trio
from openapi_spec_validator import validate
from quart_trio import QuartTrio

from smg_trio.gateway.config import GatewayHttpConfig
from smg_trio.gateway.http import app as app_module
from smg_trio.gateway.http.app import create_app
from smg_trio.gateway.http.openapi import OPERATIONS, openapi_document
from smg_trio.serve import admin
from smg_trio.serve.admin import admin_blueprint
from smg_trio.serve.admin_schema import ADMIN_OPERATIONS, WorkerSpecBody
from smg_trio.serve.engine_control import add_engine_control_routes
from smg_trio.worker.manager import WorkerManager

DEADLINE_S = 10.0
#: The routes documented as open even with --api-key / --admin-api-key.
#: What serve documents: the app's own routes plus the admin API it mounts.
ALL_OPERATIONS = (*OPERATIONS, *ADMIN_OPERATIONS)
PUBLIC = {"/health", "/liveness", "/readiness", "/metrics", "/openapi.json", "/version"}


@asynccontextmanager
async def served_app(config: GatewayHttpConfig | None = None) -> AsyncIterator[QuartTrio]:
    """The app as ``serve`` builds it: create_app over a WorkerManager plus the admin routes."""
    async with trio.open_nursery() as nursery:
        manager = WorkerManager(nursery)
        app = create_app(manager, config, operations=ADMIN_OPERATIONS)
        bp = admin_blueprint(manager, admin_api_key=None)
        add_engine_control_routes(bp, manager)
        app.register_blueprint(bp)
        yield app
        nursery.cancel_scope.cancel()


def _routes(app: QuartTrio) -> set[tuple[str, str]]:
    """(method, OpenAPI path) of every rule the app routes, HEAD/OPTIONS aside."""
    out = set()
    for rule in app.url_map.iter_rules():
        path = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule.rule)
        for method in rule.methods or ():
            if method not in ("HEAD", "OPTIONS"):
                out.add((method.lower(), path))
    return out


def _documented(doc: dict[str, Any]) -> set[tuple[str, str]]:
    return {(m, p) for p, ops in doc["paths"].items() for m in ops}


def test_document_is_valid_openapi_3_1() -> None:
    doc = openapi_document(ALL_OPERATIONS)
    validate(doc)  # raises on an invalid document
    assert doc["openapi"].startswith("3.1")
    # every $ref resolves into components.schemas
    refs = re.findall(r'"\$ref":"#/components/schemas/([^"]+)"', msgspec.json.encode(doc).decode())
    assert refs
    assert set(refs) <= set(doc["components"]["schemas"])


async def test_every_served_route_is_documented_and_every_documented_one_served() -> None:
    with trio.fail_after(DEADLINE_S):
        async with served_app() as app:
            routes = _routes(app)
            documented = _documented(openapi_document(ALL_OPERATIONS))
            assert routes == documented, (routes - documented, documented - routes)


async def test_served_document_is_built_once(monkeypatch: pytest.MonkeyPatch) -> None:
    with trio.fail_after(DEADLINE_S):
        async with served_app() as app:

            def per_request(*_: Any, **__: Any) -> Any:
                raise AssertionError("openapi.json must not be built per request")

            monkeypatch.setattr(app_module, "openapi_document", per_request)
            client = app.test_client()
            resp = await client.get("/openapi.json")
            assert resp.status_code == 200
            assert resp.content_type == "application/json"
            served = await resp.get_json()
            monkeypatch.undo()
            assert served == msgspec.json.decode(
                msgspec.json.encode(
                    openapi_document(ALL_OPERATIONS, version=served["info"]["version"])
                )
            )


async def test_openapi_json_is_public_even_with_an_api_key() -> None:
    with trio.fail_after(DEADLINE_S):
        async with served_app(GatewayHttpConfig(api_key="k")) as app:
            client = app.test_client()
            assert (await client.get("/openapi.json")).status_code == 200
            assert (await client.get("/v1/models")).status_code == 401


def test_security_marks_every_route_but_the_public_probes() -> None:
    doc = openapi_document(ALL_OPERATIONS)
    schemes = set(doc["components"]["securitySchemes"])
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            if path in PUBLIC:
                assert op["security"] == [], (method, path)
                continue
            assert op["security"], (method, path)
            assert {name for req in op["security"] for name in req} <= schemes
            assert "401" in op["responses"], (method, path)


def test_error_responses_are_the_openai_envelope() -> None:
    doc = openapi_document(ALL_OPERATIONS)
    envelope = doc["components"]["schemas"]["ErrorDetail"]
    assert set(envelope["properties"]) == {"message", "type", "param", "code"}
    for ops in doc["paths"].values():
        for op in ops.values():
            for status, resp in op["responses"].items():
                if status.startswith(("4", "5")):
                    schema = resp["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/ErrorBody"}


def test_worker_spec_schema_matches_the_admin_parser() -> None:
    fields = {f.name: f.type for f in msgspec.structs.fields(WorkerSpecBody)}
    assert set(fields) == set(admin._FIELDS)
    for name, kind in admin._FIELDS.items():
        assert kind.__name__ in str(fields[name]), (name, fields[name])
    assert [f.name for f in msgspec.structs.fields(WorkerSpecBody) if f.required] == ["url"]


def test_operations_are_unique() -> None:
    keys = [(op.method, op.path) for op in ALL_OPERATIONS]
    assert len(keys) == len(set(keys))
    ids = [op.operation_id for op in ALL_OPERATIONS]
    assert len(ids) == len(set(ids))
