"""deploy/ (issue 16, item 2): every manifest parses, and its probes, ports, smg_trio flags
and metric names match the code: a flag renamed or removed in the CLI, or a metric the
picker is pointed at that /metrics does not serve, fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from smg_trio import cli
from smg_trio.gateway.http.metrics import GatewayMetrics
from smg_trio.lora import LoraRegistry

yaml = pytest.importorskip("yaml")

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
MANIFESTS = sorted(DEPLOY.rglob("*.yaml"))


def _docs() -> list[dict[str, Any]]:
    docs = []
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            assert isinstance(doc, dict), path
            assert doc.get("apiVersion"), path
            assert doc.get("kind"), path
            docs.append(doc)
    return docs


def _one(kind: str) -> dict[str, Any]:
    (doc,) = [d for d in _docs() if d["kind"] == kind]
    return doc


def _container() -> dict[str, Any]:
    (container,) = _one("Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def _check_smg_trio_argv(argv: list[str]) -> Any:
    """Parse the smg_trio part of a command line (before ``--``) with the real parser:
    an unknown or mistyped flag is a failure, not a warning."""
    ours = argv[: argv.index("--")] if "--" in argv else argv
    parser = cli._parser()
    args, unknown = parser.parse_known_args(ours)
    assert unknown == [], f"flags the CLI does not have: {unknown}"
    return args


def _exported_metric_names() -> set[str]:
    metrics = GatewayMetrics()
    backend = SimpleNamespace(
        list_models=lambda: [SimpleNamespace(model_id="m")],
        engine_clients=list,
        loras=LoraRegistry(),
    )
    metrics.watch_backend(backend)  # type: ignore[arg-type]
    body, _ = metrics.render()
    names = set()
    for family in text_string_to_metric_families(body.decode()):
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
    return names


def test_every_manifest_parses() -> None:
    assert {p.name for p in MANIFESTS} >= {"smg-trio.yaml", "inference-pool.yaml"}
    kinds = {d["kind"] for d in _docs()}
    assert {"Deployment", "Service", "InferencePool", "HTTPRoute", "ConfigMap"} <= kinds


def test_deployment_flags_exist_and_ports_and_probes_match() -> None:
    container = _container()
    args = _check_smg_trio_argv(container["args"])
    assert args.command == "serve"
    (port,) = container["ports"]
    assert port["containerPort"] == args.port
    assert args.host == "0.0.0.0"  # reachable from the router, not only loopback
    probes = {k: container[k]["httpGet"] for k in ("livenessProbe", "readinessProbe")}
    assert probes["livenessProbe"]["path"] == "/liveness"
    assert probes["readinessProbe"]["path"] == "/readiness"
    assert {p["port"] for p in probes.values()} == {port["name"]}
    requests = container["resources"]["requests"]
    assert requests["cpu"]
    assert requests["memory"]


def test_prestop_drains_within_the_grace_period() -> None:
    container = _container()
    command = " ".join(container["lifecycle"]["preStop"]["exec"]["command"])
    assert "kill -TERM 1" in command  # smg_trio's first SIGTERM drains (tini forwards it)
    args = _check_smg_trio_argv(container["args"])
    grace = _one("Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > args.shutdown_grace_period_secs + 10  # + the engines' stop


def test_dockerfile_cmd_flags_exist_and_engine_version_is_a_build_arg() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^ARG VLLM_VERSION=", text, re.M)
    (cmd,) = re.findall(r"^CMD (\[.*\])$", text, re.M)
    args = _check_smg_trio_argv(json.loads(cmd))
    assert f"EXPOSE {args.port}" in text


def test_inference_pool_targets_the_pods_and_the_route_the_pool() -> None:
    pool = _one("InferencePool")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    labels = _one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert pool["spec"]["selector"]["matchLabels"].items() <= labels.items()
    args = _check_smg_trio_argv(_container()["args"])
    assert [p["number"] for p in pool["spec"]["targetPorts"]] == [args.port]
    route = _one("HTTPRoute")
    (rule,) = route["spec"]["rules"]
    (backend,) = rule["backendRefs"]
    assert (backend["group"], backend["kind"], backend["name"]) == (
        "inference.networking.k8s.io", "InferencePool", pool["metadata"]["name"],
    )  # fmt: skip


def test_endpoint_picker_reads_metrics_the_gateway_serves() -> None:
    config = yaml.safe_load(_one("ConfigMap")["data"]["smg-trio-plugins.yaml"])
    plugins = {p["type"]: p.get("parameters", {}) for p in config["plugins"]}
    assert plugins["metrics-data-source"]["path"] == "/metrics"
    extractor = plugins["core-metrics-extractor"]
    (engine,) = extractor["engineConfigs"]
    labels = _one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert labels[extractor["engineLabelKey"]] == engine["name"]
    exported = _exported_metric_names()
    specs = {k: v for k, v in engine.items() if k.endswith("Spec") and v}
    assert set(specs) == {"queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec"}
    for key, spec in specs.items():
        assert spec.split("{")[0] in exported, (key, spec)
    assert "vllm:lora_requests_info" not in exported  # so loraSpec stays empty
    assert engine["loraSpec"] == ""
