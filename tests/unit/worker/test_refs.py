"""The worker's model references (worker/refs.py): a hub id loads from the hub only. A LoRA
adapter on the hub names its base model in adapter_config.json, and transformers loads that
base, whatever it names: before, a repository of the caller's own whose base was another
project's model on the worker's disk loaded that model, past every check a path meets at submit."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.env import ROOT
from tests.helpers.fake_hub import FakeHub

pytestmark = pytest.mark.quick

# run with HF_ENDPOINT at the hub on loopback (huggingface_hub reads it when imported)
RESOLVE = r"""
import json, shutil, sys
from pathlib import Path
from evaluator.models import load_model
from worker.refs import RefError, resolve_model_ref
shim, swap = sys.argv[1:]
out = {}
for ref in ("attacker/shim", "org/adapter", "org/full", "org/missing", "attacker/swap", "attacker/spec", "org/spec"):
    try:
        out[ref] = list(resolve_model_ref(None, "project-b", ref))
    except RefError as exc:
        out[ref] = str(exc)
# what the check stands in front of: transformers follows the adapter's base, here project A's model
from transformers import AutoModelForCausalLM
out["loaded"] = AutoModelForCausalLM.from_pretrained("attacker/shim").name_or_path
# the owner of attacker/swap, a full model when the job resolved it, pushes the shim's adapter before the load
for name in ("adapter_config.json", "adapter_model.safetensors"):
    shutil.copy(Path(shim) / name, Path(swap) / name)
try:
    out["swapped"] = load_model("attacker/swap").name_or_path
except RefError as exc:
    out["swapped"] = str(exc)
out["full"] = load_model("org/full").name_or_path
# TRL loads a GRPO job's policy and reference model from the id itself: checked after it did
from datasets import Dataset
from trl import GRPOConfig
from evaluator.models import load_tokenizer
from trainer.vllm_generation import TimedGRPOTrainer
args = GRPOConfig(output_dir="grpo", beta=0.1, num_generations=2, per_device_train_batch_size=2, max_steps=1,
                  max_completion_length=4, use_cpu=True, bf16=False, report_to=[], save_strategy="no")
try:
    TimedGRPOTrainer(model="attacker/swap", reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
                     args=args, train_dataset=Dataset.from_list([{"prompt": "1+1="}] * 2),
                     processing_class=load_tokenizer("org/full"))
    out["grpo"] = "constructed"
except RefError as exc:
    out["grpo"] = str(exc)
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
    swap = tmp_path / "hub" / "swap"
    shutil.copytree(theirs, swap)  # the caller's "own" full model, when its job resolves it
    models = {"attacker/shim": shim, "org/adapter": honest, "org/full": Path(theirs), "attacker/swap": swap}
    for name, verifier in (("attacker/spec", str(theirs)), ("org/spec", "org/base")):  # vLLM serves the verifier
        repo = models[name] = tmp_path / "hub" / name.replace("/", "-")
        shutil.copytree(theirs, repo)
        config = json.loads((repo / "config.json").read_text())
        speculators = {"speculators_model_type": "eagle3", "verifier": {"name_or_path": verifier}}
        (repo / "config.json").write_text(json.dumps({**config, "speculators_config": speculators}))
    with FakeHub(models=models) as hub:
        env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0"}
        env["PYTHONPATH"] = str(ROOT)
        run = subprocess.run(
            [sys.executable, "-c", RESOLVE, str(shim), str(swap)],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["loaded"] == str(theirs)  # the premise: loading the caller's hub id gave project A's model
    assert isinstance(got["attacker/shim"], str), got  # before: ['attacker/shim', None], and the load above
    for name in ("attacker/shim", "attacker/spec"):  # spec: before, ['attacker/spec', None], and vLLM served A's
        assert "names another model to load in its place" in got[name] and str(tmp_path) not in got[name], got
    assert got["org/spec"] == ["org/spec", None], got
    assert got["org/adapter"] == ["org/adapter", None] and got["org/full"] == ["org/full", None]
    assert isinstance(got["org/missing"], str) and got["org/missing"].startswith("org/missing: "), got
    # changed after the check: the load itself refuses what it loaded (before: project A's model)
    assert got["attacker/swap"] == ["attacker/swap", None], got
    assert isinstance(got["swapped"], str) and "loads from the hub only" in got["swapped"], got
    assert str(tmp_path) not in got["swapped"] and got["full"] == "org/full", got
    assert "loads from the hub only" in got["grpo"], got  # before: constructed, on project A's model


def test_a_deleted_final_model_is_no_longer_resolved(tmp_path: Path) -> None:
    """DELETE /v1/models/{model} of a job's final model: 'job:<id>@final' fails with the reason
    instead of loading the job's newest checkpoint in its place."""
    from mathrl.modelref import FINAL_DELETED_TAG
    from store.db import session_scope
    from store.models import Checkpoint, Job
    from tests.helpers.store import store_with_jobs
    from worker.refs import RefError, resolve_model_ref

    url, project_id, (job_id,) = store_with_jobs(tmp_path, {"status": "succeeded"})
    with session_scope(url) as s:
        job = s.get(Job, job_id)
        assert job is not None
        s.add(Checkpoint(job_id=job.id, step=10, kind="checkpoint", uri=str(tmp_path / "checkpoint-10")))
        assert resolve_model_ref(s, project_id, f"job:{job.id}@final")[0].endswith("checkpoint-10")
        job.tags = [FINAL_DELETED_TAG]
        s.flush()
        for ref in (f"job:{job.id}@final", f"job:{job.id}"):
            with pytest.raises(RefError, match="final model was deleted"):
                resolve_model_ref(s, project_id, ref)
        assert resolve_model_ref(s, project_id, f"job:{job.id}@step-10")[0].endswith("checkpoint-10")


UNREACHABLE = r"""
import time
from worker.refs import RefError, resolve_model_ref
t0 = time.monotonic()
try:
    resolve_model_ref(None, "project-a", "no-such-org/no-such-model")
    print("resolved")
except RefError as exc:
    print(f"{time.monotonic() - t0:.1f}", exc)
"""


def test_a_hub_id_where_no_hub_answers_fails_in_seconds_naming_why(tmp_path: Path) -> None:
    """Issue 69.6: an unknown hub id on a machine with no hub failed its Tinker future after 119 s of
    huggingface_hub's retries. A port nothing listens on stands in for the unreachable hub."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: connections to it are refused
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{port}", "HF_HOME": str(tmp_path / "hf")}
    env.pop("HF_HUB_OFFLINE", None)
    out = subprocess.run(
        [sys.executable, "-c", UNREACHABLE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    seconds, said = out.stdout.strip().split(" ", 1)
    assert float(seconds) < 10, out.stdout
    assert "no-such-org/no-such-model: this model is not in the worker's model cache" in said, said
    assert f"the hub (http://127.0.0.1:{port}) cannot be reached" in said and "ConnectError" in said, said
