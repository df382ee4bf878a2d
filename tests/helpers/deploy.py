"""The Helm chart rendered by real Helm (helm-python-sdk) and the Dockerfile parsed, as the deploy
and image tests read them."""

from __future__ import annotations

import re
from typing import Any

import helm_python as helm
import kubernetes_validate
import yaml
from dockerfile_parse import DockerfileParser

from tests.helpers.env import ROOT

CHART = ROOT / "helm" / "mathrl"
GPU_VALUES = CHART / "ci" / "gpu-values.yaml"
RELEASE, NAMESPACE = "mathrl", "ml"
# the oldest Kubernetes the chart declares (Chart.yaml kubeVersion) and the newest with schemas
K8S_VERSIONS = ("1.27", kubernetes_validate.utils.latest_version())
CRD_KINDS = {"ScaledObject", "TriggerAuthentication", "ServiceMonitor", "RayCluster"}


class Rendered:
    def __init__(self, manifests: dict[str, str]):
        self.notes = next((v for k, v in manifests.items() if k.endswith("NOTES.txt")), "")
        self.files = {k: v for k, v in manifests.items() if k.endswith(".yaml")}
        self.docs = [d for v in self.files.values() for d in yaml.safe_load_all(v) if d]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] == kind]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        found = [d for d in self.of(kind) if d["metadata"]["name"] == name]
        assert found, f"no {kind} {name}; have {[d['metadata']['name'] for d in self.of(kind)]}"
        return found[0]

    def workloads(self) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] in ("Deployment", "StatefulSet", "Job")]


def render(values: dict[str, Any] | None = None) -> Rendered:
    with helm.Chart.load(str(CHART)) as chart:
        return Rendered(chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True))


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def container(workload: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    containers = pod_spec(workload)["containers"]
    return containers[0] if name is None else next(c for c in containers if c["name"] == name)


def env_of(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in c.get("env", [])}


def workers(r: Rendered) -> dict[str, dict[str, Any]]:
    return {
        d["metadata"]["labels"]["mathrl.io/pool"]: d
        for d in r.of("Deployment")
        if d["metadata"]["labels"].get("app.kubernetes.io/component") == "worker"
    }


def dockerfile() -> DockerfileParser:
    parser = DockerfileParser(fileobj=open(ROOT / "Dockerfile", "rb"))
    return parser


def stages(parser: DockerfileParser) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    current = None
    for ins in parser.structure:
        if ins["instruction"] == "FROM":
            m = re.match(r"\S+\s+AS\s+(\S+)", ins["value"], re.I)
            current = m.group(1) if m else f"stage{len(out)}"
            out[current] = []
        if current is not None:
            out[current].append(ins)
    return out


def build_args(parser: DockerfileParser) -> dict[str, str]:
    args = {}
    for ins in parser.structure:
        if ins["instruction"] == "ARG" and "=" in ins["value"]:
            k, v = ins["value"].split("=", 1)
            args[k.strip()] = v.strip()
    return args
