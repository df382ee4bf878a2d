"""The offline GPU bundle (`scripts/gpu-bundle`, docs/gpu.md) is complete: on a node that has only
torch, transformers, accelerate, peft, pyarrow, huggingface_hub and pandas (each with what pip
installs beside it), the bundle's packages are all the acceptance run needs. Such a node is
built here as a directory of links to this environment's installed copies of exactly those
distributions in an empty virtual environment's site-packages, and the acceptance run's CPU
form runs GRPO and the evals there. Before issue 45 the bundle lacked xxhash and requests, and
GRPO failed on such a node with "No module named 'xxhash'"."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.helpers.env import ROOT

NODE = ["torch", "transformers", "accelerate", "peft", "pyarrow", "huggingface_hub", "pandas"]


def bundle_names() -> list[str]:
    """The distributions scripts/gpu-bundle downloads (its `names=` list)."""
    text = (ROOT / "scripts" / "gpu-bundle").read_text()
    match = re.search(r'^names="([^"]*)"', text, re.M)
    assert match, "scripts/gpu-bundle has no names= list"
    return match.group(1).split()


def closure(names: list[str]) -> set[str]:
    """The distributions `names` need, as pip installs them (no extras)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        dist = metadata.distribution(todo.pop())
        key = dist.metadata["Name"].lower().replace("_", "-")
        if key in seen:
            continue
        seen.add(key)
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            try:
                metadata.distribution(req.name)
            except metadata.PackageNotFoundError:  # an optional platform package pip would skip here too
                continue
            todo.append(req.name)
    return seen


def link_site(dists: set[str], site: Path) -> None:
    """A directory holding exactly `dists`: a link to each top-level file or folder they installed."""
    site.mkdir()
    for name in dists:
        dist = metadata.distribution(name)
        for f in dist.files or []:
            top = f.parts[0]
            if top in ("..", "__pycache__") or top.endswith(".pth"):
                continue
            src = Path(str(dist.locate_file(top)))
            if src.exists() and not (site / top).exists():
                (site / top).symlink_to(src)


@pytest.mark.slow
def test_the_bundle_is_all_a_bare_gpu_node_needs(tmp_path: Path) -> None:
    node = closure(NODE)
    bundle = {n.lower().replace("_", "-") for n in bundle_names()}
    assert {"xxhash", "requests", "pydantic-settings"} <= bundle
    venv = tmp_path / "node"  # an empty environment: its site-packages gets the links
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site_packages,) = venv.glob("lib/python3*/site-packages")
    site_packages.rmdir()
    link_site(node | bundle, site_packages)
    python = str(venv / "bin" / "python")
    out = tmp_path / "report.json"
    cmd = [python, "-m", "service.gpu_check", "--device=cpu", "--steps=2", "--heldout=4",
           "--eval-tokens=8", "--min-gain=-100", f"--out={out}"]  # fmt: skip
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["passed"] and report["runs"][0]["steps"] == 2
    # nothing came from this environment's site-packages beyond the linked distributions
    probe = subprocess.run(
        [python, "-c", "import importlib.util as u; print(u.find_spec('fastapi') is None)"],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert probe.stdout.strip() == "True", "the bare node sees packages outside the bundle"
