"""No registry, package index or mirror host is written into the repository: index and mirror
addresses come from the machine's configuration (apt sources, pip's configuration, podman's
registries.conf) or from build arguments and values an operator sets (docs/images.md).

Two rules:
- anywhere in the tracked tree: no host of a known registry, index or mirror (KNOWN);
- in what builds, ships and installs (scripts, Dockerfile, compose file, chart): no URL at all
  whose host is a real public name; placeholders (example.com, HOST), loopback, in-cluster
  names and template expressions are fine, and ALLOWED lists the rest with why."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers.env import ROOT

pytestmark = pytest.mark.quick


# registries, package indexes and mirrors, by the names they are reached at
KNOWN = re.compile(
    r"(?<![\w.-])("
    r"(?:[\w-]+\.)*docker\.(?:io|com)|ghcr\.io|quay\.io|(?:[\w-]+\.)*gcr\.io|nvcr\.io|registry\.k8s\.io|k8s\.gcr\.io"
    r"|public\.ecr\.aws|(?:[\w-]+\.)*azurecr\.io|mcr\.microsoft\.com"
    r"|(?:[\w-]+\.)*pypi\.org|(?:[\w-]+\.)*pythonhosted\.org|(?:[\w-]+\.)*pytorch\.org|anaconda\.org"
    r"|(?:[\w-]+\.)*debian\.org|(?:[\w-]+\.)*ubuntu\.com|(?:[\w-]+\.)*npmjs\.(?:org|com)|(?:[\w-]+\.)*yarnpkg\.com"
    r"|(?:[\w-]+\.)*alpinelinux\.org|(?:[\w-]+\.)*fedoraproject\.org|(?:[\w-]+\.)*centos\.org"
    r"|(?:[\w-]+\.)*huggingface\.co|hf\.co|(?:[\w-]+\.)*download\.nvidia\.com|(?:[\w-]+\.)*aliyun(?:cs)?\.com"
    r"|(?:[\w-]+\.)*tsinghua\.edu\.cn|(?:[\w-]+\.)*ustc\.edu\.cn|(?:[\w-]+\.)*jfrog\.io"
    r"|(?:[\w-]+\.)*mirrors?[\w-]*\.(?:[\w-]+\.)*(?:com|org|net|io|edu|cn|de|jp|ru|uk|fr|kr|br)"
    r")(?![\w-])",
    re.I,
)
# where any URL's host must be a placeholder, loopback or in-cluster name
SHIPPED = ("scripts/", "Dockerfile", "compose.yaml", "helm/", ".ci/", ".dockerignore")
URL = re.compile(r"\b[a-z][a-z0-9+.-]*://(?:[^/\s@\"'`]*@)?(\[[^\]]*\]|[^/\s:\"'`)}\\]+)", re.I)
PLACEHOLDER = re.compile(
    r"^(localhost|127(\.\d+){3}|\[::1\]|0\.0\.0\.0|host|HOST|[\w-]+|"  # loopback, a bare (in-cluster) name
    r"([\w-]+\.)*example\.(com|org|net)|[\w.-]+\.(svc|internal|local|cluster\.local)|"
    r".*(\{\{|\$\{|\$\(|%s|\.\.\.|\*).*)$"  # a template, a variable, a glob, an elided value
)
# public hosts a shipped file may name, with why they are no registry or mirror
ALLOWED = {
    "json-schema.org": "the JSON Schema dialect identifier of values.schema.json (never fetched)",
    "github.com": "the chart's home: where its source is read, not where anything is installed from",
}


def tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / p for p in out.decode().split("\0") if p]


def hosts_in(path: str, text: str) -> list[str]:
    """'path:line: host' for each registry/mirror host (anywhere) and each public URL host (in
    shipped files) that `text` names."""
    found = []
    shipped = path.startswith(SHIPPED)
    for n, line in enumerate(text.splitlines(), 1):
        for m in KNOWN.finditer(line):
            found.append(f"{path}:{n}: {m.group(1)}")
        if shipped:
            for m in URL.finditer(line):
                host = m.group(1)
                if not PLACEHOLDER.match(host) and host.lower() not in ALLOWED:
                    found.append(f"{path}:{n}: {host}")
    return found


def test_no_registry_index_or_mirror_host_is_written_into_the_repository() -> None:
    found = []
    for p in tracked():
        if p == Path(__file__).resolve() or not p.is_file():
            continue
        try:
            text = p.read_text()
        except UnicodeDecodeError:
            continue
        found += hosts_in(str(p.relative_to(ROOT)), text)
    assert not found, (
        "hosts written into the repository (take them from the machine's configuration or a build "
        "argument; docs/images.md):\n" + "\n".join(found)
    )


@pytest.mark.parametrize(
    ("path", "line"),
    [
        ("Dockerfile", "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130"),
        ("Dockerfile", "RUN pip install --extra-index-url https://pypi.org/simple torch"),
        ("scripts/images", "curl -s https://registry-1.docker.io/v2/"),
        ("scripts/images", "mirror=${MATHRL_DEBIAN_MIRROR:-http://deb.debian.org/debian}"),
        ("helm/mathrl/values.yaml", "  repository: ghcr.io/acme/mathrl-api"),
        ("helm/mathrl/values.yaml", "  image: quay.io/prometheus/redis-exporter:v1"),
        ("compose.yaml", "    image: nvcr.io/nvidia/pytorch:25.01-py3"),
        ("scripts/setup", "pip install --index-url https://pip.corp-artifacts.net/simple torch"),
        ("README.md", "set PIP_INDEX_URL=https://mirrors.aliyun.com/pypi/simple"),
    ],
)
def test_the_check_finds_a_host(path: str, line: str) -> None:
    assert hosts_in(path, line), line


@pytest.mark.parametrize(
    ("path", "line"),
    [
        ("helm/mathrl/values.yaml", "  # http://mlflow.mlflow.svc:5000; empty: runs are not mirrored."),
        ("helm/mathrl/values.yaml", "  url: https://mathrl.example.com"),
        ("helm/mathrl/templates/secrets.yaml", 'printf "redis://:%s@%s-redis:6379/0"'),
        ("compose.yaml", "MATHRL_BROKER__URL: redis://redis:6379/0"),
        ("scripts/images", "--push 127.0.0.1:5000"),
        ("helm/mathrl/templates/api.yaml", "app.kubernetes.io/component: api"),
        ("Dockerfile", "ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm"),
    ],
)
def test_the_check_passes_placeholders_and_cluster_names(path: str, line: str) -> None:
    assert not hosts_in(path, line), hosts_in(path, line)
