"""A batch (OpenAI's Batch API) as its job runs it (evaluator/chat.py `run_batch`), its lines one
at a time against `--in-flight` together, side by side in one run: on a warm vLLM engine (`vllm`:
lines sent at once) or on transformers (`hf`: lines generated as one batch). Prints each way's
seconds, lines per second and the speed-up, and how many greedy answers are the same text.

    .venv/bin/python bench/batch.py                          # SmolLM2-135M-Instruct, 32 chats, 16 together, vLLM
    .venv/bin/python bench/batch.py --backend hf
    .venv/bin/python bench/batch.py --lines 64 --in-flight 32 --max-tokens 64

The engine is `vllm serve` as the worker starts its warm engine (worker/warm_engine.py
`server_command`), on this machine's CPU or GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class _Sink:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def samples(self, step: int | None, items: list[dict[str, Any]]) -> None:
        self.rows += items

    def event(self, *args: Any, **kw: Any) -> None:
        pass

    def progress(self, done: int, total: int, message: str = "") -> None:
        pass

    def should_stop(self) -> bool:
        return False

    def stored_steps(self) -> set[int]:
        return set()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=".mathrl/models/SmolLM2-135M-Instruct")
    parser.add_argument("--lines", type=int, default=32)
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--backend", choices=("vllm", "hf"), default="vllm")
    args = parser.parse_args()

    from evaluator.backends.base import EngineSettings, WarmEngineAddress
    from evaluator.backends.warm import connect
    from evaluator.chat import run_batch
    from mathrl.specs import parse_spec
    from runtime.processes import free_port
    from worker.vllm_server import launch, server_env
    from worker.warm_engine import server_command

    model = str(Path(args.model).resolve())
    work = Path(tempfile.mkdtemp(prefix="bench-batch-"))
    questions = [f"What is {a} + {a * 7 % 50}?" for a in range(args.lines)]
    lines = [
        {
            "custom_id": f"q{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": q}], "max_tokens": args.max_tokens}
            | {"temperature": 0},
        }
        for i, q in enumerate(questions)
    ]
    (work / "batch.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    server, warm = None, None
    if args.backend == "vllm":
        port = free_port()
        cmd = server_command(model, "auto", 2048, port, 0, engine=EngineSettings(enforce_eager=True))
        server = launch(cmd, port, server_env(model), work / "engine.log", None)
    try:
        t0 = time.monotonic()
        if server is not None:
            warm = WarmEngineAddress(server.url, None, 900.0)
            connect(warm)
            print(f"engine up in {time.monotonic() - t0:.1f} s")
        print(f"{args.backend}, {model}: {args.lines} chats of {args.max_tokens} tokens")
        batch = {"file": "file-" + "0" * 32, "endpoint": "/v1/chat/completions"}
        spec = parse_spec({"kind": "generate", "model": model, "batch": batch, "backend": args.backend})
        spec.batch._path = str(work / "batch.jsonl")
        results = {}
        for width in (1, args.in_flight, 1, args.in_flight):  # twice each, alternating: the second of each counts
            sink = _Sink()
            started = time.monotonic()
            run_batch(spec, sink, model, warm, in_flight=width)
            results[width] = (time.monotonic() - started, {r["data"]["custom_id"]: r["completion"] for r in sink.rows})
        one, many = results[1], results[args.in_flight]
        for width, (took, _) in ((1, one), (args.in_flight, many)):
            print(f"  {width:>3} together: {took:.2f} s, {args.lines / took:.2f} lines/s")
        same = sum(one[1][k] == many[1][k] for k in one[1])
        print(f"  speed-up {one[0] / many[0]:.2f}x; the same greedy text on {same} of {args.lines} lines")
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
