"""The worker's model references (worker/refs.py): a hub id loads from the hub only. A LoRA
adapter on the hub names its base model in adapter_config.json, and transformers loads that
base, whatever it names: before, a repository of the caller's own whose base was another
project's model on the worker's disk loaded that model, past every check a path meets at submit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.env import ROOT
from tests.helpers.fake_hub import FakeHub

pytestmark = pytest.mark.quick

# run with HF_ENDPOINT at the hub on loopback (huggingface_hub reads it when imported)
RESOLVE = r"""
import json, sys
from worker.refs import RefError, resolve_model_ref
out = {}
for ref in ("attacker/shim", "org/adapter", "org/full", "org/missing"):
    try:
        out[ref] = list(resolve_model_ref(None, "project-b", ref))
    except RefError as exc:
        out[ref] = str(exc)
if sys.argv[1:] == ["load"]:  # what the check stands in front of: transformers follows the adapter's base
    from transformers import AutoModelForCausalLM
    out["loaded"] = AutoModelForCausalLM.from_pretrained("attacker/shim").name_or_path
print(json.dumps(out))
"""


def _adapter(model: Path, folder: Path, base: str) -> Path:
    """A zero LoRA adapter on `model` (peft's own files), saved naming `base` as its base."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(model), LoraConfig(r=1, target_modules=["q_proj"]))
    peft_model.save_pretrained(folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": base}))
    return folder


def test_a_hub_adapter_whose_base_is_a_path_is_refused(tmp_path: Path) -> None:
    from trainer.tiny import build_tiny_model

    theirs = build_tiny_model(tmp_path / "artifacts" / "jobs" / "job-of-project-a" / "train" / "final", chat=True)
    shim = _adapter(Path(theirs), tmp_path / "hub" / "shim", str(theirs))
    honest = _adapter(Path(theirs), tmp_path / "hub" / "adapter", "org/base")
    models = {"attacker/shim": shim, "org/adapter": honest, "org/full": Path(theirs)}
    with FakeHub(models=models) as hub:
        env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0"}
        env["PYTHONPATH"] = str(ROOT)
        before = subprocess.run(
            [sys.executable, "-c", RESOLVE, "load"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
    assert before.returncode == 0, before.stderr[-3000:]
    got = json.loads(before.stdout.strip().splitlines()[-1])
    print(got)
    assert got["loaded"] == str(theirs)  # the premise: loading the caller's hub id gave project A's model
    assert isinstance(got["attacker/shim"], str), got  # before: ['attacker/shim', None], and the load above
    assert "adapter_config.json names" in got["attacker/shim"] and str(tmp_path) not in got["attacker/shim"]
    assert got["org/adapter"] == ["org/adapter", None] and got["org/full"] == ["org/full", None]
    assert isinstance(got["org/missing"], str) and got["org/missing"].startswith("org/missing: "), got
