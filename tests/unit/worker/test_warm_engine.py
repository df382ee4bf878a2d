"""The worker's pool of warm vLLM engines (worker/warm_engine.py): which job gets which engine,
and when an engine is stopped. The engine is a real process here, a sleeping Python started
through the same guard as `vllm serve` (the real server is run by tests/system/test_vllm.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from config.settings import Settings
from worker import warm_engine

pytestmark = pytest.mark.quick


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setattr(
        warm_engine, "server_command", lambda *a, **k: [sys.executable, "-c", "import time; time.sleep(600)"]
    )
    s = Settings()
    s.worker.warm_engines = 1
    s.worker.warm_engine_idle_seconds = 600
    yield s
    warm_engine.stop_idle()
    assert warm_engine.running() == []


def _acquire(settings: Settings, model: str, tmp_path: Path) -> tuple[Any, str]:
    return warm_engine.acquire(settings, model, "auto", [], tmp_path / "engine.log", None)


def test_the_next_job_of_the_same_model_reuses_the_engine(settings: Settings, tmp_path: Path) -> None:
    first, how = _acquire(settings, "/models/a", tmp_path)
    assert how == "started" and first.users == 1
    warm_engine.release(first, settings)
    second, how = _acquire(settings, "/models/a", tmp_path)
    assert how == "reused" and second is first and second.jobs == 2
    assert second.server.exited() is None
    warm_engine.release(second, settings)


def test_a_job_that_takes_only_a_warm_engine_never_starts_or_restarts_one(settings: Settings, tmp_path: Path) -> None:
    """A Tinker session samples on an engine of its base only where the worker has one warm, with
    LoRA up to its rank: `start=False` gives that engine, and None otherwise, leaving the others be."""
    log = tmp_path / "engine.log"
    assert warm_engine.acquire(settings, "/models/a", "auto", [], log, None, lora_rank=8, start=False) is None
    assert warm_engine.running() == []
    plain, _ = _acquire(settings, "/models/a", tmp_path)  # an eval's engine, without LoRA
    warm_engine.release(plain, settings)
    assert warm_engine.acquire(settings, "/models/a", "auto", [], log, None, lora_rank=8, start=False) is None
    assert warm_engine.running() == [plain] and plain.server.exited() is None  # not restarted with LoRA for it
    warm_engine.stop_idle()
    lora, _ = warm_engine.acquire(settings, "/models/a", "auto", [], log, None, lora_rank=16)
    warm_engine.release(lora, settings)
    got = warm_engine.acquire(settings, "/models/a", "auto", [], log, None, lora_rank=8, start=False)
    assert got is not None and got[0] is lora and got[1] == "reused"
    warm_engine.release(lora, settings)


def test_another_model_takes_the_slot_of_an_idle_engine_but_not_of_a_busy_one(
    settings: Settings, tmp_path: Path
) -> None:
    a, _ = _acquire(settings, "/models/a", tmp_path)
    b, how = _acquire(settings, "/models/b", tmp_path)  # a is in use: both run
    assert how == "started" and {e.key[0] for e in warm_engine.running()} == {"/models/a", "/models/b"}
    warm_engine.release(a, settings)
    warm_engine.release(b, settings)
    c, _ = _acquire(settings, "/models/c", tmp_path)  # one slot: the idle ones make way
    assert [e.key[0] for e in warm_engine.running()] == ["/models/c"]
    assert a.server.proc.wait(timeout=30) is not None and b.server.proc.wait(timeout=30) is not None
    warm_engine.release(c, settings)


def test_idle_engines_stop_after_the_idle_time_and_for_other_jobs(settings: Settings, tmp_path: Path) -> None:
    settings.worker.warm_engine_idle_seconds = 0.5
    e, _ = _acquire(settings, "/models/a", tmp_path)
    time.sleep(1.0)
    warm_engine.reap(settings)
    assert warm_engine.running() == [e]  # in use: never reaped
    warm_engine.release(e, settings)  # its timer stops it 1.5 s later
    deadline = time.monotonic() + 30
    while warm_engine.running() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert warm_engine.running() == [] and e.server.exited() is not None

    settings.worker.warm_engine_idle_seconds = 600
    f, _ = _acquire(settings, "/models/a", tmp_path)
    warm_engine.release(f, settings)
    assert warm_engine.stop_idle() == 1  # what the supervisor does before a GPU job of another kind
    assert f.server.exited() is not None


def test_a_cpu_job_of_another_kind_keeps_the_idle_engines_until_it_ends(settings: Settings, tmp_path: Path) -> None:
    """Issue 46.4: a training job used to stop the warm engine, and the first chat with the model it
    trained waited minutes for a new one. A CPU job holds the idle engines instead (they take memory,
    not cores): none expires or is stopped under it, and after it a checkpoint of that family reloads
    into the engine (the reload on a real server: tests/system/test_vllm.py)."""
    settings.worker.warm_engine_idle_seconds = 0.5
    e, _ = _acquire(settings, "/models/a", tmp_path)
    warm_engine.release(e, settings)
    held = warm_engine.hold_idle()  # what the supervisor does before a CPU job of another kind
    assert held == [e] and e.users == 1
    time.sleep(1.0)
    warm_engine.reap(settings)
    assert warm_engine.stop_idle() == 0 and warm_engine.running() == [e] and e.server.exited() is None
    for kept in held:  # the job ended
        warm_engine.release(kept, settings)
    assert e.users == 0 and warm_engine.running() == [e]  # idle again: its clock starts now


def test_an_engine_that_died_is_replaced(settings: Settings, tmp_path: Path) -> None:
    e, _ = _acquire(settings, "/models/a", tmp_path)
    warm_engine.release(e, settings)
    e.server.stop()
    f, how = _acquire(settings, "/models/a", tmp_path)
    assert how == "started" and f is not e and f.server.exited() is None
    warm_engine.release(f, settings)


def _checkpoint(folder: Path, weights: bytes, **config: Any) -> str:
    """A model folder as a trainer saves one: config, tokenizer, safetensors weights."""
    import json

    folder.mkdir(parents=True)
    cfg = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "_name_or_path": str(folder), **config}
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0}}}')
    (folder / "model.safetensors").write_bytes(weights)
    return str(folder)


def test_checkpoints_of_one_model_share_a_family_and_other_models_do_not(tmp_path: Path) -> None:
    step8 = _checkpoint(tmp_path / "checkpoint-8", b"weights at step 8", transformers_version="5.17.0")
    step16 = _checkpoint(tmp_path / "checkpoint-16", b"weights at step 16", transformers_version="5.16.0")
    family = warm_engine.model_family(step8)
    assert family is not None and warm_engine.model_family(step16) == family  # weights and save fields aside
    wider = _checkpoint(tmp_path / "wider", b"w", hidden_size=128)
    assert warm_engine.model_family(wider) != family
    other_tokenizer = _checkpoint(tmp_path / "other-tok", b"w")
    (Path(other_tokenizer) / "tokenizer.json").write_text('{"model": {"vocab": {"b": 0}}}')
    assert warm_engine.model_family(other_tokenizer) != family
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    assert warm_engine.model_family(str(adapter)) is None  # no config.json: never reloaded
    assert warm_engine.model_family("org/hub-model") is None
    (Path(step16) / "model.safetensors").unlink()
    assert warm_engine.model_family(step16) is None  # vLLM's reload reads safetensors


def test_a_fine_tune_and_its_base_share_a_family_whatever_its_save_rewrote(tmp_path: Path) -> None:
    """Issue 69.1: a trained model differs from its base in `use_cache`, in `eos_token_id: [2]` against `2`
    and in re-serialised tokenizer files, so a base and its fine-tune never shared an engine: the first
    chat with an `ft:` model, base warm, waited for a new engine (99.6 s here). What the files mean
    decides now; what changes the engine's answers still parts them."""
    import json

    def save(folder: Path, eos: Any, tokenizer: dict[str, Any], tok_config: dict[str, Any], **config: Any) -> str:
        indent = config.pop("indent", None)
        path = _checkpoint(folder, b"w", eos_token_id=eos, use_cache=config.pop("use_cache", True), **config)
        (folder / "tokenizer.json").write_text(json.dumps(tokenizer, indent=indent))
        (folder / "tokenizer_config.json").write_text(json.dumps(tok_config))
        (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": eos, "transformers_version": "5"}))
        return path

    vocab = {"a": 0, "b": 1, "ab": 2, "<eos>": 3}
    tokenizer = {"model": {"type": "BPE", "vocab": vocab, "merges": ["a b"]}, "added_tokens": []}
    template = {"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}", "eos_token": "<eos>"}
    base = save(tmp_path / "base", 3, tokenizer, template)
    resaved = {  # what another tokenizers version writes: merges as pairs, null fields, another order
        "added_tokens": [],
        "model": {"merges": [["a", "b"]], "vocab": vocab, "type": "BPE", "dropout": None},
    }
    fine_tune = save(
        tmp_path / "ft", [3], resaved, {**template, "eos_token": {"content": "<eos>", "special": True}},
        use_cache=False, indent=2,
    )  # fmt: skip
    family = warm_engine.model_family(base)
    assert family is not None and warm_engine.model_family(fine_tune) == family
    stops_more = save(tmp_path / "eos", [3, 2], tokenizer, template)  # the engine would not stop where it does
    other_template = save(tmp_path / "tpl", 3, tokenizer, {**template, "chat_template": "{{ messages }}"})
    other_merges = save(tmp_path / "bpe", 3, {**tokenizer, "model": {**tokenizer["model"], "merges": []}}, template)
    deeper = save(tmp_path / "deep", 3, tokenizer, template, num_hidden_layers=4)
    for other in (stops_more, other_template, other_merges, deeper):
        assert warm_engine.model_family(other) != family, other


def test_a_checkpoint_of_the_same_family_reloads_an_idle_engine_and_a_failed_reload_starts_anew(
    settings: Settings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The stand-in server answers no HTTP, so its reload fails: that engine is stopped and a new one
    started for the checkpoint (the reload itself, on a real vLLM server: tests/system/test_vllm.py)."""
    step8 = _checkpoint(tmp_path / "checkpoint-8", b"8")
    step16 = _checkpoint(tmp_path / "checkpoint-16", b"16")
    e, how = _acquire(settings, step8, tmp_path)
    assert how == "started" and e.family == warm_engine.model_family(step8)
    busy, how = _acquire(settings, step16, tmp_path)  # e is busy: never reloaded under a running job
    assert how == "started" and busy is not e
    warm_engine.release(busy, settings)
    warm_engine.release(e, settings)
    assert not any("reloading" in r.message for r in caplog.records)
    f, how = _acquire(settings, _checkpoint(tmp_path / "checkpoint-24", b"24"), tmp_path)
    assert how == "started" and f is not e and f is not busy
    (failed,) = [r.getMessage() for r in caplog.records if "reloading" in r.message]
    assert "checkpoint-24" in failed and "checkpoint-8" in failed, failed  # tried on the oldest idle one
    assert e.server.proc.wait(timeout=30) is not None
    warm_engine.release(f, settings)


def test_a_reload_holds_up_only_the_jobs_of_its_own_model(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loading a checkpoint's weights into an idle engine takes up to RELOAD_TIMEOUT (600 s). It ran
    under the pool's one lock, so every other job of the worker (another project's, another model's)
    waited for it to take or give back its engine: here 3 s and more instead of at once."""
    import threading

    settings.worker.warm_engines = 3
    unblock, reloading = threading.Event(), threading.Event()

    def slow_reload(server: Any, model_path: str) -> float:
        reloading.set()
        assert unblock.wait(30)
        return 1.0

    monkeypatch.setattr(warm_engine, "reload_weights", slow_reload)
    step8 = _checkpoint(tmp_path / "checkpoint-8", b"8")
    e, _ = _acquire(settings, step8, tmp_path)
    other, _ = _acquire(settings, "/models/other", tmp_path)  # another model's engine, in use
    warm_engine.release(e, settings)
    step16 = _checkpoint(tmp_path / "checkpoint-16", b"16")
    got: dict[str, Any] = {}
    loader = threading.Thread(target=lambda: got.setdefault("a", _acquire(settings, step16, tmp_path)))
    loader.start()
    assert reloading.wait(10)
    t = time.monotonic()
    warm_engine.release(other, settings)  # another job ends, and another starts, while the reload runs
    again, how = _acquire(settings, "/models/other", tmp_path)
    assert how == "reused" and again is other and time.monotonic() - t < 1.0
    waiter = threading.Thread(target=lambda: got.setdefault("b", _acquire(settings, step16, tmp_path)))
    waiter.start()  # a second job of the model being loaded waits for it, then shares the engine
    time.sleep(0.5)
    assert waiter.is_alive() and "b" not in got
    unblock.set()
    loader.join(10)
    waiter.join(10)
    assert got["a"] == (e, "reloaded") and got["b"] == (e, "reused") and e.users == 2
    for engine in (e, e, again):
        warm_engine.release(engine, settings)


def test_the_context_length_is_the_models_up_to_the_cap(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"max_position_embeddings": 8192}')
    assert warm_engine.max_model_len(str(tmp_path), 4096) == 4096
    assert warm_engine.max_model_len(str(tmp_path), 16384) == 8192
    assert warm_engine.max_model_len(str(tmp_path / "missing"), 4096) == 4096


def _adapter(root: Path, name: str, base: str, r: int) -> Path:
    adapter = root / name
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": base, "r": r}))
    return adapter


def test_a_lora_checkpoint_is_served_by_its_bases_engine_with_lora_on(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A generate job whose model is an adapter directory (a LoRA job's checkpoint) gets the engine
    of the adapter's base model, started with LoRA up to the adapter's rank (vLLM's bound above
    it), and the adapter to load; an idle engine of the base without LoRA is replaced, a busy one
    is not, and another adapter of the same base and rank shares the engine."""
    from mathrl.specs import parse_spec
    from worker import supervisor

    commands: list[tuple[Any, ...]] = []
    monkeypatch.setattr(
        warm_engine,
        "server_command",
        lambda *a: commands.append(a) or [sys.executable, "-c", "import time; time.sleep(600)"],
    )
    base = str(tmp_path / "base")
    first, second = _adapter(tmp_path, "checkpoint-4", base, 4), _adapter(tmp_path, "checkpoint-8", base, 8)
    monkeypatch.setattr(supervisor, "event", lambda *a, **k: None)
    settings.database.url = f"sqlite:///{tmp_path / 'db.sqlite'}"

    def generate(model: Path) -> Any:
        spec = parse_spec({"kind": "generate", "model": str(model), "prompt": "1 + 1 =", "backend": "vllm"})
        return supervisor._warm_engine(settings, spec, "p", tmp_path / "engine.log", "job", [])

    plain, _ = _acquire(settings, base, tmp_path)  # the base alone, busy: it cannot take LoRA now
    assert plain.lora_rank == 0 and generate(first) is None
    warm_engine.release(plain, settings)
    engine, loads = generate(first)  # idle now: replaced by one with LoRA
    assert loads == str(first) and engine.key[0] == base and engine.lora_rank == 8 and engine is not plain
    assert (
        plain.server.proc.wait(timeout=30) is not None and commands[-1][5] == 8
    )  # (model, dtype, length, port, gpus, lora_rank, engine settings)
    warm_engine.release(engine, settings)
    again, loads = generate(second)
    assert again is engine and loads == str(second) and len(commands) == 2
    warm_engine.release(again, settings)
    same, _ = _acquire(settings, base, tmp_path)  # the base model itself on the LoRA engine
    assert same is engine
    warm_engine.release(same, settings)


def test_only_an_adapter_directory_is_an_adapter(tmp_path: Path) -> None:
    adapter = _adapter(tmp_path, "a", "/models/base", 16)
    assert warm_engine.adapter_of(str(adapter)) == warm_engine.Adapter(str(adapter), "/models/base", 16)
    (adapter / "config.json").write_text("{}")  # a merged checkpoint: a full model
    assert warm_engine.adapter_of(str(adapter)) is None
    assert warm_engine.adapter_of(str(tmp_path / "missing")) is None
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "adapter_config.json").write_text("{}")  # no base named: not one an engine can serve
    assert warm_engine.adapter_of(str(tmp_path / "b")) is None


def test_a_shared_engines_log_stays_the_workers(tmp_path: Path) -> None:
    """A warm engine serves one job after another, other projects' among them, and logs their
    models' paths (a reload names the model before it). Before: it logged into the folder of the
    job that started it, and where it exited under a later job, that job's error and events got
    the log's tail. Now it logs in the worker's engines/ folder, and the job gets the exit code.
    A real exited server process and a real store (SQLite)."""
    import subprocess

    from sqlalchemy import select

    from store.db import session_scope
    from store.models import Event
    from tests.helpers.store import store_with_jobs
    from worker import record
    from worker.attempt import AttemptDir, job_dir
    from worker.vllm_server import VLLMServer

    log = warm_engine.log_path(tmp_path, "job-of-project-a")
    assert log.parent == tmp_path.resolve() / "engines" and not log.is_relative_to(
        job_dir(tmp_path, "job-of-project-a")
    )
    log.write_text("mathrl: reloaded /artifacts/jobs/job-of-project-a/train/final into the warm engine of org/m\n")
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    proc.wait()
    server = VLLMServer(proc, "http://127.0.0.1:1", log)
    url, _, (job_id,) = store_with_jobs(
        tmp_path, {"kind": "eval", "resolved_config": {"kind": "eval"}, "queue": "parked"}, project="project-b"
    )
    for shared in (True, False):
        out = tmp_path / ("shared" if shared else "own")
        out.mkdir()
        record.report_server_exit(url, job_id, server, out, shared=shared)
        said = AttemptDir(out).read_error() or ""
        assert ("job-of-project-a" in said) is (not shared), said  # the job's own server: its log's tail, as before
        with session_scope(url) as s:
            last = s.scalars(select(Event).where(Event.job_id == job_id).order_by(Event.seq.desc())).first()
            assert last is not None and last.type == "vllm_server"
            recorded = last.message + json.dumps(last.data)
        assert ("job-of-project-a" in recorded) is (not shared), recorded


def test_an_adapter_past_vllms_largest_rank_says_why() -> None:
    """An eval on vLLM of an r=600 LoRA checkpoint failed with 'StopIteration: ' and nothing more."""
    from worker.vllm_server import lora_rank

    assert (lora_rank(4), lora_rank(320), lora_rank(512)) == (8, 320, 512)
    with pytest.raises(ValueError, match="rank 600: vLLM serves ranks up to 512; use backend 'hf'"):
        lora_rank(600)


BASE_CHECK = """
import sys
from runtime.errors import RefError
from mathrl.specs import parse_spec
from config.settings import Settings
from worker import supervisor, warm_engine
warm_engine.server_command = lambda *a, **k: [sys.executable, "-c", "import time; time.sleep(60)"]
supervisor.event = lambda *a, **k: None
settings = Settings()
settings.database.url = "sqlite:///" + sys.argv[2] + "/db.sqlite"
spec = parse_spec({"kind": "generate", "model": sys.argv[1], "prompt": "1 + 1 =", "backend": "vllm"})
try:
    supervisor._warm_engine(settings, spec, "p", __import__("pathlib").Path(sys.argv[2]) / "engine.log", "job", [])
    print("served")
except RefError as exc:
    print("refused:", exc)
warm_engine.stop_idle()
"""


def test_a_lora_checkpoints_hub_base_is_checked_before_an_engine_serves_it(tmp_path: Path) -> None:
    """The warm engine serves a LoRA checkpoint's base, named in its adapter_config.json. A hub base
    whose owner since made it load a path in its place (config.json's speculators verifier: vLLM serves
    that path, another project's model) was served unchecked: only a hub id the job named was checked."""
    from tests.helpers.fake_hub import FakeHub

    base = tmp_path / "hub-base"
    base.mkdir()
    theirs = str(tmp_path / "artifacts" / "jobs" / "theirs" / "train" / "final")
    speculators = {"speculators_model_type": "eagle3", "verifier": {"name_or_path": theirs}}
    (base / "config.json").write_text(json.dumps({"model_type": "llama", "speculators_config": speculators}))
    adapter = _adapter(tmp_path, "checkpoint-4", "attacker/base", 4)
    with FakeHub(models={"attacker/base": base}) as hub:
        env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0"}
        env["PYTHONPATH"] = str(Path(__file__).resolve().parents[3])
        run = subprocess.run(
            [sys.executable, "-c", BASE_CHECK, str(adapter), str(tmp_path)],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout.strip().splitlines()[-1]
    assert out.startswith("refused:") and "names another model to load in its place" in out, out
    assert theirs not in out, out


def test_a_model_vllms_cpu_build_cannot_run_gets_no_engine(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 66.8: an engine of the tiny model (heads 16 wide) started, then died at its first request,
    and the batch failed with the engine's exit code. Now the worker reads the model's config.json
    before it starts one: a job that names vLLM fails saying why; 'auto' answers on transformers, and
    says so; other idle engines are kept through it, as for any CPU job."""
    from mathrl.specs import parse_spec
    from worker import supervisor

    said: list[tuple[Any, ...]] = []
    monkeypatch.setattr(supervisor, "event", lambda *a, **k: said.append(a))
    monkeypatch.setattr(supervisor, "model_resolver", lambda *a: lambda ref: (ref, None))
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    (tiny / "config.json").write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4}))
    chat = {"kind": "generate", "model": str(tiny), "prompt": "1 + 1 ="}

    def warm(backend: str) -> Any:
        spec = parse_spec({**chat, "backend": backend})
        return supervisor._warm_engine(settings, spec, "p", tmp_path / "engine.log", "job", [])

    with pytest.raises(supervisor.EngineUnfit, match="heads are 16 wide.*: set backend to 'hf'"):
        warm("vllm")
    assert warm("auto") == supervisor.ON_TRANSFORMERS and warm_engine.running() == []
    (_, _, kind, message, data, level) = said[-1]
    assert (kind, data["how"], level) == ("vllm_engine", "transformers", "warning")
    assert message.endswith("heads are 16 wide, and its CPU kernels take 32, 48, 64, 80, 96, 112, 128, 160, 192, "
                            "224, 256, 512: answering with transformers instead"), message  # fmt: skip
    (tiny / "config.json").write_text(json.dumps({"hidden_size": 128, "num_attention_heads": 2}))
    engine, adapter = warm("vllm")  # 64 wide: it fits
    assert engine.server.exited() is None and adapter is None
    warm_engine.release(engine, settings)


def test_a_shared_engine_that_died_names_its_reason_not_its_users_requests(tmp_path: Path) -> None:
    """The warm engine's job gets the exception its engine core died of (from the worker's log of it),
    never what its API server logged about requests, other projects' among them."""
    import subprocess

    from tests.helpers.store import store_with_jobs
    from tests.unit.worker.test_generation import DIED_AT_A_REQUEST
    from worker import record
    from worker.attempt import AttemptDir
    from worker.vllm_server import VLLMServer

    log = warm_engine.log_path(tmp_path, "job-of-project-a")
    log.write_text("\n".join(DIED_AT_A_REQUEST) + "\n")
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(0)"])
    proc.wait()
    url, _, (job_id,) = store_with_jobs(
        tmp_path, {"kind": "generate", "resolved_config": {"kind": "generate"}, "queue": "parked"}, project="b"
    )
    record.report_server_exit(url, job_id, VLLMServer(proc, "http://127.0.0.1:1", log), tmp_path, shared=True)
    said = AttemptDir(tmp_path).read_error() or ""
    assert said.startswith(
        "the worker's shared vLLM engine exited with code 0: RuntimeError: Unsupported CPU attention "
        "configuration: head_dim=16"
    ), said
    assert "secret" not in said and "/models/tiny" not in said and "cmpl-" not in said, said
