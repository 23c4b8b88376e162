"""The cluster manifests (deploy/kubernetes): every core object valid against Kubernetes's own
schemas (kubernetes-validate, strict: no unknown field), KEDA's ScaledObject against the fields
KEDA documents, and each one wired to the code: the processes' modules and arguments, and the
KEDA trigger reading the same backlog, group and threshold as `loop.rollout_workers=auto`."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from rlstream.config import Config, LoopConfig
from rlstream.schemas import get
from rlstream.trainers.ranks import HOST_ENV, PORT_ENV, RANK_ENV

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
KUBERNETES = "1.33.0"
RUN = "RUN_ID"  # the placeholder the manifests name the run by
WORKLOADS = ("Deployment", "StatefulSet")

# the ScaledObject fields KEDA documents for a Kafka trigger (keda.sh/docs, Apache Kafka)
SCALED_OBJECT = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "additionalProperties": False,
            "properties": {
                "scaleTargetRef": {"type": "object", "required": ["name"],
                                   "properties": {"name": {"type": "string"}}},
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "pollingInterval": {"type": "integer", "minimum": 1},
                "cooldownPeriod": {"type": "integer", "minimum": 0},
                "triggers": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "required": ["type", "metadata"],
                    "properties": {
                        "type": {"const": "kafka"},
                        "metadata": {
                            "type": "object",
                            "required": ["bootstrapServers", "consumerGroup", "topic"],
                            "additionalProperties": {"type": "string"},
                            "properties": {"lagThreshold": {"pattern": "^[0-9]+$"},
                                           "offsetResetPolicy": {"enum": ["earliest", "latest"]}},
                        },
                    },
                }},
            },
        },
    },
}  # fmt: skip


def documents() -> dict[str, dict]:
    found = {}
    for path in sorted(DEPLOY.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            found[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return found


def test_the_kustomization_lists_every_manifest():
    listed = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"]
    on_disk = {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(listed) == on_disk


@pytest.mark.parametrize("name", [n for n in documents() if not n.startswith("ScaledObject")])
def test_each_core_object_is_valid_kubernetes(name):
    kubernetes_validate.validate(documents()[name], KUBERNETES, strict=True)


def test_the_scaled_object_is_what_keda_takes():
    (scaled,) = [d for n, d in documents().items() if n.startswith("ScaledObject/")]
    jsonschema.validate(scaled, SCALED_OBJECT)
    with pytest.raises(jsonschema.ValidationError):  # the check bites
        jsonschema.validate(scaled | {"spec": scaled["spec"] | {"maxReplicas": 4}}, SCALED_OBJECT)


def test_keda_reads_the_backlog_the_autoscaler_reads():
    docs = documents()
    (scaled,) = [d for n, d in docs.items() if n.startswith("ScaledObject/")]
    (trigger,) = scaled["spec"]["triggers"]
    meta = trigger["metadata"]
    assert meta["topic"] == get("rollout_requests").topic
    assert meta["consumerGroup"] == Config(run_id=RUN).group("rollout-workers")
    assert meta["lagThreshold"] == str(LoopConfig().autoscale_lag)
    assert scaled["spec"]["maxReplicaCount"] <= get("rollout_requests").partitions
    target = docs[f"Deployment/{scaled['spec']['scaleTargetRef']['name']}"]
    (container,) = target["spec"]["template"]["spec"]["containers"]
    assert container["args"][0] == "rlstream.streams.rollout_worker"
    endpoints = docs["ConfigMap/rlstream-endpoints"]["data"]
    assert meta["bootstrapServers"] == endpoints["RLSTREAM_KAFKA_BOOTSTRAP"]


def test_every_process_runs_a_module_of_the_package_with_the_runs_config():
    deployments = [d for n, d in documents().items() if n.split("/")[0] in WORKLOADS]
    modules = set()
    for d in deployments:
        (container,) = d["spec"]["template"]["spec"]["containers"]
        module, *args = container["args"]
        assert importlib.util.find_spec(module) is not None, module
        assert args[args.index("--config") + 1] == "/etc/rlstream/config.json"
        modules.add(module)
        refs = {next(iter(r.values()))["name"] for r in container["envFrom"]}
        assert refs == {"rlstream-endpoints", "rlstream-secrets"}
    assert modules == {"rlstream.streams.trainer", "rlstream.streams.scheduler",
                       "rlstream.streams.worker", "rlstream.streams.rollout_worker"}  # fmt: skip


def test_the_trainer_ranks_meet_at_rank_zeros_stable_name():
    docs = documents()
    ranks, service = docs["StatefulSet/rlstream-trainer"], docs["Service/rlstream-trainer"]
    (container,) = ranks["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert ranks["spec"]["serviceName"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None"  # headless: each pod has its own name
    assert service["spec"]["selector"] == ranks["spec"]["template"]["metadata"]["labels"]
    host = env[HOST_ENV]["value"]
    assert host == f"{ranks['metadata']['name']}-0.{service['metadata']['name']}"
    assert "pod-index" in env[RANK_ENV]["valueFrom"]["fieldRef"]["fieldPath"]
    port = int(env[PORT_ENV]["value"])
    assert port in [p["port"] for p in service["spec"]["ports"]]
    assert port in [p["containerPort"] for p in container["ports"]]
    assert ranks["spec"]["replicas"] == LoopConfig().trainer_ranks  # the config's default
