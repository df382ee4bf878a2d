"""mathrl against lm-evaluation-harness (pinned: LM_EVAL below), each in its own environment.

    .venv/bin/python bench/lm_eval_compare.py fixtures            # rewrite tests/fixtures/lm_eval/*.json
    .venv/bin/python bench/lm_eval_compare.py compare --limit 200  # times, scores, per-item agreement

Both make lm-eval's own tasks (gsm8k, gsm8k_cot, minerva_math500) read the local copies in the
data dir (a task file that `include`s the installed task and changes only its dataset), since
the hub cannot be reached here; prompts, shots, stop strings and filters stay lm-eval's.

`fixtures` runs lm-eval with --log_samples on the first few items and stores the prompt it
built for each (the test tests/unit/evaluator/test_recipes.py renders the same items with our recipes and
compares them character for character, and token for token through the model's tokenizer).

`compare` evaluates the first --limit GSM8K test problems with lm-eval's `gsm8k` task (5-shot,
HF backend, greedy, --batch-size, 256 new tokens) and then, as eval jobs through the embedded
service (API, SQLite, one worker), with mathrl's `lm-eval-gsm8k` recipe on the same model,
batch size and length: an HF-backend job, a vLLM job on a new engine (cold: the engine start is
in its time), a second vLLM job on the engine the worker kept warm, and a vLLM job on a checkpoint
of the model (its files hard-linked under another path: the same family, so the warm engine
reloads its weights instead of starting; the same weights, so its completions must still be
lm-eval's). It prints each time
(lm-eval: command start -> results file; mathrl: job submitted -> scores stored), the ratios,
the scores and how many prompts and completions are identical to lm-eval's.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LM_EVAL = "lm_eval[hf,math]==0.4.13"
TORCH = "torch==2.13.0"  # the CPU build here; an unpinned torch pulls the CUDA packages
ENV = ROOT / ".mathrl" / "lm-eval"
FIXTURES = ROOT / "tests" / "fixtures" / "lm_eval"
# our recipe -> (lm-eval's task file under lm_eval/tasks, the local data files by split)
TASKS = {
    "lm-eval-gsm8k": ("gsm8k/gsm8k.yaml", {"train": "gsm8k_train.jsonl", "test": "gsm8k_test.jsonl"}),
    "lm-eval-gsm8k-cot": ("gsm8k/gsm8k-cot.yaml", {"train": "gsm8k_train.jsonl", "test": "gsm8k_test.jsonl"}),
    "minerva-math": ("minerva_math/minerva_math500.yaml", {"test": "math500_test.jsonl"}),
}
BENCHMARK = {"lm-eval-gsm8k": "gsm8k", "lm-eval-gsm8k-cot": "gsm8k", "minerva-math": "math500"}


def lm_eval_python() -> Path:
    """The environment with lm-eval in it, made on first use."""
    py = ENV / "venv" / "bin" / "python"
    stamp = ENV / "venv" / ".installed"
    if not stamp.exists() or stamp.read_text() != LM_EVAL:
        print(f"installing {LM_EVAL} into {ENV / 'venv'} (one time; pip's output: {ENV / 'install.log'})", flush=True)
        ENV.mkdir(parents=True, exist_ok=True)
        with (ENV / "install.log").open("w") as log:
            if not py.exists():
                subprocess.run([sys.executable, "-m", "venv", str(ENV / "venv")], check=True, stdout=log, stderr=log)
            subprocess.run([str(py), "-m", "pip", "install", TORCH, LM_EVAL], check=True, stdout=log, stderr=log)
        stamp.write_text(LM_EVAL)
    return py


def task_files(py: Path, recipes: list[str], data_dir: Path, out: Path) -> dict[str, str]:
    """A task file per recipe: lm-eval's own task, reading the local data. Returns recipe -> task name."""
    tasks_dir = subprocess.run(
        [str(py), "-c", "import lm_eval.tasks, os; print(os.path.dirname(lm_eval.tasks.__file__))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    names = {}
    out.mkdir(parents=True, exist_ok=True)
    for recipe in recipes:
        task_file, files = TASKS[recipe]
        name = "mathrl_" + recipe.replace("-", "_")
        data = "\n".join(f"    {split}: {data_dir / f}" for split, f in files.items())
        (out / f"{name}.yaml").write_text(
            f"include: {tasks_dir}/{task_file}\ntask: {name}\ndataset_path: json\ndataset_name: null\n"
            f"dataset_kwargs:\n  data_files:\n{data}\n"
        )
        names[recipe] = name
    return names


def run_lm_eval(
    py: Path, model: str, tasks: list[str], include: Path, out: Path, limit: int, extra: list[str]
) -> float:
    cmd = [
        str(py), "-m", "lm_eval", "--model", "hf",
        "--model_args", f"pretrained={model},dtype=float32",
        "--tasks", ",".join(tasks), "--include_path", str(include),
        "--limit", str(limit), "--log_samples", "--output_path", str(out), *extra,
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.perf_counter()
    with (out.parent / "lm_eval.log").open("w") as log:
        subprocess.run(cmd, check=True, env=env, stdout=log, stderr=log)
    return time.perf_counter() - t0


def samples(out: Path, task: str) -> list[dict]:
    """lm-eval's logged samples of a task, one per document (it logs a document once per filter)."""
    found = sorted(glob.glob(str(out / "**" / f"samples_{task}_2*.jsonl"), recursive=True))
    by_doc: dict[int, dict] = {}
    for line in Path(found[-1]).read_text().splitlines():
        row = json.loads(line)
        by_doc.setdefault(row["doc_id"], {})[row["filter"]] = row
    return [by_doc[d] for d in sorted(by_doc)]


def fixtures(args: argparse.Namespace) -> None:
    py = lm_eval_python()
    work = ROOT / ".mathrl" / "lm-eval" / "fixtures-run"
    names = task_files(py, list(TASKS), Path(args.data_dir), work / "tasks")
    tasks, out = list(names.values()), work / "out"
    seconds = run_lm_eval(py, args.model, tasks, work / "tasks", out, args.limit, ["--gen_kwargs", "max_gen_toks=4"])
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for recipe, task in names.items():
        rows = samples(work / "out", task)
        items = []
        for by_filter in rows:
            row = next(iter(by_filter.values()))
            args_ = row["arguments"]["gen_args_0"]
            items.append(
                {
                    "doc_id": row["doc_id"],
                    "question": row["doc"].get("question") or row["doc"].get("problem"),
                    "prompt": args_["arg_0"],
                    "until": args_["arg_1"]["until"],
                }
            )
        path = FIXTURES / f"{recipe}.json"
        record = {"lm_eval": LM_EVAL, "task": TASKS[recipe][0], "benchmark": BENCHMARK[recipe], "items": items}
        path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
        print(f"{path.relative_to(ROOT)}: {len(items)} prompts from lm-eval's {TASKS[recipe][0]}")
    print(f"lm-eval ran in {seconds:.0f} s")


def compare(args: argparse.Namespace) -> None:
    py = lm_eval_python()
    work = Path(args.work)
    names = task_files(py, ["lm-eval-gsm8k"], Path(args.data_dir), work / "tasks")
    task = names["lm-eval-gsm8k"]
    bs = str(args.batch_size)
    lm_seconds = run_lm_eval(
        py, args.model, [task], work / "tasks", work / "lm-eval", args.limit,
        ["--batch_size", bs, "--gen_kwargs", f"max_gen_toks={args.max_new_tokens}"],
    )  # fmt: skip
    theirs = samples(work / "lm-eval", task)
    lm_strict = sum(t["strict-match"]["exact_match"] for t in theirs) / len(theirs)
    lm_flex = sum(t["flexible-extract"]["exact_match"] for t in theirs) / len(theirs)
    print(
        f"GSM8K test, first {args.limit} problems, {Path(args.model).name}, fp32, greedy, {args.max_new_tokens} new "
        f"tokens, batch {bs}, {os.cpu_count()} CPU cores\n"
        f"  lm-eval {LM_EVAL.split('==')[1]} gsm8k (5-shot, HF backend): {lm_seconds:7.1f} s "
        f"(command start -> results file)  strict-match {lm_strict:.1%}  flexible-extract {lm_flex:.1%}",
        flush=True,
    )
    wanted = args.backends.split(",")
    every = (("hf", "HF"), ("vllm", "vLLM, cold"), ("vllm", "vLLM, warm"), ("vllm", "vLLM, reload"))
    runs = [(b, label) for b, label in every if b in wanted]
    for label, seconds, ours in mathrl_jobs(args, runs, work):
        pairs = [(o, t["strict-match"]) for o, t in zip(ours, theirs, strict=True)]
        same_prompt = sum(o["prompt"] == t["arguments"]["gen_args_0"]["arg_0"] for o, t in pairs)
        same_text = sum(o["completion"] == t["resps"][0][0] for o, t in pairs)
        our_acc = sum(o["data"]["correct"] for o in ours) / len(ours)
        same_verdict = sum(bool(o["data"]["correct"]) == bool(t["exact_match"]) for o, t in pairs)
        print(
            f"  mathrl eval job, lm-eval-gsm8k recipe, {label + ':':14s} {seconds:7.1f} s (job submitted -> scores "
            f"stored)  accuracy {our_acc:.1%}  {lm_seconds / seconds:.2f}x lm-eval\n"
            f"      identical prompts {same_prompt}/{len(ours)}, identical completions {same_text}/{len(ours)}, "
            f"same verdict as strict-match {same_verdict}/{len(ours)}",
            flush=True,
        )


def mathrl_jobs(args: argparse.Namespace, runs: list[tuple[str, str]], work: Path) -> list[tuple[str, float, list]]:
    """Each run as an eval job through the embedded service (API, SQLite, one worker), one after
    another: (label, seconds from submit to the job's end with its scores stored, its items). The
    'reload' run evaluates a checkpoint of the model: its files hard-linked into the work dir."""
    import shutil

    from mathrl.client import Client
    from service.embedded import demo_key, embedded_service

    os.environ.setdefault("MATHRL_DATA_DIR", str(Path(args.data_dir).resolve()))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    shutil.rmtree(work / "svc", ignore_errors=True)
    model = str(Path(args.model).resolve())
    checkpoint = work / "checkpoint"
    shutil.rmtree(checkpoint, ignore_errors=True)
    shutil.copytree(model, checkpoint, copy_function=os.link)
    out = []
    with embedded_service(work / "svc", 0, [str(Path(model).parent), str(work)]) as (url, env):
        client = Client(url, api_key=demo_key(env))
        for backend, label in runs:
            body = {
                "kind": "eval", "model": str(checkpoint) if label.endswith("reload") else model,
                "benchmark": "gsm8k", "recipe": "lm-eval-gsm8k",
                "limit": args.limit, "backend": backend, "batch_size": args.batch_size,
                "sampling": {"max_new_tokens": args.max_new_tokens},
            }  # fmt: skip
            t0 = time.perf_counter()
            job = client.jobs.create(body)
            done = client.jobs.wait(job.id, timeout=7200, poll=0.25)
            seconds = time.perf_counter() - t0
            assert done.status == "succeeded", done.error
            engine = next((e for e in client.jobs.events(job.id) if e.type == "vllm_engine"), None)
            if engine is not None:
                print(f"      ({label}) {engine.message}", flush=True)
            out.append((label, seconds, client.jobs.results(job.id)))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("fixtures", "compare"):
        s = sub.add_parser(name)
        s.add_argument("--model", default=str(ROOT / ".mathrl" / "models" / "SmolLM2-135M-Instruct"))
        s.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "datasets"))
        s.add_argument("--limit", type=int, default=5 if name == "fixtures" else 100)
    c = sub.choices["compare"]
    c.add_argument("--batch-size", type=int, default=16)
    c.add_argument("--max-new-tokens", type=int, default=256)
    c.add_argument("--work", default=str(ROOT / ".mathrl" / "lm-eval" / "compare"))
    c.add_argument(
        "--backends",
        default="hf,vllm",
        help="mathrl runs: hf (one job), vllm (a cold job, a warm one, then a checkpoint reloaded into the warm one)",
    )
    args = p.parse_args()
    {"fixtures": fixtures, "compare": compare}[args.command](args)


if __name__ == "__main__":
    main()
