"""This worker's GPUs, each lent to one running job at a time (`GPUSlots`).

A worker pod of a pool with `concurrency` over 1 runs that many jobs at once, each with a slot's
share of the pod's GPUs (workerPools: `gpus` over `concurrency`). Each job's process, its vLLM
server and its warm engine see only the devices lent to it (CUDA_VISIBLE_DEVICES). A job waits here
while the devices it needs are lent out, keeping its lease; it gives up when it loses its lease or
is cancelled. Why: RELIABILITY.md, "Tenants" (jobs at once on one worker pod)."""

from __future__ import annotations

import threading
from collections.abc import Callable


class GPUSlots:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._lent: set[str] = set()

    def take(self, n: int, visible: list[str], still_ours: Callable[[], bool], wait_seconds: float) -> list[str] | None:
        """`n` of the `visible` devices no other job holds (all of them where `n` is more than there
        are); None when `still_ours()` says the job was lost or cancelled while it waited."""
        n = min(n, len(visible))
        with self._cond:
            while True:
                free = [d for d in visible if d not in self._lent]
                if len(free) >= n:
                    got = free[:n]
                    self._lent.update(got)
                    return got
                if not still_ours():
                    return None
                self._cond.wait(wait_seconds)

    def give(self, gpus: list[str]) -> None:
        with self._cond:
            self._lent.difference_update(gpus)
            self._cond.notify_all()


SLOTS = GPUSlots()  # the worker process's (its jobs run in threads of one process: Celery's thread pool)
