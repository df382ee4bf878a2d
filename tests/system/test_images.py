"""The images, run the way the chart runs them (issue 19): `scripts/images` builds mathrl-api and
mathrl-worker-cpu with podman; this test starts them as the rendered chart describes its pods
(the same args, environment names, ports, probes, user, read-only root filesystem and writable
volumes, read from `helm template` output, so chart and test cannot drift apart) against this
machine's PostgreSQL and Redis, and drives them over HTTP from the host: the migration Job,
the API (2 processes), a worker on the cpu queue; an eval job that must succeed with its scores
stored; a training job whose worker container is stopped with SIGTERM mid-training (as
Kubernetes evicts a pod) and which must resume from the drained checkpoint in a new worker
container.

It is its own command, `scripts/test-images` (build, then this file), not part of
`scripts/test`: building the worker image takes minutes and several GB (RELIABILITY.md).
Without the images it is skipped, saying how to build them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.helpers.deploy import container, env_of, pod_spec, render, workers
from tests.helpers.env import ADMIN_TOKEN, PG_SERVER, REDIS, ROOT, free_port
from tests.helpers.processes import wait_for

VERSION = next(
    line.split('"')[1] for line in (ROOT / "pyproject.toml").read_text().splitlines() if line.startswith("version")
)
IMAGES = {"api": f"localhost/mathrl-api:{VERSION}", "worker": f"localhost/mathrl-worker-cpu:{VERSION}"}
RUNC = shutil.which("runc") or "/usr/sbin/runc"


def podman(*args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    conf = ROOT / ".mathrl" / "images" / "containers.conf"  # written by scripts/images
    env = {**os.environ, "CONTAINERS_CONF": str(conf)}
    proc = subprocess.run(
        ["podman", "--runtime", RUNC, *args], capture_output=True, text=True, env=env, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"podman {' '.join(args[:3])}... exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc


def _images_built() -> str | None:
    if os.environ.get("MATHRL_TEST_IMAGES") != "1":
        return "the image smoke test is its own command: scripts/test-images"
    if shutil.which("podman") is None:
        return "podman is not installed (apt-get install podman runc)"
    if not (ROOT / ".mathrl" / "images" / "containers.conf").exists():
        return "no images built here: run scripts/images (scripts/test-images builds and runs this)"
    missing = [i for i in IMAGES.values() if podman("image", "exists", i, check=False).returncode != 0]
    return f"{', '.join(missing)} not built: run scripts/images" if missing else None


pytestmark = pytest.mark.slow
needs_images = pytest.mark.skipif(bool(_images_built()), reason=_images_built() or "")


class Pod:
    """One container started from a rendered pod's container the way the kubelet would:
    its args ($(VAR) expanded), its env (secrets filled from `secrets`, the ConfigMap's data,
    fieldRefs), its securityContext and its volume mounts (emptyDirs as tmpfs, the artifact
    volume as a host folder)."""

    def __init__(self, workload: dict[str, Any], name: str, secrets: dict[str, str], config: dict[str, str]):
        self.workload, self.spec, self.c = workload, pod_spec(workload), container(workload)
        self.name, self.secrets, self.config = name, secrets, config

    def env(self) -> dict[str, str]:
        out = dict(self.config)
        for name, e in env_of(self.c).items():
            if "value" in e:
                out[name] = str(e["value"])
            elif "secretKeyRef" in e.get("valueFrom", {}):
                out[name] = self.secrets[name]
            elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
                out[name] = self.name
            elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP":
                out[name] = "127.0.0.1"  # host networking: the API reaches a session job here
            else:
                raise AssertionError(f"{self.name}: env {name} has a source this test does not fill: {e}")
        return out

    def args(self, port: int | None = None) -> list[str]:
        env = self.env()
        args = [a.replace("$(POD_NAME)", env.get("POD_NAME", self.name)) for a in self.c["args"]]
        if port is not None:  # host networking: a free port instead of the chart's 8000
            args[args.index("--port") + 1] = str(port)
        return args

    def run_flags(self, artifacts: Path) -> list[str]:
        sc = {**self.spec.get("securityContext", {}), **self.c.get("securityContext", {})}
        flags = ["--network=host", "--name", self.name, "--hostname", self.name]
        flags += ["--user", f"{sc['runAsUser']}:{sc['runAsGroup']}"]
        if sc.get("readOnlyRootFilesystem"):
            flags += ["--read-only", "--read-only-tmpfs=false"]  # writable: only the pod's volumes
        if sc.get("allowPrivilegeEscalation") is False:
            flags += ["--security-opt", "no-new-privileges"]
        flags += [f"--cap-drop={c}" for c in sc.get("capabilities", {}).get("drop", [])]
        volumes = {v["name"]: v for v in self.spec.get("volumes", [])}
        for m in self.c.get("volumeMounts", []):
            v = volumes[m["name"]]
            if m["mountPath"] == "/dev/shm":  # the pod's in-memory emptyDir, its sizeLimit as podman's
                limit = str(v["emptyDir"].get("sizeLimit", "64Mi"))
                flags += ["--shm-size", limit.replace("Gi", "g").replace("Mi", "m")]
                continue
            if "emptyDir" in v:
                flags += ["--mount", f"type=tmpfs,destination={m['mountPath']},tmpfs-mode=1777"]
            elif m["name"] == "artifacts":
                flags += ["--volume", f"{artifacts}:{m['mountPath']}"]
            elif m["name"] != "datasets":
                raise AssertionError(f"{self.name}: volume {m['name']} is not one this test provides: {v}")
        for k, val in self.env().items():
            flags += ["--env", f"{k}={val}"]
        return flags

    def start(self, image: str, artifacts: Path, port: int | None = None, detach: bool = True) -> Any:
        cmd = ["run", *(["--detach"] if detach else ["--rm"]), *self.run_flags(artifacts), image, *self.args(port)]
        return podman(*cmd, timeout=600)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A database of its own, Redis db 12, a host folder as the artifact volume, the chart."""
    name = f"mathrl_images_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_SERVER, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    db_url = make_url(PG_SERVER).set(database=name, drivername="postgresql+psycopg")
    broker = f"{REDIS.rsplit('/', 1)[0]}/12"
    import redis

    redis.Redis.from_url(broker).flushdb()
    artifacts = tmp_path_factory.mktemp("image-artifacts")
    os.chown(artifacts, 10001, 10001)  # the pod's fsGroup makes the volume the user's
    r = render({"api": {"workers": 2}})  # the API as 2 processes in one pod, as compose runs it
    config = next(d for d in r.of("ConfigMap") if d["metadata"]["name"].endswith("-config")).get("data") or {}
    secrets = {
        "MATHRL_DATABASE__URL": db_url.render_as_string(hide_password=False),
        "MATHRL_BROKER__URL": broker,
        "MATHRL_AUTH__ADMIN_TOKEN": ADMIN_TOKEN,
    }
    started: list[str] = []
    yield {"chart": r, "config": config, "secrets": secrets, "artifacts": artifacts, "started": started}
    for ctr in started:
        podman("rm", "-f", "-t", "0", ctr, check=False)
    with admin.connect() as conn:
        conn.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"))
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
    admin.dispose()
    redis.Redis.from_url(broker).flushdb()


@needs_images
def test_images_serve_jobs_and_a_worker_sigterm_drains_to_a_new_worker(deployment: dict[str, Any]) -> None:
    from mathrl.client import Client

    r, art, started = deployment["chart"], deployment["artifacts"], deployment["started"]
    suffix = uuid.uuid4().hex[:6]

    def pod(workload: dict[str, Any], name: str) -> Pod:
        started.append(name)
        return Pod(workload, name, deployment["secrets"], deployment["config"])

    for image in IMAGES.values():
        size = int(podman("image", "inspect", "--format", "{{.Size}}", image).stdout.strip())
        print(f"image {image}: {size / 1e6:.0f} MB")

    # 1. the migration Job, with the API image
    (migrate_job,) = r.of("Job")
    t0 = time.monotonic()
    out = pod(migrate_job, f"mathrl-migrate-{suffix}").start(IMAGES["api"], art, detach=False)
    assert "database at head" in out.stdout + out.stderr, out.stdout + out.stderr
    print(f"migrate: {time.monotonic() - t0:.1f}s")

    # 2. the API Deployment's container (2 processes), probed as the chart probes it
    api_dep = next(d for d in r.of("Deployment") if d["metadata"]["name"].endswith("-api"))
    port = free_port()
    api = pod(api_dep, f"mathrl-api-{suffix}")
    t0 = time.monotonic()
    api.start(IMAGES["api"], art, port=port)
    url = f"http://127.0.0.1:{port}"

    def probe_ok(path: str) -> bool:
        try:
            return httpx.get(url + path, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    c = api.c
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        path = c[probe]["httpGet"]["path"]
        wait_for(lambda path=path: probe_ok(path), 90, 0.5, f"the API's {probe} ({path})")
    print(f"api: probes answer {time.monotonic() - t0:.1f}s after start")
    assert podman("exec", api.name, "id", "-u").stdout.strip() == str(c["securityContext"]["runAsUser"])
    assert podman("exec", api.name, "touch", "/opt/venv/x", check=False).returncode != 0  # read-only root
    assert podman("exec", api.name, "touch", "/tmp/x").returncode == 0  # its emptyDir is writable

    # 3. a worker pod of the cpu pool
    cpu_pool = workers(r)["cpu"]

    def start_worker(name: str) -> Pod:
        w = pod(cpu_pool, name)
        w.start(IMAGES["worker"], art)
        ready = w.c["readinessProbe"]["exec"]["command"]
        wait_for(
            lambda: podman("exec", name, *ready, check=False, timeout=60).returncode == 0,
            180,
            1.0,
            f"worker {name}'s readinessProbe",
        )
        return w

    t0 = time.monotonic()
    w1 = start_worker(f"mathrl-worker-cpu-a-{suffix}")
    print(f"worker: readinessProbe answers {time.monotonic() - t0:.1f}s after start")
    assert podman("exec", w1.name, "id", "-u").stdout.strip() == str(w1.c["securityContext"]["runAsUser"])
    # the GPU acceptance run finds its example inside the image (a wheel installs examples/*.yaml)
    # and records the commit the image was built from
    found, commit = podman(
        "exec", w1.name, "python", "-c",
        "from service.gpu_check import EXAMPLE, mathrl_commit; print(EXAMPLE.is_file(), mathrl_commit())",
    ).stdout.split()  # fmt: skip
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert found == "True" and commit.split("-")[0] == head, (found, commit, head)

    # 4. a key, then the demo's eval on a tiny model, over HTTP from the host
    key = httpx.post(
        f"{url}/v1/keys", json={"project": f"images-{suffix}"}, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    assert key.status_code == 201, key.text
    client = Client(url, api_key=key.json()["key"])
    job = client.jobs.create(
        {"kind": "eval", "model": "tiny:2x64", "benchmark": "arith", "limit": 50, "sampling": {"max_new_tokens": 5}}
    )
    done = client.jobs.wait(job.id, timeout=300, poll=1)
    assert done.status == "succeeded", done.error
    scores = client.scores.list(job_id=job.id)
    assert any(s.metric == "accuracy" and s.benchmark == "arith" for s in scores), scores
    # ... and on vLLM's CPU build in the slimmed image (no Triton, OpenCV, numba, no C++ compiler:
    # the engine runs eager), with the pod's /dev/shm
    on_vllm = client.jobs.create(
        {
            "kind": "eval",
            "model": "tiny:2x128",
            "benchmark": "arith",
            "limit": 20,
            "backend": "vllm",
            "recipe": {"format": "text"},
            "sampling": {"max_new_tokens": 5},
        }
    )
    done = client.jobs.wait(on_vllm.id, timeout=600, poll=1)
    assert done.status == "succeeded", done.error
    acc = next(s for s in client.scores.list(job_id=on_vllm.id) if s.metric == "accuracy")
    assert acc.backend == "vllm" and acc.backend_version.startswith("vllm-0.31"), acc

    # 5. training; the worker container is stopped as Kubernetes stops a pod (SIGTERM to PID 1,
    #    tini, which passes it to the worker); the job drains and resumes on a new worker
    train = client.jobs.create(
        {
            "kind": "sft",
            "model": "tiny:2x64",
            "dataset": {"name": "arith", "split": "train", "limit": 2000},
            "max_steps": 300,
            "learning_rate": 1e-3,
            "per_device_train_batch_size": 32,
            "max_length": 16,
            "logging_steps": 1,
            "save_steps": 1000,
        }
    )

    def step() -> int:
        return max((p.step for m in client.jobs.metrics(train.id) if m.name == "loss" for p in m.points), default=0)

    wait_for(lambda: step() >= 3, 300, 0.5, "three training steps")
    grace = pod_spec(cpu_pool)["terminationGracePeriodSeconds"]
    t0 = time.monotonic()
    podman("stop", "-t", str(grace), w1.name, timeout=grace + 30)
    stop_seconds = time.monotonic() - t0
    state = json.loads(podman("inspect", w1.name).stdout)[0]["State"]
    assert state["ExitCode"] == 0, state  # a clean exit after the drain, not the grace period's SIGKILL
    parked = client.jobs.retrieve(train.id)
    assert parked.status == "queued" and parked.drains == 1, parked
    drained = next(e for e in client.jobs.events(train.id) if e.type == "drained")
    saved = drained.data["checkpoint_step"]
    assert saved is not None and 3 <= saved < 300, drained  # stopped mid-training, at a step of its own
    print(f"drain: podman stop took {stop_seconds:.1f}s; checkpoint at step {saved}")

    start_worker(f"mathrl-worker-cpu-b-{suffix}")
    finished = client.jobs.wait(train.id, timeout=600, poll=1)
    assert finished.status == "succeeded", finished.error
    assert finished.attempts == 2 and finished.drains == 1
    assert [e.data["step"] for e in client.jobs.events(train.id) if e.type == "resumed"] == [saved]
    loss_steps = [p.step for m in client.jobs.metrics(train.id) if m.name == "loss" for p in m.points]
    assert loss_steps == list(range(1, 301)), loss_steps


# Ubuntu's Python and glibc in the CUDA base image (nvidia/cuda:*-ubuntu24.04): Python 3.12, glibc 2.39
CUDA_BASE_PYTHON = {"ubuntu24.04": ("3.12", 39)}
SDIST_ONLY = ("rouge-score>=0.1.2,<0.2",)  # the text_similarity grader's ROUGE (pyproject.toml's worker extra)


@pytest.mark.skipif(os.environ.get("MATHRL_TEST_IMAGES") != "1", reason="part of scripts/test-images")
def test_cuda_worker_pins_resolve_with_the_cuda_torch_build(tmp_path: Path) -> None:
    """The CUDA worker image cannot be built here (no CUDA base image), so check what it
    installs: the Dockerfile's pins (torch, TRL, vLLM, transformers) and the project wheel's
    [worker,ray] extras resolve together, as binary wheels for the CUDA base's Python and glibc,
    against the package index, whose Linux torch wheels are the CUDA builds (the PyTorch CUDA
    index is not reachable from here; its torch 2.13.0 is the same CUDA 13 build). The entry
    point that image runs is the one the CPU worker image runs in the test above."""
    import sys

    from tests.helpers.deploy import build_args, dockerfile

    args = build_args(dockerfile())
    distro = args["CUDA_IMAGE"].rsplit("-", 1)[-1]
    assert distro in CUDA_BASE_PYTHON, f"add {distro}'s Python and glibc to CUDA_BASE_PYTHON"
    python, glibc = CUDA_BASE_PYTHON[distro]
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("mathrl-*.whl")
    # pure-Python dependencies published as source only (the image's pip builds them): their wheels,
    # built here, are py3-none-any and stand for them in the binary-only resolution below
    sdist_only = tmp_path / "sdist-only"
    for req in SDIST_ONLY:
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(sdist_only), req],
            check=True,
            capture_output=True,
        )
    platforms = [f"manylinux_2_{v}_x86_64" for v in range(17, glibc + 1)] + ["manylinux2014_x86_64", "linux_x86_64"]
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "pip", "install", "--isolated", "--dry-run", "--ignore-installed", "--quiet"]
    cmd += ["--report", str(report), "--only-binary", ":all:", "--python-version", python, "--implementation", "cp"]
    cmd += [f"--platform={p}" for p in platforms]
    cmd += [f"--abi=cp{python.replace('.', '')}", "--abi=abi3", "--abi=none", "--find-links", str(sdist_only)]
    pins = {k: args[f"{k.upper()}_VERSION"] for k in ("torch", "trl", "vllm", "transformers")}
    cmd += [f"{k}=={v}" for k, v in pins.items()] + [f"{wheel}[worker,ray]"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    assert {k: got[k] for k in pins} == pins
    cuda = sorted(k for k in got if k.startswith("nvidia-") and k.endswith("-cu13"))
    assert "nvidia-nccl-cu13" in cuda and "nvidia-cudnn-cu13" in cuda, cuda  # torch's CUDA 13 build
    print(f"CUDA worker: {len(got)} packages resolve for Python {python} in {time.monotonic() - t0:.0f}s; {cuda}")


# ---- what an operator pulls: sizes, labels, a push --------------------------------------------

# uncompressed, as `podman image inspect` counts them (docs/images.md lists what fills them)
SIZE_TARGETS_MB = {"api": 300, "worker": 2500}


def _largest_paths(image: str, n: int = 12) -> list[str]:
    out = podman(
        "run", "--rm", "--network=host", "--entrypoint", "sh", image, "-c",
        "du -xms /opt/venv/lib/python3*/site-packages/* /opt/venv/lib/lib* /usr/lib/python3* /usr/lib/x86_64-linux-gnu"
        " /usr/bin /usr/sbin /usr/share /var 2>/dev/null | sort -rn | head -n 40",
    ).stdout.split("\n")  # fmt: skip
    return [line for line in out if line.strip()][:n]


@needs_images
def test_images_are_within_their_size_targets_and_carry_oci_labels() -> None:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    over = []
    for key, image in IMAGES.items():
        info = json.loads(podman("image", "inspect", image).stdout)[0]
        mb = info["Size"] / 1e6
        print(f"\n{image}: {mb:.0f} MB (target {SIZE_TARGETS_MB[key]} MB); largest paths (MB):")
        print("\n".join(f"    {line}" for line in _largest_paths(image)))
        if mb > SIZE_TARGETS_MB[key]:
            over.append(f"{image} {mb:.0f} MB > {SIZE_TARGETS_MB[key]} MB")
        labels = info.get("Labels") or info["Config"].get("Labels") or {}
        assert labels.get("org.opencontainers.image.version") == VERSION, labels
        assert labels.get("org.opencontainers.image.revision", "").split("-")[0] == head, (labels, head)
        created = labels.get("org.opencontainers.image.created", "")
        assert time.strptime(created, "%Y-%m-%dT%H:%M:%SZ"), created
    assert not over, over


def _registry() -> str | None:
    return shutil.which("docker-registry") or (
        "/usr/bin/docker-registry" if Path("/usr/bin/docker-registry").exists() else None
    )


@needs_images
@pytest.mark.skipif(_registry() is None, reason="no registry to push to: apt-get install docker-registry")
def test_scripts_images_pushes_to_the_registry_the_operator_names(tmp_path: Path) -> None:
    """A registry (Debian's docker-registry, the CNCF distribution server) on loopback; `scripts/images
    --push` tags and pushes both images there, and what the registry holds carries the labels."""
    port = free_port()
    (tmp_path / "config.yml").write_text(
        "version: 0.1\nlog: {level: error}\n"
        f"storage: {{filesystem: {{rootdirectory: {tmp_path / 'store'}}}, delete: {{enabled: true}}}}\n"
        f"http: {{addr: '127.0.0.1:{port}'}}\n"
    )
    reg = subprocess.Popen(
        [str(_registry()), "serve", str(tmp_path / "config.yml")],
        stdout=open(tmp_path / "registry.log", "wb"),
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _answers(f"{base}/v2/"), 30, what="the registry")
        env = {**os.environ, "MATHRL_TAG": VERSION}
        proc = subprocess.run(
            [str(ROOT / "scripts" / "images"), "--push", f"127.0.0.1:{port}"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        catalog = httpx.get(f"{base}/v2/_catalog").json()["repositories"]
        assert set(catalog) >= {"mathrl-api", "mathrl-worker-cpu"}, catalog
        accept = "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json"
        for repo in ("mathrl-api", "mathrl-worker-cpu"):
            manifest = httpx.get(f"{base}/v2/{repo}/manifests/{VERSION}", headers={"Accept": accept})
            assert manifest.status_code == 200, manifest.text
            config = httpx.get(f"{base}/v2/{repo}/blobs/{manifest.json()['config']['digest']}").json()
            labels = config["config"]["Labels"]
            assert labels["org.opencontainers.image.version"] == VERSION and labels["org.opencontainers.image.revision"]
            print(f"pushed {repo}:{VERSION} to 127.0.0.1:{port}: {labels['org.opencontainers.image.revision']}")
    finally:
        reg.terminate()
        reg.wait(10)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


# ---- user code inside the images: the python grader's kernel boundary (issue 43) ---------------

BOUNDARY_PROBE = r"""
import errno, json, os, socket
from evaluator.sandbox import SandboxLimits, isolation, run_python
iso = isolation("kernel")
assert not iso.refused, iso.refused
probe = '''
import errno, json, os, socket
def read(p):
    try:
        return open(p).read()
    except OSError as e:
        return "refused " + errno.errorcode.get(e.errno, str(e.errno))
s = socket.socket(); s.settimeout(2)
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
userns = "made" if libc.unshare(0x10000000) == 0 else errno.errorcode.get(ctypes.get_errno())
seen = {"uid": os.getuid(), "artifact": read("/var/lib/mathrl/artifacts/secret.txt"),
        "environ": read("/proc/1/environ"), "db": errno.errorcode.get(s.connect_ex(("127.0.0.1", 5432))),
        "userns": userns}
raise RuntimeError("SEEN" + json.dumps(seen))
'''
src = "def grade(sample, item):\n" + "\n".join("    " + line for line in probe.strip().splitlines())
(raw,) = run_python(src, [({}, {})], SandboxLimits(audit_hook=False))
(hooked,) = run_python("def grade(s, i):\n    import _posixsubprocess", [({}, {})])
print("RESULT" + json.dumps({"describe": iso.describe(), "raw": raw.detail, "hooked": hooked.detail}))
"""


@needs_images
@pytest.mark.parametrize("which", ["api", "worker"])
def test_the_python_graders_kernel_boundary_holds_inside_the_image(which: str, tmp_path: Path) -> None:
    """As the chart runs the image (its user, a read-only root, the artifact volume, the admin token
    in the environment, host networking beside PostgreSQL): a grader with the audit hook switched
    off runs as nobody and reaches neither the volume, nor the process's environment, nor the database,
    and cannot make a user namespace (the system-call filter loads in the image)."""
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    (artifacts / "secret.txt").write_text("another-projects-model")
    os.chown(artifacts, 10001, 10001)
    os.chown(artifacts / "secret.txt", 10001, 10001)
    out = podman(
        "run", "--rm", "--network=host", "--user", "10001:10001", "--read-only",
        "--mount", "type=tmpfs,destination=/tmp,tmpfs-mode=1777",
        "--volume", f"{artifacts}:/var/lib/mathrl/artifacts",
        "--env", f"MATHRL_AUTH__ADMIN_TOKEN={ADMIN_TOKEN}",
        "--entrypoint", "/opt/venv/bin/python", IMAGES[which], "-c", BOUNDARY_PROBE,
    )  # fmt: skip
    result = json.loads(out.stdout.split("RESULT", 1)[1])
    print(f"\n{IMAGES[which]}: {result['describe']}; raw probe: {result['raw']}")
    assert "kernel boundary" in result["describe"], result
    seen = json.loads(result["raw"].split("SEEN", 1)[1])
    assert seen["uid"] == 65534 and seen["artifact"].startswith("refused") and seen["environ"].startswith("refused")
    assert seen["db"] in ("ECONNREFUSED", "ENETUNREACH"), seen
    assert seen["userns"] == "EPERM", seen  # the system-call filter (libseccomp in the image): no namespace of its own
    assert "_posixsubprocess is not allowed" in result["hooked"], result
