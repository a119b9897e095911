"""deploy/: the Kubernetes manifests pass the API schemas (offline, the schemas bundled
with kubernetes-validate; KEDA's CRD against the small schema vendored in
deploy/schemas/), the replicas' arguments parse with sluiceway's own CLI, and the
pieces agree with each other (labels, drain timing, ports)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from sluiceway.cli import build_parser

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
KUBERNETES_VERSION = "1.30.0"
# Custom resources: their schemas are not Kubernetes', so one is vendored per kind.
CRD_SCHEMAS = {("keda.sh/v1alpha1", "ScaledObject"): "keda-scaledobject-v1alpha1.json"}


def _documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted((DEPLOY / "kubernetes").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs.append(
                    (f"{path.relative_to(DEPLOY)}:{doc['kind']}/{doc['metadata']['name']}", doc)
                )
    return docs


DOCS = _documents()


def _one(kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for _, d in DOCS if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def _flag(args: list[str], name: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in args if a.startswith(name + "=")]
    return value


@pytest.mark.parametrize("doc", [d for _, d in DOCS], ids=[i for i, _ in DOCS])
def test_manifest_is_valid(doc: dict[str, Any]) -> None:
    crd = CRD_SCHEMAS.get((doc["apiVersion"], doc["kind"]))
    if crd is not None:
        jsonschema.validate(doc, json.loads((DEPLOY / "schemas" / crd).read_text()))
    else:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_replicas_drain_before_they_are_killed() -> None:
    pod = _one("Deployment", "sluiceway")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = container["args"]
    assert args[:2] == ["sluiceway", "serve"]
    parsed = build_parser().parse_args(args[1:])  # the flags exist and the JSON parses
    assert parsed.kv_events_config.enabled
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    assert pod["terminationGracePeriodSeconds"] > float(pre_stop[1]) + parsed.drain_grace + 5
    for probe in ("readinessProbe", "startupProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/health"
    ports = {p["containerPort"] for p in container["ports"]}
    assert {parsed.port, 5557, 5558} <= ports


def test_the_router_discovers_the_replicas_by_their_labels() -> None:
    replicas = _one("Deployment", "sluiceway")
    labels = replicas["spec"]["template"]["metadata"]["labels"]
    assert _one("PodDisruptionBudget", "sluiceway")["spec"]["selector"]["matchLabels"] == labels
    router = _one("Deployment", "vllm-router")["spec"]["template"]["spec"]
    args = router["containers"][0]["args"]
    assert "--service-discovery" in args
    selector = args[args.index("--selector") + 1 : args.index("--selector") + 3]
    assert dict(s.split("=", 1) for s in selector) == labels
    assert _flag(args, "--service-discovery-port") == "8000"
    assert _flag(args, "--policy") == "kv_aware"
    assert int(_flag(args, "--kv-aware-session-affinity-ttl-secs")) > 0
    # It may watch pods: the RBAC binds its service account to a pod reader.
    binding = _one("RoleBinding", "vllm-router-pod-reader")
    assert binding["subjects"][0]["name"] == router["serviceAccountName"]
    (rule,) = _one("Role", binding["roleRef"]["name"])["rules"]
    assert rule["resources"] == ["pods"] and {"list", "watch"} <= set(rule["verbs"])


def test_autoscalers_follow_waiting_requests() -> None:
    hpa = _one("HorizontalPodAutoscaler", "sluiceway")["spec"]
    assert hpa["scaleTargetRef"]["name"] == "sluiceway"
    assert hpa["metrics"][0]["external"]["metric"]["name"] == "vllm_num_requests_waiting"
    keda = _one("ScaledObject", "sluiceway")["spec"]
    assert keda["scaleTargetRef"]["name"] == "sluiceway"
    assert "vllm:num_requests_waiting" in keda["triggers"][0]["metadata"]["query"]


def test_compose_puts_every_replica_behind_the_router() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    replicas = sorted(name for name in services if name.startswith("replica-"))
    command = services["router"]["command"]
    urls = command[
        command.index("--worker-urls") + 1 : command.index("--worker-urls") + 1 + len(replicas)
    ]
    assert urls == [f"http://{name}:8000" for name in replicas]
    for name in replicas:
        args = services[name]["command"]
        parsed = build_parser().parse_args(args[1:])
        assert parsed.kv_events_config.enabled
        assert int(services[name]["stop_grace_period"].removesuffix("s")) > parsed.drain_grace
