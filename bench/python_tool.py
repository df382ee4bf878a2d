"""The python tool's calls (evaluator/python_tool.py): `--calls` calls of a short snippet, each in a
fresh interpreter state, through one warm sandbox that forks a state per call; beside it, in the
same run, the same snippet through a fresh sandbox per call (what a python grader's call costs:
bubblewrap, an interpreter, the filter), on `--fresh` calls. Then a step's worth of rollouts with
history: `--rollouts` rollouts of `--turns` calls each, every call replaying its rollout's earlier
blocks. Prints seconds, calls per second, and the latencies.

    .venv/bin/python bench/python_tool.py                  # 256 calls, parallel 8
    .venv/bin/python bench/python_tool.py --calls 1024 --parallel 16

Target (issue 67.3): 256 calls in at most 1.5 s on a 2-core machine (at least 170 calls/s).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SNIPPET = "import math\nxs = [i * i for i in range(100)]\nprint(sum(xs), math.sqrt(sum(xs)))"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=256)
    p.add_argument("--parallel", type=int, default=8)
    p.add_argument("--fresh", type=int, default=16, help="calls through a fresh sandbox each, for the ratio")
    p.add_argument("--rollouts", type=int, default=64)
    p.add_argument("--turns", type=int, default=4)
    a = p.parse_args()

    from evaluator.python_tool import PythonTool, ToolLimits
    from evaluator.sandbox import SandboxLimits, run_python

    with PythonTool(ToolLimits(parallel=a.parallel)) as tool:
        t0 = time.monotonic()
        tool.run([("print('warm')", [])])
        start = time.monotonic() - t0
        tool.run([(SNIPPET, [])] * a.parallel)  # the first forks touch the server's pages
        t0 = time.monotonic()
        results = tool.run([(SNIPPET, [])] * a.calls)
        warm = time.monotonic() - t0
        assert len({r.output for r in results}) == 1 and results[0].error is None, results[0]
        history = [f"x{i} = {i} * 3" for i in range(a.turns)]
        t0 = time.monotonic()
        for turn in range(a.turns):
            tool.run([(f"print(x{turn})", history[: turn + 1])] * a.rollouts)
        step = time.monotonic() - t0
    grader = "def grade(s, i):\n" + "\n".join("    " + line for line in SNIPPET.splitlines()) + "\n    return 1.0"
    t0 = time.monotonic()
    for _ in range(a.fresh):
        (r,) = run_python(grader, [({}, {})], SandboxLimits())
        assert r.score == 1.0, r
    fresh = (time.monotonic() - t0) / a.fresh
    lat = sorted(r.seconds for r in results)
    print(f"sandbox start: {start:.3f} s (once a job)")
    print(
        f"warm sandbox, a fresh state per call: {a.calls} calls in {warm:.3f} s = {a.calls / warm:.0f} calls/s "
        f"(parallel {a.parallel}; answered after p50 {statistics.median(lat):.3f} s, last {lat[-1]:.3f} s)"
    )
    print(f"a fresh sandbox per call: {fresh:.3f} s a call = {1 / fresh:.1f} calls/s ({a.fresh} calls)")
    print(f"ratio: {fresh * a.calls / warm:.1f}x the calls per second")
    n = a.rollouts * a.turns
    print(f"a step's calls: {a.rollouts} rollouts x {a.turns} turns (each replaying its history) = {n} calls "
          f"in {step:.3f} s, {a.turns} batches")  # fmt: skip


if __name__ == "__main__":
    main()
